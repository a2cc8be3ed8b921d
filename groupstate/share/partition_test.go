package share

import (
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

var lim = Limits{LockDuration: 30 * time.Second, DeliveryLimit: 5, MaxLocks: 2000}

func batches(ranges ...int64) []Batch {
	var out []Batch
	for i := 0; i+1 < len(ranges); i += 2 {
		out = append(out, Batch{Base: ranges[i], Last: ranges[i+1]})
	}
	return out
}

func one(first, last int64, t AckType) []AckBatch {
	return []AckBatch{{First: first, Last: last, Types: []AckType{t}}}
}

func wantAcq(t *testing.T, got []Acquired, want ...Acquired) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("acquired %+v, want %+v", got, want)
	}
}

func checkInvariants(t *testing.T, p *Partition) {
	t.Helper()
	next := p.start
	for i, r := range p.runs {
		if r.first != next || r.last < r.first {
			t.Fatalf("run %d %+v not contiguous from %d: %+v", i, r, next, p.runs)
		}
		if i == 0 && r.state.terminal() {
			t.Fatalf("terminal first run %+v", r)
		}
		if (r.state == StateAcquired) != (r.member != "") {
			t.Fatalf("run %+v: member set iff acquired", r)
		}
		next = r.last + 1
	}
	if next != p.end {
		t.Fatalf("runs end at %d, window end %d", next, p.end)
	}
}

func TestAcquireAcceptAdvancesSPSO(t *testing.T) {
	p := NewPartition(0)
	got := p.Acquire("m1", 0, batches(0, 4, 5, 9), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{0, 9, 1})
	if p.FetchOffset() != 10 {
		t.Fatalf("fetch offset %d, want 10", p.FetchOffset())
	}
	if s := p.Stats(); s.Acquired != 10 || s.InFlight != 10 {
		t.Fatalf("stats %+v", s)
	}
	// Accept 5-9 first: SPSO stays at 0.
	if c := p.Acknowledge("m1", one(5, 9, AckAccept), t0, lim); c != 0 {
		t.Fatalf("ack code %d", c)
	}
	if p.StartOffset() != 0 {
		t.Fatalf("SPSO %d, want 0", p.StartOffset())
	}
	if c := p.Acknowledge("m1", one(0, 4, AckAccept), t0, lim); c != 0 {
		t.Fatalf("ack code %d", c)
	}
	if p.StartOffset() != 10 || p.Stats().InFlight != 0 || len(p.runs) != 0 {
		t.Fatalf("SPSO %d stats %+v", p.StartOffset(), p.Stats())
	}
	checkInvariants(t, p)
}

func TestAckErrors(t *testing.T) {
	p := NewPartition(0)
	p.Acquire("m1", 0, batches(0, 9), 100, BatchOptimized, 100, t0, lim)
	cases := []struct {
		name   string
		member string
		acks   []AckBatch
		want   int16
	}{
		{"other member", "m2", one(0, 0, AckAccept), kerr.InvalidRecordState.Code},
		{"past window", "m1", one(5, 10, AckAccept), kerr.InvalidRequest.Code},
		{"first past window", "m1", one(10, 12, AckAccept), kerr.InvalidRequest.Code},
		{"bad type", "m1", []AckBatch{{0, 0, []AckType{9}}}, kerr.InvalidRequest.Code},
		{"twice", "m1", []AckBatch{{0, 3, []AckType{AckAccept}}, {3, 4, []AckType{AckAccept}}}, kerr.InvalidRecordState.Code},
		{"second batch bad", "m1", []AckBatch{{0, 3, []AckType{AckAccept}}, {5, 5, []AckType{AckAccept}}, {6, 20, []AckType{AckAccept}}}, kerr.InvalidRequest.Code},
	}
	for _, c := range cases {
		if got := p.Acknowledge(c.member, c.acks, t0, lim); got != c.want {
			t.Errorf("%s: code %d, want %d", c.name, got, c.want)
		}
	}
	// All-or-nothing: nothing above changed a record.
	if s := p.Stats(); s.Acquired != 10 {
		t.Fatalf("stats after failed acks %+v", s)
	}
	// Renew then accept of the same offset is allowed.
	if got := p.Acknowledge("m1", []AckBatch{{0, 3, []AckType{AckRenew}}, {3, 3, []AckType{AckAccept}}}, t0, lim); got != 0 {
		t.Fatalf("renew then accept: %d", got)
	}
	// Acked record cannot be acked again.
	if got := p.Acknowledge("m1", one(3, 3, AckAccept), t0, lim); got != kerr.InvalidRecordState.Code {
		t.Fatalf("re-ack: %d", got)
	}
	// Below the SPSO is skipped.
	p.Acknowledge("m1", one(0, 2, AckAccept), t0, lim)
	if p.StartOffset() != 4 {
		t.Fatalf("SPSO %d", p.StartOffset())
	}
	if got := p.Acknowledge("m1", one(0, 3, AckAccept), t0, lim); got != 0 {
		t.Fatalf("ack below SPSO: %d", got)
	}
	checkInvariants(t, p)
}

