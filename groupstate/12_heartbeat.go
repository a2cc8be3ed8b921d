package groupstate

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Heartbeat (key 12), versions 0-4.
//
//   - v1: ThrottleMillis in the response.
//   - v3: InstanceID (KIP-345).
//   - v4: flexible versions.
//
// A heartbeat is answered at once; it re-arms the member's session timer
// in PreparingRebalance, CompletingRebalance and Stable.

// heartbeat serves a Heartbeat on the owning loop.
func (s *shard) heartbeat(r *kmsg.HeartbeatRequest, reply func(kmsg.Response)) {
	resp := kmsg.NewPtrHeartbeatResponse()
	resp.ErrorCode = s.heartbeatCode(r)
	reply(resp)
}

// heartbeatCode applies a heartbeat and returns its error code.
func (s *shard) heartbeatCode(r *kmsg.HeartbeatRequest) int16 {
	if r.Group == "" {
		return errInvalidGroupID
	}
	if consumer, ok := s.consumerOf(r.Group); ok {
		return consumer.classicHeartbeat(r)
	}
	g, ok := s.classicOf(r.Group)
	if !ok {
		return errUnknownMemberID
	}
	if g.state == stateDead {
		return errCoordinatorNotAvailable
	}
	if code := g.validateMember(r.MemberID, r.InstanceID); code != errNone {
		return code
	}
	if r.Generation != g.generation {
		return errIllegalGeneration
	}
	m := g.members[r.MemberID]
	switch g.state {
	case stateEmpty:
		return errUnknownMemberID
	case statePreparingRebalance:
		g.rearmSession(m)
		if m.askedAt.IsZero() && m.joinReply == nil {
			m.askedAt = g.s.e.clock.Now()
		}
		return errRebalanceInProgress
	default:
		g.rearmSession(m)
		return errNone
	}
}
