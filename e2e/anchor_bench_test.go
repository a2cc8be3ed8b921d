package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/internal/loadgen"
)

// BenchmarkAnchors measures what anchors (docs/anchors.md) cost a fleet,
// with `kproxy serve` children in front of one in-memory kfake cluster.
// First the anchor requests per second at the cluster while N groups (one
// member each, $KPROXY_BENCH_ANCHOR_GROUPS, default 1000) all live in one
// partition of the groups topic and sit idle, with the anchors' session
// at $KPROXY_BENCH_ANCHOR_SESSION (default 8s: a heartbeat every 2s; the
// default 2m session heartbeats 15 times less often). Then the failover of that partition: its owner is
// SIGKILLed and every group commits through the survivor, which loads
// each group, checks it is not live on the cluster, and replaces its
// anchor (one DescribeGroups, JoinGroup and SyncGroup per group) before
// the commit is written: the time until each group's first commit after
// the kill succeeded. Run it with
//
//	go test -run '^$' -bench BenchmarkAnchors -benchtime 1x -timeout 10m ./e2e/
//
// or against a real cluster, $KPROXY_BENCH_BROKERS, whose request logs
// $KPROXY_BENCH_REQUEST_LOG (comma-separated, `interop/kafka.sh
// request-log`) give the heartbeats at the cluster:
//
//	bash interop/kafka.sh start
//	KPROXY_BENCH_BROKERS=127.0.0.1:9092 KPROXY_BENCH_REQUEST_LOG=$(bash interop/kafka.sh request-log | paste -sd,) \
//	    go test -run '^$' -bench BenchmarkAnchors -benchtime 1x -timeout 10m ./e2e/
func BenchmarkAnchors(b *testing.B) {
	n := envCount("KPROXY_BENCH_ANCHOR_GROUPS", 1000)
	session := 8 * time.Second
	if v, err := time.ParseDuration(os.Getenv("KPROXY_BENCH_ANCHOR_SESSION")); err == nil && v > 0 {
		session = v
	}
	name := "anch"
	var brokers []string
	var heartbeats func() int64 // Heartbeats the cluster served so far
	if os.Getenv("KPROXY_BENCH_BROKERS") != "" {
		brokers = commitBenchBrokers(b)
		// Groups, their offsets and the groups topic outlive a run on
		// a real cluster: a fleet and groups of this run's own.
		name += strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
		createBenchTopic(b, brokers)
		heartbeats = requestLogCounter(b, os.Getenv("KPROXY_BENCH_REQUEST_LOG"), 12)
	} else {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(benchTopicPartitions, benchTopic),
			kfake.GroupMinSessionTimeout(500*time.Millisecond), kfake.AllowAutoTopicCreation())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cluster.Close)
		brokers = cluster.ListenAddrs()
		reqs := countRequests(cluster)
		heartbeats = func() int64 { return reqs.snapshot()[12] }
	}
	var procs []*kproxyProc
	for i := range 2 {
		// The members ask for 10-minute sessions (below), past the
		// cluster's group.max.session.timeout.ms that kproxy would
		// otherwise take as its own maximum.
		args := append(fleetBenchArgs(name, "3s", "300ms"), "--group-anchor-session-timeout", session.String(),
			"--group-max-session-timeout", "10m")
		if lvl := os.Getenv("KPROXY_BENCH_LOG_LEVEL"); lvl != "" {
			args = append(args, "--log-level", lvl)
		}
		procs = append(procs, startKproxy(b, name+"-"+strconv.Itoa(i), brokers, args...))
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
	topicID := benchTopicIDAt(b, brokers[0])
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
			// Sessions of 10m: the members do not heartbeat,
			// and settling 10,000 groups and a long idle outlast
			// the default 30s.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ms := members(ctx, []*kgo.Client{cl}, g)
			if err := loadgen.Settle(ctx, ms, loadgen.SettleConfig{PollInterval: 2 * time.Millisecond, SessionTimeout: 10 * time.Minute}); err != nil {
				b.Errorf("group %s never settled: %v", g, err)
				return
			}
			p.member, p.gen = ms[0].ID, ms[0].Generation
			commitOnce(b, p) // waits for the group's anchor
			paths[i] = p
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	settled := time.Since(settleStart)

	// Idle: only the anchors (and the fleet) talk to the cluster, for
	// three heartbeat intervals (a quarter of the session each).
	interval := session / 4
	idle := 3 * interval
	before := heartbeats()
	time.Sleep(idle)
	hb := float64(heartbeats()-before) / idle.Seconds()

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
	// The anchors' scheduler looks for due heartbeats once a second,
	// so one comes every interval plus up to a second.
	fmt.Fprintf(&sb, "  idle: %.0f anchor heartbeats/s at the cluster over %v (session %v, one per anchor every %v to %v: %.0f-%.0f/s)\n",
		hb, idle, session, interval, interval+time.Second, float64(len(groups))/(interval+time.Second).Seconds(), float64(len(groups))/interval.Seconds())
	fmt.Fprintf(&sb, "  failover after SIGKILL of the owner (fleet session 3s): first commit of each group back after p50 %v, p99 %v, last %v; errors meanwhile: %s\n",
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), strings.Join(cs, ", "))
	report(b, sb.String())
	b.ReportMetric(hb, "anchor-heartbeats/s")
	b.ReportMetric(sorted[len(sorted)-1].Seconds(), "s-to-last-group")
	b.ReportMetric(p50.Seconds(), "s-to-group-p50")
}

// createBenchTopic creates benchTopic with benchTopicPartitions on the
// cluster of brokers, unless it exists.
func createBenchTopic(b *testing.B, brokers []string) {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, benchTopicPartitions, -1, nil, benchTopic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		b.Fatalf("create topic %s: %v", benchTopic, err)
	}
}

// requestLogCounter counts, in the broker request logs at paths
// (comma-separated, written by interop/kafka.sh), the requests of API
// key that were logged after it was called: the function it returns
// reads what the logs gained since.
func requestLogCounter(b *testing.B, paths string, key int16) func() int64 {
	b.Helper()
	if paths == "" {
		b.Fatal("KPROXY_BENCH_REQUEST_LOG is unset: against a real cluster the heartbeats are counted in its request logs (interop/kafka.sh request-log)")
	}
	needle := []byte(fmt.Sprintf(`"requestApiKey":%d,`, key))
	type logFile struct {
		path  string
		start int64
	}
	var logs []logFile
	for p := range strings.SplitSeq(paths, ",") {
		fi, err := os.Stat(p)
		if err != nil {
			b.Fatalf("request log: %v", err)
		}
		logs = append(logs, logFile{p, fi.Size()})
	}
	return func() int64 {
		var n int64
		for _, l := range logs {
			f, err := os.Open(l.path)
			if err != nil {
				b.Fatalf("request log: %v", err)
			}
			if _, err := f.Seek(l.start, io.SeekStart); err != nil {
				f.Close()
				b.Fatalf("request log: %v", err)
			}
			all, err := io.ReadAll(f)
			f.Close()
			if err != nil {
				b.Fatalf("request log: %v", err)
			}
			n += int64(bytes.Count(all, needle))
		}
		return n
	}
}