func TestReleaseRedeliversWithCount(t *testing.T) {
	p := NewPartition(0)
	p.Acquire("m1", 0, batches(0, 9), 100, BatchOptimized, 100, t0, lim)
	// Per-offset types: 0-4 accept, 5-9 release.
	types := []AckType{1, 1, 1, 1, 1, 2, 2, 2, 2, 2}
	if c := p.Acknowledge("m1", []AckBatch{{0, 9, types}}, t0, lim); c != 0 {
		t.Fatalf("ack %d", c)
	}
	if p.StartOffset() != 5 || p.FetchOffset() != 5 {
		t.Fatalf("SPSO %d fetch %d", p.StartOffset(), p.FetchOffset())
	}
	// Another member gets them with count 2; the fetch also returns new records.
	got := p.Acquire("m2", 5, batches(5, 9, 10, 14), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{5, 9, 2}, Acquired{10, 14, 1})
	checkInvariants(t, p)
}

func TestDeliveryLimitArchives(t *testing.T) {
	l := Limits{LockDuration: time.Second, DeliveryLimit: 2, MaxLocks: 100}
	p := NewPartition(0)
	now := t0
	for i := int16(1); i <= 2; i++ {
		got := p.Acquire("m1", p.FetchOffset(), batches(0, 2), 10, BatchOptimized, 10, now, l)
		wantAcq(t, got, Acquired{0, 2, i})
		if c := p.Acknowledge("m1", one(0, 2, AckRelease), now, l); c != 0 {
			t.Fatalf("release %d", c)
		}
	}
	// The second release hit the limit: archived, SPSO moved past.
	if p.StartOffset() != 3 || p.Stats().InFlight != 0 {
		t.Fatalf("SPSO %d stats %+v", p.StartOffset(), p.Stats())
	}
	if got := p.Acquire("m1", 0, batches(0, 2), 10, BatchOptimized, 10, now, l); len(got) != 0 {
		t.Fatalf("acquired below SPSO: %+v", got)
	}
}

func TestLastDeliveryIsolated(t *testing.T) {
	// Limit 5: a record about to be delivered for the 5th time goes alone.
	p := NewPartition(0)
	if err := p.Restore(State{StartOffset: 0, Batches: []StateBatch{
		{First: 0, Last: 1, State: 0, DeliveryCount: 1},
		{First: 2, Last: 2, State: 0, DeliveryCount: 4},
		{First: 3, Last: 5, State: 0, DeliveryCount: 1},
	}}); err != nil {
		t.Fatal(err)
	}
	got := p.Acquire("m", 0, batches(0, 5), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{0, 1, 2})
	got = p.Acquire("m", p.FetchOffset(), batches(0, 5), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{2, 2, 5})
	got = p.Acquire("m", p.FetchOffset(), batches(0, 5), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{3, 5, 2})
	checkInvariants(t, p)
}

func TestThrottledRedelivery(t *testing.T) {
	// Limit 10: throttling from count 5; a 100-record batch at count 5
	// goes out 50 at a time, at count 6 25 at a time.
	l := Limits{DeliveryLimit: 10}
	p := NewPartition(0)
	p.Restore(State{Batches: []StateBatch{{First: 0, Last: 99, State: 0, DeliveryCount: 5}}})
	got := p.Acquire("m", 0, batches(0, 99), 500, BatchOptimized, 500, t0, l)
	wantAcq(t, got, Acquired{0, 49, 6})
	got = p.Acquire("m", p.FetchOffset(), batches(0, 99), 500, BatchOptimized, 500, t0, l)
	wantAcq(t, got, Acquired{50, 99, 6})
	checkInvariants(t, p)
}

