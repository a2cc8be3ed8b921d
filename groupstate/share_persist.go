package groupstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/kproxy/kproxy/groupstate/share"
)

// Persistence of share groups. With a GroupMetadataStore the engine keeps
// one record per share group: its membership (share.GroupSnapshot) and
// the state of every share-partition (share.State), as Kafka keeps share
// state in its share coordinator's log (KIP-932's ShareSnapshot). An
// acknowledgement and an acquisition are answered only once the write
// holding them is durable, so a restarted or failed-over engine never
// delivers again a record whose accept or reject it answered, and
// delivery counts survive (records acquired at the write are restored
// as available with their count, as Kafka's share coordinator stores
// them; Kafka itself does not persist acquisitions, so after a crash it
// may under-count a delivery, which this does not).
//
// Writes are coalesced per group by the group's recordWriter
// (record_writer.go), as for KIP-848 groups: while one is in flight
// further changes wait for the next, which holds the latest state. A
// failed write answers its waiters with the store's error and drops the
// group, so that memory is again what the store holds.
//
// The record is a two-byte marker (shareRecordMagic, never a valid
// classic record version nor consumerRecordMagic), a version byte, the
// group snapshot and each share-partition's state, length-prefixed.

// shareRecordMagic starts a share group record ("KS").
const shareRecordMagic = 0x4b53

// shareRecordVersion is the version of the record's layout.
const shareRecordVersion = 1

// IsShareGroupRecord reports whether rec, a value of the groups topic, is
// a share group's record (the store finds the share groups it holds by
// it, internal/shares.Decide).
func IsShareGroupRecord(rec []byte) bool {
	return len(rec) >= 2 && binary.BigEndian.Uint16(rec) == shareRecordMagic
}

// record encodes g.
func (g *shareGroup) record() []byte {
	b := binary.BigEndian.AppendUint16(nil, shareRecordMagic)
	b = append(b, shareRecordVersion)
	gs := share.MarshalGroup(g.g.Snapshot())
	b = binary.AppendUvarint(b, uint64(len(gs)))
	b = append(b, gs...)
	b = binary.AppendUvarint(b, uint64(len(g.parts)))
	for tp, p := range g.parts {
		b = append(b, tp.TopicID[:]...)
		b = binary.BigEndian.AppendUint32(b, uint32(tp.Partition))
		st := share.MarshalState(p.Snapshot())
		b = binary.AppendUvarint(b, uint64(len(st)))
		b = append(b, st...)
	}
	return b
}

var errShareRecord = errors.New("share group record: truncated")

// decodeShareRecord decodes a share group record.
func decodeShareRecord(rec []byte) (share.GroupSnapshot, map[ShareTP]share.State, error) {
	if !IsShareGroupRecord(rec) || len(rec) < 3 {
		return share.GroupSnapshot{}, nil, errors.New("not a share group record")
	}
	if v := rec[2]; v != shareRecordVersion {
		return share.GroupSnapshot{}, nil, fmt.Errorf("share group record version %d is not supported (max %d)", v, shareRecordVersion)
	}
	b := rec[3:]
	chunk := func() ([]byte, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, errShareRecord
		}
		out := b[k : k+int(n)]
		b = b[k+int(n):]
		return out, nil
	}
	gb, err := chunk()
	if err != nil {
		return share.GroupSnapshot{}, nil, err
	}
	gs, err := share.UnmarshalGroup(gb)
	if err != nil {
		return share.GroupSnapshot{}, nil, err
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return share.GroupSnapshot{}, nil, errShareRecord
	}
	b = b[k:]
	parts := make(map[ShareTP]share.State, n)
	for range n {
		if len(b) < 20 {
			return share.GroupSnapshot{}, nil, errShareRecord
		}
		var tp ShareTP
		copy(tp.TopicID[:], b)
		tp.Partition = int32(binary.BigEndian.Uint32(b[16:]))
		b = b[20:]
		sb, err := chunk()
		if err != nil {
			return share.GroupSnapshot{}, nil, err
		}
		st, err := share.UnmarshalState(sb)
		if err != nil {
			return share.GroupSnapshot{}, nil, fmt.Errorf("share-partition %d: %w", tp.Partition, err)
		}
		parts[tp] = st
	}
	if len(b) != 0 {
		return share.GroupSnapshot{}, nil, errors.New("share group record: trailing bytes")
	}
	return gs, parts, nil
}

// installShareRecord installs a loaded share group; an unreadable record
// is dropped (its members rejoin; its share-partitions start again from
// share.auto.offset.reset), with an error logged.
func (s *shard) installShareRecord(id string, rec []byte) {
	if _, exists := s.groups[id]; exists {
		return
	}
	gs, parts, err := decodeShareRecord(rec)
	if err != nil {
		s.e.log.Error("groupstate: unreadable share group record ignored", "group", id, "err", err)
		return
	}
	set := s.e.shareSettings(id)
	now := s.e.clock.Now()
	sg, err := share.RestoreGroup(gs, now, share.GroupConfig{SessionTimeout: set.SessionTimeout, HeartbeatInterval: set.HeartbeatInterval, MaxSize: set.MaxSize})
	if err != nil {
		s.e.log.Error("groupstate: unreadable share group record ignored", "group", id, "err", err)
		return
	}
	g := newShareGroup(s, id)
	g.g = sg
	for tp, st := range parts {
		p := share.NewPartition(st.StartOffset)
		if err := p.Restore(st); err != nil {
			s.e.log.Error("groupstate: unreadable share-partition state ignored", "group", id, "partition", tp.Partition, "err", err)
			continue
		}
		g.parts[tp] = p
	}
	g.lastState, g.since = g.g.State(), now
	s.groups[id] = g
	g.armSessionTimer()
	if s.e.cfg.Events != nil {
		s.emit(g.event(EventGroupLoaded))
	}
	s.e.log.Info("groupstate: share group loaded", "group", id, "epoch", g.g.Epoch(), "members", len(g.g.Members()), "partitions", len(g.parts))
}

// saveStarting: a share group has nothing to do before a write.
func (g *shareGroup) saveStarting() {}

// saveDone counts the group's writes and their time for the share
// counters (ShareCounters).
func (g *shareGroup) saveDone(_ error, took time.Duration) {
	g.s.e.shareMetrics.writes.Add(1)
	g.s.e.shareMetrics.writeNanos.Add(int64(took))
}
