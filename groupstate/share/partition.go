package share

import (
	"math"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// RecordState is the state of an in-flight record, with Kafka's persisted
// ids (RecordState in Kafka's server share fetch package).
type RecordState int8

// The record states. Acquired is never persisted: a snapshot writes
// acquired records as Available with their delivery count.
const (
	StateAvailable    RecordState = 0
	StateAcquired     RecordState = 1
	StateAcknowledged RecordState = 2
	StateArchived     RecordState = 4
)

// String returns Kafka's name of the state.
func (s RecordState) String() string {
	switch s {
	case StateAvailable:
		return "AVAILABLE"
	case StateAcquired:
		return "ACQUIRED"
	case StateAcknowledged:
		return "ACKNOWLEDGED"
	case StateArchived:
		return "ARCHIVED"
	}
	return "UNKNOWN"
}

func (s RecordState) terminal() bool { return s == StateAcknowledged || s == StateArchived }

// Batch summarises one record batch as fetched from the log: its base and
// last offsets, whether it is a control batch (transaction marker) and
// whether it belongs to an aborted transaction (read_committed only).
type Batch struct {
	Base, Last int64
	Control    bool
	Aborted    bool
}

// AckType is an acknowledgement type of ShareFetch/ShareAcknowledge.
type AckType int8

// The acknowledgement types (KIP-932; Renew is KIP-1222, version 2).
const (
	AckGap     AckType = 0
	AckAccept  AckType = 1
	AckRelease AckType = 2
	AckReject  AckType = 3
	AckRenew   AckType = 4
)

// String returns the type's name.
func (t AckType) String() string {
	switch t {
	case AckGap:
		return "GAP"
	case AckAccept:
		return "ACCEPT"
	case AckRelease:
		return "RELEASE"
	case AckReject:
		return "REJECT"
	case AckRenew:
		return "RENEW"
	}
	return "UNKNOWN"
}

// AckBatch is one acknowledgement batch: offsets First..Last with either
// one type for all of them or one type per offset.
type AckBatch struct {
	First, Last int64
	Types       []AckType
}

// typeAt returns the acknowledgement type of offset o of the batch.
func (b AckBatch) typeAt(o int64) AckType {
	if len(b.Types) == 1 {
		return b.Types[0]
	}
	return b.Types[o-b.First]
}

// Acquired is one range of acquired records as returned in ShareFetch's
// AcquiredRecords.
type Acquired struct {
	First, Last   int64
	DeliveryCount int16
}

// Limits are the group's settings that govern a share-partition. A zero
// field takes Kafka's default.
type Limits struct {
	// LockDuration is share.record.lock.duration.ms (default 30 s).
	LockDuration time.Duration
	// DeliveryLimit is share.delivery.count.limit (default 5).
	DeliveryLimit int
	// MaxLocks is share.partition.max.record.locks (default 2000): the
	// most records in flight (from the start offset to the end of the
	// window) before new records stop being acquired.
	MaxLocks int
}

// Kafka's defaults for Limits (GroupConfig, ShareGroupConfig).
const (
	DefaultLockDuration  = 30 * time.Second
	DefaultDeliveryLimit = 5
	DefaultMaxLocks      = 2000
)

func (l Limits) withDefaults() Limits {
	if l.LockDuration <= 0 {
		l.LockDuration = DefaultLockDuration
	}
	if l.DeliveryLimit <= 0 {
		l.DeliveryLimit = DefaultDeliveryLimit
	}
	if l.MaxLocks <= 0 {
		l.MaxLocks = DefaultMaxLocks
	}
	return l
}

// AcquireMode is ShareFetch v2's ShareAcquireMode (KIP-1206).
type AcquireMode int8

// The acquire modes.
const (
	// BatchOptimized acquires whole fetched batches and may exceed
	// MaxRecords to end on a batch boundary.
	BatchOptimized AcquireMode = 0
	// RecordLimit acquires at most MaxRecords records.
	RecordLimit AcquireMode = 1
)

// run is a range of consecutive offsets in the same state, with the same
// delivery count, owner and lock deadline.
type run struct {
	first, last int64
	state       RecordState
	count       int16
	member      string    // set only while Acquired
	deadline    time.Time // set only while Acquired
}

func (r run) sameAs(o run) bool {
	return r.state == o.state && r.count == o.count && r.member == o.member && r.deadline.Equal(o.deadline)
}

// Partition is one share-partition's state: the share-partition start
// offset (SPSO) and the in-flight records from it to the end of the
// window, held as runs of offsets with equal state, so that memory grows
// with the number of distinct ranges, not with offsets. A Partition is
// owned by its caller, which must serialise every call on it.
type Partition struct {
	start int64 // SPSO: every offset below it is acknowledged or archived
	end   int64 // one past the last in-flight offset; runs cover [start, end)
	runs  []run // contiguous, ascending, runs[0].first == start
	epoch int32 // state epoch of the persisted state
	// limited counts the records archived because their delivery count
	// reached the limit, since this Partition was made (not persisted:
	// it feeds metrics only).
	limited int64
}

// NewPartition returns an empty share-partition whose records start at
// startOffset.
func NewPartition(startOffset int64) *Partition {
	return &Partition{start: startOffset, end: startOffset}
}

// StartOffset returns the share-partition start offset (SPSO).
func (p *Partition) StartOffset() int64 { return p.start }

// EndOffset returns one past the last in-flight offset.
func (p *Partition) EndOffset() int64 { return p.end }

// Epoch returns the state epoch (bumped by Reset, kept by Restore).
func (p *Partition) Epoch() int32 { return p.epoch }

// FetchOffset returns the offset a fetch should start at: the lowest
// Available in-flight offset, else the end of the in-flight window.
func (p *Partition) FetchOffset() int64 {
	for _, r := range p.runs {
		if r.state == StateAvailable {
			return r.first
		}
	}
	return p.end
}

// Stats counts the in-flight records by state.
type Stats struct {
	InFlight, Available, Acquired, Acknowledged, Archived int64
	Runs                                                  int
}

// Stats returns the counts of in-flight records.
func (p *Partition) Stats() Stats {
	s := Stats{InFlight: p.end - p.start, Runs: len(p.runs)}
	for _, r := range p.runs {
		n := r.last - r.first + 1
		switch r.state {
		case StateAvailable:
			s.Available += n
		case StateAcquired:
			s.Acquired += n
		case StateAcknowledged:
			s.Acknowledged += n
		case StateArchived:
			s.Archived += n
		}
	}
	return s
}

// find returns the index of the run holding offset o, or -1.
func (p *Partition) find(o int64) int {
	if o < p.start || o >= p.end {
		return -1
	}
	i := sort.Search(len(p.runs), func(i int) bool { return p.runs[i].last >= o })
	if i == len(p.runs) {
		return -1
	}
	return i
}

// splitAt makes offset o the first offset of a run, if o is in flight.
func (p *Partition) splitAt(o int64) {
	i := p.find(o)
	if i < 0 || p.runs[i].first == o {
		return
	}
	r := p.runs[i]
	left, right := r, r
	left.last = o - 1
	right.first = o
	p.runs = append(p.runs, run{})
	copy(p.runs[i+2:], p.runs[i+1:])
	p.runs[i] = left
	p.runs[i+1] = right
}

// isolate splits runs so that [a, b] (clipped to the window) is covered
// by whole runs, and returns the index range [i, j) of those runs.
func (p *Partition) isolate(a, b int64) (int, int) {
	if a < p.start {
		a = p.start
	}
	if b >= p.end {
		b = p.end - 1
	}
	if a > b {
		return 0, 0
	}
	p.splitAt(a)
	p.splitAt(b + 1)
	i := p.find(a)
	j := p.find(b) + 1
	return i, j
}

// appendRun extends the window with a run starting at p.end.
func (p *Partition) appendRun(r run) {
	p.runs = append(p.runs, r)
	p.end = r.last + 1
}

// normalize merges equal neighbours and advances the SPSO over the
// terminal prefix.
func (p *Partition) normalize() {
	out := p.runs[:0]
	for _, r := range p.runs {
		if n := len(out); n > 0 && out[n-1].sameAs(r) && out[n-1].last+1 == r.first {
			out[n-1].last = r.last
			continue
		}
		out = append(out, r)
	}
	k := 0
	for k < len(out) && out[k].state.terminal() {
		k++
	}
	if k > 0 {
		n := copy(out, out[k:])
		for i := n; i < len(out); i++ {
			out[i] = run{}
		}
		out = out[:n]
	}
	p.runs = out
	if len(p.runs) > 0 {
		p.start = p.runs[0].first
	} else {
		p.start = p.end
	}
}

// ArchivedAtLimit returns how many records this Partition archived
// because they had been delivered DeliveryLimit times (released, timed
// out or given back at the limit, or found Available at it), since it
// was made.
func (p *Partition) ArchivedAtLimit() int64 { return p.limited }

// release moves an acquired run back to Available, or to Archived once
// its delivery count reached the limit (Kafka InFlightState.tryUpdateState),
// counting the latter in p.limited.
func (p *Partition) release(r *run, limit int) {
	if int(r.count) >= limit {
		r.state = StateArchived
		p.limited += r.last - r.first + 1
	} else {
		r.state = StateAvailable
	}
	r.member = ""
	r.deadline = time.Time{}
}

// segment is a part of the fetched range: data records, or offsets with
// no deliverable record (a hole between batches, a control batch, an
// aborted batch). batch indexes the fetched batch of a data segment.
type segment struct {
	first, last int64
	data        bool
	batch       int
}

// segments classifies [from, to] by the fetched batches, which must be
// ascending and non-overlapping (others are dropped).
func segments(batches []Batch, from, to int64) []segment {
	var out []segment
	next := from
	for i, b := range batches {
		if b.Base > b.Last || b.Last < next {
			continue
		}
		if next > to {
			break
		}
		if b.Base > next {
			hi := min(b.Base-1, to)
			out = append(out, segment{first: next, last: hi, batch: -1})
			next = hi + 1
			if next > to {
				break
			}
		}
		lo := max(b.Base, next)
		hi := min(b.Last, to)
		out = append(out, segment{first: lo, last: hi, data: !b.Control && !b.Aborted, batch: i})
		next = hi + 1
	}
	if next <= to {
		out = append(out, segment{first: next, last: to, batch: -1})
	}
	return out
}

// throttleLimit is the delivery count from which Kafka 4.4 shrinks the
// batches it redelivers (SharePartition.throttleRecordsDeliveryLimit).
func throttleLimit(deliveryLimit int) int {
	return max(2, (deliveryLimit+1)/2)
}

// Acquire acquires records for member from the batches a fetch starting
// at fetchOffset returned, as Kafka's SharePartition.acquire does, and
// returns the acquired ranges with their delivery counts.
//
// The fetch is taken to cover every offset from min(fetchOffset, first
// base) to the last batch's last offset: offsets in that span outside
// any batch (compaction holes, records gone), control batches and
// aborted batches have no deliverable record and are archived, never
// acquired. Only offsets of the given batches are acquired: Available
// in-flight ones again with their delivery count plus one, new ones with
// count 1; an Available record already delivered DeliveryLimit times (it
// was acquired when the state was snapshotted, or the limit was lowered)
// is archived instead. The in-flight window never exceeds l.MaxLocks records, except
// that Available records inside it can always be acquired again.
//
// BatchOptimized stops at the first batch boundary once maxRecords are
// acquired and splits the result at batch boundaries into ranges of
// about batchSize records; RecordLimit acquires exactly up to maxRecords
// (the rest of a partly acquired new batch stays Available). As Kafka
// 4.4, a record on its last delivery attempt is delivered alone and
// records redelivered many times go out in shrinking groups.
func (p *Partition) Acquire(member string, fetchOffset int64, batches []Batch, maxRecords int, mode AcquireMode, batchSize int, now time.Time, l Limits) []Acquired {
	l = l.withDefaults()
	if maxRecords <= 0 || len(batches) == 0 {
		return nil
	}
	lastOff := int64(math.MinInt64)
	for _, b := range batches {
		if b.Base <= b.Last && b.Last > lastOff {
			lastOff = b.Last
		}
	}
	if lastOff < p.start {
		return nil
	}
	from := fetchOffset
	for _, b := range batches {
		if b.Base <= b.Last {
			from = min(from, b.Base)
			break
		}
	}
	from = max(from, p.start)

	// Kafka's lastOffsetAndMaxRecordsToAcquire.
	budget := int64(maxRecords)
	if room := int64(l.MaxLocks) - (p.end - p.start); room < budget {
		budget = room
	}
	to := lastOff
	if budget <= 0 {
		if from >= p.end {
			return nil
		}
		budget = min(int64(maxRecords), p.end-from)
		to = min(lastOff, p.end-1)
	}
	if from > to {
		return nil
	}
	if from > p.end {
		// The fetch started past the window: the skipped offsets were not
		// read and stay acquirable.
		p.appendRun(run{first: p.end, last: from - 1, state: StateAvailable})
	}

	a := acquirer{p: p, member: member, deadline: now.Add(l.LockDuration), limit: l.DeliveryLimit,
		throttle: throttleLimit(l.DeliveryLimit), budget: budget, recordLimit: mode == RecordLimit}
	segs := segments(batches, from, to)
	for _, s := range segs {
		if a.stop {
			break
		}
		if !s.data {
			a.archiveAbsent(s.first, s.last)
			continue
		}
		b := batches[s.batch]
		if !a.recordLimit && a.acquired >= a.budget {
			break
		}
		a.acquireData(s.first, s.last, b.Last-b.Base+1, b.Last)
	}
	p.normalize()

	out := a.out
	if mode == BatchOptimized && batchSize > 0 {
		out = splitByBatchSize(out, batches, int64(batchSize))
	}
	return out
}

// acquirer carries one Acquire call's progress.
type acquirer struct {
	p           *Partition
	member      string
	deadline    time.Time
	limit       int
	throttle    int
	budget      int64
	recordLimit bool

	acquired int64
	stop     bool
	out      []Acquired
}

func (a *acquirer) emit(first, last int64, count int16) {
	if n := len(a.out); n > 0 && a.out[n-1].Last+1 == first && a.out[n-1].DeliveryCount == count {
		a.out[n-1].Last = last
	} else {
		a.out = append(a.out, Acquired{First: first, Last: last, DeliveryCount: count})
	}
	a.acquired += last - first + 1
}

// archiveAbsent archives offsets [first, last] that hold no deliverable
// record: Available in-flight ones, and new ones past the window.
func (a *acquirer) archiveAbsent(first, last int64) {
	p := a.p
	if first < p.end {
		i, j := p.isolate(first, min(last, p.end-1))
		for k := i; k < j; k++ {
			if p.runs[k].state == StateAvailable {
				p.runs[k].state = StateArchived
			}
		}
	}
	if last >= p.end {
		p.appendRun(run{first: max(first, p.end), last: last, state: StateArchived})
	}
}

// acquireData acquires the deliverable offsets [first, last] of one
// fetched batch of batchLen records ending at batchLast.
func (a *acquirer) acquireData(first, last, batchLen, batchLast int64) {
	p := a.p
	if first < p.end {
		hi := min(last, p.end-1)
		i, j := p.isolate(first, hi)
		for k := i; k < j && !a.stop; k++ {
			r := p.runs[k]
			if r.state != StateAvailable {
				continue
			}
			c := int(r.count)
			if c >= a.limit {
				// Delivered limit times already: acquired when a snapshot
				// was taken, or the limit was lowered since.
				p.runs[k].state = StateArchived
				p.limited += r.last - r.first + 1
				continue
			}
			if a.acquired > 0 && (c >= a.throttle || (a.limit > 2 && c == a.limit-1)) {
				// Isolate records near the limit in a fetch of their own.
				a.stop = true
				break
			}
			n := r.last - r.first + 1
			if a.limit > 2 && c+1 >= a.limit {
				n = 1
				a.stop = true
			} else if c >= a.throttle {
				n = min(n, max(1, batchLen>>(c-a.throttle+1)))
				a.stop = true
			}
			if a.recordLimit {
				n = min(n, a.budget-a.acquired)
			}
			if n <= 0 {
				a.stop = true
				break
			}
			if n < r.last-r.first+1 {
				p.splitAt(r.first + n)
				j++
			}
			rr := &p.runs[k]
			rr.state = StateAcquired
			rr.count = satInc(rr.count)
			rr.member = a.member
			rr.deadline = a.deadline
			a.emit(rr.first, rr.last, rr.count)
			if a.recordLimit && a.acquired >= a.budget {
				a.stop = true
			}
		}
	}
	if a.stop || last < p.end {
		return
	}
	lo := max(first, p.end)
	hi := last
	if a.recordLimit {
		room := a.budget - a.acquired
		if room <= 0 {
			a.stop = true
			return
		}
		if hi-lo+1 > room {
			hi = lo + room - 1
		}
	}
	p.appendRun(run{first: lo, last: hi, state: StateAcquired, count: 1, member: a.member, deadline: a.deadline})
	a.emit(lo, hi, 1)
	if hi < last {
		// Record-limit mode keeps the rest of the batch in flight, Available.
		p.appendRun(run{first: hi + 1, last: batchLast, state: StateAvailable})
		a.stop = true
	}
	if a.recordLimit && a.acquired >= a.budget {
		a.stop = true
	}
}

func satInc(c int16) int16 {
	if c == math.MaxInt16 {
		return c
	}
	return c + 1
}

// splitByBatchSize cuts acquired ranges at fetched batch boundaries once
// a piece holds batchSize records or more (Kafka createBatches).
func splitByBatchSize(in []Acquired, batches []Batch, size int64) []Acquired {
	var out []Acquired
	for _, r := range in {
		cur := r.First
		for _, b := range batches {
			if b.Base <= cur {
				continue
			}
			if b.Base > r.Last {
				break
			}
			if b.Base-cur >= size {
				out = append(out, Acquired{First: cur, Last: b.Base - 1, DeliveryCount: r.DeliveryCount})
				cur = b.Base
			}
		}
		out = append(out, Acquired{First: cur, Last: r.Last, DeliveryCount: r.DeliveryCount})
	}
	return out
}

// Acknowledge applies member's acknowledgement batches for this
// partition, all or nothing, and returns a Kafka error code: 0, or
// INVALID_RECORD_STATE when an offset is not Acquired by member (or
// acknowledged twice), or INVALID_REQUEST for a malformed batch or one
// reaching past the in-flight records. Accept makes records
// Acknowledged, Release makes them Available again (Archived once the
// delivery limit is reached), Reject and Gap archive them, Renew extends
// their lock to now+LockDuration. Offsets below the SPSO are skipped, as
// Kafka does. The batches should have passed ValidateAckBatches. When the
// group disables renewals (share.renew.acknowledge.enable=false) the
// caller answers INVALID_RECORD_STATE for a Renew itself, as Kafka does.
func (p *Partition) Acknowledge(member string, acks []AckBatch, now time.Time, l Limits) int16 {
	l = l.withDefaults()
	prevLast := int64(math.MinInt64)
	var prevType AckType
	for _, b := range acks {
		if b.First > b.Last || len(b.Types) == 0 || (len(b.Types) > 1 && int64(len(b.Types)) != b.Last-b.First+1) {
			return kerr.InvalidRequest.Code
		}
		for _, t := range b.Types {
			if t < AckGap || t > AckRenew {
				return kerr.InvalidRequest.Code
			}
		}
		if b.First < prevLast {
			return kerr.InvalidRequest.Code
		}
		if b.First == prevLast && prevType != AckRenew && b.First >= p.start {
			// The offset was already moved out of Acquired by the batch before.
			return kerr.InvalidRecordState.Code
		}
		prevLast, prevType = b.Last, b.typeAt(b.Last)
		if b.Last < p.start {
			continue
		}
		if p.start == p.end {
			return kerr.InvalidRecordState.Code
		}
		if b.First >= p.end || b.Last >= p.end {
			return kerr.InvalidRequest.Code
		}
		lo := max(b.First, p.start)
		i := p.find(lo)
		for k := i; k < len(p.runs) && p.runs[k].first <= b.Last; k++ {
			if p.runs[k].state != StateAcquired || p.runs[k].member != member {
				return kerr.InvalidRecordState.Code
			}
		}
	}
	for _, b := range acks {
		if b.Last < p.start {
			continue
		}
		lo := max(b.First, p.start)
		for lo <= b.Last {
			t := b.typeAt(lo)
			hi := lo
			for hi < b.Last && b.typeAt(hi+1) == t {
				hi++
			}
			p.applyAck(lo, hi, t, now, l)
			lo = hi + 1
		}
	}
	p.normalize()
	return 0
}

func (p *Partition) applyAck(first, last int64, t AckType, now time.Time, l Limits) {
	i, j := p.isolate(first, last)
	for k := i; k < j; k++ {
		r := &p.runs[k]
		if r.state != StateAcquired {
			continue // only reachable for an offset renewed then acknowledged
		}
		switch t {
		case AckAccept:
			r.state, r.member, r.deadline = StateAcknowledged, "", time.Time{}
		case AckRelease:
			p.release(r, l.DeliveryLimit)
		case AckReject, AckGap:
			r.state, r.member, r.deadline = StateArchived, "", time.Time{}
		case AckRenew:
			r.deadline = now.Add(l.LockDuration)
		}
	}
}

// ExpireLocks releases every record whose acquisition lock ended at or
// before now (Available again, or Archived at the delivery limit) and
// returns how many records it released or archived.
func (p *Partition) ExpireLocks(now time.Time, l Limits) int {
	l = l.withDefaults()
	n := 0
	for k := range p.runs {
		r := &p.runs[k]
		if r.state == StateAcquired && !r.deadline.After(now) {
			n += int(r.last - r.first + 1)
			p.release(r, l.DeliveryLimit)
		}
	}
	if n > 0 {
		p.normalize()
	}
	return n
}

// NextDeadline returns the earliest acquisition-lock deadline, if any
// record is acquired.
func (p *Partition) NextDeadline() (time.Time, bool) {
	var d time.Time
	ok := false
	for _, r := range p.runs {
		if r.state == StateAcquired && (!ok || r.deadline.Before(d)) {
			d, ok = r.deadline, true
		}
	}
	return d, ok
}

// ReleaseMember releases every record member holds (its share session
// closed or it left the group) and returns how many. As in Kafka 4.4 the
// delivery count is kept, so a record at the limit is archived (Kafka 4.1
// decremented the count instead).
func (p *Partition) ReleaseMember(member string, l Limits) int {
	l = l.withDefaults()
	n := 0
	for k := range p.runs {
		r := &p.runs[k]
		if r.state == StateAcquired && r.member == member {
			n += int(r.last - r.first + 1)
			p.release(r, l.DeliveryLimit)
		}
	}
	if n > 0 {
		p.normalize()
	}
	return n
}

// Reset drops all in-flight state and starts the partition at
// startOffset with the next state epoch (AlterShareGroupOffsets,
// DeleteShareGroupOffsets).
func (p *Partition) Reset(startOffset int64) {
	p.runs = nil
	p.start, p.end = startOffset, startOffset
	p.epoch++
}

// AdvanceStart moves the SPSO up to the log start offset after records
// were deleted from the log (retention, DeleteRecords; a fetch answered
// OFFSET_OUT_OF_RANGE), as Kafka's SharePartition.updateCacheAndOffsets:
// in-flight records below it are dropped, acquired ones included (their
// late acknowledgements are then ignored, as for any offset below the
// SPSO). It returns how many non-terminal records were dropped.
func (p *Partition) AdvanceStart(logStartOffset int64) int {
	if logStartOffset <= p.start {
		return 0
	}
	dropped := 0
	p.splitAt(logStartOffset)
	k := 0
	for k < len(p.runs) && p.runs[k].last < logStartOffset {
		if !p.runs[k].state.terminal() {
			dropped += int(p.runs[k].last - p.runs[k].first + 1)
		}
		k++
	}
	n := copy(p.runs, p.runs[k:])
	clear(p.runs[n:])
	p.runs = p.runs[:n]
	if p.end < logStartOffset {
		p.end = logStartOffset
	}
	p.start = logStartOffset
	p.normalize()
	return dropped
}