func TestLockTimeoutRedelivery(t *testing.T) {
	l := Limits{LockDuration: 10 * time.Second, DeliveryLimit: 3}
	p := NewPartition(0)
	p.Acquire("m1", 0, batches(0, 4), 10, BatchOptimized, 10, t0, l)
	p.Acquire("m2", 5, batches(5, 9), 10, BatchOptimized, 10, t0.Add(5*time.Second), l)
	if d, ok := p.NextDeadline(); !ok || !d.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("deadline %v %v", d, ok)
	}
	if n := p.ExpireLocks(t0.Add(10*time.Second-time.Nanosecond), l); n != 0 {
		t.Fatalf("expired early: %d", n)
	}
	if n := p.ExpireLocks(t0.Add(10*time.Second), l); n != 5 {
		t.Fatalf("expired %d, want 5", n)
	}
	if d, _ := p.NextDeadline(); !d.Equal(t0.Add(15 * time.Second)) {
		t.Fatalf("next deadline %v", d)
	}
	// m1's late ack fails; the records are available again.
	if c := p.Acknowledge("m1", one(0, 4, AckAccept), t0.Add(11*time.Second), l); c != kerr.InvalidRecordState.Code {
		t.Fatalf("late ack %d", c)
	}
	got := p.Acquire("m2", p.FetchOffset(), batches(0, 9), 10, BatchOptimized, 10, t0.Add(12*time.Second), l)
	wantAcq(t, got, Acquired{0, 4, 2})
	// Renew extends m2's lock on 0-4 past the original deadline.
	if c := p.Acknowledge("m2", one(0, 4, AckRenew), t0.Add(20*time.Second), l); c != 0 {
		t.Fatalf("renew %d", c)
	}
	if n := p.ExpireLocks(t0.Add(25*time.Second), l); n != 5 { // 5-9 (deadline 15 s)
		t.Fatalf("expired %d, want 5", n)
	}
	if s := p.Stats(); s.Acquired != 5 {
		t.Fatalf("renewed records lost their lock: %+v", s)
	}
	if n := p.ExpireLocks(t0.Add(30*time.Second), l); n != 5 {
		t.Fatalf("expired %d after renew", n)
	}
	checkInvariants(t, p)
}

func TestGapAndRejectArchive(t *testing.T) {
	p := NewPartition(0)
	p.Acquire("m", 0, batches(0, 9), 10, BatchOptimized, 10, t0, lim)
	types := []AckType{AckAccept, AckGap, AckReject, AckAccept, AckAccept, AckAccept, AckAccept, AckAccept, AckAccept, AckRelease}
	if c := p.Acknowledge("m", []AckBatch{{0, 9, types}}, t0, lim); c != 0 {
		t.Fatalf("ack %d", c)
	}
	if p.StartOffset() != 9 || p.FetchOffset() != 9 {
		t.Fatalf("SPSO %d fetch %d", p.StartOffset(), p.FetchOffset())
	}
}

func TestControlAbortedAndHolesArchived(t *testing.T) {
	p := NewPartition(0)
	bs := []Batch{
		{Base: 2, Last: 4},                // 0-1 before the first batch: gone
		{Base: 5, Last: 7, Aborted: true}, // aborted transaction
		{Base: 8, Last: 8, Control: true}, // its abort marker
		{Base: 12, Last: 14},              // 9-11 compacted away
	}
	got := p.Acquire("m", 0, bs, 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{2, 4, 1}, Acquired{12, 14, 1})
	if p.StartOffset() != 2 {
		t.Fatalf("SPSO %d, want 2", p.StartOffset())
	}
	if c := p.Acknowledge("m", one(2, 4, AckAccept), t0, lim); c != 0 {
		t.Fatal(c)
	}
	if p.StartOffset() != 12 {
		t.Fatalf("SPSO %d, want 12 (archived skipped)", p.StartOffset())
	}
	// Acknowledging an archived offset is INVALID_RECORD_STATE.
	if c := p.Acknowledge("m", one(12, 13, AckAccept), t0, lim); c != 0 {
		t.Fatal(c)
	}
	checkInvariants(t, p)
}

