package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
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

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// BenchmarkCommitLatency measures synchronous OffsetCommit latency for
// one member of a one-member group (franz-go, CommitOffsetsSync, one
// commit at a time), in one run, along four paths:
//
//   - direct: the client talks to the brokers;
//   - local: through an in-process kproxy with --groups local;
//   - distributed-owner: through a fleet of one in-process kproxy, which
//     owns every partition of its groups topic;
//   - distributed-relay: through a relay (FleetConfig.Relay) of a fleet
//     of two, which relays every group request to the fleet's owner.
//
// The brokers are $KPROXY_BENCH_BROKERS (comma-separated host:port of a
// real cluster) or else an in-memory kproxy.NewDevCluster of three
// brokers. Each path gets its own topic of one partition and its own
// group, named after the run. Once every member is assigned its
// partition, the paths take turns in batches of commitBatch commits so
// that noise of the shared machine falls on all of them. Every commit
// carries a higher offset than the one before; any error fails the
// benchmark. $KPROXY_BENCH_COMMITS (default 500) is the timed commits per
// path. It reports p50 and p99 per path in ms and each kproxy path's
// ratio to direct, and runs its work once whatever b.N is:
//
//	KPROXY_BENCH_COMMITS=1000 go test -run '^$' -bench BenchmarkCommitLatency -benchtime 1x ./e2e
func BenchmarkCommitLatency(b *testing.B) {
	commits := commitBenchCommits(b)
	brokers := commitBenchBrokers(b)
	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	b.Logf("run %s: %d commits per path against %s", run, commits, strings.Join(brokers, ","))

	local := startCommitBenchKproxy(b, brokers, kproxy.GroupsLocal, kproxy.FleetConfig{})
	owner := startCommitBenchKproxy(b, brokers, kproxy.GroupsDistributed, kproxy.FleetConfig{Name: "cb-" + run + "-one"})
	relayFleet := "cb-" + run + "-two"
	relayOwner := startCommitBenchKproxy(b, brokers, kproxy.GroupsDistributed, kproxy.FleetConfig{Name: relayFleet})
	relay := startCommitBenchKproxy(b, brokers, kproxy.GroupsDistributed, kproxy.FleetConfig{Name: relayFleet, Relay: true})
	waitCommitBenchFleet(b, owner, nil)
	waitCommitBenchFleet(b, relayOwner, relay)

	paths := []*commitPath{
		{name: "direct", seeds: brokers},
		{name: "local", seeds: []string{local.Addr()}},
		{name: "distributed-owner", seeds: []string{owner.Addr()}},
		{name: "distributed-relay", seeds: []string{relay.Addr()}},
	}
	adm := measureCommits(b, brokers, "commit-bench-"+run, paths, commits)

	// The last commit of each path is what the cluster has.
	for _, p := range paths {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		offs, err := adm.FetchOffsets(ctx, p.group)
		cancel()
		if err != nil {
			b.Fatalf("%s: fetch offsets of %s: %v", p.name, p.group, err)
		}
		if o, ok := offs.Lookup(p.topic, 0); !ok || o.Err != nil || o.At != p.offset {
			b.Fatalf("%s: the cluster has offset %+v (found %v) for %s/0, want %d", p.name, o, ok, p.topic, p.offset)
		}
	}

	direct := paths[0]
	d50, d99 := p50p99(direct.lat)
	var sb strings.Builder
	fmt.Fprintf(&sb, "synchronous OffsetCommit, one member, %d commits per path in batches of %d, brokers %s\n",
		commits, commitBatch, strings.Join(brokers, ","))
	fmt.Fprintf(&sb, "%-18s %8s %8s %12s %12s\n", "path", "p50 ms", "p99 ms", "p50/direct", "p99/direct")
	for _, p := range paths {
		p50, p99 := p50p99(p.lat)
		fmt.Fprintf(&sb, "%-18s %8.3f %8.3f %12.2f %12.2f\n", p.name, ms(p50), ms(p99), ratio(p50, d50), ratio(p99, d99))
		b.ReportMetric(ms(p50), p.name+"-p50-ms")
		b.ReportMetric(ms(p99), p.name+"-p99-ms")
		if p != direct {
			b.ReportMetric(ratio(p50, d50), p.name+"/direct-p50")
			b.ReportMetric(ratio(p99, d99), p.name+"/direct-p99")
		}
	}
	b.Logf("\n%s", sb.String())
}

