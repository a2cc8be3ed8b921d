package groupstate

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// This file holds online migration between classic and KIP-848 groups
// (KIP-848's upgrade path), after Apache Kafka 4.1's GroupMetadataManager:
//
//   - Upgrade (convertToConsumerGroup, validateOnlineUpgrade,
//     ConsumerGroup.fromClassicGroup): a ConsumerGroupHeartbeat joining a
//     non-empty classic group of protocol type "consumer" converts it into
//     a consumer group when the policy allows it. Parked JoinGroups and
//     SyncGroups are answered REBALANCE_IN_PROGRESS; every classic member
//     becomes a member at epoch = generation, Stable, holding its last
//     assignment, which is also its target; group and assignment epochs =
//     generation. The joining member then bumps the epoch as any new
//     member does.
//   - Classic members inside a consumer group
//     (classicGroupJoinToConsumerGroup, classicGroupSyncToConsumerGroup,
//     classicGroupHeartbeatToConsumerGroup,
//     classicGroupLeaveToConsumerGroup): a JoinGroup is answered at once,
//     its subscription and owned partitions decoded from the consumer
//     protocol metadata and reconciled like a KIP-848 heartbeat (revoke
//     before assign); generation = member epoch, no leader. SyncGroup
//     returns the member's assigned partitions. Heartbeat answers
//     REBALANCE_IN_PROGRESS when the member must rejoin. Session, sync and
//     join timeouts fence the member.
//   - Downgrade (convertToClassicGroup, validateOnlineDowngradeWithFencedMember,
//     ClassicGroup.fromConsumerGroup): when the last KIP-848 member
//     leaves or is fenced and every remaining member speaks the classic
//     protocol, the group becomes a Stable classic group at generation =
//     group epoch with the targets as assignments, then rebalances.
//     When instead a static member rejoins with the classic protocol in
//     place of the last KIP-848 member (validateOnlineDowngradeWithReplacedMemberId),
//     the group becomes that classic group without a rebalance (unless
//     another member has not reconciled to its target yet:
//     reconciledBesides).
//
// Policy: group.consumer.migration.policy (Config.ConsumerMigrationPolicy).

// MigrationPolicy is group.consumer.migration.policy: which online
// conversions between classic and KIP-848 groups are allowed.
type MigrationPolicy string

// The migration policies, as Kafka names them.
const (
	MigrationBidirectional MigrationPolicy = "bidirectional" // upgrade and downgrade (Kafka's default)
	MigrationUpgrade       MigrationPolicy = "upgrade"       // classic → consumer only
	MigrationDowngrade     MigrationPolicy = "downgrade"     // consumer → classic only
	MigrationDisabled      MigrationPolicy = "disabled"      // neither; classic members are refused by consumer groups
)

// ParseMigrationPolicy parses a policy name (case-insensitive as Kafka's
// ConsumerGroupMigrationPolicy.parse); "" is the default, bidirectional.
func ParseMigrationPolicy(s string) (MigrationPolicy, error) {
	switch p := MigrationPolicy(toLower(s)); p {
	case "":
		return MigrationBidirectional, nil
	case MigrationBidirectional, MigrationUpgrade, MigrationDowngrade, MigrationDisabled:
		return p, nil
	}
	return "", fmt.Errorf("unknown consumer group migration policy %q (bidirectional, upgrade, downgrade, disabled)", s)
}

// toLower lowercases ASCII.
func toLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// String returns the policy's name.
func (p MigrationPolicy) String() string { return string(p) }

// upgradeEnabled and downgradeEnabled are Kafka's isUpgradeEnabled and
// isDowngradeEnabled.
func (p MigrationPolicy) upgradeEnabled() bool {
	return p == MigrationBidirectional || p == MigrationUpgrade
}
func (p MigrationPolicy) downgradeEnabled() bool {
	return p == MigrationBidirectional || p == MigrationDowngrade
}

// Member protocols, reported in Member.Protocol.
const (
	MemberProtocolClassic  = "classic"  // JoinGroup/SyncGroup/Heartbeat
	MemberProtocolConsumer = "consumer" // ConsumerGroupHeartbeat (KIP-848)
)

// classicProtocol is what a member that speaks the classic protocol
// inside a consumer group carries besides a KIP-848 member's state
// (Kafka's ClassicMemberMetadata). Owned by the group's loop.
type classicProtocol struct {
	// protocols are the member's supported protocols, in its order; the
	// first names the protocol its JoinGroup and SyncGroup answers carry.
	protocols      []kmsg.JoinGroupRequestProtocol
	sessionTimeout time.Duration
	// version is the consumer protocol version of its subscription; its
	// SyncGroup assignment is encoded at it (at most 3).
	version int16
	// syncTimer fences the member when it does not send SyncGroup
	// within its rebalance timeout after a JoinGroup; joinTimer when it
	// does not rejoin within it after being told to
	// (REBALANCE_IN_PROGRESS).
	syncTimer timerRef
	joinTimer timerRef
}

