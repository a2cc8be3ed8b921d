package groupstate

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// This file holds the KIP-848 consumer group: its members,
// epochs, target assignment and the ownership book that keeps a partition
// from ever having two owners. Every field is owned by the loop of the
// shard that holds the group.

// consumerGroup is one KIP-848 consumer group.
type consumerGroup struct {
	s  *shard
	id string

	// epoch is the group epoch; assignmentEpoch the epoch of targets.
	epoch           int32
	assignmentEpoch int32
	// assignor is the assignor that computed targets.
	assignor string
	members  map[string]*consumerMember
	// static maps instance id → member id.
	static map[string]string
	// targets is the target assignment of each member.
	targets map[string]partSet
	// owners maps a partition to the member that holds it, assigned or
	// pending revocation.
	owners map[tp]string
	// snap is the topic snapshot the members' subscriptions were last
	// resolved against; subHash describes the subscribed topics'
	// metadata (names, ids, partition counts) at the last bump.
	snap    *topicSnapshot
	subHash string
	// reconciledEpoch is the assignment epoch for which
	// EventAssignmentReconciled was last emitted.
	reconciledEpoch int32
	// stateSince is when stateName last changed, as lastState records.
	stateSince time.Time
	lastState  string
	emptyTimer timerRef
	// recordWriter writes the group's record, coalescing its writes
	// (record_writer.go, consumer_persist.go).
	recordWriter
	// converted is set once the group was converted into a classic
	// group (consumer_migration.go): answers that wait for its writes
	// wait for the classic group's record instead.
	converted *convertedWait
	// anchorSent is the Anchor last handed to the store (anchor.go);
	// nil before the first.
	anchorSent *Anchor
	// withheld holds the partitions a leave freed while they are kept
	// from every member (consumer_withhold.go); nil when none are.
	withheld *withholding
}

// consumerMember is one member of a KIP-848 group (owned by the loop).
type consumerMember struct {
	id         string
	instanceID string // "" for a dynamic member
	rackID     string
	clientID   string
	clientHost string

	rebalanceTimeout time.Duration
	subscribedNames  []string // sorted
	regex            string
	re               *regexp.Regexp
	serverAssignor   string
	// regexPending is set while regex waits for its resolution: Kafka
	// resolves a regex no member of the group resolved yet
	// asynchronously (KIP-848; GroupMetadataManager's
	// maybeUpdateRegularExpressions), so the heartbeat that brings it is
	// answered with the literal topics only and the matches come on a
	// later heartbeat (resolvePendingRegexes).
	regexPending bool
	// topics is the effective subscription resolved against the group's
	// snapshot: subscribed names ∪ regex matches that exist (none while
	// regexPending).
	topics []string

	memberAssignment
	// partEpochs holds, for each partition in Assigned or Pending, the
	// member epoch at which it was assigned (KIP-1251 commits).
	partEpochs map[tp]int32
	// lastSent is the assignment last sent to the client.
	lastSent partSet

	sessionTimer   timerRef
	rebalanceTimer timerRef

	// classic is set for a member that speaks the classic protocol
	// (JoinGroup, SyncGroup, Heartbeat) inside this group, after an
	// online upgrade (consumer_migration.go); nil for a KIP-848 member.
	classic *classicProtocol
}

// newConsumerGroup creates an empty consumer group owned by s.
func newConsumerGroup(s *shard, id string) *consumerGroup {
	g := &consumerGroup{
		s:          s,
		id:         id,
		members:    make(map[string]*consumerMember),
		static:     make(map[string]string),
		targets:    make(map[string]partSet),
		owners:     make(map[tp]string),
		stateSince: s.e.clock.Now(),
	}
	g.initWriter(s, id, g)
	return g
}

// live reports whether g is still the group the shard holds under its id.
func (g *consumerGroup) live() bool { return g.s.groups[g.id] == group(g) }

// stateName returns the group's state as ConsumerGroupDescribe and
// ListGroups name it.
func (g *consumerGroup) stateName() string {
	switch {
	case len(g.members) == 0:
		return "Empty"
	case g.epoch > g.assignmentEpoch:
		return "Assigning"
	}
	for _, m := range g.members {
		if m.State != memberStable || m.Epoch != g.assignmentEpoch {
			return "Reconciling"
		}
	}
	return "Stable"
}

