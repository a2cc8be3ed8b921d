package coexist

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Handing a group back (docs/anchors.md, "Rolling kproxy out"). A member
// that reaches the cluster directly while kproxy serves its group joins
// the cluster's group beside the anchor, and the cluster starts a
// rebalance that waits for every member it knows, the anchor included,
// to rejoin (up to the anchor's rebalance timeout). With
// AnchorOptions.OnHandBack the anchor does not rejoin: it asks the
// engine to move its members over (groupstate.Engine.HandBack), goes on
// heartbeating (REBALANCE_IN_PROGRESS keeps its session), and carries
// their commits at its generation, which the cluster accepts while it
// prepares the rebalance. Once the cluster's group holds as many other
// members as it held when the hand-back began plus the engine's members
// (each joined with an id of the cluster's, so each is a member of the
// rebalance), or once the members' rebalance timeout passed, the anchor
// leaves: the cluster completes the rebalance with every member at once,
// each carrying what it owns, and OnLost reports AnchorHandedBack.

// handback is an anchor's hand-back in progress.
type handback struct {
	since time.Time
	// static are kproxy's static members' instance ids and dynamic the
	// members without one the cluster's group must hold (those it held
	// plus kproxy's) before the anchor leaves (arrived).
	static  []string
	dynamic int
	// deadline is when the anchor leaves whatever the cluster holds.
	deadline time.Time
	// nextCheck is when the cluster's group is described next.
	nextCheck time.Time
}

// handbackCheckEvery is how often the cluster's group is described while
// a hand-back waits for the members.
const handbackCheckEvery = 100 * time.Millisecond

// memberView is who the cluster's group holds besides the anchor.
type memberView struct {
	others   int             // members other than the anchor
	dynamic  int             // of those, members without an instance id
	static   map[string]bool // the others' instance ids
	anchored bool            // the anchor is a member
}

// clusterMembers describes group on the cluster: who it holds besides
// the anchor.
func (as *Anchors) clusterMembers(ctx context.Context, group string) (memberView, error) {
	var v memberView
	g, found, err := as.describeGroup(ctx, group)
	if err != nil {
		return v, err
	}
	if !found {
		return v, fmt.Errorf("describing group %q: empty answer", group)
	}
	if g.ErrorCode != 0 {
		return v, fmt.Errorf("describing group %q: %w", group, kerr.ErrorForCode(g.ErrorCode))
	}
	v.static = make(map[string]bool)
	for _, m := range g.Members {
		v.add(m.InstanceID, as.isAnchor(m.InstanceID))
	}
	return v, nil
}

// joinView is the memberView of a JoinGroup answer to the anchor as
// the group's leader (its member list).
func (as *Anchors) joinView(jr *kmsg.JoinGroupResponse) memberView {
	v := memberView{static: make(map[string]bool)}
	for _, m := range jr.Members {
		v.add(m.InstanceID, m.MemberID == jr.MemberID || as.isAnchor(m.InstanceID))
	}
	return v
}

// add counts a member of instance id instanceID (nil for a dynamic
// member) in v; anchor says it is the anchor.
func (v *memberView) add(instanceID *string, anchor bool) {
	switch {
	case anchor:
		v.anchored = true
	case instanceID != nil:
		v.others++
		v.static[*instanceID] = true
	default:
		v.others++
		v.dynamic++
	}
}

// isAnchor reports whether a member of instance id instanceID is one of
// these anchors (every anchor joins with opts.InstanceID).
func (as *Anchors) isAnchor(instanceID *string) bool {
	return instanceID != nil && *instanceID == as.opts.InstanceID
}

// arrived reports whether the cluster's group, as v, holds every member
// the hand-back waits for: each of kproxy's static members by its
// instance id (a static member moved back directly holds its instance
// id there while kproxy still lists it, until its session ends: franz-go
// and Java static members do not leave when they stop), and as many
// members without one as the cluster had plus kproxy's dynamic members.
func (hb *handback) arrived(v memberView) bool {
	for _, id := range hb.static {
		if !v.static[id] {
			return false
		}
	}
	return v.dynamic >= hb.dynamic
}