// protocolName is the protocol name of the member's answers.
func (c *classicProtocol) protocolName() string {
	if len(c.protocols) == 0 {
		return ""
	}
	return c.protocols[0].Name
}

// memberProtocol names the protocol m speaks.
func (m *consumerMember) memberProtocol() string {
	if m.classic != nil {
		return MemberProtocolClassic
	}
	return MemberProtocolConsumer
}

// stopClassicTimers stops m's sync and join timers.
func (m *consumerMember) stopClassicTimers() {
	if m.classic == nil {
		return
	}
	stopTimer(m.classic.syncTimer)
	stopTimer(m.classic.joinTimer)
	m.classic.syncTimer, m.classic.joinTimer = timerRef{}, timerRef{}
}

// sessionTimeout is m's session timeout: the classic member's own, else
// the group's.
func (g *consumerGroup) sessionTimeout(m *consumerMember) time.Duration {
	if m.classic != nil && m.classic.sessionTimeout > 0 {
		return m.classic.sessionTimeout
	}
	session, _ := g.settings()
	return session
}

// settings are the session timeout and heartbeat interval of the group's
// KIP-848 members (Engine.ConsumerSettings).
func (g *consumerGroup) settings() (session, interval time.Duration) {
	return g.s.e.ConsumerSettings(g.id)
}

// ConsumerSettings are the session timeout and heartbeat interval the
// engine gives the KIP-848 members of group: the group's own GROUP
// configs where it has usable ones (Config.GroupSettings), else the
// engine's. Safe for concurrent use.
func (e *Engine) ConsumerSettings(group string) (session, interval time.Duration) {
	cfg := &e.cfg
	session, interval = cfg.ConsumerSessionTimeout, cfg.ConsumerHeartbeatInterval
	if cfg.GroupSettings == nil {
		return session, interval
	}
	own := cfg.GroupSettings(group)
	if t := own.ConsumerSessionTimeout; t >= cfg.ConsumerMinSessionTimeout && t <= cfg.ConsumerMaxSessionTimeout && t > 0 {
		session = t
	}
	if t := own.ConsumerHeartbeatInterval; t > 0 && t < session {
		interval = t
	}
	if interval >= session { // the group's session below the engine's interval
		interval = session / 3
	}
	return session, interval
}

// decodeSubscription decodes consumer protocol subscription metadata.
func decodeSubscription(meta []byte) (*kmsg.ConsumerMemberMetadata, error) {
	var sub kmsg.ConsumerMemberMetadata
	if err := sub.ReadFrom(meta); err != nil {
		return nil, fmt.Errorf("decoding consumer protocol subscription: %w", err)
	}
	return &sub, nil
}

// namedToParts converts partitions by topic name to a partition set by
// topic id; topics snap does not know are left out.
func namedToParts(named map[string]map[int32]struct{}, snap *topicSnapshot) partSet {
	out := partSet{}
	for name, ps := range named {
		ti, ok := snap.byName[name]
		if !ok {
			continue
		}
		for p := range ps {
			if p >= 0 && p < ti.Partitions {
				out.add(ti.ID, p)
			}
		}
	}
	return out
}

// ownedFromSubscription returns the partitions a subscription says its
// member owns (v1+; none before), by topic id.
func ownedFromSubscription(sub *kmsg.ConsumerMemberMetadata, snap *topicSnapshot) partSet {
	named := make(map[string]map[int32]struct{})
	for _, o := range sub.OwnedPartitions {
		if named[o.Topic] == nil {
			named[o.Topic] = make(map[int32]struct{})
		}
		for _, p := range o.Partitions {
			named[o.Topic][p] = struct{}{}
		}
	}
	return namedToParts(named, snap)
}

// encodeClassicAssignment encodes ps as a consumer protocol assignment
// with topic names, at version (capped to 3, the highest kmsg writes).
func encodeClassicAssignment(ps partSet, snap *topicSnapshot, version int16) []byte {
	a := kmsg.NewConsumerMemberAssignment()
	a.Version = min(max(version, 0), 3)
	for _, t := range ps.sortedTopics() {
		name, ok := snap.byID[t]
		if !ok {
			continue
		}
		a.Topics = append(a.Topics, kmsg.ConsumerMemberAssignmentTopic{Topic: name, Partitions: ps.sortedPartitions(t)})
	}
	return a.AppendTo(nil)
}

