package groupstate

import "time"

// Timers never mutate state: a timer's function only posts an event to
// the owning loop, and the event is keyed by the timer's id so that a
// timer that was cancelled or replaced, but fired anyway, is ignored.

// timerRef is an armed timer and its key (0 = none).
type timerRef struct {
	id uint64
	t  Timer
}

// stopTimer stops t if it is armed; staleness checks cover a timer that
// fires anyway.
func stopTimer(t timerRef) {
	if t.t != nil {
		t.t.Stop()
	}
}

// arm starts a timer that, after d, runs fire(id) on the shard's loop.
func (s *shard) arm(d time.Duration, fire func(id uint64)) timerRef {
	id := s.nextTimerID()
	t := s.e.clock.AfterFunc(d, func() {
		s.post(func() { fire(id) })
	})
	return timerRef{id: id, t: t}
}

// live reports whether g is still the group the shard holds under its id.
func (g *classicGroup) live() bool { return g.s.groups[g.id] == group(g) }

// cancelAllTimers stops every timer of the group and its members.
func (g *classicGroup) cancelAllTimers() {
	stopTimer(g.joinTimer)
	stopTimer(g.syncTimer)
	stopTimer(g.emptyTimer)
	stopTimer(g.joinHold)
	g.joinTimer, g.syncTimer, g.emptyTimer, g.joinHold = timerRef{}, timerRef{}, timerRef{}, timerRef{}
	for _, m := range g.members {
		stopTimer(m.timer)
		m.timer = timerRef{}
	}
}

// armMemberTimer (re)arms m's heartbeat timer for d.
func (g *classicGroup) armMemberTimer(m *classicMember, d time.Duration) {
	stopTimer(m.timer)
	m.sessionTimer = false
	m.timer = g.s.arm(d, func(id uint64) {
		if !g.live() {
			return
		}
		cur, ok := g.members[m.id]
		if !ok || cur != m || m.timer.id != id {
			return
		}
		m.timer = timerRef{}
		g.onMemberTimeout(m)
	})
}

// rearmSession moves m's session deadline to now plus its session
// timeout (a heartbeat, a commit, a join or a sync). Stopping and
// starting a runtime timer on every heartbeat cost more than the rest of
// the heartbeat, so an armed session timer that fires no later than the
// new deadline is kept: when it fires early it arms itself again for
// what is left (armSessionTimer). The member still expires exactly at
// its last deadline.
func (g *classicGroup) rearmSession(m *classicMember) {
	deadline := g.s.e.clock.Now().Add(m.sessionTimeout)
	if m.sessionTimer && m.timer.t != nil && !deadline.Before(m.sessionFireAt) {
		m.sessionDeadline = deadline
		return
	}
	g.armSessionTimer(m, deadline)
}

// armSessionTimer arms m's session timer for deadline.
func (g *classicGroup) armSessionTimer(m *classicMember, deadline time.Time) {
	stopTimer(m.timer)
	now := g.s.e.clock.Now()
	m.sessionTimer, m.sessionFireAt, m.sessionDeadline = true, deadline, deadline
	m.timer = g.s.arm(deadline.Sub(now), func(id uint64) {
		if !g.live() {
			return
		}
		cur, ok := g.members[m.id]
		if !ok || cur != m || m.timer.id != id {
			return
		}
		if g.s.e.clock.Now().Before(m.sessionDeadline) {
			g.armSessionTimer(m, m.sessionDeadline) // heartbeats came since
			return
		}
		m.timer, m.sessionTimer = timerRef{}, false
		g.onMemberTimeout(m)
	})
}

// armPendingTimer arms the session timer of a KIP-394 pending member.
func (g *classicGroup) armPendingTimer(p *pendingMember, d time.Duration) {
	p.timer = g.s.arm(d, func(id uint64) {
		if !g.live() {
			return
		}
		cur, ok := g.pending[p.id]
		if !ok || cur != p || p.timer.id != id {
			return
		}
		delete(g.pending, p.id)
		g.s.e.log.Debug("groupstate: pending member expired", "group", g.id, "member", p.id)
		g.maybeCompleteJoin()
	})
}

// armJoinTimer arms the rebalance timer: when it fires the join completes
// with whoever rejoined.
func (g *classicGroup) armJoinTimer(d time.Duration) {
	stopTimer(g.joinTimer)
	g.joinTimer = g.s.arm(d, func(id uint64) {
		if !g.live() || g.joinTimer.id != id {
			return
		}
		g.joinTimer = timerRef{}
		if g.state == statePreparingRebalance {
			g.completeJoin()
		}
	})
}

// armInitialDelay arms one step of the initial rebalance delay (KIP-134).
func (g *classicGroup) armInitialDelay(delay, remaining time.Duration) {
	stopTimer(g.joinTimer)
	g.joinTimer = g.s.arm(delay, func(id uint64) {
		if !g.live() || g.joinTimer.id != id {
			return
		}
		g.joinTimer = timerRef{}
		if g.state != statePreparingRebalance {
			return
		}
		if g.newMemberAdded && remaining != 0 {
			g.newMemberAdded = false
			next := min(delay, remaining)
			g.armInitialDelay(next, max(remaining-delay, 0))
			return
		}
		g.completeJoin()
	})
}

// armSyncTimer arms the pending-sync timer for the current generation.
func (g *classicGroup) armSyncTimer(d time.Duration) {
	stopTimer(g.syncTimer)
	gen := g.generation
	g.syncTimer = g.s.arm(d, func(id uint64) {
		if !g.live() || g.syncTimer.id != id {
			return
		}
		g.syncTimer = timerRef{}
		g.onSyncTimeout(gen)
	})
}

// armEmptyTimer arms the timer that forgets an Empty group after
// Config.EmptyGroupRetention. It fires into nothing if the group left
// Empty meanwhile, and waits again while KIP-394 members are pending.
func (g *classicGroup) armEmptyTimer() {
	g.armEmptyTimerFor(g.s.e.cfg.EmptyGroupRetention)
}

// armEmptyTimerFor is armEmptyTimer with the first wait given (a loaded
// group waits out the rest of its retention); negative never fires.
func (g *classicGroup) armEmptyTimerFor(d time.Duration) {
	if d < 0 || g.s.e.cfg.EmptyGroupRetention < 0 {
		return
	}
	stopTimer(g.emptyTimer)
	g.emptyTimer = g.s.arm(d, func(id uint64) {
		if !g.live() || g.emptyTimer.id != id {
			return
		}
		g.emptyTimer = timerRef{}
		if g.state != stateEmpty || len(g.members) > 0 {
			return
		}
		if len(g.pending) > 0 {
			g.armEmptyTimer()
			return
		}
		g.cancelAllTimers()
		g.transitionTo(stateDead)
		g.s.drop(g.id, g)
		g.s.unanchor(g.id)
		if g.generation > 0 {
			g.s.tombstone(g.id)
		}
		g.s.e.log.Debug("groupstate: forgot a long-empty group", "group", g.id)
	})
}
