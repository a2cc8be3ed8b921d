package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/faultnet"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// BenchmarkCommitSlowUpstream measures synchronous OffsetCommit latency
// when the network to the cluster is slow: every byte between the
// cluster and its client goes through a fault relay (internal/faultnet)
// that adds $KPROXY_BENCH_DELAY (default 100ms) in each direction. The
// direct member's own path is slowed that way; through kproxy (local,
// and the owner of a fleet of one) kproxy's path to the cluster is, its
// sessions' connections and its own client alike, while the member
// reaches kproxy on loopback. A commit should then cost what it costs
// directly, one slowed round trip, not a multiple: nothing in kproxy may
// queue behind it. $KPROXY_BENCH_COMMITS (default 60) per path, paths
// taking turns; brokers as in BenchmarkCommitLatency. It runs its work
// once whatever b.N is:
//
//	KPROXY_BENCH_BROKERS=127.0.0.1:9092 go test -run '^$' -bench BenchmarkCommitSlowUpstream -benchtime 1x ./e2e
func BenchmarkCommitSlowUpstream(b *testing.B) {
	delay := slowBenchDelay(b)
	commits := benchEnvInt(b, "KPROXY_BENCH_COMMITS", 60)
	brokers := commitBenchBrokers(b)
	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)

	local, owner, directPath := slowBenchPaths(b, brokers, delay, "slow-"+run)

	paths := []*commitPath{
		{name: "direct", seeds: brokers, opts: []kgo.Opt{kgo.Dialer(directPath.dial)}},
		{name: "local", seeds: []string{local.Addr()}},
		{name: "distributed-owner", seeds: []string{owner.Addr()}},
	}
	measureCommits(b, brokers, "commit-slow-"+run, paths, commits)
	d50, d99 := p50p99(paths[0].lat)
	var sb strings.Builder
	fmt.Fprintf(&sb, "synchronous OffsetCommit with %s added each way on the path to the cluster, %d commits per path\n", delay, commits)
	fmt.Fprintf(&sb, "%-18s %8s %8s %12s %12s\n", "path", "p50 ms", "p99 ms", "p50/direct", "p99/direct")
	for _, p := range paths {
		p50, p99 := p50p99(p.lat)
		fmt.Fprintf(&sb, "%-18s %8.1f %8.1f %12.2f %12.2f\n", p.name, ms(p50), ms(p99), ratio(p50, d50), ratio(p99, d99))
		b.ReportMetric(ms(p50), p.name+"-p50-ms")
		b.ReportMetric(ms(p99), p.name+"-p99-ms")
	}
	b.Log("\n" + sb.String())
}

// slowBenchDelay is $KPROXY_BENCH_DELAY, 100ms if unset.
func slowBenchDelay(b *testing.B) time.Duration {
	b.Helper()
	s := os.Getenv("KPROXY_BENCH_DELAY")
	if s == "" {
		return 100 * time.Millisecond
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		b.Fatalf("KPROXY_BENCH_DELAY=%q: want a duration", s)
	}
	return d
}