const (
	// commitBatch is how many commits a path makes in its turn.
	commitBatch = 50
	// commitWarmup is how many untimed commits each path makes first.
	commitWarmup = 10
)

// commitBenchCommits is $KPROXY_BENCH_COMMITS, 500 if unset.
func commitBenchCommits(b *testing.B) int {
	b.Helper()
	s := os.Getenv("KPROXY_BENCH_COMMITS")
	if s == "" {
		return 500
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		b.Fatalf("KPROXY_BENCH_COMMITS=%q: want a positive number", s)
	}
	return n
}

// commitBenchBrokers is $KPROXY_BENCH_BROKERS, or else the brokers of a
// new in-memory cluster of three, closed when b ends.
func commitBenchBrokers(b *testing.B) []string {
	b.Helper()
	if s := os.Getenv("KPROXY_BENCH_BROKERS"); s != "" {
		var out []string
		for a := range strings.SplitSeq(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				out = append(out, a)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	c, err := kproxy.NewDevCluster(3, 0, testLogger())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c.ListenAddrs()
}

// measureCommits gives each path a topic of one partition and a group
// named prefix-path, joins their members in parallel, warms them up
// untimed, then times commits commits per path, the paths taking turns in
// batches of commitBatch so that the machine's noise falls on all of
// them. It returns an admin client of the cluster for the checks after.
func measureCommits(b *testing.B, brokers []string, prefix string, paths []*commitPath, commits int) *kadm.Client {
	b.Helper()
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(admCl.Close)
	adm := kadm.NewClient(admCl)
	for _, p := range paths {
		p.topic = prefix + "-" + p.name
		p.group = p.topic
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := adm.CreateTopic(ctx, 1, -1, nil, p.topic)
		cancel()
		if err != nil {
			b.Fatalf("%s: create topic %s: %v", p.name, p.topic, err)
		}
	}
	joinAll(b, paths)
	for _, p := range paths {
		// Untimed: connections, the member's OffsetFetch after its
		// assignment, the first transaction of a fleet partition.
		for range commitWarmup {
			p.commit(b)
		}
	}
	b.ResetTimer()
	for r := 0; r*commitBatch < commits; r++ {
		n := min(commitBatch, commits-r*commitBatch)
		for k := range paths {
			p := paths[(r+k)%len(paths)] // rotate who goes first
			for range n {
				p.lat = append(p.lat, p.commit(b))
			}
		}
	}
	b.StopTimer()
	return adm
}

// joinAll joins the members of paths in parallel (distributed mode may
// still be claiming); each waits until it is assigned partition 0.
func joinAll(b *testing.B, paths []*commitPath) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(paths))
	for i, p := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.join(b)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			b.Fatalf("%s %s: %v", paths[i].name, paths[i].group, err)
		}
	}
}

// startCommitBenchKproxy starts an in-process kproxy in front of
// brokers, with an admin server (the fleet's view), no initial rebalance
// delay and the default fleet timers; it shuts down when b ends.
func startCommitBenchKproxy(b *testing.B, brokers []string, mode kproxy.GroupsMode, fc kproxy.FleetConfig) *kproxy.Server {
	b.Helper()
	return startBenchKproxyVia(b, brokers, mode, fc, nil)
}

// startBenchKproxyVia is startCommitBenchKproxy with every connection of
// kproxy to the brokers (its sessions' and its own clients') dialed by
// dial; nil dials directly.
func startBenchKproxyVia(b *testing.B, brokers []string, mode kproxy.GroupsMode, fc kproxy.FleetConfig, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *kproxy.Server {
	b.Helper()
	cfg := inProcessConfig(brokers, mode, fc)
	cfg.Proxy.Dial = dial
	if dial != nil {
		cfg.UpstreamOpts = []kgo.Opt{kgo.Dialer(dial)}
	}
	return startKproxyConfig(b, cfg)
}

// inProcessConfig is the configuration of the tests' and benchmarks'
// in-process kproxies: in front of brokers, an admin server (the fleet's
// view), no initial rebalance delay, fleet timers as fc gives them.
func inProcessConfig(brokers []string, mode kproxy.GroupsMode, fc kproxy.FleetConfig) kproxy.Config {
	return kproxy.Config{
		Upstream: brokers,
		Proxy:    proxy.Config{Listen: "127.0.0.1:0"},
		Groups: kproxy.GroupsConfig{
			Mode:   mode,
			Engine: groupstate.Config{InitialRebalanceDelay: -1, MinSessionTimeout: time.Second},
			Fleet:  fc,
		},
		AdminListen: "127.0.0.1:0",
		Telemetry:   tap.Config{Getenv: func(string) string { return "" }},
		Logger:      testLogger(),
	}
}

// startKproxyConfig starts an in-process kproxy of cfg; it shuts down
// when t ends.
func startKproxyConfig(t testing.TB, cfg kproxy.Config) *kproxy.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	k, err := kproxy.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("starting a %s kproxy (fleet %q, relay %v): %v", cfg.Groups.Mode, cfg.Groups.Fleet.Name, cfg.Groups.Fleet.Relay, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		k.Shutdown(ctx)
	})
	return k
}

