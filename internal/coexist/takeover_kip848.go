package coexist

import (
	"context"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// Takeover of a forwarded KIP-848 group (docs/anchors.md, "Rolling kproxy
// in"), beside the classic one (takeover.go), through the same watching,
// reports, settle time, recheck and drain. The watcher reads the
// ConsumerGroupHeartbeats it forwards: each member's id, the epoch and
// assignment the cluster told it, and its subscription, assignor and
// rebalance timeout as its heartbeats carry them (a KIP-848 heartbeat
// sends a field only when it changed, so the watcher keeps the last one
// seen). A member counts as settled ("synced" at its epoch) once a
// heartbeat at that epoch was answered without error.
//
// The group is taken over when the cluster's ConsumerGroupDescribe says
// it is Stable at one epoch (group epoch = assignment epoch = every
// member's epoch), every member reconciled (its assignment is its target)
// and a KIP-848 member, and its members are exactly the members watched
// here and reported by other kproxies, each told that epoch and that
// assignment. The engine is then handed that group
// (groupstate.Engine.ConsumerTakeoverRecord), forwarding stops, the
// requests on their way drain, and the anchor's first join removes the
// members from the cluster's group before it joins
// (anchor_takeover_kip848.go). The members' next heartbeat is
// answered by the engine at the same epoch with the same assignment.

// kip848Member is what the watcher saw of a KIP-848 member beyond a
// classic one's fields (watchedMember.generation holds its epoch).
// Guarded by the watcher's mu; exported fields travel in reports.
type kip848Member struct {
	RackID         *string            `json:"rack_id,omitempty"`
	Subscribed     []string           `json:"subscribed,omitempty"`
	Regex          *string            `json:"regex,omitempty"`
	ServerAssignor *string            `json:"server_assignor,omitempty"`
	RebalanceMS    int32              `json:"rebalance_ms,omitempty"`
	Assigned       map[string][]int32 `json:"assigned"` // by topic id in hex, sorted
	// SinceChanged is how long before the report the member was told an
	// assignment other than the one before (ms); changed is when, here.
	SinceChanged int64 `json:"since_changed_ms"`
	changed      time.Time
	assigned     map[[16]byte][]int32 // Assigned decoded; nil until an answer carried one
}

// holdsNone reports whether the last assignment k was told has no
// partition (or it was told none yet).
func (k *kip848Member) holdsNone() bool {
	for _, ps := range k.assigned {
		if len(ps) > 0 {
			return false
		}
	}
	return true
}

// consumerTakeoverStore is what a KIP-848 takeover asks of the store
// beyond takeoverStore; *Anchors implements it.
type consumerTakeoverStore interface {
	DescribeConsumerGroup(ctx context.Context, group string) (kmsg.ConsumerGroupDescribeResponseGroup, error)
	PrepareConsumerTakeover(group string, record []byte, members []TakeoverMember) error
}

// kip848MinSession is the least a watched KIP-848 member's "session"
// (how long it counts as alive since its last good answer) can be: the
// cluster's session timeout is a broker setting the client never sees,
// so the watcher counts three heartbeat intervals, at least this.
const kip848MinSession = 6 * time.Second

// watchConsumerHeartbeat returns what to do with the answer to r, a
// forwarded ConsumerGroupHeartbeat from client c, and whether r changes
// the group's membership (a join at epoch 0 or a leave).
func watchConsumerHeartbeat(c clientInfo, r *kmsg.ConsumerGroupHeartbeatRequest) (answered func(*watchedGroup, kmsg.Response), membership bool) {
	seen := kip848Member{RackID: cloneString(r.RackID), Regex: cloneString(r.SubscribedTopicRegex),
		ServerAssignor: cloneString(r.ServerAssignor), RebalanceMS: r.RebalanceTimeoutMillis}
	if r.SubscribedTopicNames != nil {
		seen.Subscribed = slices.Clone(r.SubscribedTopicNames)
	}
	instance, reqID, epoch := cloneString(r.InstanceID), r.MemberID, r.MemberEpoch
	leaving := epoch < 0
	return func(g *watchedGroup, resp kmsg.Response) {
		hr, ok := resp.(*kmsg.ConsumerGroupHeartbeatResponse)
		if !ok {
			return
		}
		id := reqID
		if hr.MemberID != nil && *hr.MemberID != "" {
			id = *hr.MemberID
		}
		if leaving || hr.ErrorCode == kerr.UnknownMemberID.Code || hr.ErrorCode == kerr.FencedMemberEpoch.Code {
			delete(g.members, id)
			switch {
			case !leaving && epoch > 0 && reqID != "":
				g.fence(reqID, time.Now(), true)
			case leaving && reqID != "":
				// A member that left holds nothing either: a hand-back
				// need not wait for it (it may have left kproxy's
				// group just as the group was unloaded, and so be
				// known to the cluster only as this leave). Its leave
				// paces nobody.
				g.fence(reqID, time.Now(), false)
			}
			return
		}
		m := g.members[id]
		if epoch == 0 || m == nil || m.kip848 == nil {
			m = &watchedMember{protocolType: "consumer", kip848: &kip848Member{}}
			g.members[id] = m
		}
		m.clientID, m.clientHost = c.id, c.host
		if instance != nil {
			m.instanceID = instance
		}
		k := m.kip848
		if seen.RackID != nil {
			k.RackID = seen.RackID
		}
		if seen.Subscribed != nil {
			k.Subscribed = seen.Subscribed
		}
		if seen.Regex != nil {
			k.Regex = seen.Regex
		}
		if seen.ServerAssignor != nil {
			k.ServerAssignor = seen.ServerAssignor
		}
		if seen.RebalanceMS > 0 {
			k.RebalanceMS = seen.RebalanceMS
		}
		if hr.ErrorCode != 0 {
			m.synced = false
			return
		}
		if hr.Assignment != nil {
			next := make(map[[16]byte][]int32)
			for _, t := range hr.Assignment.Topics {
				ps := slices.Clone(t.Partitions)
				slices.Sort(ps)
				next[t.TopicID] = ps
			}
			if k.assigned == nil || !samePartitions(next, k.assigned) {
				k.changed = time.Now()
			}
			k.assigned, k.Assigned = next, encodeAssigned(next)
		}
		m.generation = hr.MemberEpoch
		m.synced = k.assigned != nil
		m.lastOK = time.Now()
		m.sessionMS = max(3*hr.HeartbeatIntervalMillis, int32(kip848MinSession/time.Millisecond))
		g.pace(hr, k, time.Now())
	}, epoch <= 0
}

// clientInfo is the part of a proxy.Client a KIP-848 watch keeps.
type clientInfo struct{ id, host string }

func encodeAssigned(in map[[16]byte][]int32) map[string][]int32 {
	out := make(map[string][]int32, len(in))
	for id, ps := range in {
		out[hex.EncodeToString(id[:])] = ps
	}
	return out
}

// report copies k for a report sent at now.
func (k *kip848Member) report(now time.Time) *kip848Member {
	if k == nil {
		return nil
	}
	c := *k
	c.Subscribed = slices.Clone(k.Subscribed)
	c.Assigned = maps.Clone(k.Assigned)
	c.SinceChanged = now.Sub(k.changed).Milliseconds()
	return &c
}

// clone copies k, a report received at at (member), decoding Assigned.
func (k *kip848Member) clone(at time.Time) *kip848Member {
	if k == nil {
		return nil
	}
	c := *k
	c.changed = at.Add(-time.Duration(k.SinceChanged) * time.Millisecond)
	c.Subscribed = slices.Clone(k.Subscribed)
	c.Assigned = maps.Clone(k.Assigned)
	if k.Assigned != nil {
		c.assigned = make(map[[16]byte][]int32, len(k.Assigned))
		for hexID, ps := range k.Assigned {
			var id [16]byte
			raw, err := hex.DecodeString(hexID)
			if err != nil || len(raw) != len(id) {
				// Bad report: this member never matches the cluster's.
				c.assigned = nil
				break
			}
			copy(id[:], raw)
			c.assigned[id] = slices.Clone(ps)
		}
	}
	return &c
}

// isConsumerGroupLocked reports whether group's members known here are
// KIP-848 members; w.mu is held.
func (w *forwardWatcher) isConsumerGroupLocked(group string) bool {
	if g := w.groups[group]; g != nil {
		for _, m := range g.members {
			return m.kip848 != nil
		}
	}
	for _, r := range w.remote[group] {
		for _, rm := range r.Members {
			return rm.KIP848 != nil
		}
	}
	return false
}

// tryConsumerTakeover is tryTakeover for a KIP-848 group.
func (w *forwardWatcher) tryConsumerTakeover(ctx context.Context, group string) error {
	cs, ok := w.store.(consumerTakeoverStore)
	if !ok || w.consumerRecord == nil {
		return fmt.Errorf("takeover of KIP-848 group %q: no store or engine for it", group)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	d, err := cs.DescribeConsumerGroup(dctx, group)
	cancel()
	if err != nil {
		return err
	}
	if d.ErrorCode != 0 || d.State != "Stable" || len(d.Members) == 0 || d.Epoch != d.AssignmentEpoch {
		return nil
	}
	var tk groupstate.ConsumerTakeover
	rel, err := w.takeOver(group, len(d.Members), func(all map[string]*watchedMember) (members []TakeoverMember, why string) {
		tk, members, why = consumerTakeoverOf(d, all, w.settle)
		return members, why
	}, func(members []TakeoverMember) error {
		rec, err := w.consumerRecord(tk)
		if err == nil {
			err = cs.PrepareConsumerTakeover(group, rec, members)
		}
		if err != nil {
			return fmt.Errorf("takeover of KIP-848 group %q: %w", group, err)
		}
		return nil
	})
	if rel == nil || err != nil {
		return err
	}
	w.log.Info("taking the KIP-848 group over from the cluster's coordinator", "group", group, "members", len(rel.members),
		"epoch", d.Epoch, "other_kproxies", len(rel.waiting))
	return nil
}

// consumerTakeoverOf builds the takeover of the cluster's KIP-848 group
// d, whose members watched describes, each told its assignment at least
// settle ago (a KIP-848 group reconciles within an epoch: the group is
// taken over only once it was quiet for the settle time); why says what
// does not match.
func consumerTakeoverOf(d kmsg.ConsumerGroupDescribeResponseGroup, watched map[string]*watchedMember, settle time.Duration) (tk groupstate.ConsumerTakeover, members []TakeoverMember, why string) {
	tk = groupstate.ConsumerTakeover{Epoch: d.Epoch, Assignor: d.AssignorName}
	for _, dm := range d.Members {
		m := watched[dm.MemberID]
		switch {
		case m == nil || m.kip848 == nil:
			return tk, nil, "member " + dm.MemberID + " is not watched as a KIP-848 member"
		case dm.MemberType == 0:
			return tk, nil, "member " + dm.MemberID + " speaks the classic protocol"
		case dm.MemberEpoch != d.Epoch || m.generation != d.Epoch:
			return tk, nil, fmt.Sprintf("member %s at epoch %d (told %d), group at %d", dm.MemberID, dm.MemberEpoch, m.generation, d.Epoch)
		}
		assigned := assignmentOf(dm.Assignment)
		if !samePartitions(assigned, assignmentOf(dm.TargetAssignment)) {
			return tk, nil, "member " + dm.MemberID + " is not reconciled"
		}
		if !samePartitions(assigned, m.kip848.assigned) {
			return tk, nil, "member " + dm.MemberID + " was not told its assignment"
		}
		if time.Since(m.kip848.changed) < settle {
			return tk, nil, "member " + dm.MemberID + " was told a new assignment less than the settle time ago"
		}
		tm := groupstate.ConsumerTakeoverMember{
			ID: dm.MemberID, ClientID: m.clientID, ClientHost: m.clientHost,
			RebalanceTimeout: time.Duration(m.kip848.RebalanceMS) * time.Millisecond,
			Subscribed:       slices.Clone(dm.SubscribedTopics), Assigned: assigned,
		}
		if dm.InstanceID != nil {
			tm.InstanceID = *dm.InstanceID
		}
		if dm.RackID != nil {
			tm.RackID = *dm.RackID
		}
		if dm.SubscribedTopicRegex != nil {
			tm.Regex = *dm.SubscribedTopicRegex
		}
		if m.kip848.ServerAssignor != nil {
			tm.ServerAssignor = *m.kip848.ServerAssignor
		}
		tk.Members = append(tk.Members, tm)
		members = append(members, TakeoverMember{MemberID: dm.MemberID, InstanceID: cloneString(dm.InstanceID)})
	}
	return tk, members, ""
}

// assignmentOf returns a described assignment's partitions by topic id,
// sorted.
func assignmentOf(a kmsg.Assignment) map[[16]byte][]int32 {
	out := make(map[[16]byte][]int32)
	for _, t := range a.TopicPartitions {
		ps := append(out[t.TopicID], t.Partitions...)
		slices.Sort(ps)
		out[t.TopicID] = ps
	}
	return out
}

// samePartitions reports whether a and b hold the same partitions; a
// topic with none counts as absent, and a nil b matches nothing.
func samePartitions(a, b map[[16]byte][]int32) bool {
	if b == nil {
		return false
	}
	count := func(m map[[16]byte][]int32) int {
		n := 0
		for _, ps := range m {
			if len(ps) > 0 {
				n++
			}
		}
		return n
	}
	if count(a) != count(b) {
		return false
	}
	for id, ps := range a {
		if len(ps) > 0 && !slices.Equal(ps, b[id]) {
			return false
		}
	}
	return true
}

// fencedKeep is how long a fencing seen here counts (watchedGroup.fenced):
// as long as a KIP-848 hand-back waits at most (handBackWait).
const fencedKeep = handBackWait

// maxFenced bounds watchedGroup.fenced; past it fencings are not
// recorded (a hand-back then waits out its time bound).
const maxFenced = 10_000

// fence records that the cluster told member id, at when, that it is not
// (or no longer) a member at its epoch, or that id left (pace false); a
// fencing paces the group's members (pace); w.mu is held.
func (g *watchedGroup) fence(id string, when time.Time, pace bool) {
	if g.fenced == nil {
		g.fenced = make(map[string]time.Time)
	}
	if pace && when.After(g.lastFenced) {
		g.lastFenced = when
	}
	if _, ok := g.fenced[id]; !ok && len(g.fenced) >= maxFenced {
		return
	}
	g.fenced[id] = when
}

// handBackPace is the heartbeat interval, in milliseconds, told to the
// members of a KIP-848 group behind this kproxy after one of its members
// was fenced here (the cluster's own is 5 s by default): those fenced
// were kproxy's members, whose group is being handed back
// (anchor_takeover_kip848.go); they rejoin the cluster's group with
// nothing while the anchor holds their partitions, and learn that the
// cluster assigned them once the anchor left at their next heartbeat.
const handBackPace = 500

// pace lowers the heartbeat interval of hr, an answer to k, a member of
// g, to handBackPace while a fencing of g's is fresh (fencedKeep, as
// long as a hand-back may wait) and k holds no partition; w.mu is held.
// The proxy sends the answer re-encoded (proxy.ForwardWatcher).
//
// A member holding partitions heartbeats at the cluster's interval, as
// directly: paced, it would learn of the partitions a later leave frees
// before a member restarted directly (as in a rolling move back)
// rejoins, take them, and make that member wait for their revocation and
// its own next heartbeat.
func (g *watchedGroup) pace(hr *kmsg.ConsumerGroupHeartbeatResponse, k *kip848Member, now time.Time) {
	if hr.HeartbeatIntervalMillis <= handBackPace {
		return
	}
	if !g.lastFenced.IsZero() && now.Sub(g.lastFenced) <= fencedKeep && k.holdsNone() {
		hr.HeartbeatIntervalMillis = handBackPace
	}
}

// fencedAgo is g's fencings for a report: member id to how long ago, in
// milliseconds; w.mu is held.
func (g *watchedGroup) fencedAgo(now time.Time) map[string]int64 {
	if len(g.fenced) == 0 {
		return nil
	}
	out := make(map[string]int64, len(g.fenced))
	for id, at := range g.fenced {
		out[id] = now.Sub(at).Milliseconds()
	}
	return out
}

// fencedSince returns which of ids the cluster fenced at or after since
// on a KIP-848 heartbeat forwarded by this kproxy, or by another one of
// the fleet that reported it (memberReport.Fenced): members of the
// engine's group being handed back that were told to give their
// partitions up (anchor_takeover_kip848.go).
func (w *forwardWatcher) fencedSince(group string, since time.Time, ids []string) map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]bool)
	if g := w.groups[group]; g != nil {
		for _, id := range ids {
			if at, ok := g.fenced[id]; ok && !at.Before(since) {
				out[id] = true
			}
		}
	}
	for _, r := range w.remote[group] {
		for _, id := range ids {
			if ago, ok := r.Fenced[id]; ok && !r.at.Add(-time.Duration(ago)*time.Millisecond).Before(since) {
				out[id] = true
			}
		}
	}
	return out
}

// fencedReports returns the reports of the groups watched here that
// another kproxy owns and in which a member was fenced (fencedNow).
func (w *forwardWatcher) fencedReports() []memberReport {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []memberReport
	for group, g := range w.groups {
		if len(g.fenced) > 0 && !w.draining[group] && w.owns != nil && !w.owns(group) && w.fw.Forwarded(group) {
			out = append(out, w.reportLocked(group, g, now))
		}
	}
	return out
}