// noteState moves stateSince when the group's state changed.
func (g *consumerGroup) noteState() {
	if st := g.stateName(); st != g.lastState {
		g.lastState, g.stateSince = st, g.s.e.clock.Now()
	}
}

// cancelAllTimers stops every timer of the group and its members.
func (g *consumerGroup) cancelAllTimers() {
	stopTimer(g.emptyTimer)
	g.emptyTimer = timerRef{}
	g.endWithholding()
	for _, m := range g.members {
		stopTimer(m.sessionTimer)
		stopTimer(m.rebalanceTimer)
		m.sessionTimer, m.rebalanceTimer = timerRef{}, timerRef{}
		m.stopClassicTimers()
	}
}

// event returns an Event of kind stamped with the group's state: the
// group epoch stands in for the generation, the assignor for the
// protocol.
func (g *consumerGroup) event(kind EventKind) Event {
	_, interval := g.settings()
	return Event{
		Time:              g.s.e.clock.Now(),
		Kind:              kind,
		Group:             g.id,
		GroupType:         GroupTypeConsumer,
		Generation:        g.epoch,
		State:             g.stateName(),
		ProtocolType:      "consumer",
		Protocol:          g.assignor,
		HeartbeatInterval: interval,
	}
}

// public converts m for events and snapshots; the assignment is encoded
// as a standard consumer-protocol assignment with topic names.
func (g *consumerGroup) public(m *consumerMember, withAssignment bool) Member {
	pm := Member{MemberID: m.id, InstanceID: m.instanceID, ClientID: m.clientID, ClientHost: m.clientHost, Protocol: m.memberProtocol()}
	if withAssignment {
		a := kmsg.NewConsumerMemberAssignment()
		snap := g.s.e.topicsNow()
		for _, t := range m.Assigned.sortedTopics() {
			name := snap.byID[t]
			if name == "" {
				name = fmt.Sprintf("%x", t[:])
			}
			a.Topics = append(a.Topics, kmsg.ConsumerMemberAssignmentTopic{Topic: name, Partitions: m.Assigned.sortedPartitions(t)})
		}
		pm.Assignment = a.AppendTo(nil)
	}
	return pm
}

// membersList lists the members sorted by id.
func (g *consumerGroup) membersList(withAssignment bool) []Member {
	out := make([]Member, 0, len(g.members))
	for _, id := range g.sortedIDs() {
		out = append(out, g.public(g.members[id], withAssignment))
	}
	return out
}

