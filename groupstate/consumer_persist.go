package groupstate

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
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
// to the group up to its answer returned nil (persistThen, through the
// group's recordWriter, record_writer.go): an answer that moves a
// member's epoch or assignment, or the group epoch, rides on a durable
// (in a fleet: committed, fenced) write, so a new owner or a restarted
// kproxy never knows less than a client was told. A heartbeat that
// changed nothing is answered at once when no write is pending, and
// otherwise waits for the write in flight or the next one, which hold
// what its answer says. A failed write is answered with the store
// error's code to every heartbeat that waited for it, and the group's
// in-memory state is dropped: the next request loads it from the store,
// as after a restart.
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

// persistThen calls answer once every change made to g so far is
// durable (recordWriter.persistThen); once g was converted into a
// classic group, once the classic group's record is.
func (g *consumerGroup) persistThen(answer func(code int16)) {
	if g.converted != nil {
		if answer != nil {
			g.converted.add(answer)
		}
		return
	}
	g.recordWriter.persistThen(answer)
}

// maybePersist starts writing g's record if it changed; nobody waits.
func (g *consumerGroup) maybePersist() { g.persistThen(nil) }

// saveStarting tells the store's anchor of g's membership before each
// write may start (anchor.go).
func (g *consumerGroup) saveStarting() { g.anchorChanged() }

func (g *consumerGroup) saveDone(error, time.Duration) {}

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