func TestStaleAvailableArchivedByFetch(t *testing.T) {
	// Released records later compacted away: a fetch from their offset
	// returns a later batch, and they are archived so the SPSO moves.
	p := NewPartition(0)
	p.Acquire("m", 0, batches(0, 9), 100, BatchOptimized, 100, t0, lim)
	p.Acknowledge("m", one(0, 9, AckRelease), t0, lim)
	got := p.Acquire("m", 0, batches(5, 9, 10, 12), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{5, 9, 2}, Acquired{10, 12, 1})
	if p.StartOffset() != 5 {
		t.Fatalf("SPSO %d", p.StartOffset())
	}
}

func TestMaxLocks(t *testing.T) {
	l := Limits{MaxLocks: 10}
	p := NewPartition(0)
	got := p.Acquire("m", 0, batches(0, 5, 6, 11, 12, 20), 100, BatchOptimized, 100, t0, l)
	// Budget 10: batch-optimized completes the batch holding the 10th record.
	wantAcq(t, got, Acquired{0, 11, 1})
	if got := p.Acquire("m", 12, batches(12, 20), 100, BatchOptimized, 100, t0, l); len(got) != 0 {
		t.Fatalf("acquired past max locks: %+v", got)
	}
	// Released records inside the window can still be acquired.
	p.Acknowledge("m", one(3, 4, AckRelease), t0, l)
	got = p.Acquire("m2", p.FetchOffset(), batches(0, 5, 6, 11, 12, 20), 100, BatchOptimized, 100, t0, l)
	wantAcq(t, got, Acquired{3, 4, 2})
	// Accepting the head frees room.
	p.Acknowledge("m", one(0, 2, AckAccept), t0, l)
	p.Acknowledge("m", one(5, 11, AckAccept), t0, l)
	p.Acknowledge("m2", one(3, 4, AckAccept), t0, l)
	got = p.Acquire("m", 12, batches(12, 20, 21, 30), 100, BatchOptimized, 100, t0, l)
	wantAcq(t, got, Acquired{12, 30, 1}) // 9 < 10 records: the next batch is taken whole
	checkInvariants(t, p)
}

func TestRecordLimitClips(t *testing.T) {
	p := NewPartition(0)
	got := p.Acquire("m", 0, batches(0, 9), 4, RecordLimit, 4, t0, lim)
	wantAcq(t, got, Acquired{0, 3, 1})
	if p.FetchOffset() != 4 || p.EndOffset() != 10 {
		t.Fatalf("fetch %d end %d", p.FetchOffset(), p.EndOffset())
	}
	got = p.Acquire("m2", 4, batches(0, 9), 4, RecordLimit, 4, t0, lim)
	wantAcq(t, got, Acquired{4, 7, 1})
	got = p.Acquire("m2", 8, batches(0, 9, 10, 19), 4, RecordLimit, 4, t0, lim)
	wantAcq(t, got, Acquired{8, 11, 1})
	checkInvariants(t, p)
}

func TestBatchOptimizedExceedsToBoundaryAndSplits(t *testing.T) {
	p := NewPartition(0)
	got := p.Acquire("m", 0, batches(0, 2, 3, 5, 6, 8, 9, 11), 5, BatchOptimized, 3, t0, lim)
	// 5 records requested: the batch 3-5 holding the 5th is completed;
	// the result is split at batch boundaries every 3 records.
	wantAcq(t, got, Acquired{0, 2, 1}, Acquired{3, 5, 1})
	if p.EndOffset() != 6 {
		t.Fatalf("end %d", p.EndOffset())
	}
}

func TestReleaseMember(t *testing.T) {
	p := NewPartition(0)
	p.Acquire("a", 0, batches(0, 4), 100, BatchOptimized, 100, t0, lim)
	p.Acquire("b", 5, batches(5, 9), 100, BatchOptimized, 100, t0, lim)
	if n := p.ReleaseMember("a", lim); n != 5 {
		t.Fatalf("released %d", n)
	}
	if s := p.Stats(); s.Available != 5 || s.Acquired != 5 {
		t.Fatalf("stats %+v", s)
	}
	if p.FetchOffset() != 0 {
		t.Fatalf("fetch %d", p.FetchOffset())
	}
	checkInvariants(t, p)
}

