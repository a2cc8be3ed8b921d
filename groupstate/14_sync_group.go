package groupstate

import (
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
// answered on a timer (a coordinator that did so broke franz-go).

// syncGroup serves a SyncGroup on the owning loop.
func (s *shard) syncGroup(r *kmsg.SyncGroupRequest, reply func(kmsg.Response)) {
	if r.Group == "" {
		reply(syncError(errInvalidGroupID))
		return
	}
	g, ok := s.groups[r.Group]
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
		delete(g.pendingSync, m.id)
		if m.id != g.leader {
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
		for _, id := range g.order {
			o := g.members[id]
			if o.syncReply != nil {
				o.answerSync(g.syncResponse(o))
				g.rearmSession(o)
			}
		}
		if g.s.e.cfg.Events != nil {
			ev := g.event(EventSyncCompleted)
			ev.Members = g.membersList(true)
			g.s.emit(ev)
		}
		g.s.e.log.Debug("groupstate: sync completed", "group", g.id, "generation", g.generation)
	case stateStable:
		delete(g.pendingSync, m.id)
		reply(g.syncResponse(m))
		g.rearmSession(m)
	default:
		reply(syncError(errUnknownMemberID))
	}
}

// syncResponse is m's successful SyncGroup answer.
func (g *group) syncResponse(m *member) *kmsg.SyncGroupResponse {
	resp := kmsg.NewPtrSyncGroupResponse()
	pt, proto := g.protocolType, g.protocol
	resp.ProtocolType = &pt
	resp.Protocol = &proto
	resp.MemberAssignment = g.assignmentFor(m)
	return resp
}
