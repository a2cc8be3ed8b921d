package tap

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kproxy/kproxy/groupstate"
)

// BenchmarkOnEvent measures the engine-side cost of handing tap an event
// (the sink runs on the engine's loops).
func BenchmarkOnEvent(b *testing.B) {
	tp, err := New(context.Background(), Config{Getenv: noEnv, EventBuffer: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	defer tp.Shutdown(context.Background())
	m := member("m1")
	ev := groupstate.Event{Time: time.Now(), Kind: groupstate.EventMemberJoined, Group: "g", Member: &m}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tp.OnEvent(ev)
		}
	})
}

// BenchmarkRebalance measures tap's own processing of one complete
// rebalance of 10 members (5 events: spans, metrics, JSON for the
// stream), with traces exported to nowhere.
func BenchmarkRebalance(b *testing.B) {
	for _, traced := range []bool{false, true} {
		name := "traces_off"
		if traced {
			name = "traces_on"
		}
		b.Run(name, func(b *testing.B) {
			cfg := Config{Getenv: noEnv, EventBuffer: 1 << 16}
			if traced {
				cfg.SpanExporter = tracetest.NewNoopExporter()
			}
			tp, err := New(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer tp.Shutdown(context.Background())
			members := make([]groupstate.Member, 10)
			for i := range members {
				members[i] = member("m" + string(rune('0'+i)))
				members[i].Assignment = assignment("payments", int32(i), int32(i+10))
			}
			s := newSeq("g")
			b.ReportAllocs()
			for b.Loop() {
				ev := s.at(time.Millisecond, groupstate.EventMemberJoined)
				ev.Member = &members[0]
				tp.OnEvent(ev)
				ev = s.at(0, groupstate.EventRebalanceStarted)
				ev.Cause, ev.Member = groupstate.CauseMemberJoined, &members[0]
				tp.OnEvent(ev)
				ev = s.at(time.Millisecond, groupstate.EventJoinCompleted)
				ev.Generation, ev.Leader, ev.Members = 1, "m0", members
				tp.OnEvent(ev)
				ev = s.at(time.Millisecond, groupstate.EventSyncCompleted)
				ev.Generation, ev.Members = 1, members
				tp.OnEvent(ev)
				if err := tp.Flush(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			if d := tp.DroppedEvents(); d != 0 {
				b.Fatalf("dropped %d events", d)
			}
		})
	}
}
