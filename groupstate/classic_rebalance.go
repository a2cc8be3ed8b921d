package groupstate

import (
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// This file holds the rebalance core shared by the request handlers and
// the timers: starting a rebalance, completing the join phase, removing
// members, and the expiry paths. Everything runs on the owning loop.

// maybeRebalanceOrCompleteJoin starts a rebalance if the state allows,
// or, while preparing, completes the join if everyone is in.
func (g *classicGroup) maybeRebalanceOrCompleteJoin(cause string, causer *classicMember) {
	if g.state.canRebalance() {
		g.prepareRebalance(cause, causer)
	} else if g.state == statePreparingRebalance {
		g.maybeCompleteJoin()
	}
}

// prepareRebalance moves the group to PreparingRebalance.
func (g *classicGroup) prepareRebalance(cause string, causer *classicMember) {
	from := g.state
	if from == stateCompletingRebalance {
		// Assignments of the aborted generation are void: tell every
		// member waiting in SyncGroup to rejoin.
		for _, id := range g.order {
			m := g.members[id]
			m.assignment, m.owned = nil, nil
			if m.syncReply != nil {
				m.answerSync(syncError(errRebalanceInProgress))
				m.askedAt = g.s.e.clock.Now()
			}
		}
	}
	stopTimer(g.syncTimer)
	stopTimer(g.emptyTimer)
	g.syncTimer, g.emptyTimer = timerRef{}, timerRef{}
	clear(g.pendingSync)

	initial := from == stateEmpty && g.s.e.cfg.InitialRebalanceDelay > 0
	if !g.transitionTo(statePreparingRebalance) {
		return
	}
	if from == stateCompletingRebalance {
		ev := g.event(EventRebalanceAborted)
		ev.Cause = cause
		g.s.emit(ev)
	}
	if g.s.e.cfg.Events != nil {
		ev := g.event(EventRebalanceStarted)
		ev.Cause = cause
		if causer != nil {
			pm := causer.public(false)
			ev.Member = &pm
		}
		if initial {
			ev.InitialDelay = g.s.e.cfg.InitialRebalanceDelay
		}
		g.s.emit(ev)
	}
	g.s.e.log.Debug("groupstate: rebalance started", "group", g.id, "cause", cause, "generation", g.generation)
	if initial {
		delay := g.s.e.cfg.InitialRebalanceDelay
		g.newMemberAdded = false
		g.armInitialDelay(delay, max(g.rebalanceTimeout()-delay, 0))
		return
	}
	if g.allJoined() && !g.joinHeld() {
		g.completeJoin()
		return
	}
	g.armJoinTimer(g.rebalanceTimeout())
}

// maybeCompleteJoin completes the join phase if every member has rejoined,
// except during the initial delay, which never completes early.
func (g *classicGroup) maybeCompleteJoin() {
	if g.state != statePreparingRebalance || !g.allJoined() {
		return
	}
	if g.prevState == stateEmpty && g.s.e.cfg.InitialRebalanceDelay > 0 || g.joinHeld() {
		return
	}
	g.completeJoin()
}

// completeJoin ends the join phase: drops dynamic members that did not
// rejoin, elects a leader among those that did, starts the next generation
// and answers every parked JoinGroup.
func (g *classicGroup) completeJoin() {
	stopTimer(g.joinTimer)
	g.joinTimer = timerRef{}
	for _, id := range append([]string(nil), g.order...) {
		m := g.members[id]
		if m.joinReply == nil && m.instanceID == "" {
			g.remove(id)
			g.emitMember(EventMemberExpired, m, "join_timeout")
		}
	}
	if len(g.members) > 0 && !g.electJoinedLeader() {
		// Nobody rejoined: wait for session timeouts to clear them.
		g.s.e.log.Warn("groupstate: no member rejoined; waiting", "group", g.id)
		g.armJoinTimer(g.rebalanceTimeout())
		return
	}
	g.generation++
	if len(g.members) == 0 {
		g.protocol = ""
		g.leader = ""
		if !g.transitionTo(stateEmpty) {
			return
		}
		g.s.emit(g.event(EventRebalanceAborted))
		g.s.emit(g.event(EventGroupEmpty))
		g.armEmptyTimer()
		g.persist()
		return
	}
	g.protocol = g.selectProtocol()
	if !g.transitionTo(stateCompletingRebalance) {
		return
	}
	leaderMembers := make([]kmsg.JoinGroupResponseMember, 0, len(g.order))
	for _, id := range g.order {
		m := g.members[id]
		jm := kmsg.NewJoinGroupResponseMember()
		jm.MemberID = m.id
		if m.instanceID != "" {
			iid := m.instanceID
			jm.InstanceID = &iid
		}
		jm.ProtocolMetadata = m.metadataFor(g.protocol)
		leaderMembers = append(leaderMembers, jm)
	}
	pt, proto := g.protocolType, g.protocol
	for _, id := range g.order {
		m := g.members[id]
		if m.joinReply != nil {
			resp := kmsg.NewPtrJoinGroupResponse()
			resp.Generation = g.generation
			resp.ProtocolType = &pt
			resp.Protocol = &proto
			resp.LeaderID = g.leader
			resp.MemberID = m.id
			if m.id == g.leader {
				resp.Members = leaderMembers
			}
			g.awaitingJoin--
			m.answerJoin(resp)
		} else {
			m.joinAt = time.Time{} // it did not rejoin in this round
		}
		m.syncAt = time.Time{}
		g.rearmSession(m)
		m.isNew = false
		g.pendingSync[m.id] = struct{}{}
	}
	g.armSyncTimer(g.rebalanceTimeout())
	if g.s.e.cfg.Events != nil {
		ev := g.event(EventJoinCompleted)
		ev.Members = g.membersList(false)
		for i := range ev.Members {
			m := g.members[ev.Members[i].MemberID]
			ev.Members[i].JoinedAt, ev.Members[i].AskedAt = m.joinAt, m.askedAt
		}
		g.s.emit(ev)
	}
	for _, m := range g.members {
		m.askedAt = time.Time{}
	}
	g.s.e.log.Debug("groupstate: join completed", "group", g.id, "generation", g.generation,
		"members", len(g.members), "leader", g.leader, "protocol", g.protocol)
}

// electJoinedLeader keeps the leader if it rejoined, else picks the first
// member that did; it reports false if nobody rejoined.
func (g *classicGroup) electJoinedLeader() bool {
	if l, ok := g.members[g.leader]; ok && l.joinReply != nil {
		return true
	}
	for _, id := range g.order {
		if g.members[id].joinReply != nil {
			g.leader = id
			return true
		}
	}
	return false
}

// removeAndUpdate removes m and moves the group on: a rebalance from
// Stable or CompletingRebalance, a join completion attempt while
// preparing.
func (g *classicGroup) removeAndUpdate(m *classicMember, kind EventKind, cause, rebalanceCause string) {
	g.remove(m.id)
	g.emitMember(kind, m, cause)
	switch g.state {
	case stateStable, stateCompletingRebalance:
		g.prepareRebalance(rebalanceCause, m)
	case statePreparingRebalance:
		g.maybeCompleteJoin()
	}
}

// onMemberTimeout handles a member's heartbeat timer. A member waiting in
// JoinGroup or SyncGroup satisfies its heartbeat unless it is new.
func (g *classicGroup) onMemberTimeout(m *classicMember) {
	if g.state == stateDead {
		return
	}
	if !m.isNew && (m.joinReply != nil || m.syncReply != nil) {
		return
	}
	cause := "session_timeout"
	if m.isNew {
		cause = "new_member_timeout"
	}
	g.s.e.log.Info("groupstate: member expired", "group", g.id, "member", m.id, "cause", cause)
	g.removeAndUpdate(m, EventMemberExpired, cause, CauseMemberExpired)
}

// onSyncTimeout removes the members that never sent SyncGroup in
// generation gen and rebalances (KAFKA-12890).
func (g *classicGroup) onSyncTimeout(gen int32) {
	if gen != g.generation || (g.state != stateCompletingRebalance && g.state != stateStable) {
		return
	}
	if len(g.pendingSync) == 0 {
		return
	}
	var removed []*classicMember
	for _, id := range append([]string(nil), g.order...) {
		if _, ok := g.pendingSync[id]; ok {
			removed = append(removed, g.remove(id))
		}
	}
	clear(g.pendingSync)
	for _, m := range removed {
		g.emitMember(EventMemberExpired, m, "sync_timeout")
	}
	var causer *classicMember
	if len(removed) > 0 {
		causer = removed[0]
	}
	g.prepareRebalance(CauseSyncTimeout, causer)
}
