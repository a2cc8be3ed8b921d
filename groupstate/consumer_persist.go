package groupstate

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Persistence of KIP-848 groups, so that a restart needs no rebalance.
// With a GroupMetadataStore the engine keeps one record per consumer
// group, in the same slot as a
// classic group's record: the group and assignment epochs, the assignor,
// the subscribed topics' metadata hash, and per member its identity,
// subscription, epochs, reconciliation state, assigned and
// pending-revocation partitions and target. It is written in the
// background whenever one of these changed (a heartbeat that changed
// nothing writes nothing) and deleted when the group is deleted or
// forgotten. Timers are never written: on load every member gets a fresh
// session timer (and a revoking member a fresh rebalance timer), so
// members that keep heartbeating go on without a new epoch.
//
// A heartbeat is answered only once the write holding every change made
// to the group up to its answer returned nil (persistThen): an answer
// that moves a member's epoch or assignment, or the group epoch, rides on
// a durable (in a fleet: committed, fenced) write, so a new owner or a
// restarted kproxy never knows less than a client was told. A heartbeat
// that changed nothing is answered at once when no write is pending, and
// otherwise waits for the write in flight or the next one, which hold
// what its answer says.
//
// A failed write is answered with the store error's code
// (storeErrorCode: NOT_COORDINATOR for a fenced writer) to every
// heartbeat that waited for it, and the group's in-memory state is
// dropped (EventGroupUnloaded, CauseStoreError): the next request loads
// it from the store, as after a restart. Keeping the state and writing
// it with the next change would also never send an undurable answer,
// but dropping it keeps memory equal to the store after any failure, so
// partitions a failed write would have granted are never granted from
// memory, and a fenced (zombie) owner holds no state a write cannot back.
//
// The record is a two-byte marker (consumerRecordMagic, never a valid classic
// record version) followed by a versioned JSON document.

// consumerRecordMagic starts a consumer group record ("K8").
const consumerRecordMagic = 0x4b38

// consumerRecordVersion is the version of the JSON document.
const consumerRecordVersion = 1

// consumerGroupRecord is the stored form of a consumer group.
type consumerGroupRecord struct {
	Version         int                    `json:"version"`
	Epoch           int32                  `json:"epoch"`
	AssignmentEpoch int32                  `json:"assignment_epoch"`
	Assignor        string                 `json:"assignor,omitempty"`
	SubHash         string                 `json:"sub_hash,omitempty"`
	Members         []consumerMemberRecord `json:"members"`
}

// consumerMemberRecord is the stored form of one member.
type consumerMemberRecord struct {
	ID               string                     `json:"id"`
	InstanceID       string                     `json:"instance_id,omitempty"`
	RackID           string                     `json:"rack_id,omitempty"`
	ClientID         string                     `json:"client_id,omitempty"`
	ClientHost       string                     `json:"client_host,omitempty"`
	RebalanceTimeout int64                      `json:"rebalance_timeout_ms"`
	Subscribed       []string                   `json:"subscribed,omitempty"`
	Regex            string                     `json:"regex,omitempty"`
	ServerAssignor   string                     `json:"server_assignor,omitempty"`
	State            uint8                      `json:"state"`
	Epoch            int32                      `json:"epoch"`
	PreviousEpoch    int32                      `json:"previous_epoch"`
	Assigned         []consumerPartitionsRecord `json:"assigned,omitempty"`
	Pending          []consumerPartitionsRecord `json:"pending,omitempty"`
	Target           []consumerPartitionsRecord `json:"target,omitempty"`
	// Classic is set for a member speaking the classic protocol in an
	// upgraded group (consumer_migration.go).
	Classic *classicMemberRecord `json:"classic,omitempty"`
}

// classicMemberRecord is the stored form of a classic member's protocol
// data (Kafka's ClassicMemberMetadata: session timeout and supported
// protocols).
type classicMemberRecord struct {
	SessionTimeout int64                   `json:"session_timeout_ms"`
	Version        int16                   `json:"version,omitempty"`
	Protocols      []classicProtocolRecord `json:"protocols"`
}

// classicProtocolRecord is one supported protocol and its metadata.
type classicProtocolRecord struct {
	Name     string `json:"name"`
	Metadata []byte `json:"metadata"`
}

// consumerPartitionsRecord is one topic's partitions, the topic id in hex; Epochs, when
// present, holds each partition's assignment epoch.
type consumerPartitionsRecord struct {
	Topic      string  `json:"topic"`
	Partitions []int32 `json:"partitions"`
	Epochs     []int32 `json:"epochs,omitempty"`
}

