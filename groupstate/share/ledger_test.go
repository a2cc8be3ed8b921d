package share

import (
	"math/rand"
	"testing"
	"time"
)

// synthLog is a log of record batches with control batches, aborted
// batches and compaction holes.
type synthLog struct {
	batches []Batch
	end     int64
}

func newSynthLog(r *rand.Rand, n int) synthLog {
	var l synthLog
	o := int64(0)
	for i := 0; i < n; i++ {
		if r.Intn(10) == 0 {
			o += int64(r.Intn(5) + 1) // compacted away
		}
		size := int64(r.Intn(20) + 1)
		b := Batch{Base: o, Last: o + size - 1}
		switch r.Intn(12) {
		case 0:
			b.Last = b.Base // control batches hold one record
			b.Control = true
		case 1:
			b.Aborted = true
		}
		l.batches = append(l.batches, b)
		o = b.Last + 1
	}
	l.end = o
	return l
}

// fetch returns the batches a broker would return from offset, up to
// maxBatches, the first one being the batch holding offset if any.
func (l synthLog) fetch(offset int64, maxBatches int) []Batch {
	var out []Batch
	for _, b := range l.batches {
		if b.Last < offset {
			continue
		}
		out = append(out, b)
		if len(out) == maxBatches {
			break
		}
	}
	return out
}

func (l synthLog) deliverable(o int64) bool {
	for _, b := range l.batches {
		if o >= b.Base && o <= b.Last {
			return !b.Control && !b.Aborted
		}
	}
	return false
}

// TestLedger runs members sharing a partition as kproxy's share path
// would (fetch at the hinted offset, acquire, acknowledge at random,
// members dying and their locks timing out, snapshots reloaded as after
// a failover) and checks, per offset, the ledger rules: only
// deliverable records are delivered; no delivery after an accept or a
// reject was answered; delivery counts rise by one per delivery and
// never exceed the limit; in the end every deliverable record was
// accepted, rejected or archived at the limit, and the SPSO reached the
// log end.
func TestLedger(t *testing.T) {
	for seed := int64(1); seed <= 100; seed++ {
		r := rand.New(rand.NewSource(seed))
		log := newSynthLog(r, 200)
		l := Limits{LockDuration: 5 * time.Second, DeliveryLimit: 1 + r.Intn(5), MaxLocks: 50 + r.Intn(200)}
		p := NewPartition(0)
		now := t0
		members := []string{"a", "b", "c"}
		type entry struct {
			count int16
			final bool
		}
		ledger := map[int64]*entry{}
		held := map[string][]Acquired{}

		for step := 0; step < 20000 && p.StartOffset() < log.end; step++ {
			m := members[r.Intn(len(members))]
			switch r.Intn(10) {
			case 0: // time passes; locks expire
				now = now.Add(time.Duration(r.Intn(3000)) * time.Millisecond)
				p.ExpireLocks(now, l)
			case 1: // a member dies: its records come back at once
				p.ReleaseMember(m, l)
				held[m] = nil
			case 2: // reload from a snapshot, as a new owner would
				q := NewPartition(0)
				data, err := UnmarshalState(MarshalState(p.Snapshot()))
				if err != nil {
					t.Fatal(err)
				}
				if err := q.Restore(data); err != nil {
					t.Fatal(err)
				}
				p = q
				held = map[string][]Acquired{}
			default:
				// Acknowledge what the member holds, then fetch more.
				var acks []AckBatch
				for _, a := range held[m] {
					types := make([]AckType, a.Last-a.First+1)
					for i := range types {
						types[i] = []AckType{AckAccept, AckAccept, AckAccept, AckRelease, AckReject}[r.Intn(5)]
						if !log.deliverable(a.First + int64(i)) {
							types[i] = AckGap
						}
					}
					acks = append(acks, AckBatch{First: a.First, Last: a.Last, Types: types})
				}
				if err := ValidateAckBatches(acks, false); err != nil {
					t.Fatal(err)
				}
				if p.Acknowledge(m, acks, now, l) == 0 {
					for _, b := range acks {
						for o := b.First; o <= b.Last; o++ {
							if ty := b.typeAt(o); (ty == AckAccept || ty == AckReject) && ledger[o] != nil {
								ledger[o].final = true
							}
						}
					}
				}
				held[m] = nil
				from := p.FetchOffset()
				got := p.Acquire(m, from, log.fetch(from, 1+r.Intn(4)), 1+r.Intn(60), AcquireMode(r.Intn(2)), 1+r.Intn(60), now, l)
				for _, a := range got {
					for o := a.First; o <= a.Last; o++ {
						if !log.deliverable(o) {
							t.Fatalf("seed %d: offset %d delivered without a record", seed, o)
						}
						e := ledger[o]
						if e == nil {
							e = &entry{}
							ledger[o] = e
						}
						if e.final {
							t.Fatalf("seed %d: offset %d delivered after a final ack", seed, o)
						}
						if a.DeliveryCount != e.count+1 || int(a.DeliveryCount) > l.DeliveryLimit {
							t.Fatalf("seed %d: offset %d count %d after %d (limit %d)", seed, o, a.DeliveryCount, e.count, l.DeliveryLimit)
						}
						e.count = a.DeliveryCount
					}
				}
				held[m] = got
			}
		}
		if p.StartOffset() != log.end {
			t.Fatalf("seed %d: SPSO %d, log end %d, stats %+v", seed, p.StartOffset(), log.end, p.Stats())
		}
		for o := int64(0); o < log.end; o++ {
			e := ledger[o]
			if !log.deliverable(o) {
				continue
			}
			if e == nil {
				t.Fatalf("seed %d: deliverable offset %d never delivered", seed, o)
			}
			if !e.final && int(e.count) < l.DeliveryLimit {
				t.Fatalf("seed %d: offset %d neither final nor at the limit: %+v", seed, o, *e)
			}
		}
	}
}
