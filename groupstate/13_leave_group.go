package groupstate

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// LeaveGroup (key 13), versions 0-5.
//
//   - v0-2: one MemberID; the error is at the top level.
//   - v1: ThrottleMillis in the response.
//   - v3: a batch of {MemberID, InstanceID} with per-member errors
//     (KIP-345); a member id "" with an instance id removes by instance.
//   - v4: flexible versions.
//   - v5: a Reason per member (KIP-800).

// leaveGroup serves a LeaveGroup on the owning loop.
func (s *shard) leaveGroup(r *kmsg.LeaveGroupRequest, reply func(kmsg.Response)) {
	resp := kmsg.NewPtrLeaveGroupResponse()
	leaving := r.Members
	if r.Version < 3 {
		leaving = []kmsg.LeaveGroupRequestMember{{MemberID: r.MemberID}}
	}
	results := make([]kmsg.LeaveGroupResponseMember, len(leaving))
	for i, l := range leaving {
		results[i] = kmsg.NewLeaveGroupResponseMember()
		results[i].MemberID, results[i].InstanceID = l.MemberID, l.InstanceID
	}
	finish := func(top int16) {
		if r.Version < 3 {
			if top == errNone && len(results) == 1 {
				top = results[0].ErrorCode
			}
			resp.ErrorCode = top
		} else {
			resp.ErrorCode = top
			if top == errNone {
				resp.Members = results
			}
		}
		reply(resp)
	}
	if r.Group == "" {
		finish(errInvalidGroupID)
		return
	}
	if consumer, ok := s.consumerOf(r.Group); ok {
		consumer.classicLeave(leaving, results)
		finish(errNone)
		return
	}
	g, ok := s.classicOf(r.Group)
	if !ok {
		// As Kafka: every member is unknown (v0-2 carry it at the top).
		for i := range results {
			results[i].ErrorCode = errUnknownMemberID
		}
		finish(errNone)
		return
	}
	if g.state == stateDead {
		finish(errCoordinatorNotAvailable)
		return
	}
	var left []*classicMember
	removedPending := false
	for i, l := range leaving {
		id := l.MemberID
		switch {
		case id == "" && l.InstanceID != nil:
			mid, ok := g.static[*l.InstanceID]
			if !ok {
				results[i].ErrorCode = errUnknownMemberID
				continue
			}
			id = mid
		case g.pending[id] != nil:
			stopTimer(g.pending[id].timer)
			delete(g.pending, id)
			removedPending = true
			continue
		default:
			if code := g.validateMember(id, l.InstanceID); code != errNone {
				results[i].ErrorCode = code
				continue
			}
		}
		m := g.remove(id)
		if m == nil {
			results[i].ErrorCode = errUnknownMemberID
			continue
		}
		reason := ""
		if l.Reason != nil {
			reason = *l.Reason
		}
		g.s.e.log.Info("groupstate: member left", "group", g.id, "member", id, "reason", reason)
		g.emitMember(EventMemberLeft, m, reason)
		left = append(left, m)
	}
	if len(left) > 0 {
		g.holdJoinAfterLeave()
	}
	if len(left) > 0 || removedPending {
		switch g.state {
		case stateStable, stateCompletingRebalance:
			if len(left) > 0 {
				g.prepareRebalance(CauseMemberLeft, left[0])
			}
		case statePreparingRebalance:
			g.maybeCompleteJoin()
		}
	}
	finish(errNone)
}