func TestSnapshotRestoreKeepsCounts(t *testing.T) {
	p := NewPartition(100)
	p.Acquire("a", 100, batches(100, 109), 100, BatchOptimized, 100, t0, lim)
	p.Acknowledge("a", one(100, 101, AckAccept), t0, lim)
	p.Acknowledge("a", one(104, 105, AckAccept), t0, lim)
	p.Acknowledge("a", one(106, 107, AckRelease), t0, lim)
	p.Acquire("b", 106, batches(100, 109), 100, BatchOptimized, 100, t0, lim) // 106-107 count 2
	s := p.Snapshot()
	want := State{StartOffset: 102, Batches: []StateBatch{
		{102, 103, 0, 1}, {104, 105, 2, 1}, {106, 107, 0, 2}, {108, 109, 0, 1},
	}}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("snapshot %+v\nwant %+v", s, want)
	}
	dec, err := UnmarshalState(MarshalState(s))
	if err != nil || !reflect.DeepEqual(dec, s) {
		t.Fatalf("round trip %+v %v", dec, err)
	}
	q := NewPartition(0)
	if err := q.Restore(dec); err != nil {
		t.Fatal(err)
	}
	// Acquired records come back Available with their counts.
	got := q.Acquire("c", q.FetchOffset(), batches(100, 109), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{102, 103, 2}, Acquired{106, 107, 3}, Acquired{108, 109, 2})
	checkInvariants(t, q)

	// Gaps between stored batches are acquirable with count 0.
	r := NewPartition(0)
	if err := r.Restore(State{StartOffset: 10, Batches: []StateBatch{{15, 16, 2, 1}}}); err != nil {
		t.Fatal(err)
	}
	got = r.Acquire("c", r.FetchOffset(), batches(10, 20), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{10, 14, 1}, Acquired{17, 20, 1})
	checkInvariants(t, r)

	bad := []State{
		{Batches: []StateBatch{{5, 4, 0, 0}}},
		{Batches: []StateBatch{{0, 4, 1, 0}}},
		{Batches: []StateBatch{{0, 4, 0, 0}, {4, 5, 0, 0}}},
		{Batches: []StateBatch{{0, 4, 0, -1}}},
	}
	for _, b := range bad {
		if err := r.Restore(b); err == nil {
			t.Errorf("Restore(%+v) accepted", b)
		}
	}
}

func TestReset(t *testing.T) {
	p := NewPartition(0)
	p.Acquire("a", 0, batches(0, 9), 100, BatchOptimized, 100, t0, lim)
	p.Reset(50)
	if p.StartOffset() != 50 || p.FetchOffset() != 50 || p.Epoch() != 1 || p.Stats().InFlight != 0 {
		t.Fatalf("after reset: %d %d %d %+v", p.StartOffset(), p.FetchOffset(), p.Epoch(), p.Stats())
	}
}

func TestFetchPastWindowKeepsSkippedAcquirable(t *testing.T) {
	p := NewPartition(0)
	got := p.Acquire("a", 10, batches(10, 19), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{10, 19, 1})
	if p.FetchOffset() != 0 || p.StartOffset() != 0 {
		t.Fatalf("fetch %d SPSO %d", p.FetchOffset(), p.StartOffset())
	}
	got = p.Acquire("b", 0, batches(0, 9, 10, 19), 100, BatchOptimized, 100, t0, lim)
	wantAcq(t, got, Acquired{0, 9, 1})
	checkInvariants(t, p)
}

func TestRunsStayFewUnderChurn(t *testing.T) {
	// Memory follows ranges, not offsets: a million records acquired and
	// accepted in big batches leave no runs behind.
	p := NewPartition(0)
	l := Limits{MaxLocks: 1 << 30}
	for o := int64(0); o < 1_000_000; o += 10_000 {
		p.Acquire("m", o, batches(o, o+9_999), 10_000, BatchOptimized, 10_000, t0, l)
		if s := p.Stats(); s.Runs > 2 {
			t.Fatalf("%d runs", s.Runs)
		}
		p.Acknowledge("m", one(o, o+9_999, AckAccept), t0, l)
	}
	if p.StartOffset() != 1_000_000 || len(p.runs) != 0 {
		t.Fatalf("SPSO %d runs %d", p.StartOffset(), len(p.runs))
	}
}

