// Package groupdriver plays classic consumer-group members against a
// coordinator engine by handing it kmsg requests directly, without
// sockets. tap's tests and its browser-test server use it to produce real
// rebalances.
package groupdriver

import (
	"context"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// Handler is the part of the engine the driver uses.
type Handler interface {
	Handle(rc groupstate.RequestContext, req kmsg.Request, reply func(kmsg.Response))
}

// Member is one consumer-group member. It is not safe for concurrent use;
// drive each Member from one goroutine.
type Member struct {
	Engine   Handler
	Group    string
	ClientID string
	Host     string
	// InstanceID makes the member static when set.
	InstanceID string
	// Topics is the member's subscription; Partitions is how many
	// partitions each topic has (for the leader's assignment).
	Topics     []string
	Partitions int32
	// SessionMillis and RebalanceMillis are the member's timeouts.
	SessionMillis, RebalanceMillis int32

	// ID and Generation are learnt from JoinGroup.
	ID         string
	Generation int32
	// Assigned is the assignment received in the last SyncGroup.
	Assigned kmsg.ConsumerMemberAssignment
}

// do sends req and waits for the reply or ctx.
func (m *Member) do(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	select {
	case r := <-m.post(req):
		return r, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for api key %d: %w", req.Key(), ctx.Err())
	}
}

// JoinResult is the outcome of Join: the response, or an error.
type JoinResult struct {
	Resp *kmsg.JoinGroupResponse
	Err  error
}

// Join sends JoinGroup (v5, retrying once on MEMBER_ID_REQUIRED) and
// waits for the join phase to complete.
func (m *Member) Join(ctx context.Context) (*kmsg.JoinGroupResponse, error) {
	r := <-m.JoinAsync(ctx)
	return r.Resp, r.Err
}

// JoinAsync sends JoinGroup as Join does and returns at once: the first
// JoinGroup is posted to the engine before JoinAsync returns, so a later
// request of the caller's (Engine.Group, say) runs after it. The channel
// yields Join's result once the join phase completes.
func (m *Member) JoinAsync(ctx context.Context) <-chan JoinResult {
	ch := make(chan JoinResult, 1)
	first := m.post(m.joinRequest())
	go func() {
		resp, err := m.awaitJoin(ctx, first)
		ch <- JoinResult{resp, err}
	}()
	return ch
}

func (m *Member) joinRequest() *kmsg.JoinGroupRequest {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Version = 5
	req.Group = m.Group
	req.SessionTimeoutMillis = m.SessionMillis
	req.RebalanceTimeoutMillis = m.RebalanceMillis
	req.MemberID = m.ID
	if m.InstanceID != "" {
		iid := m.InstanceID
		req.InstanceID = &iid
	}
	req.ProtocolType = "consumer"
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = m.Topics
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name = "range"
	p.Metadata = meta.AppendTo(nil)
	req.Protocols = append(req.Protocols, p)
	return req
}

// awaitJoin waits for the answer to the posted JoinGroup, rejoining once
// with the member id a MEMBER_ID_REQUIRED answer gave.
func (m *Member) awaitJoin(ctx context.Context, answer <-chan kmsg.Response) (*kmsg.JoinGroupResponse, error) {
	for try := 0; ; try++ {
		var resp *kmsg.JoinGroupResponse
		select {
		case r := <-answer:
			resp = r.(*kmsg.JoinGroupResponse)
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for api key 11: %w", ctx.Err())
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err == kerr.MemberIDRequired && try == 0 {
			m.ID = resp.MemberID
			answer = m.post(m.joinRequest())
			continue
		} else if err == kerr.MemberIDRequired {
			return nil, fmt.Errorf("join group %s: member id required twice", m.Group)
		} else if err != nil {
			return resp, fmt.Errorf("join group %s: %w", m.Group, err)
		}
		m.ID = resp.MemberID
		m.Generation = resp.Generation
		return resp, nil
	}
}

// takeID sends a new member's first JoinGroup and keeps the id its
// MEMBER_ID_REQUIRED answer gives.
func (m *Member) takeID(ctx context.Context) error {
	select {
	case r := <-m.post(m.joinRequest()):
		resp := r.(*kmsg.JoinGroupResponse)
		if err := kerr.ErrorForCode(resp.ErrorCode); err != kerr.MemberIDRequired {
			return fmt.Errorf("join group %s without a member id: %v, want MEMBER_ID_REQUIRED", m.Group, err)
		}
		m.ID = resp.MemberID
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for api key 11: %w", ctx.Err())
	}
}

// post hands req to the engine and returns where its answer will be.
func (m *Member) post(req kmsg.Request) <-chan kmsg.Response {
	ch := make(chan kmsg.Response, 1)
	m.Engine.Handle(groupstate.RequestContext{ClientID: m.ClientID, ClientHost: m.Host}, req, func(r kmsg.Response) { ch <- r })
	return ch
}

// Sync sends SyncGroup. When join says this member leads, it assigns the
// partitions of every member's topics round-robin.
func (m *Member) Sync(ctx context.Context, join *kmsg.JoinGroupResponse) error {
	return <-m.SyncAsync(ctx, join)
}

// SyncAsync sends SyncGroup as Sync does and returns at once: the request
// is posted to the engine before SyncAsync returns, so a later request of
// the caller's (Engine.Group, say) runs after it. The channel yields
// Sync's error once the engine answers.
func (m *Member) SyncAsync(ctx context.Context, join *kmsg.JoinGroupResponse) <-chan error {
	done := make(chan error, 1)
	req := kmsg.NewPtrSyncGroupRequest()
	req.Version = 3
	req.Group = m.Group
	req.Generation = m.Generation
	req.MemberID = m.ID
	if m.InstanceID != "" {
		iid := m.InstanceID
		req.InstanceID = &iid
	}
	if join != nil && join.LeaderID == m.ID {
		plan, err := m.assign(join.Members)
		if err != nil {
			done <- err
			return done
		}
		req.GroupAssignment = plan
	}
	ch := m.post(req)
	go func() {
		select {
		case r := <-ch:
			done <- m.synced(r.(*kmsg.SyncGroupResponse))
		case <-ctx.Done():
			done <- fmt.Errorf("waiting for api key %d: %w", req.Key(), ctx.Err())
		}
	}()
	return done
}

// synced takes a SyncGroup answer's assignment.
func (m *Member) synced(resp *kmsg.SyncGroupResponse) error {
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("sync group %s: %w", m.Group, err)
	}
	m.Assigned = kmsg.NewConsumerMemberAssignment()
	if len(resp.MemberAssignment) > 0 {
		if err := m.Assigned.ReadFrom(resp.MemberAssignment); err != nil {
			return fmt.Errorf("sync group %s: decoding assignment: %w", m.Group, err)
		}
	}
	return nil
}

// assign spreads every subscribed topic's partitions over the members.
func (m *Member) assign(members []kmsg.JoinGroupResponseMember) ([]kmsg.SyncGroupRequestGroupAssignment, error) {
	ids := make([]string, 0, len(members))
	subs := map[string][]string{}
	topics := map[string]bool{}
	for _, jm := range members {
		var meta kmsg.ConsumerMemberMetadata
		if err := meta.ReadFrom(jm.ProtocolMetadata); err != nil {
			return nil, fmt.Errorf("decoding metadata of %s: %w", jm.MemberID, err)
		}
		ids = append(ids, jm.MemberID)
		subs[jm.MemberID] = meta.Topics
		for _, t := range meta.Topics {
			topics[t] = true
		}
	}
	sort.Strings(ids)
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	sort.Strings(names)
	got := map[string]map[string][]int32{}
	for _, id := range ids {
		got[id] = map[string][]int32{}
	}
	for _, t := range names {
		var takers []string
		for _, id := range ids {
			for _, st := range subs[id] {
				if st == t {
					takers = append(takers, id)
				}
			}
		}
		for p := int32(0); p < m.Partitions && len(takers) > 0; p++ {
			id := takers[int(p)%len(takers)]
			got[id][t] = append(got[id][t], p)
		}
	}
	plan := make([]kmsg.SyncGroupRequestGroupAssignment, 0, len(ids))
	for _, id := range ids {
		a := kmsg.NewConsumerMemberAssignment()
		for _, t := range names {
			if ps := got[id][t]; len(ps) > 0 {
				a.Topics = append(a.Topics, kmsg.ConsumerMemberAssignmentTopic{Topic: t, Partitions: ps})
			}
		}
		ga := kmsg.NewSyncGroupRequestGroupAssignment()
		ga.MemberID = id
		ga.MemberAssignment = a.AppendTo(nil)
		plan = append(plan, ga)
	}
	return plan, nil
}

// Heartbeat sends one heartbeat and returns the group error, if any
// (kerr.RebalanceInProgress asks the member to rejoin).
func (m *Member) Heartbeat(ctx context.Context) error {
	req := kmsg.NewPtrHeartbeatRequest()
	req.Version = 3
	req.Group = m.Group
	req.Generation = m.Generation
	req.MemberID = m.ID
	if m.InstanceID != "" {
		iid := m.InstanceID
		req.InstanceID = &iid
	}
	r, err := m.do(ctx, req)
	if err != nil {
		return err
	}
	return kerr.ErrorForCode(r.(*kmsg.HeartbeatResponse).ErrorCode)
}

// Leave sends LeaveGroup for this member.
func (m *Member) Leave(ctx context.Context) error {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Version = 3
	req.Group = m.Group
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.MemberID = m.ID
	req.Members = append(req.Members, lm)
	r, err := m.do(ctx, req)
	if err != nil {
		return err
	}
	resp := r.(*kmsg.LeaveGroupResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("leave group %s: %w", m.Group, err)
	}
	for _, rm := range resp.Members {
		if err := kerr.ErrorForCode(rm.ErrorCode); err != nil {
			return fmt.Errorf("leave group %s member %s: %w", m.Group, rm.MemberID, err)
		}
	}
	return nil
}

// Rebalance has every member (re)join concurrently, then sync, and
// returns when all have their assignment for the new generation.
//
// New dynamic members first get their ids, all of them before any
// rejoins: the engine then holds each as pending and completes the join
// only when all have rejoined (as Kafka does), not with whichever member
// rejoined before another's first JoinGroup arrived.
func Rebalance(ctx context.Context, members ...*Member) error {
	for _, m := range members {
		if m.ID == "" && m.InstanceID == "" {
			if err := m.takeID(ctx); err != nil {
				return err
			}
		}
	}
	chans := make([]<-chan JoinResult, len(members))
	for i, m := range members {
		chans[i] = m.JoinAsync(ctx)
	}
	joins := make([]*kmsg.JoinGroupResponse, len(members))
	for i, ch := range chans {
		select {
		case r := <-ch:
			if r.Err != nil {
				return r.Err
			}
			joins[i] = r.Resp
		case <-ctx.Done():
			return fmt.Errorf("rebalance: %w", ctx.Err())
		}
	}
	errs := make(chan error, len(members))
	for i, m := range members {
		go func() { errs <- m.Sync(ctx, joins[i]) }()
	}
	for range members {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}