// checkHandback runs when the cluster rebalances a's group, or holds a
// member besides the anchor: if a member other than the anchor is in the
// cluster's group and the engine can hand the group back, the hand-back
// begins; otherwise the anchor rejoins.
// During a hand-back it decides whether the anchor leaves now.
func (as *Anchors) checkHandback(a *anchor) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := as.clusterMembers(ctx, a.group)
	others, anchored := v.others, v.anchored
	a.mu.Lock()
	hb := a.handback
	a.handbackCheck = false
	if hb != nil {
		hb.nextCheck = time.Now().Add(handbackCheckEvery)
	}
	a.mu.Unlock()
	if hb == nil {
		if err != nil || others == 0 {
			a.mu.Lock()
			a.rejoin, a.rejoinKnown = true, true
			a.broadcastLocked()
			a.mu.Unlock()
			return err
		}
		if !as.beginHandback(a, v, true) {
			a.mu.Lock()
			a.rejoin, a.rejoinKnown = true, true
			a.broadcastLocked()
			a.mu.Unlock()
		}
		return nil
	}
	now := time.Now()
	switch {
	case err != nil && now.Before(hb.deadline):
		return err
	case err == nil && anchored && !hb.arrived(v) && now.Before(hb.deadline):
		return nil // members still on their way
	}
	if err == nil && anchored && !hb.arrived(v) {
		as.log.Warn("hand-back: not every member of kproxy's group reached the cluster's in time; the anchor leaves anyway",
			"group", a.group, "members", others, "static_expected", hb.static, "dynamic_expected", hb.dynamic, "waited", now.Sub(hb.since))
	}
	a.mu.Lock()
	memberID := a.memberID
	a.mu.Unlock()
	if anchored {
		lctx, lcancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := as.leave(lctx, a.group, memberID)
		lcancel()
		if err != nil {
			return err
		}
	}
	a.mu.Lock()
	a.state, a.memberID, a.gen, a.handback = anchorOut, "", 0, nil
	a.broadcastLocked()
	a.mu.Unlock()
	as.log.Info("group handed back to the cluster's coordinator", "group", a.group,
		"members", others, "took", now.Sub(hb.since))
	as.lose(a, AnchorHandedBack)
	return nil
}

// handsBack reports whether a member of the cluster's own in a's group
// may make the anchor hand it back (a.mu held). The members a takeover
// replaced are not: the anchor's join that completes a takeover answers
// once they left (anchor_takeover.go), and is never one that begins a
// hand-back.
func (as *Anchors) handsBack(a *anchor) bool {
	return as.opts.OnHandBack != nil && a.want.Members > 0
}

// beginHandback asks the engine to hand a's group back, the cluster's
// group holding v besides the anchor, and reports whether it does: the
// anchor then waits for the engine's members there. joinNow says the
// cluster's rebalance waits for the anchor's join.
//
// A static member of kproxy's that v holds already was restarted
// against the brokers, where directly it would take its instance id's
// place and its partitions without a rebalance (KIP-345). The engine
// replaces it (its process behind kproxy is fenced) and returns what it
// was assigned; the anchor then joins the cluster's rebalance at once,
// which that member's join started and which waits for the anchor
// alone, and as leader assigns it those partitions and itself the
// rest: the member consumes again within the anchor's reaction, not
// after the engine's members followed at their next heartbeat. The
// hand-back goes on as for any member; the engine's members joining the
// cluster start its next rebalance, in which the member moved back
// rejoins at its next heartbeat, and which a static member moved back
// meanwhile joins and waits for (docs/anchors.md). Only at the start:
// a join of the anchor for a static member moved back later in the
// hand-back starts a rebalance of its own, which the members moved back
// before rejoin at their next heartbeat, and then the engine's members
// start another (tried: TestStaticMovesBackDuringHandBack's second
// member consumed again after 2.0 s that way, 1.0 s without).
func (as *Anchors) beginHandback(a *anchor, v memberView, joinNow bool) bool {
	a.mu.Lock()
	members, static := a.want.Members, slices.Clone(a.want.InstanceIDs)
	a.mu.Unlock()
	var moved []string
	for _, id := range static {
		if v.static[id] {
			moved = append(moved, id)
		}
	}
	wait, freed, ok := as.opts.OnHandBack(a.group, moved)
	if !ok {
		return false
	}
	now := time.Now()
	wait = min(max(wait, 10*time.Second), as.opts.RebalanceTimeout-as.opts.HeartbeatInterval)
	a.mu.Lock()
	a.handback = &handback{since: now, static: static, dynamic: v.dynamic + members - len(static),
		deadline: now.Add(wait), nextCheck: now.Add(handbackCheckEvery)}
	if joinNow && handsOver(v, freed) {
		a.handOver = freed
	}
	a.broadcastLocked()
	a.mu.Unlock()
	as.log.Info("a member reached the cluster's group directly: handing the group back to the cluster's coordinator",
		"group", a.group, "direct_members", v.others, "kproxy_members", members, "kproxy_static", len(static),
		"static_moved_back", len(moved), "handed_over", len(freed), "wait_at_most", wait)
	return true
}

// handsOver reports whether the anchor joins the rebalance the
// cluster's group, as v, is in, to hand the static members moved back
// the partitions freed for them: v holds no member but the anchor and
// those (none of the cluster's own, whom the anchor's join would
// assign nothing).
func handsOver(v memberView, freed map[string]map[string][]int32) bool {
	if len(freed) == 0 || v.dynamic > 0 {
		return false
	}
	for id := range v.static {
		if freed[id] == nil {
			return false
		}
	}
	return true
}
