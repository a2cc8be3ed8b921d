package tap

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// StreamEvent is an engine event as /api/events streams it (one JSON
// object per Server-Sent Event) and as `kproxy tap --json` prints it.
type StreamEvent struct {
	// Seq numbers the events tap has seen since it started; it is the
	// SSE event id, so a reconnecting client resumes after it.
	Seq          uint64       `json:"seq"`
	Time         time.Time    `json:"time"`
	Kind         string       `json:"kind"`
	Group        string       `json:"group"`
	Generation   int32        `json:"generation"`
	State        string       `json:"state,omitempty"`
	ProtocolType string       `json:"protocol_type,omitempty"`
	Protocol     string       `json:"protocol,omitempty"`
	Leader       string       `json:"leader,omitempty"`
	Cause        string       `json:"cause,omitempty"`
	Member       *MemberInfo  `json:"member,omitempty"`
	Members      []MemberInfo `json:"members,omitempty"`
	Offsets      int          `json:"offsets,omitempty"`
}

// MemberInfo describes a group member in the admin API and the event
// stream.
type MemberInfo struct {
	MemberID   string `json:"member_id"`
	InstanceID string `json:"instance_id,omitempty"`
	ClientID   string `json:"client_id,omitempty"`
	ClientHost string `json:"client_host,omitempty"`
	// Protocol is the group protocol the member speaks, classic or
	// consumer (KIP-848); a mixed group has both during a migration.
	Protocol string `json:"protocol,omitempty"`
	// Assignment is the member's assignment decoded to topic-partitions
	// (consumer protocol and share groups only).
	Assignment []TopicPartitions `json:"assignment,omitempty"`
	// AssignmentBytes is the size of the raw assignment.
	AssignmentBytes int `json:"assignment_bytes,omitempty"`
	// AssignmentError says why a consumer assignment could not be
	// decoded.
	AssignmentError string `json:"assignment_error,omitempty"`
	// Epoch, State and Revoking are set in member_reconciling events
	// (KIP-848): the member epoch, its reconciliation state and the
	// partitions it must still revoke.
	Epoch    int32             `json:"epoch,omitempty"`
	State    string            `json:"state,omitempty"`
	Revoking []TopicPartitions `json:"revoking,omitempty"`
	// JoinedAt is, in join_completed events, when the member's
	// JoinGroup of this rebalance arrived.
	JoinedAt *time.Time `json:"joined_at,omitempty"`
}

// TopicPartitions is one topic of an assignment.
type TopicPartitions struct {
	Topic      string  `json:"topic"`
	Partitions []int32 `json:"partitions"`
}

// toStreamEvent converts an engine event for the stream.
func toStreamEvent(ev groupstate.Event) StreamEvent {
	se := StreamEvent{
		Time:         ev.Time,
		Kind:         ev.Kind.String(),
		Group:        ev.Group,
		Generation:   ev.Generation,
		State:        ev.State,
		ProtocolType: ev.ProtocolType,
		Protocol:     ev.Protocol,
		Leader:       ev.Leader,
		Cause:        ev.Cause,
		Offsets:      ev.Offsets,
	}
	if ev.Member != nil {
		m := toMemberInfo(ev.ProtocolType, *ev.Member)
		se.Member = &m
	}
	for _, m := range ev.Members {
		se.Members = append(se.Members, toMemberInfo(ev.ProtocolType, m))
	}
	return se
}

// toMemberInfo converts a member, decoding its assignment when the
// protocol type says how.
func toMemberInfo(protocolType string, m groupstate.Member) MemberInfo {
	mi := MemberInfo{
		MemberID:        m.MemberID,
		InstanceID:      m.InstanceID,
		ClientID:        m.ClientID,
		ClientHost:      m.ClientHost,
		Protocol:        m.Protocol,
		AssignmentBytes: len(m.Assignment),
		Epoch:           m.Epoch,
		State:           m.State,
	}
	if !m.JoinedAt.IsZero() {
		at := m.JoinedAt
		mi.JoinedAt = &at
	}
	if len(m.Revoking) > 0 {
		// Revoking is encoded as a consumer-protocol assignment
		// whatever the group's protocol type says.
		mi.Revoking, _ = decodeAssignment("consumer", m.Revoking)
	}
	tps, err := decodeAssignment(protocolType, m.Assignment)
	if err != nil {
		mi.AssignmentError = err.Error()
	}
	mi.Assignment = tps
	return mi
}

