package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/internal/kproxy"
)

// BenchmarkKIP848TopicFreshness measures, directly and through kproxy
// (local mode) in the same run, how soon a franz-go KIP-848 consumer gets
// its partitions in the two cases where kproxy's view of the cluster's
// topics matters: its topic was created just before it started (first
// assignment), and its topic grew (time from CreatePartitions to the
// member owning the new partitions). $KPROXY_BENCH_ROUNDS rounds
// (default 3), the two paths side by side in each (two groups, one
// member each, on one topic). Against a real cluster:
//
//	KPROXY_BENCH_BROKERS=127.0.0.1:9092 go test -run '^$' -bench BenchmarkKIP848TopicFreshness -benchtime 1x ./e2e
//
// Without it, against kproxy's in-memory cluster (kfake). Both paths get
// the cluster's heartbeat interval (kproxy takes
// group.consumer.heartbeat.interval.ms from the cluster).
func BenchmarkKIP848TopicFreshness(b *testing.B) {
	rounds := benchEnvInt(b, "KPROXY_BENCH_ROUNDS", 3)
	brokers := commitBenchBrokers(b)
	k := startCommitBenchKproxy(b, brokers, kproxy.GroupsLocal, kproxy.FleetConfig{})
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(admCl.Close)
	adm := kadm.NewClient(admCl)
	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	paths := []freshPath{{"direct", brokers}, {"kproxy", []string{k.Addr()}}}
	first := map[string][]time.Duration{}
	grow := map[string][]time.Duration{}
	const parts = 4
	for r := range rounds {
		topic := fmt.Sprintf("fresh-bench-%s-%d", run, r)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := adm.CreateTopic(ctx, parts, -1, nil, topic)
		cancel()
		if err != nil {
			b.Fatalf("create topic %s: %v", topic, err)
		}
		start := time.Now()
		members := make([]*watchedMember, len(paths))
		for i, p := range paths {
			members[i] = startWatched(b, p.seeds, topic+"-"+p.name, topic)
		}
		for i, p := range paths {
			at, _ := members[i].waitOwns(b, parts, 60*time.Second)
			first[p.name] = append(first[p.name], at.Sub(start))
		}
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		grownAt := time.Now()
		_, err = adm.CreatePartitions(ctx, 2, topic)
		cancel()
		if err != nil {
			b.Fatalf("create partitions of %s: %v", topic, err)
		}
		for i, p := range paths {
			at, _ := members[i].waitOwns(b, parts+2, 90*time.Second)
			grow[p.name] = append(grow[p.name], at.Sub(grownAt))
		}
	}
	median := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	list := func(ds []time.Duration) string {
		var out []string
		for _, d := range ds {
			out = append(out, d.Round(time.Millisecond).String())
		}
		return strings.Join(out, " ")
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "KIP-848 consumer (franz-go), %d rounds; median, and every round\n", rounds)
	fmt.Fprintf(&sb, "%-8s %-38s %-38s\n", "path", "first assignment of a new topic", "new partitions after an increase")
	for _, p := range paths {
		fmt.Fprintf(&sb, "%-8s %-38s %-38s\n", p.name,
			median(first[p.name]).Round(time.Millisecond).String()+" ("+list(first[p.name])+")",
			median(grow[p.name]).Round(time.Millisecond).String()+" ("+list(grow[p.name])+")")
		b.ReportMetric(float64(median(first[p.name]).Milliseconds()), p.name+"-first-ms")
		b.ReportMetric(float64(median(grow[p.name]).Milliseconds()), p.name+"-grow-ms")
	}
	fmt.Fprintf(&sb, "kproxy/direct: first %.2f, increase %.2f\n",
		ratio(median(first["kproxy"]), median(first["direct"])), ratio(median(grow["kproxy"]), median(grow["direct"])))
	b.Log("\n" + sb.String())
}
