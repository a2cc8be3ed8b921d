package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/internal/loadgen"
)

// BenchmarkCoordinator runs one load generator against kfake's own group
// coordinator (clients connected to the broker) and against kproxy's
// engine (the same clients connected through kproxy, in front of the same
// cluster), in one run: the time for a group of N members to settle (every
// member joined and synced in one generation) and heartbeats per second.
// Every member has its own connection, as real members do. Read the
// kproxy/kfake ratio; the kproxy path includes the proxy hop.
func BenchmarkCoordinator(b *testing.B) {
	var opts []stackOpt
	if os.Getenv("KPROXY_BENCH_NO_PERSIST") != "" {
		opts = append(opts, func(c *kproxy.Config) { c.Groups.WrapStore = groupstate.WithoutGroupMetadata })
	}
	s := newStack(b, opts...)
	targets := map[string]string{"kfake": s.cluster.ListenAddrs()[0], "kproxy": s.addr()}
	// 1000 members do not fit here: clients, proxy and broker share this
	// process, each franz-go client holds about five connections and a
	// connection through the proxy costs four descriptors, past this
	// machine's hard limit of 20000. groupstate's BenchmarkSettle
	// measures 1000 members on the engine alone.
	for _, n := range []int{10, 100} {
		for _, target := range []string{"kfake", "kproxy"} {
			b.Run(fmt.Sprintf("settle/members=%d/%s", n, target), func(b *testing.B) {
				clients := benchClients(b, targets[target], n)
				i := 0
				var settling time.Duration
				for b.Loop() {
					group := fmt.Sprintf("settle-%s-%d-%d", target, n, i)
					start := time.Now()
					ids, _ := settle(b, clients, group)
					settling += time.Since(start)
					// Leave, so that no session expiry storm of this
					// group lands in the middle of a later measurement.
					leave(b, clients[0], group, ids)
					i++
				}
				b.ReportMetric(float64(settling.Microseconds())/float64(i)/1000, "ms/settle")
			})
		}
	}
	for _, target := range []string{"kfake", "kproxy"} {
		b.Run("heartbeats/members=50/"+target, func(b *testing.B) {
			clients := benchClients(b, targets[target], 50)
			group := "hb-" + target
			ids, gen := settle(b, clients, group)
			var sent atomic.Int64
			per := b.N/len(clients) + 1
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for i, cl := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						req := kmsg.NewPtrHeartbeatRequest()
						req.Group, req.MemberID, req.Generation = group, ids[i], gen
						resp, err := req.RequestWith(context.Background(), cl)
						if err != nil || resp.ErrorCode != 0 {
							b.Errorf("heartbeat: %v (code %d)", err, resp.ErrorCode)
							return
						}
						sent.Add(1)
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(sent.Load())/time.Since(start).Seconds(), "heartbeats/s")
			b.StopTimer()
			leave(b, clients[0], group, ids)
		})
	}
	// Members sharing connections, as a multiplexing client (or kbench's
	// groups mode) does: 1000 members pipeline their heartbeats on 8
	// raw connections. kproxy only: kfake's coordinator does not settle
	// a group of 1000 within the two minutes.
	for _, target := range []string{"kproxy"} {
		b.Run("heartbeats/members=1000/conns=8/"+target, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var conns []*loadgen.Conn
			for range 8 {
				c, err := loadgen.Dial(ctx, targets[target], loadgen.DialConfig{})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { c.Close() })
				conns = append(conns, c)
			}
			group := "hb-shared-" + target
			ms := make([]*loadgen.Member, 1000)
			for i := range ms {
				ms[i] = &loadgen.Member{Group: group, D: conns[i%len(conns)]}
			}
			if err := loadgen.Settle(ctx, ms, loadgen.SettleConfig{}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			l := loadgen.StartHeartbeats(ms)
			for l.Answered() < int64(b.N) && l.Failed() == 0 && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			n := l.Answered()
			elapsed := time.Since(start)
			if err := l.Stop(10 * time.Second); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(n)/elapsed.Seconds(), "heartbeats/s")
		})
	}
}

// leave removes every member of group in one batched LeaveGroup.
func leave(b *testing.B, cl *kgo.Client, group string, ids []string) {
	b.Helper()
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	for _, id := range ids {
		m := kmsg.NewLeaveGroupRequestMember()
		m.MemberID = id
		req.Members = append(req.Members, m)
	}
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil || resp.ErrorCode != 0 {
		b.Fatalf("leave %s: %v (code %d)", group, err, resp.ErrorCode)
	}
}

func benchClients(b *testing.B, addr string, n int) []*kgo.Client {
	b.Helper()
	out := make([]*kgo.Client, n)
	for i := range out {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cl.Close)
		out[i] = cl
	}
	return out
}

// members makes one member of group per client, each sending through its
// own client.
func members(ctx context.Context, clients []*kgo.Client, group string) []*loadgen.Member {
	ms := make([]*loadgen.Member, len(clients))
	for i, cl := range clients {
		ms[i] = &loadgen.Member{Group: group, D: loadgen.KgoDoer(ctx, cl)}
	}
	return ms
}

// settle drives every client into group until one generation has all of
// them joined and synced (loadgen.Settle, with a member's poll for the
// rest of its group every 2ms); it returns the member ids and that
// generation.
func settle(b *testing.B, clients []*kgo.Client, group string) ([]string, int32) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ms := members(ctx, clients, group)
	if err := loadgen.Settle(ctx, ms, loadgen.SettleConfig{PollInterval: 2 * time.Millisecond}); err != nil {
		b.Fatalf("group %s of %d members never settled: %v", group, len(ms), err)
	}
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids, ms[0].Generation
}