// isConsumerRecord reports whether rec is a consumer group record.
func isConsumerRecord(rec []byte) bool {
	return len(rec) >= 2 && binary.BigEndian.Uint16(rec) == consumerRecordMagic
}

// encodeParts converts a partition set for the record, with the
// partitions' assignment epochs when epochs is non-nil.
func encodeParts(ps partSet, epochs map[tp]int32) []consumerPartitionsRecord {
	var out []consumerPartitionsRecord
	for _, t := range ps.sortedTopics() {
		rt := consumerPartitionsRecord{Topic: hex.EncodeToString(t[:]), Partitions: ps.sortedPartitions(t)}
		if epochs != nil {
			for _, p := range rt.Partitions {
				rt.Epochs = append(rt.Epochs, epochs[tp{t, p}])
			}
		}
		out = append(out, rt)
	}
	return out
}

// decodeParts converts a record's partitions back, recording their
// assignment epochs in epochs (def when the record has none).
func decodeParts(in []consumerPartitionsRecord, epochs map[tp]int32, def int32) (partSet, error) {
	out := partSet{}
	for _, t := range in {
		raw, err := hex.DecodeString(t.Topic)
		if err != nil || len(raw) != 16 {
			return nil, fmt.Errorf("bad topic id %q", t.Topic)
		}
		if len(t.Epochs) != 0 && len(t.Epochs) != len(t.Partitions) {
			return nil, fmt.Errorf("topic %s: %d epochs for %d partitions", t.Topic, len(t.Epochs), len(t.Partitions))
		}
		var id topicID
		copy(id[:], raw)
		for i, p := range t.Partitions {
			if p < 0 {
				return nil, fmt.Errorf("negative partition %d", p)
			}
			out.add(id, p)
			if epochs != nil {
				epochs[tp{id, p}] = def
				if len(t.Epochs) != 0 {
					epochs[tp{id, p}] = t.Epochs[i]
				}
			}
		}
	}
	return out, nil
}

// record encodes g.
func (g *consumerGroup) record() []byte {
	rec := consumerGroupRecord{Version: consumerRecordVersion, Epoch: g.epoch, AssignmentEpoch: g.assignmentEpoch, Assignor: g.assignor, SubHash: g.subHash}
	for _, id := range g.sortedIDs() {
		m := g.members[id]
		var classic *classicMemberRecord
		if m.classic != nil {
			classic = &classicMemberRecord{SessionTimeout: m.classic.sessionTimeout.Milliseconds(), Version: m.classic.version}
			for _, p := range m.classic.protocols {
				classic.Protocols = append(classic.Protocols, classicProtocolRecord{Name: p.Name, Metadata: p.Metadata})
			}
		}
		rec.Members = append(rec.Members, consumerMemberRecord{
			Classic: classic,
			ID:      m.id, InstanceID: m.instanceID, RackID: m.rackID, ClientID: m.clientID, ClientHost: m.clientHost,
			RebalanceTimeout: m.rebalanceTimeout.Milliseconds(),
			Subscribed:       m.subscribedNames, Regex: m.regex, ServerAssignor: m.serverAssignor,
			State: uint8(m.State), Epoch: m.Epoch, PreviousEpoch: m.PreviousEpoch,
			Assigned: encodeParts(m.Assigned, m.partEpochs), Pending: encodeParts(m.Pending, m.partEpochs),
			Target: encodeParts(g.targets[id], nil),
		})
	}
	body, err := json.Marshal(rec)
	if err != nil {
		// Only plain data is marshalled: this cannot happen.
		g.s.e.log.Error("groupstate: encoding consumer group record failed", "group", g.id, "err", err)
		return nil
	}
	out := binary.BigEndian.AppendUint16(nil, consumerRecordMagic)
	return append(out, body...)
}

// markDirty notes that g changed in a way its record holds.
func (g *consumerGroup) markDirty() { g.dirty = true }

// persistThen calls answer once every change made to g so far is
// durable: at once when nothing is to be written, else after the write
// that holds the change. Writes are coalesced: while one is in flight,
// further changes only mark the group dirty and wait for the next write,
// which holds the latest state, so a busy rebalance costs one write at a
// time per group. answer gets errNone; the store error's code when the
// write failed (the group is then dropped, to be reloaded);
// NOT_COORDINATOR when the group was unloaded before its write started;
// COORDINATOR_NOT_AVAILABLE when the engine closed first. A nil answer
// just starts the write.
func (g *consumerGroup) persistThen(answer func(code int16)) {
	if answer == nil {
		answer = func(int16) {}
	}
	if g.converted != nil {
		g.converted.add(answer)
		return
	}
	if g.s.e.meta == nil || !g.live() {
		g.dirty = false
		answer(errNone)
		return
	}
	switch {
	case g.dirty:
		g.waitNext = append(g.waitNext, answer)
		g.startSave()
	case g.saving:
		g.cur.add(answer)
	default:
		answer(errNone)
	}
}

