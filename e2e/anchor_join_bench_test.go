package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/kproxy"
)

// BenchmarkAnchorFirstCommit measures how long $KPROXY_BENCH_GROUPS
// (default 20) new groups, one franz-go member each, all started at
// once, take until their member is assigned and until its first
// synchronous commit is acknowledged, directly and through kproxy
// (local, and a fleet of one owning every group).
//
// Through kproxy the engine answers the JoinGroup, and each group's
// anchor then joins the cluster's group before the group's first commit
// can go under its identity (docs/anchors.md). On a cluster with
// group.initial.rebalance.delay.ms above 0 (Kafka's default is 3 s) the
// cluster holds a JoinGroup into an empty group for that delay, so the
// anchors' joins must not wait on each other. kproxy's engine gets the
// cluster's own delay (read from the broker's config), so both paths
// pay it once. The brokers are $KPROXY_BENCH_BROKERS or an in-memory
// cluster (no delay there); against the interop broker with Kafka's
// default:
//
//	KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS=3000 bash interop/kafka.sh start
//	KPROXY_BENCH_BROKERS=127.0.0.1:9092 go test -run '^$' -bench BenchmarkAnchorFirstCommit -benchtime 1x ./e2e
//
// Every group's commit must be the offset the cluster then has; paths
// run one after the other, each on groups of its own.
func BenchmarkAnchorFirstCommit(b *testing.B) {
	groups := benchEnvInt(b, "KPROXY_BENCH_GROUPS", 20)
	brokers := commitBenchBrokers(b)
	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)

	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(admCl.Close)
	adm := kadm.NewClient(admCl)
	delay := clusterInitialRebalanceDelay(b, adm)
	topic := "first-commit-" + run
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = adm.CreateTopic(ctx, 1, -1, nil, topic)
	cancel()
	if err != nil {
		b.Fatalf("create topic %s: %v", topic, err)
	}
	b.Logf("run %s: %d groups per path against %s, the cluster's group.initial.rebalance.delay.ms %v",
		run, groups, strings.Join(brokers, ","), delay)

	engineDelay := delay
	if engineDelay == 0 {
		engineDelay = -1 // groupstate.Config: negative is none
	}
	start := func(mode kproxy.GroupsMode, fc kproxy.FleetConfig) *kproxy.Server {
		cfg := inProcessConfig(brokers, mode, fc)
		cfg.Groups.Engine.InitialRebalanceDelay = engineDelay
		return startKproxyConfig(b, cfg)
	}
	local := start(kproxy.GroupsLocal, kproxy.FleetConfig{})
	owner := start(kproxy.GroupsDistributed, kproxy.FleetConfig{Name: "fc-" + run})
	waitCommitBenchFleet(b, owner, nil)

	type path struct {
		name     string
		seeds    []string
		assigned []time.Duration
		commit   []time.Duration
		retries  []int
	}
	paths := []*path{
		{name: "direct", seeds: brokers},
		{name: "local", seeds: []string{local.Addr()}},
		{name: "distributed-owner", seeds: []string{owner.Addr()}},
	}
	b.ResetTimer()
	for _, p := range paths {
		p.assigned, p.commit = make([]time.Duration, groups), make([]time.Duration, groups)
		p.retries = make([]int, groups)
		names := make([]string, groups)
		errs := make([]error, groups)
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := range groups {
			names[i] = fmt.Sprintf("first-commit-%s-%s-%d", run, p.name, i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.assigned[i], p.commit[i], errs[i] = firstCommit(p.seeds, names[i], topic, int64(i+1), t0, &p.retries[i])
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				b.Fatalf("%s: group %s: %v", p.name, names[i], err)
			}
		}
		for i, g := range names {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			offs, err := adm.FetchOffsets(ctx, g)
			cancel()
			if err != nil {
				b.Fatalf("%s: fetch offsets of %s: %v", p.name, g, err)
			}
			if o, ok := offs.Lookup(topic, 0); !ok || o.Err != nil || o.At != int64(i+1) {
				b.Fatalf("%s: the cluster has offset %+v (found %v) for group %s, want %d", p.name, o, ok, g, i+1)
			}
		}
	}
	b.StopTimer()

	direct := paths[0]
	dc := quantile(direct.commit, 0.5)
	dcMax := quantile(direct.commit, 1)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d new groups started at once, one member each, brokers %s, initial rebalance delay %v\n",
		groups, strings.Join(brokers, ","), delay)
	fmt.Fprintf(&sb, "%-18s %14s %14s %14s %12s %12s %8s\n", "path", "assigned p50", "commit p50", "commit max", "p50/direct", "max/direct", "retried")
	for _, p := range paths {
		a, c, cm := quantile(p.assigned, 0.5), quantile(p.commit, 0.5), quantile(p.commit, 1)
		retried := 0
		for _, r := range p.retries {
			retried += r
		}
		fmt.Fprintf(&sb, "%-18s %11.0f ms %11.0f ms %11.0f ms %12.2f %12.2f %8d\n", p.name, ms(a), ms(c), ms(cm), ratio(c, dc), ratio(cm, dcMax), retried)
		b.ReportMetric(ms(c), p.name+"-commit-p50-ms")
		b.ReportMetric(ms(cm), p.name+"-commit-max-ms")
		if p != direct {
			b.ReportMetric(ratio(c, dc), p.name+"/direct-p50")
			b.ReportMetric(ratio(cm, dcMax), p.name+"/direct-max")
		}
	}
	b.Logf("\n%s", sb.String())
}