// copyProtocols deep-copies JoinGroup protocols.
func copyProtocols(in []kmsg.JoinGroupRequestProtocol) []kmsg.JoinGroupRequestProtocol {
	out := make([]kmsg.JoinGroupRequestProtocol, len(in))
	for i, p := range in {
		out[i] = kmsg.JoinGroupRequestProtocol{Name: p.Name, Metadata: append([]byte(nil), p.Metadata...)}
	}
	return out
}

// sortedNames sorts and deduplicates topic names.
func sortedNames(in []string) []string {
	names := append([]string{}, in...)
	sort.Strings(names)
	return slices.Compact(names)
}

// emitConverted emits EventGroupConverted for g (Cause says which way,
// Member is the member whose request or departure converted it).
func (s *shard) emitConverted(ev Event, cause string, by *Member, members []Member) {
	if s.e.cfg.Events == nil {
		return
	}
	ev.Kind = EventGroupConverted
	ev.Cause = cause
	ev.Member = by
	ev.Members = members
	s.emit(ev)
}

// ---- Upgrade: classic → consumer ----

// validateOnlineUpgrade is Kafka's validateOnlineUpgrade: the policy
// allows upgrades, the group uses the consumer embedded protocol, and it
// is not larger than a consumer group may be.
func (s *shard) validateOnlineUpgrade(c *classicGroup) (bool, string) {
	switch {
	case !s.e.cfg.ConsumerMigrationPolicy.upgradeEnabled():
		return false, "the online upgrade is disabled"
	case c.protocolType != "consumer":
		return false, "the group does not use the consumer embedded protocol"
	case s.e.cfg.ConsumerMaxGroupSize > 0 && len(c.members) > s.e.cfg.ConsumerMaxGroupSize:
		return false, "the group size exceeds the consumer group maximum size"
	}
	return true, ""
}

// upgradeWaitsForTopics reports whether the upgrade of c must wait for a
// topic refresh: a member's assignment (or, in CompletingRebalance, its
// subscription's owned partitions) names a partition the topic cache
// does not know. Kafka converts against its always current metadata
// image; kproxy's cache is refreshed periodically, so it asks for a
// refresh and waits for one that started after the first refusal. If
// that refresh does not know the partition either (its topic was
// deleted), the conversion goes on without it.
func (s *shard) upgradeWaitsForTopics(c *classicGroup) bool {
	snap := s.e.topicsNow()
	known := func(topic string, p int32) bool {
		ti, ok := snap.byName[topic]
		return ok && p >= 0 && p < ti.Partitions
	}
	unknown := false
	for _, m := range c.members {
		for topic, ps := range decodeOwned(m.assignment) {
			for p := range ps {
				unknown = unknown || !known(topic, p)
			}
		}
		name := c.protocol
		if name == "" && len(m.protocols) > 0 {
			name = m.protocols[0].Name
		}
		if sub, err := decodeSubscription(m.metadataFor(name)); err == nil {
			for _, o := range sub.OwnedPartitions {
				for _, p := range o.Partitions {
					unknown = unknown || !known(o.Topic, p)
				}
			}
		}
	}
	if !unknown {
		c.upgradeAfterRefresh = 0
		return false
	}
	if c.upgradeAfterRefresh == 0 {
		c.upgradeAfterRefresh = s.e.topicSeq.Load() + 1
	}
	s.e.topicMu.Lock()
	stored := s.e.topicStored
	s.e.topicMu.Unlock()
	if stored >= c.upgradeAfterRefresh {
		s.e.log.Warn("groupstate: upgrading a classic group whose members hold partitions of unknown topics", "group", c.id)
		c.upgradeAfterRefresh = 0
		return false
	}
	s.e.requestTopicRefresh()
	return true
}

