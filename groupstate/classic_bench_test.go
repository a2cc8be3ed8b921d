package groupstate

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// BenchmarkSettle measures the engine alone (fake clock, no initial
// delay) bringing a group of N members from nothing to Stable: N KIP-394
// handshakes, N JoinGroups, N SyncGroups.
func BenchmarkSettle(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			h := newHarness(b, func(c *Config) { c.Events = nil; c.Shards = 0 })
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				group := fmt.Sprintf("g%d", i)
				i++
				ids, gen := h.joinedGroup(group, n)
				h.syncAll(group, gen, ids, nil)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(i)/1000, "ms/settle")
		})
	}
}

// BenchmarkHeartbeat measures heartbeats per second through Handle, from
// parallel senders, over 64 stable groups of 10 members.
func BenchmarkHeartbeat(b *testing.B) {
	h := newHarness(b, func(c *Config) { c.Events = nil; c.Shards = 0 })
	type m struct {
		group, id string
		gen       int32
	}
	var members []m
	for g := 0; g < 64; g++ {
		group := fmt.Sprintf("hb%d", g)
		ids, gen := h.stableGroup(group, 10)
		for _, id := range ids {
			members = append(members, m{group, id, gen})
		}
	}
	b.ReportAllocs()
	var next sync.Mutex
	k := 0
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		next.Lock()
		off := k
		k += 97
		next.Unlock()
		done := make(chan int16, 1)
		reply := func(r kmsg.Response) { done <- r.(*kmsg.HeartbeatResponse).ErrorCode }
		rc := RequestContext{ClientID: "bench"}
		for j := off; pb.Next(); j++ {
			mm := members[j%len(members)]
			h.e.Handle(rc, hb(mm.group, mm.id, mm.gen), reply)
			if code := <-done; code != 0 {
				b.Errorf("heartbeat: %s", errName(code))
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "heartbeats/s")
}

// BenchmarkMemoryPerMember measures the heap held per member of settled
// groups (10 groups of 1000 members).
func BenchmarkMemoryPerMember(b *testing.B) {
	for b.Loop() {
		h := newHarness(b, func(c *Config) { c.Events = nil })
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		const groups, per = 10, 1000
		for g := 0; g < groups; g++ {
			h.stableGroup(fmt.Sprintf("mem%d", g), per)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(groups*per), "B/member")
		runtime.KeepAlive(h)
		h.e.Close()
	}
}