// maybePersist starts writing g's record if it changed; nobody waits.
func (g *consumerGroup) maybePersist() { g.persistThen(nil) }

// startSave writes the current state unless a write is in flight (its
// completion starts the next one).
func (g *consumerGroup) startSave() {
	g.anchorChanged()
	if g.saving || !g.dirty {
		return
	}
	rec := g.record()
	if rec == nil {
		g.dirty = false
		return
	}
	g.dirty, g.saving = false, true
	batch := &saveBatch{ws: g.waitNext}
	g.cur, g.waitNext = batch, nil
	id, epoch := g.id, g.epoch
	log := g.s.e.log
	g.s.saveMeta(id, rec, func(err error) {
		if errors.Is(err, errEngineClosed) || errors.Is(err, errUnloaded) {
			// Closed or unloaded before the write started: the group
			// was already dropped; answer here.
			batch.finish(storeErrorCode(err))
			return
		}
		g.saving = false
		g.cur = nil
		if err != nil {
			// Nothing of this write is durable: answer its waiters with
			// the error and drop the group, so that memory is again
			// what the store holds (the next request reloads it).
			code := storeErrorCode(err)
			log.Warn("groupstate: persisting consumer group failed; dropping its state", "group", id, "epoch", epoch, "err", err)
			batch.finish(code)
			if g.live() {
				g.s.unloadConsumer(g, code, CauseStoreError)
			}
			return
		}
		batch.finish(errNone)
		if g.live() {
			g.startSave()
			return
		}
		// The group was dropped meanwhile (deleted or replaced, and
		// tombstoned after this write): nothing more to write.
		ws := g.waitNext
		g.waitNext, g.dirty = nil, false
		for _, w := range ws {
			w(errNone)
		}
	}, func() {
		// The engine closed while the write ran (off the loop).
		batch.finish(errCoordinatorNotAvailable)
	})
}

// saveBatch holds the answers waiting for one write. The loop adds to it
// while the write runs; the write's completion finishes it, on the loop
// or, once the engine closed, off it: hence mu.
type saveBatch struct {
	mu   sync.Mutex
	ws   []func(code int16) // guarded by mu
	code int16              // guarded by mu: the answer once done
	done bool               // guarded by mu
}

// add queues answer, or calls it at once if the batch is finished.
func (b *saveBatch) add(answer func(code int16)) {
	b.mu.Lock()
	if b.done {
		code := b.code
		b.mu.Unlock()
		answer(code)
		return
	}
	b.ws = append(b.ws, answer)
	b.mu.Unlock()
}

// finish answers every queued answer with code, once.
func (b *saveBatch) finish(code int16) {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return
	}
	b.done, b.code = true, code
	ws := b.ws
	b.ws = nil
	b.mu.Unlock()
	for _, w := range ws {
		w(code)
	}
}

// failWaiters answers code to every heartbeat waiting for a write that
// will not happen (teardown, the group unloaded or dropped).
func (g *consumerGroup) failWaiters(code int16) {
	ws := g.waitNext
	g.waitNext, g.dirty = nil, false
	for _, w := range ws {
		w(code)
	}
}

