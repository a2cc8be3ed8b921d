package groupstate

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"time"
)

// Takeover of a KIP-848 group from the cluster's coordinator
// (docs/anchors.md, "Rolling kproxy in"). The group is handed to the
// engine as a consumer group record (consumer_persist.go) returned by its
// next load: the cluster's group and assignment epochs, and every member
// at its epoch with the partitions the cluster assigned it, reconciled
// (its assignment is its target, nothing pending revocation). The record's
// subscription hash is computed from the engine's own topic cache, as a
// heartbeat would compute it, so that the members' first heartbeats find
// nothing changed and the engine keeps the epochs: no member is revoked
// or re-assigned anything.

// ConsumerTakeover is a KIP-848 group as the cluster's coordinator holds
// it, stable: every member at Epoch with its target assignment.
type ConsumerTakeover struct {
	Epoch    int32
	Assignor string // the group's server assignor; must be one the engine has
	Members  []ConsumerTakeoverMember
}

// ConsumerTakeoverMember is one member of a ConsumerTakeover.
type ConsumerTakeoverMember struct {
	ID, InstanceID, RackID, ClientID, ClientHost string
	// RebalanceTimeout is the member's own (its heartbeats carry it);
	// zero takes the engine's consumer session timeout.
	RebalanceTimeout time.Duration
	Subscribed       []string
	Regex            string
	ServerAssignor   string
	// Assigned holds the member's partitions by topic id.
	Assigned map[[16]byte][]int32
}

// ConsumerTakeoverRecord builds the consumer group record of t. It fails
// when t is not something the engine can serve unchanged: an assignor
// it lacks, a member without an id or repeated, a partition assigned
// twice, or a topic or partition its topic cache does not hold (the cache
// lags the cluster: a later try may succeed).
func (e *Engine) ConsumerTakeoverRecord(t ConsumerTakeover) ([]byte, error) {
	if t.Epoch <= 0 {
		return nil, fmt.Errorf("groupstate: takeover at group epoch %d", t.Epoch)
	}
	if _, ok := assignors[t.Assignor]; !ok {
		return nil, fmt.Errorf("groupstate: takeover: assignor %q is not one of the engine's", t.Assignor)
	}
	if len(t.Members) == 0 {
		return nil, fmt.Errorf("groupstate: takeover of a group without members")
	}
	snap := e.topicsNow()
	// hash is computed by the same code as a heartbeat's (a group that
	// exists only for it: subscriptionHash reads members and snap).
	hash := &consumerGroup{members: make(map[string]*consumerMember), snap: snap}
	owners := make(map[tp]string)
	rec := consumerGroupRecord{Version: consumerRecordVersion, Epoch: t.Epoch, AssignmentEpoch: t.Epoch, Assignor: t.Assignor}
	for _, tm := range t.Members {
		if tm.ID == "" || hash.members[tm.ID] != nil {
			return nil, fmt.Errorf("groupstate: takeover: member id %q is empty or repeated", tm.ID)
		}
		m := &consumerMember{id: tm.ID, subscribedNames: slices.Clone(tm.Subscribed), regex: tm.Regex}
		slices.Sort(m.subscribedNames)
		m.subscribedNames = slices.Compact(m.subscribedNames)
		if tm.Regex != "" {
			re, err := regexp.Compile("^(?:" + tm.Regex + ")$")
			if err != nil {
				return nil, fmt.Errorf("groupstate: takeover: member %q: %w", tm.ID, err)
			}
			m.re = re
		}
		m.resolve(snap)
		hash.members[tm.ID] = m
		assigned, epochs := partSet{}, make(map[tp]int32)
		for id, parts := range tm.Assigned {
			name, ok := snap.byID[id]
			if !ok {
				return nil, fmt.Errorf("groupstate: takeover: member %q: topic %x is not in the topic cache", tm.ID, id[:])
			}
			for _, p := range parts {
				if p < 0 || p >= snap.byName[name].Partitions {
					return nil, fmt.Errorf("groupstate: takeover: member %q: %s/%d is not in the topic cache", tm.ID, name, p)
				}
				if o, taken := owners[tp{id, p}]; taken {
					return nil, fmt.Errorf("groupstate: takeover: %s/%d assigned to %q and %q", name, p, o, tm.ID)
				}
				owners[tp{id, p}] = tm.ID
				epochs[tp{id, p}] = t.Epoch
				assigned.add(id, p)
			}
		}
		rec.Members = append(rec.Members, consumerMemberRecord{
			ID: tm.ID, InstanceID: tm.InstanceID, RackID: tm.RackID, ClientID: tm.ClientID, ClientHost: tm.ClientHost,
			RebalanceTimeout: tm.RebalanceTimeout.Milliseconds(),
			Subscribed:       m.subscribedNames, Regex: tm.Regex, ServerAssignor: tm.ServerAssignor,
			State: uint8(memberStable), Epoch: t.Epoch, PreviousEpoch: t.Epoch,
			Assigned: encodeParts(assigned, epochs), Target: encodeParts(assigned, nil),
		})
	}
	slices.SortFunc(rec.Members, func(a, b consumerMemberRecord) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	rec.SubHash = hash.subscriptionHash()
	body, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("groupstate: takeover: encoding the record: %w", err)
	}
	return append(binary.BigEndian.AppendUint16(nil, consumerRecordMagic), body...), nil
}