// convertToConsumer converts non-empty classic group c into a consumer
// group (Kafka's convertToConsumerGroup and ConsumerGroup.fromClassicGroup)
// and installs it; by is the heartbeat's member id (for the event). It
// fails, leaving c untouched, when a member's embedded protocol does not
// decode (Kafka: GROUP_ID_NOT_FOUND).
func (s *shard) convertToConsumer(c *classicGroup, by string) (*consumerGroup, error) {
	snap := s.e.topicsNow()
	type conv struct {
		m        *classicMember
		sub      *kmsg.ConsumerMemberMetadata
		assigned partSet
	}
	protocol := c.protocol
	convs := make([]conv, 0, len(c.order))
	for _, id := range c.order {
		m := c.members[id]
		name := protocol
		if name == "" && len(m.protocols) > 0 {
			name = m.protocols[0].Name
		}
		sub, err := decodeSubscription(m.metadataFor(name))
		if err != nil {
			return nil, fmt.Errorf("member %s: %w", m.id, err)
		}
		owned := decodeOwned(m.assignment)
		if owned == nil {
			return nil, fmt.Errorf("member %s: the assignment does not decode", m.id)
		}
		convs = append(convs, conv{m: m, sub: sub, assigned: namedToParts(owned, snap)})
	}
	// What a member holds is its last assignment plus what it reported
	// owning at its last JoinGroup (consumer protocol v1+). The two
	// differ in the middle of a rebalance: a cooperative member keeps
	// its partitions until it has synced the generation that takes them
	// away (KIP-429), so when the leader has synced a generation that
	// moves a partition off a follower still to sync, the follower's
	// assignment no longer lists it while the follower still consumes
	// it; and a generation whose leader never synced voided the
	// assignments (prepareRebalance). Counted by assignment alone, such
	// a partition looked free and went at once to the joining KIP-848
	// member: two owners. Kafka's ConsumerGroup.fromClassicGroup takes
	// the assignment only. A partition a member reported owning that
	// another member's assignment gives is left to the assignment (the
	// report is older); a member that no longer owns what it reported
	// says so at its next JoinGroup, which reconciliation then frees.
	given := partSet{}
	for _, cv := range convs {
		for t, ps := range cv.assigned {
			for p := range ps {
				given.add(t, p)
			}
		}
	}
	for i := range convs {
		for t, ps := range ownedFromSubscription(convs[i].sub, snap) {
			for p := range ps {
				if !given.has(t, p) {
					convs[i].assigned.add(t, p)
				}
			}
		}
	}
	// The classic group ends here: its parked requests rejoin.
	for _, id := range c.order {
		m := c.members[id]
		if m.joinReply != nil {
			m.answerJoin(joinError(errRebalanceInProgress, m.id))
		}
		if m.syncReply != nil {
			m.answerSync(syncError(errRebalanceInProgress))
		}
	}
	c.awaitingJoin = 0
	c.cancelAllTimers()
	for _, p := range c.pending {
		stopTimer(p.timer)
	}
	c.transitionTo(stateDead)
	s.drop(c.id, c)

	g := newConsumerGroup(s, c.id)
	g.epoch, g.assignmentEpoch, g.reconciledEpoch = c.generation, c.generation, c.generation
	g.snap = snap
	for _, cv := range convs {
		m := cv.m
		cm := &consumerMember{
			id: m.id, instanceID: m.instanceID, clientID: m.clientID, clientHost: m.clientHost,
			rebalanceTimeout: m.rebalanceTimeout,
			subscribedNames:  sortedNames(cv.sub.Topics),
			classic: &classicProtocol{
				protocols:      copyProtocols(m.protocols),
				sessionTimeout: m.sessionTimeout,
				version:        cv.sub.Version,
			},
		}
		if cv.sub.Rack != nil {
			cm.rackID = *cv.sub.Rack
		}
		cm.resolve(snap)
		g.add(cm)
		for t, ps := range cv.assigned {
			for p := range ps {
				if _, taken := g.owners[tp{t, p}]; taken {
					delete(ps, p) // a client assignor gave it twice: keep the first
				}
			}
		}
		g.targets[cm.id] = cv.assigned.clone()
		g.setAssignment(cm, memberAssignment{State: memberStable, Epoch: c.generation, PreviousEpoch: c.generation, Assigned: cv.assigned, Pending: partSet{}})
	}
	g.subHash = g.subscriptionHash()
	g.assignor = g.preferredAssignor()
	s.groups[g.id] = g
	for _, id := range g.sortedIDs() {
		g.armSessionTimer(g.members[id])
	}
	g.noteState()
	g.markDirty()
	s.e.log.Info("groupstate: classic group converted to a consumer group", "group", g.id, "generation", c.generation, "members", len(g.members), "member", by)
	pm := Member{MemberID: by, Protocol: MemberProtocolConsumer}
	s.emitConverted(g.event(0), CauseConvertedToConsumer, &pm, g.membersList(true))
	return g, nil
}

// ---- Classic members inside a consumer group ----

// supportsClassicProtocols is Kafka's ConsumerGroup.supportsClassicProtocols:
// the type must be "consumer" and, unless no other member speaks the
// classic protocol, one of the protocols must be supported by every
// other classic member.
func (g *consumerGroup) supportsClassicProtocols(memberID, protocolType string, protocols []kmsg.JoinGroupRequestProtocol) bool {
	if protocolType != "consumer" || len(protocols) == 0 {
		return false
	}
	counts := make(map[string]int)
	n := 0
	for _, m := range g.members {
		if m.classic == nil || m.id == memberID {
			continue
		}
		n++
		for _, p := range m.classic.protocols {
			counts[p.Name]++
		}
	}
	if n == 0 {
		return true
	}
	for _, p := range protocols {
		if counts[p.Name] == n {
			return true
		}
	}
	return false
}

