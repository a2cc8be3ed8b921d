package groupstate

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// BenchmarkVersusKfake runs one load generator over the network against
// kfake's own group coordinator and against kproxy's engine (serving the
// group APIs inside the same kfake cluster), in one run: the time for a
// group of N members to settle, and heartbeats per second. Each member has
// its own connection, as real members do. The ratio engine/kfake is what
// to read; absolute numbers include the loopback network and kfake.
func BenchmarkVersusKfake(b *testing.B) {
	for _, n := range []int{10, 100} {
		for _, target := range []string{"kfake", "engine"} {
			b.Run(fmt.Sprintf("settle/members=%d/%s", n, target), func(b *testing.B) {
				clients := benchCluster(b, target, n)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					settleOverNetwork(b, clients, fmt.Sprintf("g%d", i))
					i++
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(i)/1000, "ms/settle")
			})
		}
	}
	for _, target := range []string{"kfake", "engine"} {
		b.Run("heartbeats/members=50/"+target, func(b *testing.B) {
			clients := benchCluster(b, target, 50)
			ids, gen := settleOverNetwork(b, clients, "hb")
			var sent atomic.Int64
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N/len(clients) + 1
			start := time.Now()
			for i, cl := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						req := kmsg.NewPtrHeartbeatRequest()
						req.Group, req.MemberID, req.Generation = "hb", ids[i], gen
						resp, err := req.RequestWith(context.Background(), cl)
						if err != nil || resp.ErrorCode != 0 {
							b.Errorf("heartbeat: %v %v", err, kerr.ErrorForCode(resp.ErrorCode))
							return
						}
						sent.Add(1)
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(sent.Load())/time.Since(start).Seconds(), "heartbeats/s")
		})
	}
}

// benchCluster starts kfake (with the engine serving group APIs when
// target is "engine") and n clients, one connection each.
func benchCluster(b *testing.B, target string, n int) []*kgo.Client {
	b.Helper()
	var addrs []string
	if target == "engine" {
		ec := newEngineCluster(b, 1, "t", func(c *Config) {
			// kfake has no initial rebalance delay: compare like with like.
			c.InitialRebalanceDelay = -1
			c.Events = nil
		})
		addrs = ec.c.ListenAddrs()
	} else {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"), kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		addrs = c.ListenAddrs()
	}
	clients := make([]*kgo.Client, n)
	for i := range clients {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cl.Close)
		clients[i] = cl
	}
	return clients
}

// settleOverNetwork brings group to a generation in which every client is
// a member and has synced; it returns the member ids and generation.
func settleOverNetwork(b *testing.B, clients []*kgo.Client, group string) ([]string, int32) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := len(clients)
	var (
		mu      sync.Mutex
		synced  = make(map[int32]int) // generation → members synced in it
		settled = make(chan int32)
		once    sync.Once
	)
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			meta := kmsg.NewConsumerMemberMetadata()
			meta.Topics = []string{"t"}
			proto := []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta.AppendTo(nil)}}
			member := ""
			for ctx.Err() == nil {
				jreq := kmsg.NewPtrJoinGroupRequest()
				jreq.Group, jreq.MemberID, jreq.ProtocolType, jreq.Protocols = group, member, "consumer", proto
				jreq.SessionTimeoutMillis, jreq.RebalanceTimeoutMillis = 30000, 30000
				jresp, err := jreq.RequestWith(ctx, cl)
				if err != nil {
					return
				}
				if jresp.ErrorCode == errMemberIDRequired {
					member = jresp.MemberID
					continue
				}
				if jresp.ErrorCode != 0 {
					continue
				}
				member = jresp.MemberID
				sreq := kmsg.NewPtrSyncGroupRequest()
				sreq.Group, sreq.MemberID, sreq.Generation = group, member, jresp.Generation
				if jresp.LeaderID == member {
					for _, m := range jresp.Members {
						sreq.GroupAssignment = append(sreq.GroupAssignment, kmsg.SyncGroupRequestGroupAssignment{MemberID: m.MemberID, MemberAssignment: emptyConsumerAssignment})
					}
				}
				sresp, err := sreq.RequestWith(ctx, cl)
				if err != nil {
					return
				}
				if sresp.ErrorCode != 0 {
					continue
				}
				mu.Lock()
				synced[jresp.Generation]++
				done := synced[jresp.Generation] == n
				mu.Unlock()
				ids[i] = member
				if done {
					gen := jresp.Generation
					once.Do(func() { go func() { settled <- gen }() })
				}
				// Heartbeat until everyone settled or a rebalance.
				for ctx.Err() == nil {
					select {
					case <-ctx.Done():
						return
					default:
					}
					mu.Lock()
					all := synced[jresp.Generation] == n
					mu.Unlock()
					if all {
						return
					}
					h := kmsg.NewPtrHeartbeatRequest()
					h.Group, h.MemberID, h.Generation = group, member, jresp.Generation
					hresp, err := h.RequestWith(ctx, cl)
					if err != nil {
						return
					}
					if hresp.ErrorCode != 0 {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				mu.Lock()
				all := synced[jresp.Generation] == n
				mu.Unlock()
				if all {
					return
				}
			}
		}()
	}
	var gen int32
	select {
	case gen = <-settled:
	case <-ctx.Done():
		b.Fatalf("group %s of %d members never settled", group, n)
	}
	wg.Wait()
	return ids, gen
}
