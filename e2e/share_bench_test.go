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
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/codec"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// BenchmarkShareConsume measures a share consumer (franz-go, KIP-932)
// reading a prefilled topic directly and through an in-process kproxy
// (--groups local), in one run: records per second and the latency of
// each ShareFetch (client write to response read, kgo's E2E hook), p50
// and p99, with kproxy's ratio to direct. Each path has its own share
// group (share.auto.offset.reset=earliest) on one topic of three
// partitions holding $KPROXY_BENCH_SHARE_RECORDS records (default
// 20000, 100 bytes each); the paths run one after the other, twice, in
// alternating order, so that the machine's noise falls on both. The
// brokers are $KPROXY_BENCH_BROKERS (a real cluster; Kafka 4.2+ for
// franz-go's share consumer) or an in-memory cluster of three. It runs
// its work once whatever b.N is:
//
//	KPROXY_BENCH_BROKERS=127.0.0.1:9092 go test -run '^$' -bench BenchmarkShareConsume -benchtime 1x ./e2e
func BenchmarkShareConsume(b *testing.B) {
	n := 20000
	if s := os.Getenv("KPROXY_BENCH_SHARE_RECORDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("KPROXY_BENCH_SHARE_RECORDS=%q: want a positive number", s)
		}
		n = v
	}
	brokers := commitBenchBrokers(b)
	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	ctx := context.Background()
	k := startCommitBenchKproxy(b, brokers, kproxy.GroupsLocal, kproxy.FleetConfig{})
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	defer adm.Close()
	topic := "share-bench-" + run
	if resp, err := kadm.NewClient(adm).CreateTopic(ctx, 3, -1, nil, topic); err != nil || resp.Err != nil {
		b.Fatalf("creating %s: %v %v", topic, err, resp.Err)
	}
	value := strings.Repeat("x", shareBenchValueBytes)
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Value: []byte(value)}
	}
	if err := adm.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatalf("producing: %v", err)
	}
	b.Logf("run %s: %d records of %d bytes against %s", run, n, len(value), strings.Join(brokers, ","))

	paths := []*shareBenchPath{{name: "direct", addr: brokers[0]}, {name: "kproxy", addr: k.Addr()}}
	for round, order := range [][]int{{0, 1}, {1, 0}} {
		for _, i := range order {
			p := paths[i]
			group := fmt.Sprintf("share-bench-%s-%s-%d", run, p.name, round)
			setShareReset(ctx, b, adm, group)
			cpu := selfCPUTime()
			took, lat := shareReadAll(ctx, b, p.addr, group, topic, n)
			p.cpu += selfCPUTime() - cpu
			p.elapsed += took
			p.lat = append(p.lat, lat...)
		}
	}
	b.Logf("share consume, %d records twice per path, %d and %d ShareFetches:\n%s", n, len(paths[0].lat), len(paths[1].lat), reportShareBench(b, 2*n, paths))
}

// shareBenchValueBytes is the size of the share benchmarks' record
// values.
const shareBenchValueBytes = 100

// shareBenchPath is one path of a share benchmark: where its consumers
// connect, and what they measured.
type shareBenchPath struct {
	name    string
	addr    string
	elapsed time.Duration
	lat     []time.Duration
	// cpu is this process's CPU time while the path ran (selfCPUTime):
	// the consumer, and the path's kproxy where it runs in process.
	cpu time.Duration
	// pids are the path's kproxy processes, if it has any, and
	// kproxyCPU their CPU time while the path ran.
	pids      []int
	kproxyCPU time.Duration
}

// reportShareBench reports each path's records/s (n records in all) and
// ShareFetch p50/p99, with their ratios to the first path, as benchmark
// metrics and as a table.
func reportShareBench(b *testing.B, n int, paths []*shareBenchPath) string {
	d := paths[0]
	dRate := float64(n) / d.elapsed.Seconds()
	d50, d99 := p50p99(d.lat)
	var sb strings.Builder
	// CPU per GB of record values, this process's: the consumer, and
	// the path's kproxy, which runs in process. With the clusters
	// elsewhere ($KPROXY_BENCH_SHARE_*), the direct path's is the
	// consumer's alone; the others' are the consumer's and kproxy's
	// together (the consumer's own part varies with the batches each
	// path returns, so a difference is not kproxy's).
	gb := float64(n) * shareBenchValueBytes / 1e9
	// kproxy s/GB: the path's kproxy processes alone, where it has any.
	fmt.Fprintf(&sb, "%-8s %12s %10s %12s %12s %9s %9s %12s %14s\n", "path", "records/s", "rate/dir", "fetch p50 ms", "fetch p99 ms", "p50/dir", "p99/dir", "CPU s/GB", "kproxy s/GB")
	for _, p := range paths {
		rate := float64(n) / p.elapsed.Seconds()
		p50, p99 := p50p99(p.lat)
		perGB := p.cpu.Seconds() / gb
		kproxyGB := "-"
		if len(p.pids) > 0 {
			kproxyGB = fmt.Sprintf("%.1f", p.kproxyCPU.Seconds()/gb)
			b.ReportMetric(p.kproxyCPU.Seconds()/gb, p.name+"-kproxy-cpu-s/GB")
		}
		fmt.Fprintf(&sb, "%-8s %12.0f %10.2f %12.3f %12.3f %9.2f %9.2f %12.1f %14s\n", p.name, rate, rate/dRate, ms(p50), ms(p99), ratio(p50, d50), ratio(p99, d99), perGB, kproxyGB)
		b.ReportMetric(rate, p.name+"-records/s")
		b.ReportMetric(ms(p50), p.name+"-fetch-p50-ms")
		b.ReportMetric(ms(p99), p.name+"-fetch-p99-ms")
		b.ReportMetric(perGB, p.name+"-cpu-s/GB")
	}
	return sb.String()
}

// shareReadAll reads n records with one franz-go share consumer of group
// at addr and returns how long it took and each ShareFetch's latency.
func shareReadAll(ctx context.Context, b *testing.B, addr, group, topic string, n int) (time.Duration, []time.Duration) {
	b.Helper()
	var mu sync.Mutex
	var lat []time.Duration
	hook := shareFetchHook(func(d time.Duration) {
		mu.Lock()
		lat = append(lat, d)
		mu.Unlock()
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ShareGroup(group), kgo.ConsumeTopics(topic), kgo.WithHooks(hook))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	got := 0
	for got < n {
		fs := cl.PollFetches(rctx)
		if rctx.Err() != nil {
			b.Fatalf("share group %s at %s: %d of %d records in 2m", group, addr, got, n)
		}
		fs.EachError(func(t string, p int32, err error) { b.Logf("share fetch %s/%d: %v", t, p, err) })
		got += fs.NumRecords()
	}
	took := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	return took, lat
}

// shareFetchHook reports the end-to-end latency of every ShareFetch.
type shareFetchHook func(time.Duration)

var _ kgo.HookBrokerE2E = shareFetchHook(nil)

func (h shareFetchHook) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e kgo.BrokerE2E) {
	if key == codec.KeyShareFetch && e.Err() == nil {
		h(e.DurationE2E())
	}
}
