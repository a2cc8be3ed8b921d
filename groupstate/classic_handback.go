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
// group. They join the cluster's rebalance carrying what they own, with
// a member id of the cluster's: the proxy turns that answer into
// MEMBER_ID_REQUIRED with an id it asked the cluster for (a dynamic
// member), or the member looks its coordinator up again, is sent to the
// cluster's, and kproxy clears the member id the cluster does not know.
// Commits at the engine's generation go on being accepted meanwhile,
// under the anchor's identity. Once they all stand in the cluster's
// rebalance the anchor leaves and the cluster completes it with every
// member at once: one rebalance, no partition owned twice.

// HandBack starts handing classic group back to the cluster's
// coordinator. It reports false when the engine cannot (it does not
// hold the group, the group has no members, or it is a KIP-848 group,
// whose members kproxy does not hand back), and otherwise the longest
// rebalance timeout among the members: how long the last of them may
// take to rejoin.
//
// moved are instance ids the cluster's group holds already: static
// members of kproxy's restarted against the brokers (a franz-go or Java
// static member does not leave when it stops). Each one the group
// lists is replaced there, as the cluster's coordinator replaces a
// static member that rejoins under a new member id (KIP-345): the
// engine takes it out of the group, so the process kproxy knew it by is
// fenced (its requests find its member id unknown), and freed returns
// what it was assigned, by instance id, for the cluster to give the
// member at once rather than after the hand-back.
func (e *Engine) HandBack(group string, moved []string) (wait time.Duration, freed map[string]map[string][]int32, ok bool) {
	type res struct {
		wait  time.Duration
		freed map[string]map[string][]int32
		ok    bool
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
		ch <- res{wait, g.replaceMovedStatic(moved), true}
	}) {
		return 0, nil, false
	}
	r := <-ch
	return r.wait, r.freed, r.ok
}

// replaceMovedStatic takes the static members of g whose instance ids
// are in moved out of g, which is being handed back, and returns what
// each was assigned, by instance id (only those assigned a partition).
func (g *classicGroup) replaceMovedStatic(moved []string) map[string]map[string][]int32 {
	var freed map[string]map[string][]int32
	if g.protocolType != "consumer" {
		moved = nil // not consumer protocol assignments: nothing to give
	}
	for _, inst := range moved {
		m := g.members[g.static[inst]]
		if m == nil {
			continue
		}
		owned := sortedOwned(decodeOwned(m.assignment))
		g.removeAndUpdate(m, EventMemberLeft, CauseHandedBack, CauseHandedBack)
		n := 0
		for _, ps := range owned {
			n += len(ps)
		}
		g.s.e.log.Info("groupstate: a static member moved back to the cluster's coordinator: replaced there", "group", g.id,
			"instance_id", inst, "member", m.id, "partitions", n)
		if n == 0 {
			continue
		}
		if freed == nil {
			freed = make(map[string]map[string][]int32)
		}
		freed[inst] = owned
	}
	return freed
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

// leaveJoinHold is how long a rebalance that a leave started in an
// anchored group stays open at least.
//
// A member moved back to the cluster leaves kproxy's group, and its
// restart joins the cluster's group a moment later, which starts the
// hand-back. Directly, that member joins the rebalance its own leave
// started, while the partitions it freed are still unowned, because the
// cluster completes it only once the others rejoined at their next
// heartbeat. The engine's rebalance used to complete as soon as the
// others rejoined, often before the hand-back began (Kafka 4.1.1,
// java-adoption: 354 ms after the leave, the member moved back ready 2 ms
// before): the others took the leaver's partitions, and a cooperative
// group then needed two rounds at the cluster (revoke, then assign at
// the next heartbeat) where directly it needs one. Held open, the
// hand-back answers the waiting JoinGroups NOT_COORDINATOR and the
// members reach the cluster's rebalance owning only what they owned
// before the leave. The cost, where no member moves back: a leave's
// rebalance completes no sooner than this after it (eager members stay
// revoked as long), where directly it completes once the others rejoined
// at their next heartbeat (3 s interval by default for Java).
const leaveJoinHold = time.Second

// holdJoinAfterLeave keeps the rebalance a leave starts from completing
// before leaveJoinHold, in a group anchored in the cluster's coordinator
// with members left (only there can a member move back).
func (g *classicGroup) holdJoinAfterLeave() {
	if g.s.e.anchors == nil || len(g.members) == 0 || g.handingBack {
		return
	}
	stopTimer(g.joinHold)
	g.joinHold = g.s.arm(leaveJoinHold, func(id uint64) {
		if !g.live() || g.joinHold.id != id {
			return
		}
		g.joinHold = timerRef{}
		g.maybeCompleteJoin()
	})
}

// joinHeld reports whether a leave holds the join phase open.
func (g *classicGroup) joinHeld() bool {
	return g.joinHold.t != nil
}
