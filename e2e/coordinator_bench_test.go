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

var emptyAssignment = func() []byte {
	a := kmsg.NewConsumerMemberAssignment()
	return a.AppendTo(nil)
}()

// settle drives every client into group until one generation has all of
// them joined and synced; it returns the member ids and that generation.
// A member whose sync or heartbeat reports a rebalance joins again.
func settle(b *testing.B, clients []*kgo.Client, group string) ([]string, int32) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := len(clients)
	var mu sync.Mutex
	synced := map[int32]int{} // generation -> members synced in it; guarded by mu
	allSynced := func(gen int32) bool {
		mu.Lock()
		defer mu.Unlock()
		return synced[gen] == n
	}
	ids := make([]string, n)
	gens := make([]int32, n)
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{"bench"}
	protocols := []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta.AppendTo(nil)}}
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			member := ""
			for ctx.Err() == nil {
				join := kmsg.NewPtrJoinGroupRequest()
				join.Group, join.MemberID, join.ProtocolType, join.Protocols = group, member, "consumer", protocols
				join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = 30000, 60000
				jr, err := join.RequestWith(ctx, cl)
				if err != nil {
					return
				}
				member = jr.MemberID
				if jr.ErrorCode != 0 {
					continue // MEMBER_ID_REQUIRED or a retriable error: join again
				}
				sync := kmsg.NewPtrSyncGroupRequest()
				sync.Group, sync.MemberID, sync.Generation = group, member, jr.Generation
				if jr.LeaderID == member {
					for _, m := range jr.Members {
						sync.GroupAssignment = append(sync.GroupAssignment, kmsg.SyncGroupRequestGroupAssignment{MemberID: m.MemberID, MemberAssignment: emptyAssignment})
					}
				}
				sr, err := sync.RequestWith(ctx, cl)
				if err != nil {
					return
				}
				if sr.ErrorCode != 0 {
					continue
				}
				mu.Lock()
				synced[jr.Generation]++
				mu.Unlock()
				ids[i], gens[i] = member, jr.Generation
				// Heartbeat until everyone synced in this generation, or
				// a rebalance asks us to join again.
				rejoin := false
				for !allSynced(jr.Generation) && ctx.Err() == nil {
					hb := kmsg.NewPtrHeartbeatRequest()
					hb.Group, hb.MemberID, hb.Generation = group, member, jr.Generation
					hr, err := hb.RequestWith(ctx, cl)
					if err != nil {
						return
					}
					if hr.ErrorCode != 0 {
						rejoin = true
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
				if !rejoin {
					return
				}
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		b.Fatalf("group %s of %d members never settled", group, n)
	}
	for _, g := range gens {
		if !allSynced(g) {
			b.Fatalf("group %s: members ended in different generations %v", group, gens)
		}
	}
	return ids, gens[0]
}
