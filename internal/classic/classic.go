// Package classic is kproxy's side of the classic group membership
// protocol as a client of the cluster's coordinator: the JoinGroup,
// SyncGroup, Heartbeat and LeaveGroup a member sends, built from one
// identity, and the reading of their answers. Two kinds of member use
// it: the fleet member (package fleet: one per kproxy, in the fleet's
// group) and the anchors (package groupstate/kafkastore: one per group a
// kproxy serves, docs/anchors.md). Each keeps its own loop and state;
// what a request carries, and what an answer's error codes mean, is
// written once, here.
package classic

import (
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Member is a member's identity in its group: what every request after
// the JoinGroup carries.
type Member struct {
	Group    string
	MemberID string
	// InstanceID is the static member's group.instance.id (KIP-345);
	// nil for a dynamic member.
	InstanceID *string
	Generation int32
}

// Join describes a JoinGroup.
type Join struct {
	Group string
	// MemberID is "" on a first join (a dynamic member is then told
	// MEMBER_ID_REQUIRED, KIP-394; a static one joins at once).
	MemberID         string
	InstanceID       *string
	ProtocolType     string
	Protocols        []kmsg.JoinGroupRequestProtocol
	SessionTimeout   time.Duration
	RebalanceTimeout time.Duration
}

// Request builds the JoinGroup.
func (j Join) Request() *kmsg.JoinGroupRequest {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group = j.Group
	req.MemberID = j.MemberID
	req.InstanceID = j.InstanceID
	req.ProtocolType = j.ProtocolType
	req.Protocols = j.Protocols
	req.SessionTimeoutMillis = int32(j.SessionTimeout.Milliseconds())
	req.RebalanceTimeoutMillis = int32(j.RebalanceTimeout.Milliseconds())
	return req
}

// Joined returns the identity a successful JoinGroup answer gives.
func Joined(group string, instanceID *string, resp *kmsg.JoinGroupResponse) Member {
	return Member{Group: group, MemberID: resp.MemberID, InstanceID: instanceID, Generation: resp.Generation}
}

// Sync builds m's SyncGroup; assignments are the leader's (nil for a
// follower).
func (m Member) Sync(protocolType, protocol string, assignments []kmsg.SyncGroupRequestGroupAssignment) *kmsg.SyncGroupRequest {
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group = m.Group
	req.Generation = m.Generation
	req.MemberID = m.MemberID
	req.InstanceID = m.InstanceID
	req.ProtocolType = kmsg.StringPtr(protocolType)
	req.Protocol = kmsg.StringPtr(protocol)
	req.GroupAssignment = assignments
	return req
}

// Heartbeat builds m's Heartbeat.
func (m Member) Heartbeat() *kmsg.HeartbeatRequest {
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group = m.Group
	req.Generation = m.Generation
	req.MemberID = m.MemberID
	req.InstanceID = m.InstanceID
	return req
}

// Leave builds m's LeaveGroup (v3+ names it in Members, KIP-345; older
// versions carry MemberID), with reason (KIP-800) when not "".
func (m Member) Leave(reason string) *kmsg.LeaveGroupRequest {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = m.Group
	req.MemberID = m.MemberID
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.MemberID, lm.InstanceID = m.MemberID, m.InstanceID
	if reason != "" {
		lm.Reason = kmsg.StringPtr(reason)
	}
	req.Members = []kmsg.LeaveGroupRequestMember{lm}
	return req
}

// LeaveError is the error of a LeaveGroup answer: the group's, else the
// first member's; nil when the member left.
func LeaveError(resp *kmsg.LeaveGroupResponse) error {
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return err
	}
	for _, m := range resp.Members {
		if err := kerr.ErrorForCode(m.ErrorCode); err != nil {
			return err
		}
	}
	return nil
}

// Gone reports whether a LeaveGroup error means the member is no longer
// in the group anyway: unknown there, replaced by a newer instance of
// its group.instance.id, or the group is gone.
func Gone(err error) bool {
	return errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.FencedInstanceID) || errors.Is(err, kerr.GroupIDNotFound)
}

// Outcome is what a member does after an answer's error code.
type Outcome int8

const (
	// OK: the request succeeded.
	OK Outcome = iota
	// Rejoin: the group is rebalancing (REBALANCE_IN_PROGRESS); join
	// again with the same identity.
	Rejoin
	// Stale: the member id or generation is no longer the group's
	// (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION): what it held is lost.
	Stale
	// Fenced: a newer instance of the same group.instance.id replaced
	// this one (FENCED_INSTANCE_ID, KIP-345).
	Fenced
	// Failed: any other error; back off and retry, or give up.
	Failed
)

// OutcomeOf reads a heartbeat, sync or commit error code.
func OutcomeOf(code int16) Outcome {
	switch code {
	case 0:
		return OK
	case kerr.RebalanceInProgress.Code:
		return Rejoin
	case kerr.UnknownMemberID.Code, kerr.IllegalGeneration.Code:
		return Stale
	case kerr.FencedInstanceID.Code:
		return Fenced
	}
	return Failed
}
