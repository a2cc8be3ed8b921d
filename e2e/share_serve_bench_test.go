package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// BenchmarkShareServe measures share groups served by kproxy against the
// same consumers of a cluster that serves them itself, in one run: a
// franz-go share consumer (implicit acknowledgement) reads a prefilled
// topic of three partitions directly from the cluster that serves share
// groups, and through an in-process kproxy serving them
// (--share-groups serve, --groups local) in front of a cluster that does
// not, and through a fleet of two whose member the consumer reaches owns
// nothing (the group's owner remote: its share steps travel as kproxy
// messages); records per second and ShareFetch p50/p99, with kproxy's
// ratio to direct. The paths run twice, in alternating order.
//
// The direct cluster is $KPROXY_BENCH_SHARE_DIRECT (Kafka 4.2+), the
// served one $KPROXY_BENCH_SHARE_SERVED (say Kafka 4.1.1 or 3.6.2); each
// defaults to an in-memory cluster of three (the served one with its
// share APIs hidden). $KPROXY_BENCH_SHARE_RECORDS records of 100 bytes
// (default 20000). $KPROXY_BENCH_SHARE_PROCS=1 runs the kproxies as
// `kproxy serve` processes and reports their own CPU per GB. It runs its
// work once whatever b.N is:
//
//	KPROXY_BENCH_SHARE_DIRECT=127.0.0.1:9092 KPROXY_BENCH_SHARE_SERVED=127.0.0.1:9192 \
//	    go test -run '^$' -bench BenchmarkShareServe -benchtime 1x ./e2e
func BenchmarkShareServe(b *testing.B) {
	n := 20000
	if s := os.Getenv("KPROXY_BENCH_SHARE_RECORDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("KPROXY_BENCH_SHARE_RECORDS=%q: want a positive number", s)
		}
		n = v
	}
	brokersOf := func(env string, hide bool) []string {
		if s := os.Getenv(env); s != "" {
			return strings.Split(s, ",")
		}
		var opts = noShareCluster()
		if !hide {
			opts = nil
		}
		c, err := kproxy.NewDevCluster(3, 0, testLogger(), opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		return c.ListenAddrs()
	}
	direct, served := brokersOf("KPROXY_BENCH_SHARE_DIRECT", false), brokersOf("KPROXY_BENCH_SHARE_SERVED", true)
	serving := func(mode kproxy.GroupsMode, fc kproxy.FleetConfig) *kproxy.Server {
		cfg := inProcessConfig(served, mode, fc)
		cfg.Groups.ServeShares = true
		cfg.Groups.Engine.ShareSettings = func(string) groupstate.ShareSettings {
			return groupstate.ShareSettings{AutoOffsetReset: "earliest"}
		}
		return startKproxyConfig(b, cfg)
	}
	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	fleet := "share-bench-" + run
	// With $KPROXY_BENCH_SHARE_PROCS=1 the kproxies are `kproxy serve`
	// processes, whose own CPU is then measured apart from the
	// consumer's; the groups' share.auto.offset.reset=earliest is then a
	// GROUP config of the served cluster (or kept by kproxy, in front
	// of one without GROUP configs).
	procs := os.Getenv("KPROXY_BENCH_SHARE_PROCS") == "1"
	var k, owner, relay *kproxy.Server
	var servedAddr, remoteAddr string
	var servedPids, remotePids []int
	if procs {
		sp := startKproxy(b, "share-bench-served", served, "--groups", "local", "--share-groups", "serve")
		op := startKproxy(b, "share-bench-owner", served, "--groups", "distributed", "--fleet-name", fleet, "--share-groups", "serve")
		rp := startKproxy(b, "share-bench-relay", served, "--groups", "distributed", "--fleet-name", fleet, "--fleet-role", "relay", "--share-groups", "serve")
		servedAddr, remoteAddr = sp.addr, rp.addr
		servedPids, remotePids = []int{sp.cmd.Process.Pid}, []int{op.cmd.Process.Pid, rp.cmd.Process.Pid}
	} else {
		k = serving(kproxy.GroupsLocal, kproxy.FleetConfig{})
		// The owner remote: a fleet of two, the consumer behind the one
		// that owns nothing (--fleet-role relay), so every share step
		// goes to the owner as a kproxy message while the records come
		// from the brokers to the relay.
		owner = serving(kproxy.GroupsDistributed, kproxy.FleetConfig{Name: fleet})
		relay = serving(kproxy.GroupsDistributed, kproxy.FleetConfig{Name: fleet, Relay: true})
		servedAddr, remoteAddr = k.Addr(), relay.Addr()
	}

	ctx := context.Background()
	topic := "share-serve-bench-" + run
	value := []byte(strings.Repeat("x", shareBenchValueBytes))
	prefill := func(brokers []string) *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cl.Close)
		if resp, err := kadm.NewClient(cl).CreateTopic(ctx, 3, -1, nil, topic); err != nil || resp.Err != nil {
			b.Fatalf("creating %s: %v %v", topic, err, resp.Err)
		}
		recs := make([]*kgo.Record, n)
		for i := range recs {
			recs[i] = &kgo.Record{Topic: topic, Value: value}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			b.Fatalf("producing: %v", err)
		}
		return cl
	}
	dcl := prefill(direct)
	scl := prefill(served)

	paths := []*shareBenchPath{{name: "direct", addr: direct[0]}, {name: "served", addr: servedAddr, pids: servedPids}, {name: "remote", addr: remoteAddr, pids: remotePids}}
	for round, order := range [][]int{{0, 1, 2}, {2, 1, 0}} {
		for _, i := range order {
			p := paths[i]
			group := fmt.Sprintf("share-serve-bench-%s-%s-%d", run, p.name, round)
			switch {
			case p.name == "direct":
				setShareReset(ctx, b, dcl, group)
			case procs:
				setShareResetWith(ctx, b, scl, p.addr, group)
			}
			cpu, kcpu := selfCPUTime(), pidsCPU(b, p.pids)
			took, lat := shareReadAll(ctx, b, p.addr, group, topic, n)
			p.cpu += selfCPUTime() - cpu
			p.kproxyCPU += pidsCPU(b, p.pids) - kcpu
			p.elapsed += took
			p.lat = append(p.lat, lat...)
		}
	}
	if procs {
		b.Logf("share groups served by kproxy processes, %d records twice per path:\n%s", n, reportShareBench(b, 2*n, paths))
		return
	}
	c, oc := k.Engine().ShareCounters(), owner.Engine().ShareCounters()
	b.Logf("share groups served, %d records twice per path; kproxy wrote %d share records (mean %.2f ms), the fleet's owner %d (mean %.2f ms):\n%s",
		n, c.Writes, ms(c.WriteTime)/float64(max(c.Writes, 1)), oc.Writes, ms(oc.WriteTime)/float64(max(oc.Writes, 1)), reportShareBench(b, 2*n, paths))
}

// setShareResetWith sets group's share.auto.offset.reset=earliest on the
// served cluster (cl) where it has GROUP configs, else through the kproxy
// at addr, which keeps them for it.
func setShareResetWith(ctx context.Context, b *testing.B, cl *kgo.Client, addr, group string) {
	b.Helper()
	if trySetShareReset(ctx, cl, group) == nil {
		return
	}
	kcl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		b.Fatal(err)
	}
	defer kcl.Close()
	setShareReset(ctx, b, kcl, group)
}

// pidsCPU sums the CPU time of the processes pids.
func pidsCPU(b *testing.B, pids []int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		u, err := readProcUsage(pid)
		if err != nil {
			b.Fatal(err)
		}
		d += u.cpu
	}
	return d
}