// classicJoin serves a JoinGroup to a non-empty consumer group (Kafka's
// classicGroupJoinToConsumerGroup). It is answered at once: generation =
// the member's epoch after reconciliation, protocol = its first
// protocol, no leader and no member list (every classic member is a
// follower, the coordinator assigns).
func (g *consumerGroup) classicJoin(j *joinReq) {
	r := j.r
	if g.s.e.cfg.ConsumerMigrationPolicy == MigrationDisabled {
		// KAFKA-20640: with the policy disabled Kafka still admitted
		// classic members into consumer groups; they are refused.
		j.reply(joinError(errInconsistentGroupProtocol, r.MemberID))
		return
	}
	memberID := r.MemberID
	unknown := memberID == ""
	if unknown {
		memberID = newMemberID("")[1:]
	}
	_, knownID := g.members[memberID]
	_, knownInstance := g.static[j.instanceID]
	if max := g.s.e.cfg.ConsumerMaxGroupSize; max > 0 && !knownID && !(j.instanceID != "" && knownInstance) && len(g.members) >= max {
		j.reply(joinError(errGroupMaxSizeReached, memberID))
		return
	}
	if !g.supportsClassicProtocols(memberID, r.ProtocolType, j.protocols) {
		j.reply(joinError(errInconsistentGroupProtocol, r.MemberID))
		return
	}
	if unknown && j.instanceID == "" && r.Version >= 4 {
		// KIP-394: a dynamic member first learns its id.
		j.reply(joinError(errMemberIDRequired, memberID))
		return
	}
	sub, err := decodeSubscription(j.protocols[0].Metadata)
	if err != nil {
		j.reply(joinError(errInconsistentGroupProtocol, r.MemberID))
		return
	}
	var m *consumerMember
	joined := false
	// replacesStatic is Kafka's existingStaticMemberIdOrNull != null: the
	// join is by an instance id the group knows, under its old or a new
	// member id (step 7 may downgrade the group).
	replacesStatic := false
	if j.instanceID == "" {
		m = g.members[memberID]
	} else if oldID, ok := g.static[j.instanceID]; ok {
		replacesStatic = true
		switch {
		case unknown:
			// A new instance of a known static member takes over its
			// assignment and target under the new id.
			old := g.members[oldID]
			m = &consumerMember{id: memberID, instanceID: j.instanceID, subscribedNames: old.subscribedNames, regex: old.regex, re: old.re,
				serverAssignor: old.serverAssignor, topics: old.topics, rebalanceTimeout: old.rebalanceTimeout}
			target, assigned := g.targets[old.id], old.Assigned.clone()
			g.remove(old)
			old.stopClassicTimers()
			g.emitMember(EventMemberFenced, old, "static_member_replaced")
			g.add(m)
			g.targets[m.id] = target
			g.setAssignment(m, memberAssignment{State: memberStable, Assigned: assigned, Pending: partSet{}})
			g.emitMember(EventMemberJoined, m, "static_member_replaced")
		case oldID != memberID:
			j.reply(joinError(errFencedInstanceID, memberID))
			return
		default:
			m = g.members[oldID]
		}
	}
	if m == nil {
		m = &consumerMember{id: memberID, instanceID: j.instanceID}
		g.add(m)
		g.setAssignment(m, memberAssignment{State: memberStable, Assigned: partSet{}, Pending: partSet{}})
		joined = true
		g.reclaimWithheld() // as for a KIP-848 newcomer (memberFor)
	}
	// 1. Apply the request.
	if m.clientID != j.rc.ClientID || m.clientHost != j.rc.ClientHost {
		m.clientID, m.clientHost = j.rc.ClientID, j.rc.ClientHost
		g.markDirty()
	}
	if sub.Rack != nil && *sub.Rack != m.rackID {
		m.rackID = *sub.Rack
		g.markDirty()
	}
	if j.rebalance != m.rebalanceTimeout {
		m.rebalanceTimeout = j.rebalance
		g.markDirty()
	}
	subChanged := joined
	if names := sortedNames(sub.Topics); !slices.Equal(names, m.subscribedNames) {
		m.subscribedNames = names
		subChanged = true
	}
	// Dropping a regex changes the subscription; dropping a server
	// assignor (a KIP-848 member replaced by a classic instance) does
	// not bump the epoch (Kafka's hasMemberSubscriptionChanged compares
	// topic names and regex only).
	if m.regex != "" {
		subChanged = true
	}
	if m.regex != "" || m.serverAssignor != "" {
		m.regex, m.re, m.serverAssignor = "", nil, ""
	}
	if m.classic == nil {
		m.classic = &classicProtocol{}
	}
	m.classic.protocols, m.classic.sessionTimeout, m.classic.version = j.protocols, j.session, sub.Version
	g.markDirty()
	if joined {
		g.emitMember(EventMemberJoined, m, "")
	}
	// 2-4. Resolve, bump the epoch, compute the target.
	g.assignStep(m, joined, subChanged)
	// 5. Reconcile toward the target with what the member says it owns
	// (an eager member revoked everything before rejoining).
	owned := ownedFromSubscription(sub, g.snapOrNow())
	wasRevoking, revokingAt := m.State == memberUnrevoked, m.Epoch
	next := reconcile(m.memberAssignment, g.targets[m.id], g.assignmentEpoch, owned, g.ownedByOther(m.id))
	g.setAssignment(m, next)
	g.syncRebalanceTimer(m, revokingAt, wasRevoking)
	resp := kmsg.NewPtrJoinGroupResponse()
	pt, name := "consumer", m.classic.protocolName()
	resp.MemberID, resp.Generation = m.id, m.Epoch
	resp.ProtocolType, resp.Protocol = &pt, &name
	reply := j.reply
	// 7. Kafka's validateOnlineDowngradeWithReplacedMemberId: a static
	// member that rejoins with the classic protocol in place of the last
	// KIP-848 member downgrades the group, without a rebalance (the
	// joining member keeps the replaced member's target; the classic
	// group's heartbeats take over the timers).
	if replacesStatic && g.canDowngrade() {
		g.convertToClassic(m, !g.reconciledBesides(m))
		g.persistThen(func(code int16) {
			if code != errNone {
				reply(joinError(code, m.id))
				return
			}
			reply(resp)
		})
		return
	}
	// 6. Timers: a fresh session, the join done, the sync due within the
	// rebalance timeout.
	stopTimer(m.classic.joinTimer)
	m.classic.joinTimer = timerRef{}
	g.armSessionTimer(m)
	g.armClassicSyncTimer(m)
	g.maybeEmitReconciled()

	g.persistThen(func(code int16) {
		if code != errNone {
			reply(joinError(code, m.id))
			return
		}
		reply(resp)
	})
}

