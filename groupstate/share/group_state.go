package share

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
)

// GroupSnapshot is what of a share group must survive a restart: epochs,
// the metadata hash, the target assignment and every member with its
// subscription, epochs and assignment. Session deadlines are not kept:
// Restore starts every member's session afresh, as Kafka reschedules
// session timeouts on load.
type GroupSnapshot struct {
	ID              string
	Epoch           int32
	AssignmentEpoch int32
	MetadataHash    uint64
	Members         []MemberSnapshot
}

// MemberSnapshot is one member of a GroupSnapshot.
type MemberSnapshot struct {
	ID         string
	Rack       *string
	ClientID   string
	ClientHost string
	Epoch      int32
	PrevEpoch  int32
	Subscribed []string
	Assigned   []TopicPartition
	Target     []TopicPartition
}

// Snapshot returns the group's persistable state, members sorted by id.
func (g *Group) Snapshot() GroupSnapshot {
	s := GroupSnapshot{ID: g.id, Epoch: g.epoch, AssignmentEpoch: g.assignmentEpoch, MetadataHash: g.metadataHash}
	for _, id := range g.Members() {
		m := g.members[id]
		var rack *string
		if m.rack != nil {
			r := *m.rack
			rack = &r
		}
		s.Members = append(s.Members, MemberSnapshot{
			ID: m.id, Rack: rack, ClientID: m.clientID, ClientHost: m.clientHost,
			Epoch: m.epoch, PrevEpoch: m.prevEpoch,
			Subscribed: slices.Clone(m.subscribed),
			Assigned:   slices.Clone(m.assigned),
			Target:     slices.Clone(g.target[id]),
		})
	}
	return s
}

// RestoreGroup rebuilds a group from a snapshot; every member's session
// runs from now for cfg's session timeout.
func RestoreGroup(s GroupSnapshot, now time.Time, cfg GroupConfig) (*Group, error) {
	cfg = cfg.withDefaults()
	g := NewGroup(s.ID)
	g.epoch, g.assignmentEpoch, g.metadataHash = s.Epoch, s.AssignmentEpoch, s.MetadataHash
	for _, ms := range s.Members {
		if ms.ID == "" || len(ms.ID) > maxMemberIDLen {
			return nil, fmt.Errorf("share group %q snapshot: invalid member id %q", s.ID, ms.ID)
		}
		if _, dup := g.members[ms.ID]; dup {
			return nil, fmt.Errorf("share group %q snapshot: member %q twice", s.ID, ms.ID)
		}
		subs := slices.Clone(ms.Subscribed)
		sort.Strings(subs)
		m := &member{
			id: ms.ID, clientID: ms.ClientID, clientHost: ms.ClientHost,
			epoch: ms.Epoch, prevEpoch: ms.PrevEpoch,
			subscribed: slices.Compact(subs),
			assigned:   slices.SortedFunc(slices.Values(ms.Assigned), compareTP),
			deadline:   now.Add(cfg.SessionTimeout),
		}
		if ms.Rack != nil {
			r := *ms.Rack
			m.rack = &r
		}
		g.members[m.id] = m
		if len(ms.Target) > 0 {
			g.target[m.id] = slices.SortedFunc(slices.Values(ms.Target), compareTP)
		}
	}
	return g, nil
}

// groupStateVersion is the first byte of MarshalGroup's encoding.
const groupStateVersion = 1

// MarshalGroup encodes s: a version byte, then the fields in order with
// varint integers, length-prefixed strings and lists.
func MarshalGroup(s GroupSnapshot) []byte {
	var w enc
	w.b = append(w.b, groupStateVersion)
	w.str(s.ID)
	w.int(int64(s.Epoch))
	w.int(int64(s.AssignmentEpoch))
	w.b = binary.BigEndian.AppendUint64(w.b, s.MetadataHash)
	w.uint(uint64(len(s.Members)))
	for _, m := range s.Members {
		w.str(m.ID)
		if m.Rack == nil {
			w.b = append(w.b, 0)
		} else {
			w.b = append(w.b, 1)
			w.str(*m.Rack)
		}
		w.str(m.ClientID)
		w.str(m.ClientHost)
		w.int(int64(m.Epoch))
		w.int(int64(m.PrevEpoch))
		w.uint(uint64(len(m.Subscribed)))
		for _, t := range m.Subscribed {
			w.str(t)
		}
		w.tps(m.Assigned)
		w.tps(m.Target)
	}
	return w.b
}

