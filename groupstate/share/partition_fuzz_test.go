package share

import (
	"reflect"
	"testing"
	"time"
)

func FuzzUnmarshalState(f *testing.F) {
	f.Add(MarshalState(State{StartOffset: 7, Epoch: 2, Batches: []StateBatch{{7, 9, 0, 1}, {12, 12, 4, 3}}}))
	f.Add([]byte{1, 0, 0, 0})
	f.Add([]byte{2})
	f.Add([]byte{1, 0x30, 0x80, 0x00, 0x00}) // overlong varint: must not decode
	f.Add([]byte{1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := UnmarshalState(b)
		if err != nil {
			return
		}
		if re := MarshalState(s); !reflect.DeepEqual(re, b) {
			// Varints have one canonical form each, so a decodable input
			// re-encodes to itself.
			t.Fatalf("re-encoding differs: %x vs %x", re, b)
		}
		p := NewPartition(0)
		if err := p.Restore(s); err != nil {
			return
		}
		checkInvariants(t, p)
		p.Acquire("m", p.FetchOffset(), []Batch{{Base: p.StartOffset(), Last: p.StartOffset() + 5}}, 10, BatchOptimized, 10, t0, Limits{})
		checkInvariants(t, p)
	})
}

// FuzzPartitionOps drives a partition with random acquires, acks, lock
// expiries and member releases over offsets 0-63 and checks, after every
// step, the run invariants, that no delivery count exceeds the limit,
// that a record accepted or rejected is never acquired again, and that
// every offset below the SPSO is terminal.
func FuzzPartitionOps(f *testing.F) {
	f.Add([]byte{0, 0, 10, 1, 0, 5, 2, 3})
	f.Add([]byte{0, 1, 63, 0, 2, 0, 9, 1, 3, 0, 0, 1, 4, 2, 0})
	f.Fuzz(runOps)
}

func runOps(t *testing.T, ops []byte) {
	{
		l := Limits{LockDuration: 10 * time.Second, DeliveryLimit: 3, MaxLocks: 40}
		p := NewPartition(0)
		now := t0
		final := map[int64]bool{} // accepted or rejected
		members := []string{"a", "b", "c"}
		next := func() int64 {
			if len(ops) == 0 {
				return 0
			}
			v := int64(ops[0])
			ops = ops[1:]
			return v
		}
		for len(ops) > 0 {
			switch next() % 6 {
			case 0: // acquire a fetch of batches of 4 from some offset
				m := members[next()%3]
				from := next() % 64
				var bs []Batch
				for o := from - from%4; o < 64; o += 4 {
					bs = append(bs, Batch{Base: o, Last: o + 3, Control: (o/4)%7 == 6})
				}
				mode := AcquireMode(next() % 2)
				max := int(next()%16) + 1
				got := p.Acquire(m, from, bs, max, mode, max, now, l)
				var n int64
				for _, a := range got {
					for o := a.First; o <= a.Last; o++ {
						if final[o] {
							t.Fatalf("offset %d acquired after its final ack", o)
						}
					}
					if int(a.DeliveryCount) > l.DeliveryLimit || a.DeliveryCount < 1 {
						t.Fatalf("delivery count %d", a.DeliveryCount)
					}
					n += a.Last - a.First + 1
				}
				if mode == RecordLimit && n > int64(max) {
					t.Fatalf("record limit %d exceeded: %d", max, n)
				}
			case 1: // ack a range with one type
				m := members[next()%3]
				first := next() % 64
				last := first + next()%8
				ty := AckType(next() % 5)
				if p.Acknowledge(m, one(first, last, ty), now, l) == 0 && (ty == AckAccept || ty == AckReject) {
					for o := first; o <= last; o++ {
						final[o] = true
					}
				}
			case 2:
				now = now.Add(time.Duration(next()) * time.Second / 4)
				p.ExpireLocks(now, l)
			case 3:
				p.ReleaseMember(members[next()%3], l)
			case 5:
				if o := next(); o%8 == 0 {
					p.AdvanceStart(p.StartOffset() + o%16)
				}
			case 4:
				s := p.Snapshot()
				q := NewPartition(0)
				if err := q.Restore(s); err != nil {
					t.Fatalf("restore own snapshot: %v", err)
				}
				if !reflect.DeepEqual(q.Snapshot(), s) {
					t.Fatalf("snapshot not stable across restore")
				}
			}
			checkInvariants(t, p)
			for _, r := range p.runs {
				if int(r.count) > l.DeliveryLimit {
					t.Fatalf("run %+v over the delivery limit", r)
				}
				if r.state == StateAvailable && int(r.count) >= l.DeliveryLimit {
					t.Fatalf("run %+v available at the limit", r)
				}
			}
		}
	}
}
