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

	"github.com/kproxy/kproxy/internal/kproxy"
)

// BenchmarkManyGroupsCommit measures synchronous OffsetCommits of many
// groups at once: $KPROXY_BENCH_GROUPS one-member groups (default 64)
// per path, each member committing the next offset in a loop of its own
// for $KPROXY_BENCH_COMMIT_FOR (default 5s), one path after the other:
// direct, local, distributed-owner. A direct member has its own
// connection to its coordinator, and a Kafka broker handles the requests
// of different connections side by side; through kproxy every group's
// commit is kproxy's request to the same coordinator, so what this
// measures is whether kproxy keeps them side by side too. It reports the
// commits per second and p50/p99 per path, each as a ratio to direct:
//
//	bash interop/kafka.sh start --brokers 3
//	KPROXY_BENCH_BROKERS=127.0.0.1:9092 go test -run '^$' -bench BenchmarkManyGroupsCommit -benchtime 1x ./e2e
func BenchmarkManyGroupsCommit(b *testing.B) {
	groups := envCount("KPROXY_BENCH_GROUPS", 64)
	dur := 5 * time.Second
	if v, err := time.ParseDuration(os.Getenv("KPROXY_BENCH_COMMIT_FOR")); err == nil && v > 0 {
		dur = v
	}
	brokers := commitBenchBrokers(b)
	run := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	local := startCommitBenchKproxy(b, brokers, kproxy.GroupsLocal, kproxy.FleetConfig{})
	owner := startCommitBenchKproxy(b, brokers, kproxy.GroupsDistributed, kproxy.FleetConfig{Name: "mg-" + run})
	waitCommitBenchFleet(b, owner, nil)

	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(admCl.Close)
	adm := kadm.NewClient(admCl)
	topic := "many-groups-" + run
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = adm.CreateTopic(ctx, 1, -1, nil, topic)
	cancel()
	if err != nil {
		b.Fatalf("create topic %s: %v", topic, err)
	}

	type pathRun struct {
		name    string
		seeds   []string
		members []*commitPath
		lat     []time.Duration
		commits int
	}
	runs := []*pathRun{
		{name: "direct", seeds: brokers},
		{name: "local", seeds: []string{local.Addr()}},
		{name: "distributed-owner", seeds: []string{owner.Addr()}},
	}
	for _, r := range runs {
		r.members = make([]*commitPath, groups)
		for i := range groups {
			r.members[i] = &commitPath{name: r.name, seeds: r.seeds, topic: topic, group: fmt.Sprintf("%s-%s-%d", topic, r.name, i)}
		}
		joinAll(b, r.members)
		for _, p := range r.members {
			for range commitWarmup {
				p.commit(b)
			}
		}
	}
	b.ResetTimer()
	for _, r := range runs {
		var mu sync.Mutex
		var wg sync.WaitGroup
		end := time.Now().Add(dur)
		for _, p := range r.members {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var lat []time.Duration
				for time.Now().Before(end) {
					lat = append(lat, p.commit(b))
				}
				mu.Lock()
				r.lat = append(r.lat, lat...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		r.commits = len(r.lat)
	}
	b.StopTimer()

	// Every group's last commit is what the cluster has.
	for _, r := range runs {
		for _, p := range r.members {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			offs, err := adm.FetchOffsets(ctx, p.group)
			cancel()
			if err != nil {
				b.Fatalf("%s: fetch offsets of %s: %v", r.name, p.group, err)
			}
			if o, ok := offs.Lookup(topic, 0); !ok || o.Err != nil || o.At != p.offset {
				b.Fatalf("%s: the cluster has offset %+v (found %v) for %s of %s, want %d", r.name, o, ok, topic, p.group, p.offset)
			}
		}
	}

	direct := runs[0]
	d50, d99 := p50p99(direct.lat)
	dRate := float64(direct.commits) / dur.Seconds()
	var sb strings.Builder
	fmt.Fprintf(&sb, "synchronous OffsetCommits of %d one-member groups at once, %v per path, brokers %s\n",
		groups, dur, strings.Join(brokers, ","))
	fmt.Fprintf(&sb, "%-18s %10s %8s %8s %12s %12s %12s\n", "path", "commits/s", "p50 ms", "p99 ms", "rate/direct", "p50/direct", "p99/direct")
	for _, r := range runs {
		p50, p99 := p50p99(r.lat)
		rate := float64(r.commits) / dur.Seconds()
		fmt.Fprintf(&sb, "%-18s %10.0f %8.3f %8.3f %12.2f %12.2f %12.2f\n", r.name, rate, ms(p50), ms(p99), rate/dRate, ratio(p50, d50), ratio(p99, d99))
		b.ReportMetric(rate, r.name+"-commits/s")
		b.ReportMetric(ms(p50), r.name+"-p50-ms")
		b.ReportMetric(ms(p99), r.name+"-p99-ms")
	}
	b.Logf("\n%s", sb.String())
}
