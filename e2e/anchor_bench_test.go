package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
)

// BenchmarkAnchors measures what anchors (docs/anchors.md) cost a fleet,
// with `kproxy serve` children in front of one in-memory kfake cluster.
// First the anchor requests per second at the cluster while N groups (one
// member each, $KPROXY_BENCH_ANCHOR_GROUPS, default 1000) all live in one
// partition of the groups topic and sit idle, with the anchors' session
// at 8s (a heartbeat every 2s; the default 2m session heartbeats 15 times
// less often). Then the failover of that partition: its owner is
// SIGKILLed and every group commits through the survivor, which loads
// each group, checks it is not live on the cluster, and replaces its
// anchor (one DescribeGroups, JoinGroup and SyncGroup per group) before
// the commit is written: the time until each group's first commit after
// the kill succeeded. Run it with
//
//	go test -run '^$' -bench BenchmarkAnchors -benchtime 1x -timeout 10m ./e2e/
func BenchmarkAnchors(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("KPROXY_BENCH_ANCHOR_GROUPS")); err == nil && v > 0 {
		n = v
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(benchTopicPartitions, benchTopic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond), kfake.AllowAutoTopicCreation())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cluster.Close)
	reqs := countRequests(cluster)
	const name = "anch"
	var procs []*kproxyProc
	for i := range 2 {
		args := append(fleetBenchArgs(name, "3s", "300ms"), "--group-anchor-session-timeout", "8s")
		procs = append(procs, startKproxy(b, name+"-"+strconv.Itoa(i), cluster.ListenAddrs(), args...))
	}
	owners := waitFleetSettled(b, procs, 60*time.Second)
	owner, survivor := procs[0], procs[1]
	// n groups in one partition served by owner.
	var part int32 = -1
	var groups []string
	for i := 0; len(groups) < n; i++ {
		g := name + "-g-" + strconv.Itoa(i)
		p := kafkastore.GroupPartition(g, fleetPartitions)
		if owners[p] != owner.name {
			continue
		}
		if part < 0 {
			part = p
		}
		if p == part {
			groups = append(groups, g)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(survivor.addr), kgo.RequestRetries(0))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	topicID := benchTopicID(b, cluster)
	paths := make([]*latencyPath, len(groups))
	settleStart := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, g := range groups {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			p := &latencyPath{name: g, cl: cl, group: g, topicID: topicID}
			ids, gen := settle(b, []*kgo.Client{cl}, g)
			p.member, p.gen = ids[0], gen
			commitOnce(b, p) // waits for the group's anchor
			paths[i] = p
		}()
	}
	wg.Wait()
	settled := time.Since(settleStart)

	// Idle: only the anchors (and the fleet) talk to the cluster.
	const idle = 6 * time.Second
	before := reqs.snapshot()
	time.Sleep(idle)
	after := reqs.snapshot()
	hb := float64(after[12]-before[12]) / idle.Seconds()

	// Failover: every group commits through the survivor until it
	// succeeded once after the kill.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	killed := time.Now()
	owner.signal(b, syscall.SIGKILL)
	<-owner.exited
	back := make([]time.Duration, len(paths))
	errs := make([]map[string]int, len(paths))
	for i, p := range paths {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = map[string]int{}
			for off := int64(1_000_000); ctx.Err() == nil; off++ {
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := commitRequest(p.topicID, p.group, p.member, p.gen, off).RequestWith(rctx, p.cl)
				rcancel()
				if err == nil && commitCode(resp) == 0 {
					back[i] = time.Since(killed)
					return
				}
				msg := "request error"
				if err == nil {
					msg = strconv.Itoa(int(commitCode(resp)))
				}
				errs[i][msg]++
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	for i, d := range back {
		if d == 0 {
			b.Fatalf("group %s: no commit succeeded through %s within 3m of killing %s (errors %v)", paths[i].group, survivor.name, owner.name, errs[i])
		}
	}
	sorted := slices.Clone(back)
	slices.Sort(sorted)
	p50, p99 := p50p99(sorted)
	codes := map[string]int{}
	for _, e := range errs {
		for k, v := range e {
			codes[k] += v
		}
	}
	var cs []string
	for k, v := range codes {
		cs = append(cs, fmt.Sprintf("code %s x%d", k, v))
	}
	slices.Sort(cs)
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nanchors: %d groups in groups partition %d, one member each (settled and anchored in %v)\n", len(groups), part, settled.Round(time.Millisecond))
	fmt.Fprintf(&sb, "  idle: %.0f anchor heartbeats/s at the cluster (session 8s, every 2s: %.0f expected); %d groups at the default 2m session: %.0f/s, 10,000 groups: %.0f/s\n",
		hb, float64(len(groups))/2, len(groups), float64(len(groups))/30, 10000.0/30)
	fmt.Fprintf(&sb, "  failover after SIGKILL of the owner (fleet session 3s): first commit of each group back after p50 %v, p99 %v, last %v; errors meanwhile: %s\n",
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), strings.Join(cs, ", "))
	report(b, sb.String())
	b.ReportMetric(hb, "anchor-heartbeats/s")
	b.ReportMetric(sorted[len(sorted)-1].Seconds(), "s-to-last-group")
	b.ReportMetric(p50.Seconds(), "s-to-group-p50")
}