// benchEnvInt is the positive number in $name, def if unset.
func benchEnvInt(b *testing.B, name string, def int) int {
	b.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

// startSlowKproxy starts an in-process kproxy whose every connection to
// brokers (its sessions' and its own clients') goes through a fault relay
// adding delay each way; it shuts down when b ends.
func startSlowKproxy(b *testing.B, brokers []string, delay time.Duration, mode kproxy.GroupsMode, fc kproxy.FleetConfig) *kproxy.Server {
	b.Helper()
	path := newFaultPath(b)
	path.apply(func(r *faultnet.Relay) { r.Delay(faultnet.Both, delay) })
	return startBenchKproxyVia(b, brokers, mode, fc, path.dial)
}

// slowBenchPaths starts what both slow-upstream benchmarks compare: a
// local kproxy and the owner of a fleet of one named fleet, each behind
// a link slowed by delay each way, and the direct member's own path
// slowed the same way.
func slowBenchPaths(b *testing.B, brokers []string, delay time.Duration, fleet string) (local, owner *kproxy.Server, direct *faultPath) {
	b.Helper()
	local = startSlowKproxy(b, brokers, delay, kproxy.GroupsLocal, kproxy.FleetConfig{})
	owner = startSlowKproxy(b, brokers, delay, kproxy.GroupsDistributed, kproxy.FleetConfig{Name: fleet})
	waitCommitBenchFleet(b, owner, nil)
	direct = newFaultPath(b)
	direct.apply(func(r *faultnet.Relay) { r.Delay(faultnet.Both, delay) })
	return local, owner, direct
}

// BenchmarkGroupCommitsSlowUpstream is BenchmarkCommitSlowUpstream with
// $KPROXY_BENCH_MEMBERS (default 4) members of one group, each assigned
// one partition of the group's topic and all committing their own
// partition at once, $KPROXY_BENCH_COMMITS (default 30) synchronous
// commits each. Directly the cluster's coordinator takes the members'
// commits as they come; through kproxy each must still cost one slowed
// round trip, not one per member queued behind the others. Paths run one
// after the other:
//
//	KPROXY_BENCH_BROKERS=127.0.0.1:9092 go test -run '^$' -bench BenchmarkGroupCommitsSlowUpstream -benchtime 1x ./e2e
func BenchmarkGroupCommitsSlowUpstream(b *testing.B) {
	delay := slowBenchDelay(b)
	commits := benchEnvInt(b, "KPROXY_BENCH_COMMITS", 30)
	members := benchEnvInt(b, "KPROXY_BENCH_MEMBERS", 4)
	brokers := commitBenchBrokers(b)
	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	local, owner, directPath := slowBenchPaths(b, brokers, delay, "gslow-"+run)

	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(admCl.Close)
	adm := kadm.NewClient(admCl)
	type path struct {
		name  string
		seeds []string
		opts  []kgo.Opt
		lat   []time.Duration
	}
	paths := []*path{
		{name: "direct", seeds: brokers, opts: []kgo.Opt{kgo.Dialer(directPath.dial)}},
		{name: "local", seeds: []string{local.Addr()}},
		{name: "distributed-owner", seeds: []string{owner.Addr()}},
	}
	for _, p := range paths {
		topic := "group-commit-slow-" + run + "-" + p.name
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := adm.CreateTopic(ctx, int32(members), -1, nil, topic)
		cancel()
		if err != nil {
			b.Fatalf("%s: create topic %s: %v", p.name, topic, err)
		}
		lat, err := groupCommits(topic, topic, members, commits, p.seeds, p.opts)
		if err != nil {
			b.Fatalf("%s: %v", p.name, err)
		}
		p.lat = lat
		// The cluster holds every member's last commit.
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		offs, err := adm.FetchOffsets(ctx, topic)
		cancel()
		if err != nil {
			b.Fatalf("%s: fetch offsets: %v", p.name, err)
		}
		for part := range int32(members) {
			if o, ok := offs.Lookup(topic, part); !ok || o.Err != nil || o.At != int64(commits+commitWarmup) {
				b.Fatalf("%s: the cluster has %+v (found %v) for %s/%d, want %d", p.name, o, ok, topic, part, commits+commitWarmup)
			}
		}
	}
	d50, d99 := p50p99(paths[0].lat)
	var sb strings.Builder
	fmt.Fprintf(&sb, "synchronous OffsetCommit, %d members of one group committing at once, %s added each way on the path to the cluster, %d commits per member\n", members, delay, commits)
	fmt.Fprintf(&sb, "%-18s %8s %8s %12s %12s\n", "path", "p50 ms", "p99 ms", "p50/direct", "p99/direct")
	for _, p := range paths {
		p50, p99 := p50p99(p.lat)
		fmt.Fprintf(&sb, "%-18s %8.1f %8.1f %12.2f %12.2f\n", p.name, ms(p50), ms(p99), ratio(p50, d50), ratio(p99, d99))
		b.ReportMetric(ms(p50), p.name+"-p50-ms")
		b.ReportMetric(ms(p99), p.name+"-p99-ms")
	}
	b.Log("\n" + sb.String())
}

// groupCommits joins members members of group (range assignor, one
// partition each of topic), then has them all commit their partition at
// once, commitWarmup untimed and commits timed synchronous commits each
// with offsets 1, 2, ...; it returns the timed latencies of all members.
func groupCommits(group, topic string, members, commits int, seeds []string, opts []kgo.Opt) ([]time.Duration, error) {
	type member struct {
		cl   *kgo.Client
		part int32
	}
	ms := make([]*member, members)
	assigned := make(chan struct{}, members)
	var amu sync.Mutex // guards every member's part
	for i := range ms {
		m := &member{part: -1}
		ms[i] = m
		cl, err := kgo.NewClient(append([]kgo.Opt{
			kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
			kgo.Balancers(kgo.RangeBalancer()),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
				amu.Lock()
				defer amu.Unlock()
				if len(a[topic]) > 0 {
					m.part = a[topic][0]
				}
				select {
				case assigned <- struct{}{}:
				default:
				}
			}),
		}, opts...)...)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		cl.PauseFetchTopics(topic)
		m.cl = cl
	}
	// Members joining one by one rebalance the group until all are in
	// (range assigns each its own partition once all joined, and each
	// assignment replaces the last): wait until every member holds a
	// partition of its own and no assignment came for a second.
	deadline := time.After(2 * time.Minute)
	for settled := false; !settled; {
		select {
		case <-assigned:
			continue
		case <-deadline:
			return nil, fmt.Errorf("group %s: the members never held one partition each", group)
		case <-time.After(time.Second):
		}
		amu.Lock()
		held := map[int32]bool{}
		for _, m := range ms {
			if m.part >= 0 {
				held[m.part] = true
			}
		}
		settled = len(held) == members
		amu.Unlock()
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lat  []time.Duration
		errs []error
	)
	for _, m := range ms {
		wg.Add(1)
		amu.Lock()
		part := m.part
		amu.Unlock()
		go func() {
			defer wg.Done()
			for i := 1; i <= commitWarmup+commits; i++ {
				offsets := map[string]map[int32]kgo.EpochOffset{topic: {part: {Epoch: -1, Offset: int64(i)}}}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				start := time.Now()
				var cerr error
				m.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
					if err != nil {
						cerr = err
						return
					}
					for _, t := range resp.Topics {
						for _, pt := range t.Partitions {
							if pt.ErrorCode != 0 {
								cerr = kerr.ErrorForCode(pt.ErrorCode)
							}
						}
					}
				})
				took := time.Since(start)
				cancel()
				if cerr != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("member of partition %d, commit %d: %w", part, i, cerr))
					mu.Unlock()
					return
				}
				if i > commitWarmup {
					mu.Lock()
					lat = append(lat, took)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return lat, nil
}