// UnmarshalGroup decodes MarshalGroup's encoding; it returns an error,
// never panics, on malformed input.
func UnmarshalGroup(b []byte) (GroupSnapshot, error) {
	var s GroupSnapshot
	if len(b) == 0 || b[0] != groupStateVersion {
		return s, errors.New("share group state: empty or unknown version")
	}
	r := dec{b: b[1:]}
	s.ID = r.str()
	s.Epoch = r.int32()
	s.AssignmentEpoch = r.int32()
	s.MetadataHash = r.u64()
	n := r.count(6)
	for i := 0; i < n && r.err == nil; i++ {
		var m MemberSnapshot
		m.ID = r.str()
		if r.byte() == 1 {
			rack := r.str()
			m.Rack = &rack
		}
		m.ClientID = r.str()
		m.ClientHost = r.str()
		m.Epoch = r.int32()
		m.PrevEpoch = r.int32()
		ns := r.count(1)
		for j := 0; j < ns && r.err == nil; j++ {
			m.Subscribed = append(m.Subscribed, r.str())
		}
		m.Assigned = r.tps()
		m.Target = r.tps()
		s.Members = append(s.Members, m)
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return GroupSnapshot{}, fmt.Errorf("share group state: %w", r.err)
	}
	return s, nil
}

type enc struct{ b []byte }

func (w *enc) int(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *enc) uint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *enc) str(s string)  { w.uint(uint64(len(s))); w.b = append(w.b, s...) }
func (w *enc) tps(tps []TopicPartition) {
	w.uint(uint64(len(tps)))
	for _, tp := range tps {
		w.b = append(w.b, tp.TopicID[:]...)
		w.int(int64(tp.Partition))
	}
}

// dec reads MarshalGroup's encoding; the first error sticks and makes
// every later read return zero values.
type dec struct {
	b   []byte
	err error
}

var errShortGroup = errors.New("truncated or non-canonical")

func (r *dec) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

func (r *dec) int() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 || n != varintLen(v) {
		r.fail(errShortGroup)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *dec) int32() int32 {
	v := r.int()
	if int64(int32(v)) != v {
		r.fail(fmt.Errorf("value %d out of int32 range", v))
		return 0
	}
	return int32(v)
}

func (r *dec) uint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 || n != len(binary.AppendUvarint(nil, v)) {
		r.fail(errShortGroup)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a list length whose elements take at least minSize bytes each.
func (r *dec) count(minSize int) int {
	v := r.uint()
	if v > uint64(len(r.b)/minSize) {
		r.fail(fmt.Errorf("list of %d in %d bytes", v, len(r.b)))
		return 0
	}
	return int(v)
}

func (r *dec) byte() byte {
	if len(r.b) == 0 {
		r.fail(errShortGroup)
		return 0
	}
	v := r.b[0]
	if v > 1 {
		r.fail(fmt.Errorf("flag byte %d", v))
		return 0
	}
	r.b = r.b[1:]
	return v
}

func (r *dec) u64() uint64 {
	if len(r.b) < 8 {
		r.fail(errShortGroup)
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *dec) str() string {
	n := r.count(1)
	if r.err != nil {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *dec) tps() []TopicPartition {
	n := r.count(17)
	var out []TopicPartition
	for i := 0; i < n && r.err == nil; i++ {
		var tp TopicPartition
		if len(r.b) < 16 {
			r.fail(errShortGroup)
			break
		}
		copy(tp.TopicID[:], r.b[:16])
		r.b = r.b[16:]
		tp.Partition = r.int32()
		out = append(out, tp)
	}
	return out
}
