package share

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// State is what is persisted of a share-partition, as Kafka's
// ShareSnapshotValue: the SPSO, the state epoch and the in-flight state
// batches. Acquired records are written as Available with their delivery
// count, so that a reload makes them deliverable again without losing
// the count.
type State struct {
	StartOffset int64
	Epoch       int32
	Batches     []StateBatch
}

// StateBatch is one persisted range of in-flight records. State is a
// RecordState id (0 Available, 2 Acknowledged, 4 Archived).
type StateBatch struct {
	First, Last   int64
	State         int8
	DeliveryCount int16
}

// Snapshot returns the partition's persistable state.
func (p *Partition) Snapshot() State {
	s := State{StartOffset: p.start, Epoch: p.epoch}
	for _, r := range p.runs {
		st := r.state
		if st == StateAcquired {
			st = StateAvailable
		}
		b := StateBatch{First: r.first, Last: r.last, State: int8(st), DeliveryCount: r.count}
		if n := len(s.Batches); n > 0 {
			q := &s.Batches[n-1]
			if q.Last+1 == b.First && q.State == b.State && q.DeliveryCount == b.DeliveryCount {
				q.Last = b.Last
				continue
			}
		}
		s.Batches = append(s.Batches, b)
	}
	return s
}

// Restore replaces the partition's state with s, as after a reload:
// every in-flight record is Available, Acknowledged or Archived with its
// stored count, offsets between stored batches are Available with count
// 0, and batches below the SPSO are dropped. It returns an error, and
// changes nothing, if s is malformed (unknown state, negative count,
// unordered or overlapping batches).
func (p *Partition) Restore(s State) error {
	var runs []run
	prev := int64(math.MinInt64)
	end := s.StartOffset
	for i, b := range s.Batches {
		st := RecordState(b.State)
		if st != StateAvailable && st != StateAcknowledged && st != StateArchived {
			return fmt.Errorf("share state batch %d: unknown record state %d", i, b.State)
		}
		if b.First > b.Last || b.DeliveryCount < 0 || b.Last == math.MaxInt64 {
			return fmt.Errorf("share state batch %d: invalid range %d-%d count %d", i, b.First, b.Last, b.DeliveryCount)
		}
		if i > 0 && b.First <= prev {
			return fmt.Errorf("share state batch %d: offset %d overlaps or precedes the batch before", i, b.First)
		}
		prev = b.Last
		if b.Last < s.StartOffset {
			continue
		}
		first := max(b.First, s.StartOffset)
		if first > end {
			runs = append(runs, run{first: end, last: first - 1, state: StateAvailable})
		}
		runs = append(runs, run{first: first, last: b.Last, state: st, count: b.DeliveryCount})
		end = b.Last + 1
	}
	p.start, p.end, p.runs, p.epoch = s.StartOffset, end, runs, s.Epoch
	p.normalize()
	return nil
}

// stateVersion is the first byte of MarshalState's encoding.
const stateVersion = 1

// MarshalState encodes s: a version byte, then varints for the start
// offset, the epoch and the batch count, and per batch the first offset
// (as a delta from the previous batch's end), the length minus one, the
// state and the delivery count.
func MarshalState(s State) []byte {
	b := make([]byte, 0, 16+8*len(s.Batches))
	b = append(b, stateVersion)
	b = binary.AppendVarint(b, s.StartOffset)
	b = binary.AppendVarint(b, int64(s.Epoch))
	b = binary.AppendUvarint(b, uint64(len(s.Batches)))
	prev := s.StartOffset
	for _, sb := range s.Batches {
		b = binary.AppendVarint(b, sb.First-prev)
		b = binary.AppendVarint(b, sb.Last-sb.First)
		b = append(b, byte(sb.State))
		b = binary.AppendVarint(b, int64(sb.DeliveryCount))
		prev = sb.Last + 1
	}
	return b
}

var errShortState = errors.New("share state: truncated or non-canonical varint")

// varintLen is the length of v's canonical varint: decoding accepts only
// that form, so every decodable input has exactly one meaning and one
// encoding.
func varintLen(v int64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutVarint(buf[:], v)
}

// UnmarshalState decodes MarshalState's encoding. It returns an error,
// never panics, on any malformed input; the result is not checked for
// consistency (Restore does that).
func UnmarshalState(b []byte) (State, error) {
	var s State
	if len(b) == 0 {
		return s, errShortState
	}
	if b[0] != stateVersion {
		return s, fmt.Errorf("share state: unknown version %d", b[0])
	}
	b = b[1:]
	varint := func() (int64, error) {
		v, n := binary.Varint(b)
		if n <= 0 || n != varintLen(v) {
			return 0, errShortState
		}
		b = b[n:]
		return v, nil
	}
	var err error
	if s.StartOffset, err = varint(); err != nil {
		return State{}, err
	}
	ep, err := varint()
	if err != nil {
		return State{}, err
	}
	if ep < math.MinInt32 || ep > math.MaxInt32 {
		return State{}, fmt.Errorf("share state: epoch %d out of range", ep)
	}
	s.Epoch = int32(ep)
	cnt, n := binary.Uvarint(b)
	if n <= 0 || n != len(binary.AppendUvarint(nil, cnt)) {
		return State{}, errShortState
	}
	b = b[n:]
	// Every batch takes at least four bytes.
	if cnt > uint64(len(b)/4) {
		return State{}, fmt.Errorf("share state: %d batches in %d bytes", cnt, len(b))
	}
	s.Batches = make([]StateBatch, 0, cnt)
	prev := s.StartOffset
	for i := uint64(0); i < cnt; i++ {
		d, err := varint()
		if err != nil {
			return State{}, err
		}
		ln, err := varint()
		if err != nil {
			return State{}, err
		}
		if len(b) == 0 {
			return State{}, errShortState
		}
		st := int8(b[0])
		b = b[1:]
		c, err := varint()
		if err != nil {
			return State{}, err
		}
		if ln < 0 || c < 0 || c > math.MaxInt16 {
			return State{}, fmt.Errorf("share state batch %d: invalid length %d or count %d", i, ln, c)
		}
		first, ok1 := addNoOverflow(prev, d)
		last, ok2 := addNoOverflow(first, ln)
		if !ok1 || !ok2 || last == math.MaxInt64 {
			return State{}, fmt.Errorf("share state batch %d: offset overflow", i)
		}
		s.Batches = append(s.Batches, StateBatch{First: first, Last: last, State: st, DeliveryCount: int16(c)})
		prev = last + 1
	}
	if len(b) != 0 {
		return State{}, fmt.Errorf("share state: %d trailing bytes", len(b))
	}
	return s, nil
}

func addNoOverflow(a, b int64) (int64, bool) {
	c := a + b
	if (b > 0 && c < a) || (b < 0 && c > a) {
		return 0, false
	}
	return c, true
}
