package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/faultnet"
	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
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
	delay := 100 * time.Millisecond
	if s := os.Getenv("KPROXY_BENCH_DELAY"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			b.Fatalf("KPROXY_BENCH_DELAY=%q: want a duration", s)
		}
		delay = d
	}
	commits := 60
	if s := os.Getenv("KPROXY_BENCH_COMMITS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			b.Fatalf("KPROXY_BENCH_COMMITS=%q: want a positive number", s)
		}
		commits = n
	}
	brokers := commitBenchBrokers(b)
	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	slow := func(r *faultnet.Relay) { r.Delay(faultnet.Both, delay) }

	start := func(mode kproxy.GroupsMode, fc kproxy.FleetConfig) *kproxy.Server {
		path := newFaultPath(b)
		path.apply(slow)
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		k, err := kproxy.Start(ctx, kproxy.Config{
			Upstream:     brokers,
			UpstreamOpts: []kgo.Opt{kgo.Dialer(path.dial)},
			Proxy:        proxy.Config{Listen: "127.0.0.1:0", Dial: path.dial},
			Groups: kproxy.GroupsConfig{
				Mode:   mode,
				Engine: groupstate.Config{InitialRebalanceDelay: -1, MinSessionTimeout: time.Second},
				Fleet:  fc,
			},
			AdminListen: "127.0.0.1:0",
			Telemetry:   tap.Config{Getenv: func(string) string { return "" }},
			Logger:      testLogger(),
		})
		if err != nil {
			b.Fatalf("starting a %s kproxy behind a slow link: %v", mode, err)
		}
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			k.Shutdown(ctx)
		})
		return k
	}
	local := start(kproxy.GroupsLocal, kproxy.FleetConfig{})
	owner := start(kproxy.GroupsDistributed, kproxy.FleetConfig{Name: "slow-" + run})
	waitCommitBenchFleet(b, owner, nil)
	directPath := newFaultPath(b)
	directPath.apply(slow)

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