// sortedIDs returns the member ids in order.
func (g *consumerGroup) sortedIDs() []string {
	ids := make([]string, 0, len(g.members))
	for id := range g.members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// emitMember emits an event about one member.
func (g *consumerGroup) emitMember(kind EventKind, m *consumerMember, cause string) {
	if g.s.e.cfg.Events == nil {
		return
	}
	ev := g.event(kind)
	pm := g.public(m, false)
	ev.Member = &pm
	ev.Cause = cause
	g.s.emit(ev)
}

// emitReconciling emits EventMemberReconciling when m's assignment
// differs from prev (its state, epoch, assigned or pending partitions).
func (g *consumerGroup) emitReconciling(m *consumerMember, prev memberAssignment) {
	cur := m.memberAssignment
	if g.s.e.cfg.Events == nil || (cur.State == prev.State && cur.Epoch == prev.Epoch &&
		cur.Assigned.equal(prev.Assigned) && cur.Pending.equal(prev.Pending)) {
		return
	}
	ev := g.event(EventMemberReconciling)
	pm := g.public(m, true)
	pm.Epoch, pm.State = cur.Epoch, cur.State.String()
	if cur.Pending.size() > 0 {
		pm.Revoking = g.partsAssignment(cur.Pending)
	}
	ev.Member = &pm
	g.s.emit(ev)
}

// partsAssignment encodes ps as a consumer-protocol assignment with topic
// names, as public encodes a member's assignment.
func (g *consumerGroup) partsAssignment(ps partSet) []byte {
	a := kmsg.NewConsumerMemberAssignment()
	snap := g.s.e.topicsNow()
	for _, t := range ps.sortedTopics() {
		name := snap.byID[t]
		if name == "" {
			name = fmt.Sprintf("%x", t[:])
		}
		a.Topics = append(a.Topics, kmsg.ConsumerMemberAssignmentTopic{Topic: name, Partitions: ps.sortedPartitions(t)})
	}
	return a.AppendTo(nil)
}

// bumpEpoch advances the group epoch, which makes the next heartbeat
// compute a new target assignment, and emits EventRebalanceStarted.
func (g *consumerGroup) bumpEpoch(cause string, causer *consumerMember) {
	g.epoch++
	g.markDirty()
	g.s.e.log.Debug("groupstate: consumer group epoch bumped", "group", g.id, "epoch", g.epoch, "cause", cause)
	if g.s.e.cfg.Events == nil {
		return
	}
	ev := g.event(EventRebalanceStarted)
	ev.Cause = cause
	if causer != nil {
		pm := g.public(causer, false)
		ev.Member = &pm
	}
	g.s.emit(ev)
}

// ownedByOther returns the ownership check reconcile needs for member
// id: a partition another member holds, or one withheld from every
// member (consumer_withhold.go), is not given to it.
func (g *consumerGroup) ownedByOther(id string) func(topicID, int32) bool {
	return func(t topicID, p int32) bool {
		o, ok := g.owners[tp{t, p}]
		return ok && o != id || g.withholds(tp{t, p})
	}
}

// setAssignment replaces m's assignment and keeps the ownership book in
// step.
func (g *consumerGroup) setAssignment(m *consumerMember, next memberAssignment) {
	cur := m.memberAssignment
	if cur.State != next.State || cur.Epoch != next.Epoch || cur.PreviousEpoch != next.PreviousEpoch ||
		!cur.Assigned.equal(next.Assigned) || !cur.Pending.equal(next.Pending) {
		g.markDirty()
	}
	g.release(m)
	m.memberAssignment = next
	epochs := make(map[tp]int32, next.Assigned.size()+next.Pending.size())
	for _, ps := range []partSet{m.Assigned, m.Pending} {
		for t, parts := range ps {
			for p := range parts {
				x := tp{t, p}
				g.owners[x] = m.id
				if e, held := m.partEpochs[x]; held {
					epochs[x] = e
				} else {
					epochs[x] = next.Epoch
				}
			}
		}
	}
	m.partEpochs = epochs
}

// release drops m's partitions from the ownership book.
func (g *consumerGroup) release(m *consumerMember) {
	for _, ps := range []partSet{m.Assigned, m.Pending} {
		for t, parts := range ps {
			for p := range parts {
				if g.owners[tp{t, p}] == m.id {
					delete(g.owners, tp{t, p})
				}
			}
		}
	}
}

// add inserts a new member.
func (g *consumerGroup) add(m *consumerMember) {
	g.markDirty()
	g.members[m.id] = m
	if m.instanceID != "" {
		g.static[m.instanceID] = m.id
	}
	stopTimer(g.emptyTimer)
	g.emptyTimer = timerRef{}
}

// remove deletes member m from the group: its partitions are released,
// its timers stopped and its target dropped (no epoch bump).
func (g *consumerGroup) remove(m *consumerMember) {
	g.markDirty()
	g.release(m)
	stopTimer(m.sessionTimer)
	stopTimer(m.rebalanceTimer)
	m.sessionTimer, m.rebalanceTimer = timerRef{}, timerRef{}
	m.stopClassicTimers()
	delete(g.members, m.id)
	delete(g.targets, m.id)
	if m.instanceID != "" && g.static[m.instanceID] == m.id {
		delete(g.static, m.instanceID)
	}
}

// removeAndBump removes m, emits kind and goes on as afterRemoval says.
func (g *consumerGroup) removeAndBump(m *consumerMember, kind EventKind, cause, rebalanceCause string) {
	g.remove(m)
	g.emitMember(kind, m, cause)
	g.afterRemoval(m, rebalanceCause)
}

// afterRemoval follows the removal of members (causer the first of
// them): when every remaining member speaks the classic protocol and the
// policy allows it the group is downgraded to a classic group
// (consumer_migration.go); otherwise the group epoch is bumped, and an
// empty group emits EventGroupEmpty and starts its retention timer.
func (g *consumerGroup) afterRemoval(causer *consumerMember, rebalanceCause string) {
	if g.canDowngrade() {
		g.convertToClassic(causer, true)
		return
	}
	g.bumpEpoch(rebalanceCause, causer)
	if g.snap != nil {
		// The subscribed topics may have shrunk with the member: that
		// is this bump, not a later topics change.
		g.subHash = g.subscriptionHash()
	}
	defer g.maybePersist()
	g.noteState()
	if len(g.members) == 0 {
		g.s.emit(g.event(EventGroupEmpty))
		g.armEmptyTimer()
		return
	}
	g.maybeEmitReconciled()
}

// maybeEmitReconciled emits EventAssignmentReconciled once per assignment
// epoch, when every member holds its target at that epoch.
func (g *consumerGroup) maybeEmitReconciled() {
	g.noteState()
	if len(g.members) == 0 || g.reconciledEpoch == g.assignmentEpoch || g.stateName() != "Stable" {
		return
	}
	g.reconciledEpoch = g.assignmentEpoch
	if g.s.e.cfg.Events == nil {
		return
	}
	ev := g.event(EventAssignmentReconciled)
	ev.Members = g.membersList(true)
	g.s.emit(ev)
}

// armSessionTimer (re)arms m's session timer; when it fires the member is
// removed and the group epoch bumped.
func (g *consumerGroup) armSessionTimer(m *consumerMember) {
	stopTimer(m.sessionTimer)
	m.sessionTimer = g.s.arm(g.sessionTimeout(m), func(id uint64) {
		if !g.live() || g.members[m.id] != m || m.sessionTimer.id != id {
			return
		}
		m.sessionTimer = timerRef{}
		g.s.e.log.Info("groupstate: consumer group member expired", "group", g.id, "member", m.id)
		g.removeAndBump(m, EventMemberExpired, "session_timeout", CauseMemberExpired)
	})
}

// syncRebalanceTimer arms m's rebalance timer when it starts revoking at
// its epoch, and cancels it once it is no longer revoking. A member still
// revoking at the same epoch when it fires is fenced.
func (g *consumerGroup) syncRebalanceTimer(m *consumerMember, wasRevokingAt int32, wasRevoking bool) {
	if m.State != memberUnrevoked {
		stopTimer(m.rebalanceTimer)
		m.rebalanceTimer = timerRef{}
		return
	}
	if wasRevoking && wasRevokingAt == m.Epoch && m.rebalanceTimer.t != nil {
		return
	}
	stopTimer(m.rebalanceTimer)
	epoch := m.Epoch
	m.rebalanceTimer = g.s.arm(m.rebalanceTimeout, func(id uint64) {
		if !g.live() || g.members[m.id] != m || m.rebalanceTimer.id != id {
			return
		}
		m.rebalanceTimer = timerRef{}
		if m.State != memberUnrevoked || m.Epoch != epoch {
			return
		}
		g.s.e.log.Info("groupstate: consumer group member fenced: partitions not revoked in time", "group", g.id, "member", m.id)
		g.removeAndBump(m, EventMemberExpired, "rebalance_timeout", CauseMemberExpired)
	})
}

// armEmptyTimer forgets the group once it stayed empty for
// Config.EmptyGroupRetention (its offsets stay in the store).
func (g *consumerGroup) armEmptyTimer() {
	d := g.s.e.cfg.EmptyGroupRetention
	if d < 0 {
		return
	}
	stopTimer(g.emptyTimer)
	g.emptyTimer = g.s.arm(d, func(id uint64) {
		if !g.live() || g.emptyTimer.id != id || len(g.members) > 0 {
			return
		}
		g.emptyTimer = timerRef{}
		g.s.drop(g.id, g)
		g.s.unanchor(g.id)
		g.s.tombstone(g.id)
		g.s.e.log.Debug("groupstate: forgot a long-empty consumer group", "group", g.id)
	})
}

// resolve computes m's effective subscription against snap.
func (m *consumerMember) resolve(snap *topicSnapshot) {
	seen := make(map[string]bool)
	var out []string
	for _, n := range m.subscribedNames {
		if _, ok := snap.byName[n]; ok && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if m.re != nil && !m.regexPending {
		for n := range snap.byName {
			if !seen[n] && m.re.MatchString(n) {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	m.topics = out
}

// regexResolved reports whether a member other than except subscribes
// to regex and has it resolved: a member that subscribes to it then uses
// that resolution at once, as Kafka's group keeps one resolution per
// regex.
func (g *consumerGroup) regexResolved(regex string, except *consumerMember) bool {
	for _, o := range g.members {
		if o != except && o.regex == regex && !o.regexPending {
			return true
		}
	}
	return false
}

// resolvePendingRegexes resolves the regexes that wait for it, on the
// loop after the heartbeats that brought them were answered, and bumps
// the group epoch if that changes the subscribed topics: the members get
// the matches on their next heartbeat, as from Kafka's asynchronous
// resolution (GroupMetadataManager.handleRegularExpressionsResult).
func (g *consumerGroup) resolvePendingRegexes() {
	if !g.live() || g.snap == nil {
		return
	}
	resolved := false
	for _, m := range g.members {
		if m.regexPending {
			m.regexPending = false
			m.resolve(g.snap)
			resolved = true
		}
	}
	if !resolved || !g.s.e.topicsKnown() {
		return
	}
	if hash := g.subscriptionHash(); hash != g.subHash {
		g.subHash = hash
		g.bumpEpoch(CauseSubscriptionChanged, nil)
		g.maybePersist()
	}
}

// subscriptionHash describes the metadata of every topic a member
// subscribes to: a change of it (a topic created, deleted or resized)
// bumps the group epoch.
func (g *consumerGroup) subscriptionHash() string {
	names := make(map[string]bool)
	for _, m := range g.members {
		for _, n := range m.topics {
			names[n] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	var b strings.Builder
	for _, n := range sorted {
		ti := g.snap.byName[n]
		fmt.Fprintf(&b, "%s/%x/%d;", n, ti.ID[:], ti.Partitions)
	}
	return b.String()
}

// subscribed reports whether a member subscribes to topic (by name, or
// through its regex), for OffsetDelete.
func (g *consumerGroup) subscribed(topic string) bool {
	for _, m := range g.members {
		if slices.Contains(m.subscribedNames, topic) || slices.Contains(m.topics, topic) || (m.re != nil && m.re.MatchString(topic)) {
			return true
		}
	}
	return false
}

// preferredAssignor is the most common ServerAssignor among members (ties
// to the name first in order), else the first configured one.
func (g *consumerGroup) preferredAssignor() string {
	counts := make(map[string]int)
	for _, m := range g.members {
		if m.serverAssignor != "" {
			counts[m.serverAssignor]++
		}
	}
	best, bestN := "", 0
	for _, a := range g.s.e.cfg.ConsumerAssignors {
		if counts[a] > bestN {
			best, bestN = a, counts[a]
		}
	}
	if best == "" {
		best = g.s.e.cfg.ConsumerAssignors[0]
	}
	return best
}

// computeTargets runs the preferred assignor over the members and stores
// the targets at the group epoch.
func (g *consumerGroup) computeTargets() {
	g.assignor = g.preferredAssignor()
	members := make([]assignMember, 0, len(g.members))
	partitions := make(map[topicID]int32)
	for _, id := range g.sortedIDs() {
		m := g.members[id]
		am := assignMember{ID: m.id, InstanceID: m.instanceID, Current: g.targets[m.id]}
		for _, n := range m.topics {
			ti := g.snap.byName[n]
			am.Topics = append(am.Topics, ti.ID)
			partitions[ti.ID] = ti.Partitions
		}
		members = append(members, am)
	}
	g.targets = assignors[g.assignor](members, partitions)
	g.assignmentEpoch = g.epoch
	g.markDirty()
	g.s.e.log.Debug("groupstate: consumer group target computed", "group", g.id, "epoch", g.epoch, "assignor", g.assignor)
}

// carryTargets moves the target assignment to the group epoch without
// changing it (the topics are not known yet): members keep their targets,
// new members get an empty one.
func (g *consumerGroup) carryTargets() {
	for id := range g.members {
		if g.targets[id] == nil {
			g.targets[id] = partSet{}
		}
	}
	g.assignmentEpoch = g.epoch
	g.markDirty()
	if g.assignor == "" {
		g.assignor = g.preferredAssignor()
	}
}

// snapshot copies the group's state for Engine.Groups.
func (g *consumerGroup) snapshot() GroupSnapshot {
	return GroupSnapshot{
		Group:        g.id,
		State:        g.stateName(),
		ProtocolType: "consumer",
		Protocol:     g.assignor,
		Generation:   g.epoch,
		Members:      g.membersList(true),
		StateSince:   g.stateSince,
	}
}