// commitBenchFleetView reads k's /api/fleet; ok is false if it does not
// answer.
func commitBenchFleetView(k *kproxy.Server) (tap.FleetView, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+k.AdminAddr()+"/api/fleet", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return tap.FleetView{}, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return tap.FleetView{}, false
	}
	var v tap.FleetView
	if err := json.Unmarshal(body, &v); err != nil {
		return tap.FleetView{}, false
	}
	return v, true
}

// waitCommitBenchFleet waits until owner serves every partition of its
// groups topic and, with a relay, until the relay is in the owner's
// generation with a table that names the owner for every partition.
func waitCommitBenchFleet(b *testing.B, owner, relay *kproxy.Server) {
	b.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var ov, rv tap.FleetView
	for time.Now().Before(deadline) {
		var ok bool
		ov, ok = commitBenchFleetView(owner)
		ready := ok && ov.Partitions > 0 && len(ov.Serving) == ov.Partitions && !ov.Member.Joining
		if ready && relay != nil {
			rv, ok = commitBenchFleetView(relay)
			ready = ok && !rv.Member.Joining && rv.Member.Generation == ov.Member.Generation &&
				len(rv.Serving) == 0 && len(rv.Member.Table) == ov.Partitions
			for _, o := range rv.Member.Table {
				ready = ready && o.ID == ov.ID
			}
		}
		if ready {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatalf("the fleet never settled: owner serves %v of %d (generation %d), relay generation %d, table %v",
		ov.Serving, ov.Partitions, ov.Member.Generation, rv.Member.Generation, rv.Member.Table)
}

// commitPath is one way to a coordinator with its one-member group:
// written by its join, then by the benchmark goroutine only.
type commitPath struct {
	name   string
	seeds  []string
	topic  string
	group  string
	opts   []kgo.Opt // more client options (a dialer through a fault relay)
	cl     *kgo.Client
	offset int64 // the last offset committed
	lat    []time.Duration
}

// join makes p's member: a franz-go group consumer of p.topic that
// never commits by itself and never fetches, and waits until it is
// assigned partition 0.
func (p *commitPath) join(b *testing.B) error {
	assigned := make(chan struct{})
	var once sync.Once
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(p.seeds...),
		kgo.ConsumerGroup(p.group),
		kgo.ConsumeTopics(p.topic),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			for _, part := range m[p.topic] {
				if part == 0 {
					once.Do(func() { close(assigned) })
				}
			}
		}),
	}, p.opts...)...)
	if err != nil {
		return err
	}
	b.Cleanup(cl.Close)
	// Fetches would only long-poll the empty topic beside the commits.
	cl.PauseFetchTopics(p.topic)
	p.cl = cl
	select {
	case <-assigned:
		return nil
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("member of %s was never assigned %s/0", p.group, p.topic)
	}
}

// commit commits the next offset of p's partition synchronously and
// returns how long it took; any error fails b.
func (p *commitPath) commit(b *testing.B) time.Duration {
	b.Helper()
	p.offset++
	offsets := map[string]map[int32]kgo.EpochOffset{p.topic: {0: {Epoch: -1, Offset: p.offset}}}
	var cerr error
	found := false
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	p.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, pt := range t.Partitions {
				// Only p.topic was asked for; v10+ answers name it by id.
				found = found || pt.Partition == 0
				if e := kerr.ErrorForCode(pt.ErrorCode); e != nil && cerr == nil {
					cerr = fmt.Errorf("%s/%d: %w", t.Topic, pt.Partition, e)
				}
			}
		}
	})
	took := time.Since(start)
	if cerr == nil && !found {
		cerr = fmt.Errorf("the response has no %s/0", p.topic)
	}
	if cerr != nil {
		b.Fatalf("%s: commit of offset %d: %v", p.name, p.offset, cerr)
	}
	return took
}
