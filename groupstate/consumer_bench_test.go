package groupstate

import (
	"fmt"
	"testing"
)

// BenchmarkConsumerHeartbeat measures steady-state KIP-848 heartbeats
// (nothing changes) in groups of various sizes, end to end through
// Engine.Handle.
func BenchmarkConsumerHeartbeat(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			h := &consumerHarness{newHarness(b)}
			h.store.SetTopic("t", int32(n*2))
			if err := h.e.refreshTopics(b.Context()); err != nil {
				b.Fatal(err)
			}
			cs := make([]*client, n)
			for i := range cs {
				cs[i] = &client{id: fmt.Sprintf("m%04d", i)}
				cs[i].applyResp(h.consumerResp(consumerJoin("g", cs[i].id, "t"), errNone))
			}
			h.settle("g", cs...)
			b.ReportAllocs()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				c := cs[i%n]
				h.consumerResp(consumerBeat("g", c.id, c.epoch, nil), errNone)
				i++
			}
		})
	}
}
