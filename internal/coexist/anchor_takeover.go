package coexist

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Takeover of a forwarded group (docs/anchors.md, "Rolling kproxy in").
// A classic group the cluster's coordinator serves, whose every member
// is behind kproxy, becomes kproxy's without a rebalance: the engine is
// handed the group as the cluster holds it (PrepareTakeover: a group
// record at the cluster's generation, with its members, subscriptions
// and assignments), its members' requests stop being forwarded (the
// caller's part) and are answered by the engine at that generation, and
// the group's anchor, on its first join, takes the members' place in
// the cluster's group: its JoinGroup first, then one LeaveGroup for
// those members on another connection, so the join the cluster holds
// for them completes at once with the anchor alone (Kafka's
// ClassicGroup completes a pending join when the last awaited member
// leaves), and the cluster never sees the group empty.

// TakeoverMember is one member of a group taken over: the identity the
// anchor's LeaveGroup takes out of the cluster's group.
type TakeoverMember struct {
	MemberID   string
	InstanceID *string
}

// takeoverPlan is a pending takeover. Immutable but for ready, closed
// once by TakeoverReady, and loaded, guarded by the Anchors's mu.
type takeoverPlan struct {
	record  []byte
	members []TakeoverMember
	ready   chan struct{}
	at      time.Time
	// loaded is set once a load returned record: a later load (the
	// group unloaded meanwhile) asks the cluster as usual.
	loaded bool
	// consumer marks a KIP-848 group's takeover (anchor_takeover_kip848.go):
	// the members leave before the anchor joins. Set before the plan is
	// published, immutable after.
	consumer bool
}

// takeoverWait bounds how long an anchor's first join waits for the
// caller to say that no member request of the group is on its way to the
// cluster any more (TakeoverReady); past it the join goes ahead.
const takeoverWait = 10 * time.Second

// takeoverTTL is how long a takeover nobody loaded stays pending.
const takeoverTTL = time.Minute

// leaveDelay is how long after the anchor's JoinGroup the LeaveGroup of
// the members goes out: long enough for the join to reach the
// coordinator first (otherwise the group is Empty for a moment and the
// anchor's join waits the initial rebalance delay), short beside the
// members' heartbeat intervals.
const leaveDelay = 300 * time.Millisecond

// PrepareTakeover makes the next load of group (the store's
// LoadGroupMetadata, through CheckLoad)
// return record, a classic group record (kmsg.GroupMetadataValue) of
// the group as the cluster holds it, and the group's anchor, on its
// first join, take members out of the cluster's group. It replaces a
// pending takeover of the group.
func (as *Anchors) PrepareTakeover(group string, record []byte, members []TakeoverMember) error {
	return as.prepareTakeover(group, &takeoverPlan{record: record, members: members, ready: make(chan struct{})})
}

// prepareTakeover publishes plan as group's pending takeover.
func (as *Anchors) prepareTakeover(group string, plan *takeoverPlan) error {
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.takeovers == nil {
		as.takeovers = make(map[string]*takeoverPlan)
	}
	now := time.Now()
	for g, p := range as.takeovers {
		if now.Sub(p.at) > takeoverTTL {
			delete(as.takeovers, g)
		}
	}
	plan.at = now
	as.takeovers[group] = plan
	return nil
}

// TakeoverReady lets group's pending takeover complete: no request of
// its members is on its way to the cluster any more.
func (as *Anchors) TakeoverReady(group string) {
	as.mu.Lock()
	p := as.takeovers[group]
	as.mu.Unlock()
	if p != nil {
		select {
		case <-p.ready:
		default:
			close(p.ready)
		}
	}
}

// takeTakeover hands group's pending takeover to its anchor a (the
// group is being loaded) and returns its record; nil if none is
// pending, or a load had it already.
func (as *Anchors) takeTakeover(group string, a *anchor) []byte {
	as.mu.Lock()
	p := as.takeovers[group]
	if p == nil || p.loaded {
		as.mu.Unlock()
		return nil
	}
	p.loaded = true
	as.mu.Unlock()
	a.mu.Lock()
	a.takeover = p
	a.checked = true
	a.mu.Unlock()
	return p.record
}

// takeoverDone forgets plan once the anchor's join that completes it is
// answered.
func (as *Anchors) takeoverDone(group string, plan *takeoverPlan) {
	as.mu.Lock()
	if as.takeovers[group] == plan {
		delete(as.takeovers, group)
	}
	as.mu.Unlock()
}

// joinResult is the outcome of an anchor's JoinGroup.
type joinResult struct {
	resp kmsg.Response
	err  error
}

// joinTakingOver sends the anchor's JoinGroup req and, with plan, the
// LeaveGroup of the members the anchor replaces.
func (as *Anchors) joinTakingOver(ctx context.Context, a *anchor, plan *takeoverPlan, req kmsg.Request) (kmsg.Response, error) {
	code := func(r kmsg.Response) int16 { return r.(*kmsg.JoinGroupResponse).ErrorCode }
	if plan == nil {
		return as.request(ctx, a.group, req, code)
	}
	defer as.takeoverDone(a.group, plan)
	if plan.consumer {
		return as.joinAfterLeaving(ctx, a, plan, req)
	}
	if err := as.awaitTakeoverReady(ctx, a, plan); err != nil {
		return nil, err
	}
	ch := make(chan joinResult, 1)
	go func() {
		resp, err := as.request(ctx, a.group, req, code)
		ch <- joinResult{resp, err}
	}()
	select {
	case r := <-ch:
		// Answered before the members left: the join completed without
		// them (they had left already) or failed.
		return r.resp, r.err
	case <-time.After(leaveDelay):
	}
	leave := kmsg.NewPtrLeaveGroupRequest()
	leave.Group = a.group
	for _, m := range plan.members {
		lm := kmsg.NewLeaveGroupRequestMember()
		lm.MemberID, lm.InstanceID = m.MemberID, m.InstanceID
		reason := "taken over by kproxy"
		lm.Reason = &reason
		leave.Members = append(leave.Members, lm)
	}
	resp, err := as.request(ctx, a.group, leave, func(r kmsg.Response) int16 { return r.(*kmsg.LeaveGroupResponse).ErrorCode })
	switch {
	case err != nil:
		as.log.Warn("takeover: the members' LeaveGroup failed; the anchor's join waits for the cluster's rebalance", "group", a.group, "err", err)
	default:
		for _, m := range resp.(*kmsg.LeaveGroupResponse).Members {
			if m.ErrorCode != 0 {
				as.log.Info("takeover: a member was not in the cluster's group any more", "group", a.group,
					"member", m.MemberID, "err", kerr.ErrorForCode(m.ErrorCode))
			}
		}
	}
	r := <-ch
	return r.resp, r.err
}

// awaitTakeoverReady waits until plan is ready (TakeoverReady), at most
// takeoverWait.
func (as *Anchors) awaitTakeoverReady(ctx context.Context, a *anchor, plan *takeoverPlan) error {
	select {
	case <-plan.ready:
	case <-time.After(takeoverWait):
		as.log.Warn("takeover: members' requests still on their way to the cluster; joining anyway", "group", a.group)
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// DescribeClassicGroup returns what the cluster's coordinator answers
// DescribeGroups for group.
func (as *Anchors) DescribeClassicGroup(ctx context.Context, group string) (kmsg.DescribeGroupsResponseGroup, error) {
	return describeAnchored(as, group, func(as *Anchors) (kmsg.DescribeGroupsResponseGroup, bool, error) {
		return as.describeGroup(ctx, group)
	})
}
