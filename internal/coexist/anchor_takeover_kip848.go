package coexist

import (
	"context"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Takeover of a forwarded KIP-848 group (docs/anchors.md, "Rolling
// kproxy in"). As for a classic group (anchor_takeover.go) the engine is handed
// the group as the cluster holds it (a consumer group record:
// groupstate.Engine.ConsumerTakeoverRecord) and its members' requests
// stop being forwarded; the anchor's first join then takes their place.
// The order differs: a classic JoinGroup into a consumer group that still
// has members would make the anchor a member of that group, given
// partitions by the cluster's assignor out of the members' (Kafka's
// GroupMetadataManager.classicGroupJoinToConsumerGroup). So the members
// leave first, in one LeaveGroup (Kafka 4.x fences consumer-protocol
// members named in a LeaveGroup: classicGroupLeaveToConsumerGroup, one
// write and one epoch bump), and each member the LeaveGroup did not
// remove leaves by a ConsumerGroupHeartbeat at epoch -1 on its behalf
// (kfake, the tests' cluster, takes only those). The group is then
// Empty, and the anchor's JoinGroup converts it into a classic group
// (maybeDeleteEmptyConsumerGroup: the group's records are deleted, its
// offsets kept) and waits group.initial.rebalance.delay.ms (3 s by
// default) before it completes. Commits wait for the anchor's join
// meanwhile (commitIdentity): none is lost, none goes out anonymously.

// PrepareConsumerTakeover is PrepareTakeover for a KIP-848 group:
// record is a consumer group record, and the anchor's first join takes
// members out of the cluster's group before it joins.
func (as *Anchors) PrepareConsumerTakeover(group string, record []byte, members []TakeoverMember) error {
	return as.prepareTakeover(group, &takeoverPlan{record: record, members: members, ready: make(chan struct{}), consumer: true})
}

// DescribeConsumerGroup returns what the cluster's coordinator answers
// ConsumerGroupDescribe for group.
func (as *Anchors) DescribeConsumerGroup(ctx context.Context, group string) (kmsg.ConsumerGroupDescribeResponseGroup, error) {
	return describeAnchored(as, group, func(as *Anchors) (kmsg.ConsumerGroupDescribeResponseGroup, bool, error) {
		return describeOne(ctx, as, group, &kmsg.ConsumerGroupDescribeRequest{Groups: []string{group}},
			func(r *kmsg.ConsumerGroupDescribeResponse) []kmsg.ConsumerGroupDescribeResponseGroup { return r.Groups },
			func(g kmsg.ConsumerGroupDescribeResponseGroup) int16 { return g.ErrorCode })
	})
}

// joinAfterLeaving completes a KIP-848 takeover: once no member request
// is on its way to the cluster (plan.ready), the members leave the
// cluster's group, then the anchor's JoinGroup req goes out.
func (as *Anchors) joinAfterLeaving(ctx context.Context, a *anchor, plan *takeoverPlan, req kmsg.Request) (kmsg.Response, error) {
	if err := as.awaitTakeoverReady(ctx, a, plan); err != nil {
		return nil, err
	}
	as.removeConsumerMembers(ctx, a.group, plan.members)
	return as.request(ctx, a.group, req, func(r kmsg.Response) int16 { return r.(*kmsg.JoinGroupResponse).ErrorCode })
}

// removeConsumerMembers takes members out of the cluster's KIP-848
// group: one LeaveGroup, then a leave heartbeat for each member it did
// not remove. A member the cluster no longer has is gone already; any
// other failure is logged: the anchor's join then finds the group not
// empty and hands it back (join).
func (as *Anchors) removeConsumerMembers(ctx context.Context, group string, members []TakeoverMember) {
	leave := kmsg.NewPtrLeaveGroupRequest()
	leave.Group = group
	reason := "taken over by kproxy"
	for _, m := range members {
		lm := kmsg.NewLeaveGroupRequestMember()
		lm.MemberID, lm.InstanceID, lm.Reason = m.MemberID, m.InstanceID, &reason
		leave.Members = append(leave.Members, lm)
	}
	left := make(map[string]bool)
	resp, err := as.request(ctx, group, leave, func(r kmsg.Response) int16 { return r.(*kmsg.LeaveGroupResponse).ErrorCode })
	if err != nil {
		as.log.Info("takeover: the members' LeaveGroup failed; they leave one by one", "group", group, "err", err)
	} else {
		for _, m := range resp.(*kmsg.LeaveGroupResponse).Members {
			if m.ErrorCode == 0 {
				left[m.MemberID] = true
			}
		}
	}
	for _, m := range members {
		if left[m.MemberID] {
			continue
		}
		hb := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		hb.Group, hb.MemberID, hb.InstanceID, hb.MemberEpoch = group, m.MemberID, m.InstanceID, -1
		resp, err := as.request(ctx, group, hb, func(r kmsg.Response) int16 { return r.(*kmsg.ConsumerGroupHeartbeatResponse).ErrorCode })
		switch {
		case err != nil:
			as.log.Warn("takeover: a member's leave failed", "group", group, "member", m.MemberID, "err", err)
		case resp.(*kmsg.ConsumerGroupHeartbeatResponse).ErrorCode == kerr.UnknownMemberID.Code:
			// Gone already.
		case resp.(*kmsg.ConsumerGroupHeartbeatResponse).ErrorCode != 0:
			as.log.Warn("takeover: a member's leave was refused", "group", group, "member", m.MemberID,
				"err", kerr.ErrorForCode(resp.(*kmsg.ConsumerGroupHeartbeatResponse).ErrorCode))
		}
	}
}

// handBackWait bounds how long an anchor that found the cluster's group
// turned into a KIP-848 group with members of its own waits for kproxy's
// members to reach that group before it leaves.
const handBackWait = 30 * time.Second

// handBackSlack is what a member told to rejoin needs beyond its
// heartbeat interval to be back in the cluster's group: the answer, its
// rejoin, the next describe.
const handBackSlack = time.Second

// handBackPoll is how often a KIP-848 hand-back looks at the cluster's
// group and at the fencings of kproxy's members.
const handBackPoll = 200 * time.Millisecond

// handBackFencedGrace is how long a KIP-848 hand-back waits after every
// one of kproxy's members was seen fenced by the cluster before the
// anchor leaves: the fencing was seen as it went to the member, which
// then drops its partitions (franz-go and Java at once, before they
// rejoin).
const handBackFencedGrace = 500 * time.Millisecond

// memberHeartbeatInterval is AnchorOptions.MemberHeartbeatInterval, 5s
// when unset.
func (as *Anchors) memberHeartbeatInterval() time.Duration {
	if f := as.opts.MemberHeartbeatInterval; f != nil {
		if d := f(); d > 0 {
			return d
		}
	}
	return 5 * time.Second
}

// handBackConsumer hands group back to the cluster when the anchor's
// JoinGroup (member id memberID) found the cluster's group a KIP-848
// group with members of its own (a member moved back to the brokers:
// Kafka upgraded the anchored classic group and counts the anchor, a
// classic member, as owning the partitions it joined with). It reports
// false when the group is not a KIP-848 group on the cluster (the caller
// hands a classic group back its own way).
//
// The order keeps every partition with one owner. The anchor first stops
// the group here (lose: the engine unloads it and forwards it), so
// kproxy's members are sent to the cluster, which does not know them:
// they drop their partitions and rejoin there. Until the anchor leaves,
// the cluster holds the partitions it joined with for it, so the
// newcomers get none of them. The anchor leaves, and the cluster
// assigns them, once every one of kproxy's members was fenced by the
// cluster on a heartbeat a kproxy of the fleet forwarded (the watcher
// sees the answer on its way to the member: MembersFenced), and
// handBackFencedGrace passed; or once every one of them is back in the
// cluster's group under its id (a client that keeps its id when
// fenced, as Java's); or once the cluster's group holds as many members
// beyond the direct ones it had as kproxy had, a heartbeat interval
// after the unload (franz-go takes a new id after UNKNOWN_MEMBER_ID, so
// a member back cannot be told from a newcomer by its id; but a
// heartbeat interval after the unload every one of kproxy's members
// that can reach the cluster was told, and dropped its partitions,
// whoever the members counted are); or after handBackWait.
func (as *Anchors) handBackConsumer(ctx context.Context, a *anchor, memberID string) bool {
	d, err := as.DescribeConsumerGroup(ctx, a.group)
	if err != nil || d.ErrorCode != 0 {
		return false
	}
	ours := func(m kmsg.ConsumerGroupDescribeResponseGroupMember) bool {
		return m.MemberID == memberID || as.isAnchor(m.InstanceID)
	}
	direct := make(map[string]bool)
	for _, m := range d.Members {
		if !ours(m) {
			direct[m.MemberID] = true
		}
	}
	a.mu.Lock()
	ids := a.want.MemberIDs
	a.mu.Unlock()
	as.log.Warn("a member reached the cluster's group directly; handing the KIP-848 group back once kproxy's members rejoined there",
		"group", a.group, "direct_members", len(direct), "kproxy_members", len(ids))
	began := time.Now()
	as.lose(a, AnchorLiveOnCluster)
	told := as.memberHeartbeatInterval() + handBackSlack
	back, joined, fenced := 0, 0, 0
	var allFenced time.Time // when every one of ids was first seen fenced
	for time.Since(began) < handBackWait && ctx.Err() == nil && back < len(ids) &&
		(joined < len(ids) || time.Since(began) < told) {
		time.Sleep(handBackPoll)
		if f := as.opts.MembersFenced; f != nil && len(ids) > 0 {
			fenced = len(f(a.group, began, ids))
			switch {
			case fenced < len(ids):
				allFenced = time.Time{}
			case allFenced.IsZero():
				allFenced = time.Now()
			}
			if !allFenced.IsZero() && time.Since(allFenced) >= handBackFencedGrace {
				break
			}
		}
		d, err := as.DescribeConsumerGroup(ctx, a.group)
		if err != nil || d.ErrorCode != 0 {
			continue
		}
		back, joined = 0, 0
		for _, m := range d.Members {
			switch {
			case slices.Contains(ids, m.MemberID):
				back++
				joined++
			case !ours(m) && !direct[m.MemberID]:
				joined++
			}
		}
	}
	if err := as.leave(ctx, a.group, memberID); err != nil {
		as.log.Warn("the anchor's leave failed; the cluster removes it after its session", "group", a.group, "err", err)
	}
	as.log.Info("KIP-848 group handed back to the cluster", "group", a.group, "kproxy_members_back", back,
		"members_joined", joined, "kproxy_members_fenced", fenced, "of", len(ids), "waited", time.Since(began).Round(time.Millisecond))
	return true
}