// snapOrNow returns the snapshot the group resolved against, or the
// engine's current one.
func (g *consumerGroup) snapOrNow() *topicSnapshot {
	if g.snap != nil {
		return g.snap
	}
	return g.s.e.topicsNow()
}

// armClassicSyncTimer fences m if it does not send SyncGroup within its
// rebalance timeout (Kafka's scheduleConsumerGroupSyncTimeout).
func (g *consumerGroup) armClassicSyncTimer(m *consumerMember) {
	stopTimer(m.classic.syncTimer)
	m.classic.syncTimer = g.s.arm(m.rebalanceTimeout, func(id uint64) {
		if !g.live() || g.members[m.id] != m || m.classic == nil || m.classic.syncTimer.id != id {
			return
		}
		m.classic.syncTimer = timerRef{}
		g.s.e.log.Info("groupstate: classic member of a consumer group fenced: no SyncGroup in time", "group", g.id, "member", m.id)
		g.removeAndBump(m, EventMemberExpired, "sync_timeout", CauseMemberExpired)
	})
}

// armClassicJoinTimerIfAbsent fences m if it does not rejoin within its
// rebalance timeout after being told to (Kafka's
// scheduleConsumerGroupJoinTimeoutIfAbsent).
func (g *consumerGroup) armClassicJoinTimerIfAbsent(m *consumerMember) {
	if m.classic.joinTimer.t != nil {
		return
	}
	m.classic.joinTimer = g.s.arm(m.rebalanceTimeout, func(id uint64) {
		if !g.live() || g.members[m.id] != m || m.classic == nil || m.classic.joinTimer.id != id {
			return
		}
		m.classic.joinTimer = timerRef{}
		g.s.e.log.Info("groupstate: classic member of a consumer group fenced: no rejoin in time", "group", g.id, "member", m.id)
		g.removeAndBump(m, EventMemberExpired, "join_timeout", CauseMemberExpired)
	})
}

// classicMember finds the member a classic request is for, as Kafka's
// validateConsumerGroupMember and throwIfMemberDoesNotUseClassicProtocol
// do.
func (g *consumerGroup) classicMember(memberID string, instanceID *string) (*consumerMember, int16) {
	var m *consumerMember
	if instanceID != nil {
		id, ok := g.static[*instanceID]
		if !ok {
			return nil, errUnknownMemberID
		}
		if id != memberID {
			return nil, errFencedInstanceID
		}
		m = g.members[id]
	} else {
		m = g.members[memberID]
	}
	if m == nil || m.classic == nil {
		return nil, errUnknownMemberID
	}
	return m, errNone
}

// rebalanceDue is Kafka's throwIfRebalanceInProgress condition: the group
// epoch moved past the member's and it is not revoking (a revoking
// member has rejoined already and gets the next round after revoking).
func (g *consumerGroup) rebalanceDue(m *consumerMember) bool {
	return g.epoch > m.Epoch && m.State != memberUnrevoked
}

