package groupstate

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// SyncGroup (key 14), versions 0-5.
//
//   - v1: ThrottleMillis in the response.
//   - v3: InstanceID (KIP-345).
//   - v4: flexible versions.
//   - v5: ProtocolType and Protocol in request and response; a mismatch
//     is INCONSISTENT_GROUP_PROTOCOL (KIP-559).
//
// Followers' SyncGroups park until the leader's arrives; nothing is ever
// answered on a timer (a coordinator that did so broke franz-go). With a
// GroupMetadataStore the leader's assignments are written first and
// every parked SyncGroup is answered only once the write returned nil
// (a write too large to ever succeed excepted, see below); a failed
// write answers the store error's code and rebalances.

// syncGroup serves a SyncGroup on the owning loop.
func (s *shard) syncGroup(r *kmsg.SyncGroupRequest, reply func(kmsg.Response)) {
	if r.Group == "" {
		reply(syncError(errInvalidGroupID))
		return
	}
	if consumer, ok := s.consumerOf(r.Group); ok {
		consumer.classicSync(r, reply)
		return
	}
	g, ok := s.classicOf(r.Group)
	if !ok || g.state == stateEmpty {
		reply(syncError(errUnknownMemberID))
		return
	}
	if g.state == stateDead {
		reply(syncError(errCoordinatorNotAvailable))
		return
	}
	if code := g.validateMember(r.MemberID, r.InstanceID); code != errNone {
		reply(syncError(code))
		return
	}
	if r.Generation != g.generation {
		reply(syncError(errIllegalGeneration))
		return
	}
	if r.Version >= 5 {
		if (r.ProtocolType != nil && *r.ProtocolType != g.protocolType) || (r.Protocol != nil && *r.Protocol != g.protocol) {
			reply(syncError(errInconsistentGroupProtocol))
			return
		}
	}
	m := g.members[r.MemberID]
	switch g.state {
	case statePreparingRebalance:
		reply(syncError(errRebalanceInProgress))
	case stateCompletingRebalance:
		if m.syncReply != nil {
			m.answerSync(syncError(errRebalanceInProgress))
		}
		m.syncReply = reply
		if m.syncAt.IsZero() {
			m.syncAt = g.s.e.clock.Now()
		}
		delete(g.pendingSync, m.id)
		if m.id != g.leader {
			return
		}
		if g.savingSync && g.savingGen == g.generation {
			// A retried leader SyncGroup: the first one's assignments
			// are being persisted; this one waits with the others.
			return
		}
		// The leader's assignments: members it left out get an empty
		// assignment, unknown member ids are ignored.
		given := make(map[string][]byte, len(r.GroupAssignment))
		for _, a := range r.GroupAssignment {
			if _, ok := g.members[a.MemberID]; ok {
				given[a.MemberID] = append([]byte(nil), a.MemberAssignment...)
			}
		}
		if g.s.e.meta == nil {
			g.completeSync(given)
			return
		}
		// Persist first; the syncs are answered once it is durable and
		// only if the group is still waiting for this generation.
		gen := g.generation
		g.savingSync, g.savingGen = true, gen
		g.s.saveMeta(g.id, g.record(given), func(err error) {
			if g.savingGen == gen {
				g.savingSync = false
			}
			if !g.live() || g.generation != gen || g.state != stateCompletingRebalance {
				return
			}
			if err != nil && !recordTooLarge(err) {
				g.syncSaveFailed(err)
				return
			}
			if err != nil {
				// Retrying cannot help and failing would rebalance
				// forever: go on unpersisted (a restart will then
				// rebalance this group once).
				g.s.e.log.Error("groupstate: group metadata too large to persist; the group goes on unpersisted",
					"group", g.id, "generation", gen, "members", len(g.members), "err", err)
			}
			g.completeSync(given)
		}, nil)
	case stateStable:
		delete(g.pendingSync, m.id)
		reply(g.syncResponse(m))
		g.rearmSession(m)
	default:
		reply(syncError(errUnknownMemberID))
	}
}

// recordTooLarge reports whether err says the record can never be stored.
func recordTooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// syncSaveFailed answers the parked syncs of a generation whose
// assignments could not be persisted and starts a new rebalance, as Kafka
// does. A write refused because this engine is no longer the group's
// owner (fenced, docs/fleet.md) drops the group instead:
// a rebalance here could never be persisted either, and the owner loads
// the group from the store.
func (g *classicGroup) syncSaveFailed(err error) {
	code := storeErrorCode(err)
	if fenced(err) {
		g.s.e.log.Warn("groupstate: persisting the leader's assignments was refused; dropping the group",
			"group", g.id, "generation", g.generation, "err", err)
		g.s.unloadClassic(g, code, CauseStoreError)
		return
	}
	g.s.e.log.Warn("groupstate: persisting the leader's assignments failed; rebalancing",
		"group", g.id, "generation", g.generation, "err", err)
	for _, id := range g.order {
		m := g.members[id]
		m.assignment, m.owned = nil, nil
		if m.syncReply != nil {
			m.answerSync(syncError(code))
		}
	}
	g.prepareRebalance(CauseStoreError, nil)
}

// completeSync stores the leader's assignments, answers every parked
// SyncGroup and makes the group Stable.
func (g *classicGroup) completeSync(given map[string][]byte) {
	check := g.s.e.cfg.CheckCommitOwnership && g.protocolType == "consumer"
	for _, id := range g.order {
		o := g.members[id]
		o.assignment = given[id]
		o.owned = nil
		if check {
			o.owned = decodeOwned(o.assignment)
		}
	}
	if !g.transitionTo(stateStable) {
		return
	}
	g.anchorChanged()
	// The event goes out before the answers, so that whoever sees an
	// answer also finds the sync in the event stream (tap's traces).
	if g.s.e.cfg.Events != nil {
		ev := g.event(EventSyncCompleted)
		ev.Members = g.membersList(true)
		for i := range ev.Members {
			ev.Members[i].SyncedAt = g.members[ev.Members[i].MemberID].syncAt
		}
		g.s.emit(ev)
	}
	for _, id := range g.order {
		o := g.members[id]
		if o.syncReply != nil {
			o.answerSync(g.syncResponse(o))
			g.rearmSession(o)
		}
	}
	g.s.e.log.Debug("groupstate: sync completed", "group", g.id, "generation", g.generation)
}

// syncResponse is m's successful SyncGroup answer.
func (g *classicGroup) syncResponse(m *classicMember) *kmsg.SyncGroupResponse {
	resp := kmsg.NewPtrSyncGroupResponse()
	pt, proto := g.protocolType, g.protocol
	resp.ProtocolType = &pt
	resp.Protocol = &proto
	resp.MemberAssignment = g.assignmentFor(m)
	return resp
}