// decodeAssignment decodes a classic consumer-protocol assignment into
// sorted topic-partitions; the engine encodes share groups' (protocol
// type "share") the same way. It returns nil, nil for other protocol
// types and for empty assignments.
func decodeAssignment(protocolType string, b []byte) ([]TopicPartitions, error) {
	if (protocolType != "consumer" && protocolType != "share") || len(b) == 0 {
		return nil, nil
	}
	var a kmsg.ConsumerMemberAssignment
	if err := a.ReadFrom(b); err != nil {
		return nil, fmt.Errorf("decoding consumer assignment: %w", err)
	}
	tps := make([]TopicPartitions, 0, len(a.Topics))
	for _, t := range a.Topics {
		ps := append([]int32(nil), t.Partitions...)
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
		tps = append(tps, TopicPartitions{Topic: t.Topic, Partitions: ps})
	}
	sort.Slice(tps, func(i, j int) bool { return tps[i].Topic < tps[j].Topic })
	return tps, nil
}

// hubEntry is one published event, encoded once for every subscriber.
type hubEntry struct {
	seq   uint64
	group string
	data  []byte // the StreamEvent as JSON
}

// hub fans published events out to live-stream subscribers and keeps a
// ring of recent ones. It never blocks the publisher: a subscriber whose
// buffer is full loses the event and the loss is counted.
type hub struct {
	subBuf int    // immutable after newHub
	boot   string // random id of this hub's sequence; immutable

	mu      sync.Mutex // guards everything below
	seq     uint64
	ring    []*hubEntry // circular, len == capacity once full
	next    int         // ring index of the next write
	subs    map[*subscriber]struct{}
	closed  bool
	dropped atomic.Int64 // total events lost by subscribers; not guarded by mu
}

// subscriber is one live-stream reader.
type subscriber struct {
	ch      chan *hubEntry // closed by the hub on unsubscribe or close
	group   string         // "" for every group; immutable
	dropped atomic.Int64   // events lost since the reader last looked
}

// newHub returns a hub keeping recent events and giving each subscriber
// a buffer of subBuf events.
func newHub(recent, subBuf int) *hub {
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return &hub{
		boot:   hex.EncodeToString(b[:]),
		subBuf: subBuf,
		ring:   make([]*hubEntry, 0, recent),
		subs:   map[*subscriber]struct{}{},
	}
}

// publish assigns the event its sequence number and hands it to every
// subscriber. Called only from the tap goroutine.
func (h *hub) publish(se StreamEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.seq++
	se.Seq = h.seq
	data, err := json.Marshal(se)
	if err != nil {
		// StreamEvent holds only strings, numbers and times: this
		// cannot happen, but an event is not worth a panic.
		return
	}
	e := &hubEntry{seq: se.Seq, group: se.Group, data: data}
	if len(h.ring) < cap(h.ring) {
		h.ring = append(h.ring, e)
	} else if cap(h.ring) > 0 {
		h.ring[h.next] = e
		h.next = (h.next + 1) % cap(h.ring)
	}
	for s := range h.subs {
		if s.group != "" && s.group != e.group {
			continue
		}
		select {
		case s.ch <- e:
		default:
			s.dropped.Add(1)
			h.dropped.Add(1)
		}
	}
}

// subscribe registers a subscriber for group ("" for all) and returns the
// recent events after afterSeq, in order, taken atomically with the
// registration so that nothing is missed or repeated, and the current
// sequence number.
func (h *hub) subscribe(group string, afterSeq uint64) (*subscriber, []*hubEntry, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &subscriber{ch: make(chan *hubEntry, h.subBuf), group: group}
	if h.closed {
		close(s.ch)
		return s, nil, h.seq
	}
	h.subs[s] = struct{}{}
	var recent []*hubEntry
	n := len(h.ring)
	for i := 0; i < n; i++ {
		e := h.ring[(h.next+i)%n]
		if e.seq <= afterSeq || (group != "" && e.group != group) {
			continue
		}
		recent = append(recent, e)
	}
	return s, recent, h.seq
}

// eventID is the SSE id of seq: the hub's boot id and the sequence
// number, so that a client resuming against a restarted kproxy gets a
// full replay instead of nothing.
func (h *hub) eventID(seq uint64) string { return h.boot + "-" + strconv.FormatUint(seq, 10) }

// resumeAfter parses a Last-Event-ID; ids of another boot (or garbage)
// resume from the start of the ring.
func (h *hub) resumeAfter(lastID string) uint64 {
	boot, seq, ok := strings.Cut(lastID, "-")
	if !ok || boot != h.boot {
		return 0
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// unsubscribe removes s and closes its channel.
func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		delete(h.subs, s)
		close(s.ch)
	}
}

// close ends every subscription; later publishes are ignored.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		delete(h.subs, s)
		close(s.ch)
	}
}

// subscribers returns how many subscribers are registered.
func (h *hub) subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// droppedTotal returns how many events subscribers have lost in total.
func (h *hub) droppedTotal() int64 { return h.dropped.Load() }