// classicSync serves a SyncGroup to a consumer group (Kafka's
// classicGroupSyncToConsumerGroup): the member's assigned partitions, once
// every change made so far is durable.
func (g *consumerGroup) classicSync(r *kmsg.SyncGroupRequest, reply func(kmsg.Response)) {
	m, code := g.classicMember(r.MemberID, r.InstanceID)
	switch {
	case code != errNone:
	case r.Generation != m.Epoch:
		code = errIllegalGeneration
	case r.ProtocolType != nil && *r.ProtocolType != "consumer",
		r.Protocol != nil && *r.Protocol != m.classic.protocolName():
		code = errInconsistentGroupProtocol
	case g.rebalanceDue(m):
		g.armClassicJoinTimerIfAbsent(m)
		code = errRebalanceInProgress
	}
	if code != errNone {
		reply(syncError(code))
		return
	}
	resp := kmsg.NewPtrSyncGroupResponse()
	resp.ProtocolType, resp.Protocol = r.ProtocolType, r.Protocol
	resp.MemberAssignment = encodeClassicAssignment(m.Assigned, g.s.e.topicsNow(), m.classic.version)
	g.persistThen(func(code int16) {
		if code != errNone {
			reply(syncError(code))
			return
		}
		if g.live() && g.members[m.id] == m && m.classic != nil {
			stopTimer(m.classic.syncTimer)
			m.classic.syncTimer = timerRef{}
			g.armSessionTimer(m)
		}
		reply(resp)
	})
}

// classicHeartbeat serves a Heartbeat to a consumer group (Kafka's
// classicGroupHeartbeatToConsumerGroup): REBALANCE_IN_PROGRESS tells the
// member to rejoin when the group epoch moved past it, when it must
// revoke, or when partitions it waits for are now free.
func (g *consumerGroup) classicHeartbeat(r *kmsg.HeartbeatRequest) int16 {
	m, code := g.classicMember(r.MemberID, r.InstanceID)
	if code != errNone {
		return code
	}
	if r.Generation != m.Epoch {
		return errIllegalGeneration
	}
	g.armSessionTimer(m)
	if m.Epoch < g.epoch || m.State == memberUnrevoked || (m.State == memberUnreleased && !g.waitingOnUnreleased(m)) {
		g.armClassicJoinTimerIfAbsent(m)
		return errRebalanceInProgress
	}
	return errNone
}

// waitingOnUnreleased reports whether some partition of m's target that
// it does not hold yet is still held by another member (Kafka's
// waitingOnUnreleasedPartition).
func (g *consumerGroup) waitingOnUnreleased(m *consumerMember) bool {
	taken := g.ownedByOther(m.id)
	for t, ps := range g.targets[m.id] {
		for p := range ps {
			if m.Assigned.has(t, p) {
				continue
			}
			if taken(t, p) {
				return true
			}
		}
	}
	return false
}

// classicLeave serves a LeaveGroup to a consumer group (Kafka's
// classicGroupLeaveToConsumerGroup): every listed member is removed (by
// instance id when given), then the epoch is bumped once; removing the
// last KIP-848 member may downgrade the group.
func (g *consumerGroup) classicLeave(leaving []kmsg.LeaveGroupRequestMember, results []kmsg.LeaveGroupResponseMember) {
	var first *consumerMember
	for i, l := range leaving {
		var m *consumerMember
		if l.InstanceID != nil {
			id, ok := g.static[*l.InstanceID]
			switch {
			case !ok:
				results[i].ErrorCode = errUnknownMemberID
				continue
			case l.MemberID != "" && l.MemberID != id:
				results[i].ErrorCode = errFencedInstanceID
				continue
			}
			m = g.members[id]
		} else if m = g.members[l.MemberID]; m == nil {
			results[i].ErrorCode = errUnknownMemberID
			continue
		}
		reason := ""
		if l.Reason != nil {
			reason = *l.Reason
		}
		g.s.e.log.Info("groupstate: member left a consumer group with LeaveGroup", "group", g.id, "member", m.id, "reason", reason)
		g.remove(m)
		m.stopClassicTimers()
		g.emitMember(EventMemberLeft, m, reason)
		if first == nil {
			first = m
		}
	}
	if first != nil {
		g.afterRemoval(first, CauseMemberLeft)
	}
}

// ---- Downgrade: consumer → classic ----