// consumerGroupFromRecord rebuilds a consumer group from its record, every
// member with a fresh session timer.
func (s *shard) consumerGroupFromRecord(id string, rec []byte) (*consumerGroup, error) {
	var r consumerGroupRecord
	dec := json.NewDecoder(bytes.NewReader(rec[2:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("decoding consumer group record: %w", err)
	}
	if r.Version < 1 || r.Version > consumerRecordVersion {
		return nil, fmt.Errorf("consumer group record version %d is not supported (max %d)", r.Version, consumerRecordVersion)
	}
	if r.Epoch < 0 || r.AssignmentEpoch < 0 || r.AssignmentEpoch > r.Epoch {
		return nil, fmt.Errorf("bad epochs %d/%d", r.Epoch, r.AssignmentEpoch)
	}
	if _, ok := assignors[r.Assignor]; r.Assignor != "" && !ok {
		return nil, fmt.Errorf("unknown assignor %q", r.Assignor)
	}
	g := newConsumerGroup(s, id)
	g.epoch, g.assignmentEpoch, g.assignor, g.subHash = r.Epoch, r.AssignmentEpoch, r.Assignor, r.SubHash
	g.reconciledEpoch = r.AssignmentEpoch
	for _, rm := range r.Members {
		if rm.ID == "" || g.members[rm.ID] != nil {
			return nil, fmt.Errorf("member id %q is empty or repeated", rm.ID)
		}
		if rm.State > uint8(memberUnreleased) {
			return nil, fmt.Errorf("member %q has state %d", rm.ID, rm.State)
		}
		m := &consumerMember{
			id: rm.ID, instanceID: rm.InstanceID, rackID: rm.RackID, clientID: rm.ClientID, clientHost: rm.ClientHost,
			rebalanceTimeout: time.Duration(rm.RebalanceTimeout) * time.Millisecond,
			subscribedNames:  rm.Subscribed, regex: rm.Regex, serverAssignor: rm.ServerAssignor,
		}
		if m.rebalanceTimeout <= 0 {
			m.rebalanceTimeout = s.e.cfg.ConsumerSessionTimeout
		}
		if rc := rm.Classic; rc != nil {
			if rc.SessionTimeout <= 0 || len(rc.Protocols) == 0 {
				return nil, fmt.Errorf("member %q: classic member with session timeout %d and %d protocols", rm.ID, rc.SessionTimeout, len(rc.Protocols))
			}
			m.classic = &classicProtocol{sessionTimeout: time.Duration(rc.SessionTimeout) * time.Millisecond, version: rc.Version}
			for _, p := range rc.Protocols {
				m.classic.protocols = append(m.classic.protocols, kmsg.JoinGroupRequestProtocol{Name: p.Name, Metadata: p.Metadata})
			}
		}
		if rm.Regex != "" {
			re, err := regexp.Compile("^(?:" + rm.Regex + ")$")
			if err != nil {
				return nil, fmt.Errorf("member %q: %w", rm.ID, err)
			}
			m.re = re
		}
		m.partEpochs = make(map[tp]int32)
		assigned, err := decodeParts(rm.Assigned, m.partEpochs, rm.Epoch)
		if err != nil {
			return nil, fmt.Errorf("member %q: %w", rm.ID, err)
		}
		pending, err := decodeParts(rm.Pending, m.partEpochs, rm.Epoch)
		if err != nil {
			return nil, fmt.Errorf("member %q: %w", rm.ID, err)
		}
		target, err := decodeParts(rm.Target, nil, 0)
		if err != nil {
			return nil, fmt.Errorf("member %q: %w", rm.ID, err)
		}
		if m.instanceID != "" {
			if _, dup := g.static[m.instanceID]; dup {
				return nil, fmt.Errorf("instance id %q is repeated", m.instanceID)
			}
		}
		g.add(m)
		g.targets[m.id] = target
		next := memberAssignment{State: memberState(rm.State), Epoch: rm.Epoch, PreviousEpoch: rm.PreviousEpoch, Assigned: assigned, Pending: pending}
		for _, ps := range []partSet{assigned, pending} {
			for t, parts := range ps {
				for p := range parts {
					if o, taken := g.owners[tp{t, p}]; taken {
						return nil, fmt.Errorf("partition %x/%d held by %q and %q", t[:], p, o, m.id)
					}
					g.owners[tp{t, p}] = m.id
				}
			}
		}
		m.memberAssignment = next
	}
	for _, mid := range g.sortedIDs() {
		m := g.members[mid]
		g.armSessionTimer(m)
		if m.State == memberUnrevoked {
			g.syncRebalanceTimer(m, 0, false)
		}
	}
	if len(g.members) == 0 {
		g.armEmptyTimer()
	}
	g.dirty = false
	return g, nil
}

// installConsumerRecord installs a loaded consumer group (an unreadable
// record is dropped: its members rejoin).
func (s *shard) installConsumerRecord(id string, rec []byte) {
	if _, exists := s.groups[id]; exists {
		return
	}
	g, err := s.consumerGroupFromRecord(id, rec)
	if err != nil {
		s.e.log.Error("groupstate: unreadable consumer group record ignored", "group", id, "err", err)
		return
	}
	s.groups[id] = g
	g.anchorChanged()
	if s.e.cfg.Events != nil {
		ev := g.event(EventGroupLoaded)
		ev.Members = g.membersList(true)
		s.emit(ev)
	}
	s.e.log.Info("groupstate: consumer group loaded", "group", id, "epoch", g.epoch, "members", len(g.members))
}
