package groupstate

import (
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// ConsumerGroupHeartbeat (key 68), versions 0-1 (KIP-848).
//
//   - v0: the coordinator mints the member id of a member joining with
//     epoch 0 and an empty id.
//   - v1: the client generates its member id (KIP-1082), so it is never
//     empty; SubscribedTopicRegex (RE2, full-name match).
//
// One heartbeat, in the order of Kafka's GroupMetadataManager: validate the
// request's fields, find or create the group and member (checking the
// member epoch), apply the request's fields, bump the group epoch when the
// subscription or the subscribed topics' metadata changed, compute a new
// target when the group epoch is ahead of the assignment epoch, reconcile
// the member toward its target (revoke before assign), re-arm its
// session timer and answer. Epochs -1 and -2 leave.
//
// An empty classic group is replaced; a non-empty one of protocol type
// "consumer" is converted online when the migration policy allows it
// (consumer_migration.go), else refused with GROUP_ID_NOT_FOUND.

// Special member epochs.
const (
	epochLeave       int32 = -1 // the member leaves the group
	epochStaticLeave int32 = -2 // a static member leaves temporarily
)

// consumerHeartbeat serves a ConsumerGroupHeartbeat on the owning loop.
// waited is set when the heartbeat already waited for a topic refresh
// (waitsForTopics): it then runs with the topics known.
func (s *shard) consumerHeartbeat(rc RequestContext, r *kmsg.ConsumerGroupHeartbeatRequest, reply func(kmsg.Response), waited bool) {
	fail := func(code int16, msg string) {
		resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		resp.ErrorCode = code
		if msg != "" {
			resp.ErrorMessage = &msg
		}
		reply(resp)
	}
	re, code, msg := validateConsumerHeartbeat(r, s.e.cfg.ConsumerAssignors)
	if code != errNone {
		fail(code, msg)
		return
	}
	if !waited && s.waitsForTopics(r) {
		// The member subscribes to a topic the cache does not know
		// (most often created just before the member started): Kafka's
		// coordinator knows it from its metadata image and assigns it in
		// this answer. Refresh now and serve the heartbeat again, on
		// this loop, once the refresh completed or maxTopicWait passed;
		// nothing of the group changes meanwhile on its behalf.
		s.e.awaitTopics(s.e.clock.Now(), func() {
			s.e.onGroup(r.Group, r, reply, func(s *shard) { s.consumerHeartbeat(rc, r, reply, true) })
		})
		return
	}
	g, _ := s.consumerOf(r.Group)
	if r.MemberEpoch != 0 {
		if g == nil {
			// Kafka's texts (GroupMetadataManager.getOrMaybeCreateConsumerGroup).
			if _, held := s.kindOf(r.Group); held {
				fail(errGroupIDNotFound, notKindText(r.Group, KindConsumer))
			} else {
				fail(errGroupIDNotFound, "Consumer group "+r.Group+" not found.")
			}
			return
		}
	} else if g == nil {
		if classic, ok := s.classicOf(r.Group); ok && classic.state != stateDead {
			if len(classic.members) > 0 {
				// Online upgrade (consumer_migration.go), as Kafka's
				// getOrMaybeCreateConsumerGroup does.
				if ok, why := s.validateOnlineUpgrade(classic); !ok {
					s.e.log.Info("groupstate: classic group not upgraded", "group", r.Group, "reason", why)
					fail(errGroupIDNotFound, "cannot upgrade the classic group: "+why)
					return
				}
				if !s.e.topicsKnown() {
					// The members' assignments name topics: without
					// the topic cache they cannot be carried over.
					s.e.requestTopicRefresh()
					fail(errCoordinatorLoadInProgress, "topic metadata is loading")
					return
				}
				if s.upgradeWaitsForTopics(classic) {
					// A member holds a partition the topic cache does
					// not know yet (a topic created since the last
					// refresh): carried over now, it would be lost and
					// given to a second member.
					fail(errCoordinatorLoadInProgress, "topic metadata is loading")
					return
				}
				if max := s.e.cfg.ConsumerMaxGroupSize; max > 0 && len(classic.members) >= max {
					// The joining member would not fit: Kafka rolls the
					// conversion back with this error.
					fail(errGroupMaxSizeReached, "the consumer group has reached its maximum size")
					return
				}
				var err error
				if g, err = s.convertToConsumer(classic, r.MemberID); err != nil {
					s.e.log.Warn("groupstate: classic group not upgraded: malformed embedded consumer protocol", "group", r.Group, "err", err)
					fail(errGroupIDNotFound, "cannot upgrade the classic group: the embedded consumer protocol is malformed")
					return
				}
			} else {
				s.dropClassic(classic)
			}
		}
		if g == nil {
			g = newConsumerGroup(s, r.Group)
			s.groups[r.Group] = g
			s.emit(g.event(EventGroupCreated))
		}
	}
	if r.MemberEpoch == epochLeave || r.MemberEpoch == epochStaticLeave {
		g.leave(r, reply, fail)
		return
	}
	m, joined, code, msg := g.memberFor(r)
	if code != errNone {
		if len(g.members) == 0 && g.epoch == 0 {
			s.drop(g.id, g)
		}
		fail(code, msg)
		return
	}
	g.heartbeat(rc, r, re, m, joined, reply)
}

// waitsForTopics reports whether heartbeat r must wait for a topic
// refresh before it is served: it subscribes to a topic name the topic
// cache does not know (or the cache was never loaded) and the member did
// not subscribe to that name already. A member that keeps a subscription
// to a missing topic is not held up on every heartbeat: the periodic
// refresh and requestTopicRefresh find the topic once it exists, as
// Kafka's coordinator bumps the group epoch when its metadata changes.
// Regular expressions never wait: Kafka resolves them asynchronously and
// assigns their matches on a later heartbeat (KIP-848).
func (s *shard) waitsForTopics(r *kmsg.ConsumerGroupHeartbeatRequest) bool {
	if r.MemberEpoch < 0 || r.SubscribedTopicNames == nil {
		return false
	}
	if _, ok := s.e.cfg.Store.(TopicMetadataStore); !ok {
		return false
	}
	snap, known := s.e.topicsNow(), s.e.topicsKnown()
	var already []string
	if g, _ := s.consumerOf(r.Group); g != nil {
		m := g.members[r.MemberID]
		if m == nil && r.InstanceID != nil {
			m = g.members[g.static[*r.InstanceID]]
		}
		if m != nil {
			already = m.subscribedNames
		}
	}
	for _, n := range r.SubscribedTopicNames {
		if _, ok := snap.byName[n]; ok && known {
			continue
		}
		if !slices.Contains(already, n) {
			return true
		}
	}
	return false
}

// validateConsumerHeartbeat checks the request's fields as Kafka does
// before any group logic (INVALID_REQUEST for a missing or empty field the
// member epoch requires, UNSUPPORTED_ASSIGNOR for an unknown assignor) and
// compiles the regex.
func validateConsumerHeartbeat(r *kmsg.ConsumerGroupHeartbeatRequest, configured []string) (*regexp.Regexp, int16, string) {
	switch {
	case r.Group == "":
		return nil, errInvalidRequest, "GroupId can't be empty."
	case r.InstanceID != nil && *r.InstanceID == "":
		return nil, errInvalidRequest, "InstanceId can't be empty."
	case r.RackID != nil && *r.RackID == "":
		return nil, errInvalidRequest, "RackId can't be empty."
	case r.MemberEpoch < epochStaticLeave:
		return nil, errInvalidRequest, "MemberEpoch is invalid."
	case r.MemberID == "" && (r.Version >= 1 || r.MemberEpoch > 0 || r.MemberEpoch == epochLeave):
		return nil, errInvalidRequest, "MemberId can't be empty."
	case r.MemberEpoch == epochStaticLeave && r.InstanceID == nil:
		return nil, errInvalidRequest, "InstanceId can't be null for a static leave."
	}
	if r.MemberEpoch == 0 {
		switch {
		case r.RebalanceTimeoutMillis == -1:
			return nil, errInvalidRequest, "RebalanceTimeoutMs must be provided in first request."
		case r.Topics == nil || len(r.Topics) > 0:
			return nil, errInvalidRequest, "TopicPartitions must be empty when (re-)joining."
		case r.SubscribedTopicNames == nil && (r.Version < 1 || r.SubscribedTopicRegex == nil):
			return nil, errInvalidRequest, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
		}
	}
	if r.ServerAssignor != nil && !slices.Contains(configured, *r.ServerAssignor) {
		return nil, errUnsupportedAssignor, "ServerAssignor " + *r.ServerAssignor + " is not supported."
	}
	if r.Version >= 1 && r.SubscribedTopicRegex != nil && *r.SubscribedTopicRegex != "" {
		re, err := regexp.Compile("^(?:" + *r.SubscribedTopicRegex + ")$")
		if err != nil {
			return nil, errInvalidRegularExpression, "SubscribedTopicRegex is invalid: " + err.Error()
		}
		return re, errNone, ""
	}
	return nil, errNone, ""
}

// dropClassic forgets an empty classic group replaced by a consumer
// group (offline upgrade; its offsets stay).
func (s *shard) dropClassic(classic *classicGroup) {
	classic.cancelAllTimers()
	for _, p := range classic.pending {
		stopTimer(p.timer)
	}
	classic.transitionTo(stateDead)
	s.drop(classic.id, classic)
	if classic.generation > 0 {
		s.tombstone(classic.id)
	}
	s.e.log.Info("groupstate: empty classic group replaced by a consumer group", "group", classic.id)
}

// memberFor finds or creates the member a heartbeat with epoch ≥ 0 is
// for, enforcing static membership (KIP-345) and the group size limit;
// joined reports a new member.
func (g *consumerGroup) memberFor(r *kmsg.ConsumerGroupHeartbeatRequest) (m *consumerMember, joined bool, code int16, msg string) {
	if r.InstanceID != nil {
		inst := *r.InstanceID
		oldID, known := g.static[inst]
		if r.MemberEpoch != 0 {
			if !known {
				return nil, false, errUnknownMemberID, "unknown static member"
			}
			if oldID != r.MemberID {
				return nil, false, errFencedInstanceID, "the instance id is used by another member"
			}
			return g.members[oldID], false, errNone, ""
		}
		if known && oldID == r.MemberID {
			g.resetForRejoin(g.members[oldID])
			return g.members[oldID], false, errNone, ""
		}
		if known {
			old := g.members[oldID]
			if old.Epoch != epochStaticLeave {
				return nil, false, errUnreleasedInstanceID, "static member " + inst + " has not left yet"
			}
			// The new instance takes over the old member's
			// assignment and target under its own id.
			nm := g.newMember(r)
			nm.instanceID = inst
			nm.subscribedNames, nm.regex, nm.re, nm.regexPending = old.subscribedNames, old.regex, old.re, old.regexPending
			nm.serverAssignor, nm.topics, nm.rebalanceTimeout = old.serverAssignor, old.topics, old.rebalanceTimeout
			target := g.targets[old.id]
			assigned := old.Assigned.clone()
			g.remove(old)
			g.emitMember(EventMemberFenced, old, "static_member_replaced")
			g.add(nm)
			g.targets[nm.id] = target
			g.setAssignment(nm, memberAssignment{State: memberStable, Epoch: 0, Assigned: assigned, Pending: partSet{}})
			// Same subscription, same target: no new epoch.
			g.emitMember(EventMemberJoined, nm, "static_member_replaced")
			return nm, false, errNone, ""
		}
	} else if r.MemberEpoch != 0 {
		m, ok := g.members[r.MemberID]
		if !ok {
			return nil, false, errUnknownMemberID, "unknown member"
		}
		return m, false, errNone, ""
	} else if m, ok := g.members[r.MemberID]; ok && r.MemberID != "" {
		// KAFKA-19233: an existing (maybe fenced) member rejoins.
		g.resetForRejoin(m)
		return m, false, errNone, ""
	}
	if max := g.s.e.cfg.ConsumerMaxGroupSize; max > 0 && len(g.members) >= max {
		return nil, false, errGroupMaxSizeReached, "the consumer group has reached its maximum size"
	}
	nm := g.newMember(r)
	if r.InstanceID != nil {
		nm.instanceID = *r.InstanceID
	}
	g.add(nm)
	g.setAssignment(nm, memberAssignment{State: memberStable, Assigned: partSet{}, Pending: partSet{}})
	// Withheld partitions may be meant for the newcomer: the anchor
	// takes them back now rather than after the window.
	g.reclaimWithheld()
	return nm, true, errNone, ""
}

// newMember builds a member for a joining heartbeat, minting its id for
// v0 clients that sent none.
func (g *consumerGroup) newMember(r *kmsg.ConsumerGroupHeartbeatRequest) *consumerMember {
	id := r.MemberID
	if id == "" {
		id = newMemberID("")[1:]
	}
	return &consumerMember{id: id}
}

// resetForRejoin resets a member rejoining with epoch 0: it owns nothing
// (its request says so) and starts from epoch 0 toward its target.
func (g *consumerGroup) resetForRejoin(m *consumerMember) {
	g.setAssignment(m, memberAssignment{State: memberStable, Assigned: partSet{}, Pending: partSet{}})
	stopTimer(m.rebalanceTimer)
	m.rebalanceTimer = timerRef{}
	m.lastSent = nil
}

// heartbeat runs one heartbeat's seven steps for member m, numbered below.
func (g *consumerGroup) heartbeat(rc RequestContext, r *kmsg.ConsumerGroupHeartbeatRequest, re *regexp.Regexp, m *consumerMember, joined bool, reply func(kmsg.Response)) {
	// Epoch check: a lost response may leave the client one epoch
	// behind, owning a subset of what it was given.
	owned := ownedFromRequest(r.Topics)
	if r.MemberEpoch > 0 && r.MemberEpoch != m.Epoch {
		if r.MemberEpoch > m.Epoch || r.MemberEpoch != m.PreviousEpoch || owned == nil || !subsetOf(owned, m.Assigned) {
			resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
			resp.ErrorCode = errFencedMemberEpoch
			msg := "the member epoch is fenced"
			resp.ErrorMessage = &msg
			reply(resp)
			return
		}
	}
	// 1. Apply every non-null field.
	if m.clientID != rc.ClientID || m.clientHost != rc.ClientHost {
		m.clientID, m.clientHost = rc.ClientID, rc.ClientHost
		g.markDirty()
	}
	subChanged := joined
	if r.RackID != nil && *r.RackID != m.rackID {
		m.rackID = *r.RackID
		g.markDirty()
	}
	if d := time.Duration(r.RebalanceTimeoutMillis) * time.Millisecond; d > 0 && d != m.rebalanceTimeout {
		m.rebalanceTimeout = d
		g.markDirty()
	}
	if r.SubscribedTopicNames != nil {
		names := append([]string(nil), r.SubscribedTopicNames...)
		sort.Strings(names)
		names = slices.Compact(names)
		if !slices.Equal(names, m.subscribedNames) {
			m.subscribedNames = names
			subChanged = true
		}
	}
	if r.Version >= 1 && r.SubscribedTopicRegex != nil && *r.SubscribedTopicRegex != m.regex {
		m.regex, m.re = *r.SubscribedTopicRegex, re
		m.regexPending = re != nil && !g.regexResolved(m.regex, m)
		subChanged = true
	}
	if r.ServerAssignor != nil && *r.ServerAssignor != m.serverAssignor {
		m.serverAssignor = *r.ServerAssignor
		subChanged = true
	}
	if m.rebalanceTimeout <= 0 {
		m.rebalanceTimeout = g.s.e.cfg.ConsumerSessionTimeout
	}
	if joined {
		g.emitMember(EventMemberJoined, m, "")
	}
	// 2-4. Resolve, bump, compute the target.
	g.assignStep(m, joined, subChanged)
	// 5. Reconcile the member toward its target.
	wasRevoking, revokingAt := m.State == memberUnrevoked, m.Epoch
	next := reconcile(m.memberAssignment, g.targets[m.id], g.assignmentEpoch, owned, g.ownedByOther(m.id))
	prev := m.memberAssignment
	g.setAssignment(m, next)
	g.emitReconciling(m, prev)
	g.syncRebalanceTimer(m, revokingAt, wasRevoking)
	// 6. Re-arm the session timer.
	g.armSessionTimer(m)
	// 7. Answer.
	resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	resp.MemberID = &m.id
	resp.MemberEpoch = m.Epoch
	resp.HeartbeatIntervalMillis = int32(g.heartbeatEvery() / time.Millisecond)
	full := r.RebalanceTimeoutMillis != -1 && (r.SubscribedTopicNames != nil || r.SubscribedTopicRegex != nil) && r.Topics != nil
	if r.MemberEpoch == 0 || full || m.lastSent == nil || !m.lastSent.equal(m.Assigned) {
		a := kmsg.NewConsumerGroupHeartbeatResponseAssignment()
		for _, t := range m.Assigned.sortedTopics() {
			at := kmsg.NewConsumerGroupHeartbeatResponseAssignmentTopic()
			at.TopicID, at.Partitions = t, m.Assigned.sortedPartitions(t)
			a.Topics = append(a.Topics, at)
		}
		resp.Assignment = &a
		m.lastSent = m.Assigned.clone()
	}
	g.maybeEmitReconciled()
	if subChanged {
		g.markDirty()
	}
	// The answer carries the new epoch and assignment: it goes out once
	// they are durable, so a restarted engine never knows less than the
	// client.
	g.persistThen(answerWith(resp, reply))
	if m.regexPending {
		// Resolved after this answer, as Kafka resolves it off the
		// heartbeat: the matches come on a later heartbeat.
		g.s.post(g.resolvePendingRegexes)
	}
}

// answerWith returns the durability callback that sends resp, or the
// error code instead of it.
func answerWith(resp *kmsg.ConsumerGroupHeartbeatResponse, reply func(kmsg.Response)) func(int16) {
	return func(code int16) {
		if code != errNone {
			resp = kmsg.NewPtrConsumerGroupHeartbeatResponse()
			resp.ErrorCode = code
		}
		reply(resp)
	}
}

// leave serves epoch -1 (leave) and -2 (static member leaving for a
// while): a leaving member is removed and the group epoch bumped; a
// static member leaving with -2 keeps its assignment, without a bump,
// until its session expires or a new instance replaces it.
func (g *consumerGroup) leave(r *kmsg.ConsumerGroupHeartbeatRequest, reply func(kmsg.Response), fail func(int16, string)) {
	var m *consumerMember
	if r.InstanceID != nil {
		id, ok := g.static[*r.InstanceID]
		if !ok {
			fail(errUnknownMemberID, "unknown static member")
			return
		}
		if id != r.MemberID {
			fail(errFencedInstanceID, "the instance id is used by another member")
			return
		}
		m = g.members[id]
	} else {
		var ok bool
		if m, ok = g.members[r.MemberID]; !ok {
			fail(errUnknownMemberID, "unknown member")
			return
		}
	}
	resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	resp.MemberID = &m.id
	resp.MemberEpoch = r.MemberEpoch
	if r.MemberEpoch == epochStaticLeave && m.instanceID != "" {
		// The static member keeps its assignment until its session
		// expires or a new instance replaces it.
		next := m.memberAssignment
		next.Epoch, next.State, next.Pending = epochStaticLeave, memberStable, partSet{}
		g.setAssignment(m, next)
		stopTimer(m.rebalanceTimer)
		m.rebalanceTimer = timerRef{}
		g.emitMember(EventMemberLeft, m, "static_leave")
		g.persistThen(answerWith(resp, reply))
		return
	}
	g.withholdFreed(m)
	g.removeAndBump(m, EventMemberLeft, "", CauseMemberLeft)
	g.persistThen(answerWith(resp, reply))
}

// ownedFromRequest converts the owned partitions of a request; nil stays
// nil (unchanged).
func ownedFromRequest(topics []kmsg.ConsumerGroupHeartbeatRequestTopic) partSet {
	if topics == nil {
		return nil
	}
	out := partSet{}
	for _, t := range topics {
		for _, p := range t.Partitions {
			out.add(t.TopicID, p)
		}
	}
	return out
}

// subsetOf reports whether every partition of a is in b.
func subsetOf(a, b partSet) bool {
	for t, ps := range a {
		for p := range ps {
			if !b.has(t, p) {
				return false
			}
		}
	}
	return true
}

// assignStep runs steps 2-4 of a heartbeat (or of a classic member's
// JoinGroup) for member m, after its fields were applied: resolve the
// subscriptions against the current topics (a name the cache does not
// know asks for a refresh), bump the group epoch on a subscription or
// metadata change, and compute a new target when the group epoch is
// ahead of the assignment epoch.
func (g *consumerGroup) assignStep(m *consumerMember, joined, subChanged bool) {
	snap := g.s.e.topicsNow()
	snapChanged := snap != g.snap
	if snapChanged {
		g.snap = snap
		for _, om := range g.members {
			om.resolve(snap)
		}
	} else if subChanged {
		m.resolve(snap)
	}
	for _, n := range m.subscribedNames {
		if _, ok := snap.byName[n]; !ok {
			g.s.e.requestTopicRefresh()
			break
		}
	}
	// 3. Bump the group epoch on a subscription or metadata change.
	// Until the topic cache was loaded once (just after a start) the
	// topics are unknown, not gone: targets are carried over unchanged
	// (new members get none) until the cache is loaded.
	topicsKnown := g.s.e.topicsKnown()
	hash := g.subHash
	if snapChanged || subChanged {
		hash = g.subscriptionHash()
	}
	switch {
	case joined:
		g.subHash = hash
		g.bumpEpoch(CauseMemberJoined, m)
	case subChanged:
		g.subHash = hash
		g.bumpEpoch(CauseSubscriptionChanged, m)
	case hash != g.subHash && topicsKnown:
		g.subHash = hash
		g.bumpEpoch(CauseTopicsChanged, nil)
	}
	// 4. Compute a new target when the group epoch is ahead.
	if g.epoch > g.assignmentEpoch {
		if topicsKnown {
			g.computeTargets()
		} else {
			g.carryTargets()
		}
	}
}