// canDowngrade is Kafka's validateOnlineDowngradeWithFencedMember, asked
// once the fenced or leaving members are removed: some members remain,
// every one speaks the classic protocol, the policy allows downgrades
// and they fit group.max.size.
func (g *consumerGroup) canDowngrade() bool {
	n := 0
	for _, o := range g.members {
		if o.classic == nil {
			return false
		}
		n++
	}
	if n == 0 {
		return false
	}
	if !g.s.e.cfg.ConsumerMigrationPolicy.downgradeEnabled() {
		g.s.e.log.Info("groupstate: consumer group not downgraded: the online downgrade is disabled", "group", g.id)
		return false
	}
	if max := g.s.e.cfg.MaxGroupSize; max > 0 && n > max {
		g.s.e.log.Info("groupstate: consumer group not downgraded: larger than group.max.size", "group", g.id)
		return false
	}
	return true
}

// reconciledBesides reports whether every member but m holds exactly its
// target at the group epoch. A static replacement downgrades without a
// rebalance only then: the classic group takes the targets as the
// members' assignments, and a classic member still waiting for a
// partition of its target (released meanwhile, as the replaced member's
// were) would otherwise never be told of it: its heartbeats at its
// generation go on succeeding and the partition stays without an owner
// until the next rebalance. Kafka's convertToClassicGroup always skips
// the rebalance here; a rebalance costs one round, an unowned partition
// stops consumption.
func (g *consumerGroup) reconciledBesides(m *consumerMember) bool {
	for id, o := range g.members {
		if o == m {
			continue
		}
		if o.State != memberStable || o.Epoch != g.epoch || !o.Assigned.equal(g.targets[id]) {
			return false
		}
	}
	return true
}

// convertToClassic replaces g by a classic group (Kafka's
// convertToClassicGroup and ClassicGroup.fromConsumerGroup): Stable at
// generation = group epoch, protocol type "consumer", every member with
// its target as assignment. by is the member whose departure (or static
// replacement) converted it. With rebalance, as after a departure, every
// member is then made to rejoin; a static replacement keeps the group
// Stable (Kafka triggers no rebalance when a joining member converts
// it). Heartbeats waiting for g's writes are answered once the classic
// record is written.
func (g *consumerGroup) convertToClassic(by *consumerMember, rebalance bool) {
	s := g.s
	snap := s.e.topicsNow()
	g.cancelAllTimers()
	s.drop(g.id, g)

	c := newClassicGroup(s, g.id)
	// A group built whole (as Kafka constructs it), not a transition.
	c.state, c.prevState = stateStable, stateCompletingRebalance
	c.generation = g.epoch
	check := s.e.cfg.CheckCommitOwnership
	for _, id := range g.sortedIDs() {
		m := g.members[id]
		cm := &classicMember{
			id: m.id, instanceID: m.instanceID, clientID: m.clientID, clientHost: m.clientHost,
			protocols:        m.classic.protocols,
			sessionTimeout:   m.classic.sessionTimeout,
			rebalanceTimeout: m.rebalanceTimeout,
			assignment:       encodeClassicAssignment(g.targets[m.id], snap, m.classic.version),
		}
		if check {
			cm.owned = decodeOwned(cm.assignment)
		}
		c.add(cm, "consumer")
	}
	c.protocol = c.selectProtocol()
	s.groups[c.id] = c
	byMember := (*Member)(nil)
	if by != nil {
		pm := g.public(by, false)
		byMember = &pm
	}
	s.e.log.Info("groupstate: consumer group converted to a classic group", "group", c.id, "generation", c.generation, "members", len(c.members), "rebalance", rebalance)
	s.emitConverted(c.event(0), CauseConvertedToClassic, byMember, c.membersList(true))
	for _, id := range c.order {
		c.rearmSession(c.members[id])
	}
	// The classic record replaces the consumer one; whoever waited for
	// the consumer group's writes is answered once it is durable.
	waiters := g.takeWaiters()
	g.converted = &convertedWait{}
	conv := g.converted
	conv.ws = waiters
	if s.e.meta == nil {
		conv.finish(errNone)
	} else {
		s.saveMeta(c.id, c.record(nil), func(err error) {
			code := errNone
			if err != nil {
				code = storeErrorCode(err)
				s.e.log.Warn("groupstate: persisting a downgraded group failed", "group", c.id, "err", err)
			}
			conv.finish(code)
		}, func() { conv.finish(errCoordinatorNotAvailable) })
	}
	if rebalance {
		c.prepareRebalance(CauseConvertedToClassic, nil)
	}
}

// convertedWait holds the answers waiting for the record of the classic
// group a consumer group was converted into (owned by the loop).
type convertedWait struct {
	done bool
	code int16
	ws   []func(int16)
}

// add queues answer, or answers at once once done.
func (c *convertedWait) add(answer func(int16)) {
	if c.done {
		answer(c.code)
		return
	}
	c.ws = append(c.ws, answer)
}

// finish answers every waiter with code.
func (c *convertedWait) finish(code int16) {
	if c.done {
		return
	}
	c.done, c.code = true, code
	ws := c.ws
	c.ws = nil
	for _, w := range ws {
		w(code)
	}
}
