package groupstate

import (
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Handing a classic group back to the cluster's coordinator
// (docs/anchors.md, "Handing a group back"). A member of an anchored
// group that reaches the cluster directly (its application is being
// moved back off kproxy) joins the cluster's group beside the anchor,
// and the cluster starts a rebalance that waits for the anchor. The
// anchor holds off its rejoin and the engine moves its own members over
// within that rebalance: it starts a rebalance of its own, so every
// member's next heartbeat says REBALANCE_IN_PROGRESS (an eager member
// revokes and commits, a cooperative one keeps what it owns), and
// answers their JoinGroup with NOT_COORDINATOR, taking them out of the
// group. They look their coordinator up again, are sent to the
// cluster's, and join its rebalance carrying what they own (kproxy
// clears the member id the cluster does not know, so they get one of
// its own). Commits at the engine's generation go on being accepted
// meanwhile, under the anchor's identity. Once they all stand in the
// cluster's rebalance the anchor leaves and the cluster completes it
// with every member at once: one rebalance, no partition owned twice.

// HandBack starts handing classic group back to the cluster's
// coordinator. It reports false when the engine cannot (it does not
// hold the group, the group has no members, or it is a KIP-848 group,
// whose members kproxy does not hand back), and otherwise the longest
// rebalance timeout among the members: how long the last of them may
// take to rejoin.
func (e *Engine) HandBack(group string) (time.Duration, bool) {
	type res struct {
		wait time.Duration
		ok   bool
	}
	ch := make(chan res, 1)
	s := e.shardFor(group)
	if !s.post(func() {
		g, ok := s.classicOf(group)
		if !ok || g.state == stateDead || len(g.members) == 0 {
			ch <- res{}
			return
		}
		wait := g.rebalanceTimeout()
		g.startHandBack()
		ch <- res{wait, true}
	}) {
		return 0, false
	}
	r := <-ch
	return r.wait, r.ok
}

// startHandBack marks g handed back and starts its rebalance; the
// members already waiting in a JoinGroup are answered NOT_COORDINATOR
// and leave the group at once.
func (g *classicGroup) startHandBack() {
	if g.handingBack {
		return
	}
	g.handingBack = true
	g.s.e.log.Info("groupstate: handing the group back to the cluster's coordinator", "group", g.id,
		"members", len(g.members), "generation", g.generation)
	for id, p := range g.pending {
		stopTimer(p.timer)
		delete(g.pending, id)
	}
	var parked []*classicMember
	for _, id := range g.order {
		if m := g.members[id]; m.joinReply != nil {
			parked = append(parked, m)
		}
	}
	if g.state.canRebalance() {
		g.prepareRebalance(CauseHandedBack, nil)
	}
	for _, m := range parked {
		if g.members[m.id] == m && m.joinReply != nil {
			reply := m.joinReply
			m.joinReply = nil
			g.awaitingJoin--
			g.removeAndUpdate(m, EventMemberLeft, CauseHandedBack, CauseHandedBack)
			reply(joinError(errNotCoordinator, m.id))
		}
	}
}

// refuseHandedBackJoin answers a JoinGroup of g, which is being handed
// back: NOT_COORDINATOR, and a known member leaves the group.
func (g *classicGroup) refuseHandedBackJoin(r *kmsg.JoinGroupRequest, reply func(kmsg.Response)) {
	if m, ok := g.members[r.MemberID]; ok {
		if m.joinReply != nil {
			g.awaitingJoin--
			m.joinReply = nil
		}
		g.removeAndUpdate(m, EventMemberLeft, CauseHandedBack, CauseHandedBack)
	}
	reply(joinError(errNotCoordinator, r.MemberID))
}
