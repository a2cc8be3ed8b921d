package groupstate

import "time"

// Partitions a leave freed, withheld for a member moved back to the
// cluster (docs/anchors.md, "Out (rollback)").
//
// The anchor of a KIP-848 group holds, in the cluster's group, every
// partition of the topics the members subscribe to (anchorChanged), so
// that a member moved back to the cluster, whose join converts the
// cluster's group into a consumer group (Kafka's online upgrade keeps a
// classic member's assignment as what it owns), is never given one that
// the engine may hand out too. That member then got nothing until the
// hand-back was done and its own next heartbeat came (5 s in
// franz-kip848-adoption on Kafka 4.1.1, against 0.0-0.1 s for the same
// move directly, where the partitions its leave freed are unowned when it
// rejoins and are assigned at once).
//
// So when a member leaves a group that is anchored and keeps members, the
// partitions it held are withheld: no member of the engine is given them
// (ownedByOther), and the anchor lets them go at the cluster (Owned leaves
// them out). A member moved back within the window (withholdFor, or the
// group's heartbeat interval if shorter: directly the others would be
// given the partitions at their next heartbeat, up to an interval after
// the leave, so a window of at most an interval costs a plain leave about
// what it may cost directly) converts a group in
// which nobody holds them and gets them in its first heartbeat's answer,
// as directly; the hand-back follows as before. Once withholdFor passed
// (or a member joined the engine's group, which the partitions may be
// meant for), the anchor takes them back, and only when it reports a sync
// that holds them (Engine.AnchorHeld, of an Anchor version at least the
// one that took them back) are they given out: a conversion before that
// sync finds them the anchor's, one after it makes the anchor hand the
// group back before the engine gave them to anyone. An anchor that does
// not report within withholdConfirmWait (it cannot join) no longer holds
// anything the engine must wait for: they are given out then.
//
// The cost, on a plain leave: the others are given the partitions after
// withholdFor and the anchor's rejoin instead of at their next heartbeat;
// meanwhile their heartbeats are answered with an interval of at most
// withheldHeartbeat, so they learn it within that of the anchor's sync.
// Directly they learn it at their next heartbeat, up to the cluster's
// group.consumer.heartbeat.interval.ms (5 s by default).
const (
	withholdFor         = 3 * time.Second
	withholdConfirmWait = 10 * time.Second
	withheldHeartbeat   = 500 * time.Millisecond
)

// withholding is a consumer group's withheld partitions (owned by the
// loop of the shard that holds the group, as the group is).
type withholding struct {
	parts map[tp]struct{}
	// reclaimVersion is, once the anchor was asked to take them back,
	// the first Anchor version that holds them; 0 before (versions start
	// at 1).
	reclaimVersion uint64
	timer          timerRef
}

// withholdFreed withholds the partitions m held, which its leave frees,
// if the group is anchored and keeps other members.
func (g *consumerGroup) withholdFreed(m *consumerMember) {
	if g.s.e.anchors == nil || len(g.members) <= 1 {
		return
	}
	if m.Assigned.size()+m.Pending.size() == 0 {
		return
	}
	if g.withheld == nil {
		g.withheld = &withholding{parts: make(map[tp]struct{})}
	}
	w := g.withheld
	for _, ps := range []partSet{m.Assigned, m.Pending} {
		for t, parts := range ps {
			for p := range parts {
				w.parts[tp{t, p}] = struct{}{}
			}
		}
	}
	w.reclaimVersion = 0
	stopTimer(w.timer)
	_, interval := g.settings()
	w.timer = g.s.arm(min(withholdFor, interval), func(id uint64) {
		if !g.live() || g.withheld != w || w.timer.id != id {
			return
		}
		w.timer = timerRef{}
		g.reclaimWithheld()
	})
	g.s.e.log.Debug("groupstate: withholding the partitions a leave freed, for a member moved back to the cluster",
		"group", g.id, "member", m.id, "partitions", len(w.parts))
}

// reclaimWithheld asks the anchor to take the withheld partitions back;
// they are given out once it says it holds them (anchorHeld) or after
// withholdConfirmWait.
func (g *consumerGroup) reclaimWithheld() {
	w := g.withheld
	if w == nil || w.reclaimVersion != 0 {
		return
	}
	stopTimer(w.timer)
	// The next version the shard numbers is the first Anchor of g's
	// that holds them: the one anchorChanged sends now, or a later one.
	w.reclaimVersion = g.s.anchorVersion + 1
	g.anchorChanged()
	w.timer = g.s.arm(withholdConfirmWait, func(id uint64) {
		if !g.live() || g.withheld != w || w.timer.id != id {
			return
		}
		w.timer = timerRef{}
		g.s.e.log.Warn("groupstate: the anchor did not confirm holding the withheld partitions; giving them out",
			"group", g.id, "partitions", len(w.parts), "waited", withholdConfirmWait)
		g.endWithholding()
	})
}

// anchorHeld is the store's report that the anchor's last sync holds
// the Anchor of version.
func (g *consumerGroup) anchorHeld(version uint64) {
	if w := g.withheld; w != nil && w.reclaimVersion != 0 && version >= w.reclaimVersion {
		g.endWithholding()
	}
}

// endWithholding gives the withheld partitions back to the assignment:
// members whose target holds them get them at their next heartbeat.
func (g *consumerGroup) endWithholding() {
	if g.withheld == nil {
		return
	}
	stopTimer(g.withheld.timer)
	g.withheld = nil
}

// withholds reports whether x is withheld from every member.
func (g *consumerGroup) withholds(x tp) bool {
	if g.withheld == nil {
		return false
	}
	_, ok := g.withheld.parts[x]
	return ok
}

// releasedToCluster reports whether the anchor lets x go at the cluster:
// withheld and not yet taken back.
func (g *consumerGroup) releasedToCluster(x tp) bool {
	return g.withheld != nil && g.withheld.reclaimVersion == 0 && g.withholds(x)
}

// heartbeatEvery is the interval a member's heartbeat is answered with:
// the group's, or withheldHeartbeat while partitions are withheld.
func (g *consumerGroup) heartbeatEvery() time.Duration {
	_, interval := g.settings()
	if g.withheld != nil && interval > withheldHeartbeat {
		return withheldHeartbeat
	}
	return interval
}

// AnchorHeld tells the engine that the anchor of group holds, in the
// cluster's group, what the Anchor of version says (a sync completed
// with it): partitions withheld for a member moved back are given out
// once the anchor holds them again. It does not block.
func (e *Engine) AnchorHeld(group string, version uint64) {
	s := e.shardFor(group)
	s.post(func() {
		if g, ok := s.consumerOf(group); ok {
			g.anchorHeld(version)
		}
	})
}