// firstCommit starts one member of group on topic through seeds, waits
// for its assignment of partition 0 and commits offset there once; it
// returns both moments as time since t0. Commits answered with a
// retriable error are counted in *retries.
func firstCommit(seeds []string, group, topic string, offset int64, t0 time.Time, retries *int) (assigned, committed time.Duration, err error) {
	got := make(chan struct{})
	var once sync.Once
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(),
		// A commit waiting on its anchor's join is measured, not failed
		// at the client's default 10 s read deadline.
		kgo.RequestTimeoutOverhead(2*time.Minute),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			if len(m[topic]) > 0 {
				once.Do(func() { close(got) })
			}
		}),
	)
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	cl.PauseFetchTopics(topic)
	select {
	case <-got:
	case <-time.After(3 * time.Minute):
		return 0, 0, fmt.Errorf("never assigned %s/0", topic)
	}
	assigned = time.Since(t0)
	// A retriable error is retried, as an application would on its
	// next commit; the time counts until one is acknowledged.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		var cerr error
		cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{topic: {0: {Epoch: -1, Offset: offset}}},
			func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
				if err != nil {
					cerr = err
					return
				}
				for _, t := range resp.Topics {
					for _, pt := range t.Partitions {
						if pt.ErrorCode != 0 {
							cerr = fmt.Errorf("commit of %s/%d: %w", topic, pt.Partition, kerr.ErrorForCode(pt.ErrorCode))
						}
					}
				}
			})
		cancel()
		if cerr == nil {
			break
		}
		if !kerr.IsRetriable(cerr) || time.Now().After(deadline) {
			return 0, 0, cerr
		}
		*retries++
	}
	return assigned, time.Since(t0), nil
}

// clusterInitialRebalanceDelay is the group.initial.rebalance.delay.ms
// of the cluster's first broker (0 where the broker does not say, as
// kfake).
func clusterInitialRebalanceDelay(b *testing.B, adm *kadm.Client) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bm, err := adm.BrokerMetadata(ctx)
	if err != nil {
		b.Fatalf("broker metadata: %v", err)
	}
	rc, err := adm.DescribeBrokerConfigs(ctx, bm.Brokers.NodeIDs()[0])
	if err != nil {
		b.Logf("describe broker configs: %v (taking no initial rebalance delay)", err)
		return 0
	}
	for _, r := range rc {
		for _, c := range r.Configs {
			if c.Key == "group.initial.rebalance.delay.ms" && c.Value != nil {
				n, err := strconv.Atoi(*c.Value)
				if err != nil {
					b.Fatalf("group.initial.rebalance.delay.ms=%q: %v", *c.Value, err)
				}
				return time.Duration(n) * time.Millisecond
			}
		}
	}
	return 0
}

// quantile is the q-quantile (0..1, nearest rank below) of d.
func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[int(q*float64(len(s)-1))]
}