func TestAdvanceStart(t *testing.T) {
	p := NewPartition(0)
	p.Acquire("m", 0, batches(0, 9), 100, BatchOptimized, 100, t0, lim)
	p.Acknowledge("m", one(0, 1, AckAccept), t0, lim)
	if n := p.AdvanceStart(5); n != 3 { // 2-4 acquired, dropped
		t.Fatalf("dropped %d", n)
	}
	if p.StartOffset() != 5 || p.Stats().Acquired != 5 {
		t.Fatalf("SPSO %d stats %+v", p.StartOffset(), p.Stats())
	}
	// A late ack reaching below the new SPSO applies to what is left.
	if c := p.Acknowledge("m", one(2, 9, AckAccept), t0, lim); c != 0 || p.StartOffset() != 10 {
		t.Fatalf("ack %d SPSO %d", c, p.StartOffset())
	}
	if n := p.AdvanceStart(20); n != 0 || p.StartOffset() != 20 || p.FetchOffset() != 20 {
		t.Fatalf("past the window: %d %d %d", n, p.StartOffset(), p.FetchOffset())
	}
	if n := p.AdvanceStart(3); n != 0 || p.StartOffset() != 20 {
		t.Fatal("moved back")
	}
	checkInvariants(t, p)
}

func TestRestoredAtLimitArchived(t *testing.T) {
	// Acquired for the 5th (last) time when the snapshot was taken: after
	// the reload the record is not delivered a 6th time.
	l := Limits{DeliveryLimit: 5}
	p := NewPartition(0)
	if err := p.Restore(State{Batches: []StateBatch{{0, 1, 0, 5}, {2, 3, 0, 4}}}); err != nil {
		t.Fatal(err)
	}
	got := p.Acquire("m", p.FetchOffset(), batches(0, 3), 10, BatchOptimized, 10, t0, l)
	wantAcq(t, got, Acquired{2, 2, 5}) // 0-1 archived; 2 is on its last delivery, alone
	if p.StartOffset() != 2 {
		t.Fatalf("SPSO %d", p.StartOffset())
	}
	checkInvariants(t, p)
}

func TestArchivedAtLimitCounted(t *testing.T) {
	l := Limits{LockDuration: time.Second, DeliveryLimit: 2, MaxLocks: 100}
	p := NewPartition(0)
	// 0-2 released at the limit (second delivery), 3-6 given back by
	// their member at it, 7 rejected (not counted).
	for i := 0; i < 2; i++ {
		p.Acquire("m", p.FetchOffset(), batches(0, 7), 100, BatchOptimized, 100, t0, l)
		if i == 0 {
			if n := p.ExpireLocks(t0.Add(time.Second), l); n != 8 {
				t.Fatalf("expired %d", n)
			}
			if got := p.ArchivedAtLimit(); got != 0 {
				t.Fatalf("archived %d below the limit", got)
			}
		}
	}
	if c := p.Acknowledge("m", []AckBatch{{First: 0, Last: 2, Types: []AckType{AckRelease}}, {First: 7, Last: 7, Types: []AckType{AckReject}}}, t0, l); c != 0 {
		t.Fatalf("ack %d", c)
	}
	if got := p.ArchivedAtLimit(); got != 3 {
		t.Fatalf("after release: %d, want 3", got)
	}
	if n := p.ReleaseMember("m", l); n != 4 {
		t.Fatalf("released %d", n)
	}
	if got := p.ArchivedAtLimit(); got != 7 {
		t.Fatalf("after member release: %d, want 7", got)
	}
	// Timed out at the limit.
	r := NewPartition(0)
	for i := 0; i < 2; i++ {
		r.Acquire("m", r.FetchOffset(), batches(0, 4), 100, BatchOptimized, 100, t0, l)
		r.ExpireLocks(t0.Add(time.Second), l)
	}
	if got := r.ArchivedAtLimit(); got != 5 {
		t.Fatalf("timed out at the limit: %d, want 5", got)
	}
	// Restored Available at the limit, archived by the next fetch.
	q := NewPartition(0)
	if err := q.Restore(State{Batches: []StateBatch{{0, 1, 0, 2}, {2, 3, 0, 1}}}); err != nil {
		t.Fatal(err)
	}
	q.Acquire("m", q.FetchOffset(), batches(0, 3), 10, BatchOptimized, 10, t0, l)
	if got := q.ArchivedAtLimit(); got != 2 {
		t.Fatalf("restored at the limit: %d, want 2", got)
	}
	checkInvariants(t, p)
}
