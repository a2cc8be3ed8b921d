package groupstate

import (
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// JoinGroup (key 11), versions 0-9.
//
//   - v0: no rebalance timeout; it equals the session timeout (KAFKA-8653).
//   - v1: RebalanceTimeoutMillis.
//   - v2: ThrottleMillis in the response.
//   - v4: a dynamic member joining with an empty id gets MEMBER_ID_REQUIRED
//     and the id to rejoin with (KIP-394).
//   - v5: InstanceID for static membership (KIP-345).
//   - v6: flexible versions.
//   - v7: ProtocolType in the response.
//   - v8: Reason.
//   - v9: SkipAssignment for a static leader replaced in Stable (KIP-814).

// joinGroup serves a JoinGroup on the owning loop.
func (s *shard) joinGroup(rc RequestContext, r *kmsg.JoinGroupRequest, reply func(kmsg.Response)) {
	if r.Group == "" {
		reply(joinError(errInvalidGroupID, r.MemberID))
		return
	}
	session := time.Duration(r.SessionTimeoutMillis) * time.Millisecond
	if session < s.e.cfg.MinSessionTimeout || session > s.e.cfg.MaxSessionTimeout {
		reply(joinError(errInvalidSessionTimeout, r.MemberID))
		return
	}
	rebalance := time.Duration(r.RebalanceTimeoutMillis) * time.Millisecond
	if r.Version == 0 || rebalance <= 0 {
		rebalance = session
	}
	if consumer, ok := s.consumerOf(r.Group); ok {
		// A consumer (KIP-848) group of the same id: an empty one is
		// replaced (offline downgrade); a non-empty one takes the
		// member in (consumer_migration.go).
		if len(consumer.members) > 0 {
			consumer.classicJoin(newJoinReq(rc, r, reply, session, rebalance))
			return
		}
		consumer.cancelAllTimers()
		s.drop(r.Group, consumer)
		s.tombstone(r.Group)
		s.e.log.Info("groupstate: empty consumer group replaced by a classic group", "group", r.Group)
	}
	g, ok := s.classicOf(r.Group)
	if ok && g.handingBack {
		g.refuseHandedBackJoin(r, reply)
		return
	}
	if !ok {
		if r.MemberID != "" {
			reply(joinError(errUnknownMemberID, r.MemberID))
			return
		}
		g = newClassicGroup(s, r.Group)
		s.groups[r.Group] = g
		s.emit(g.event(EventGroupCreated))
		g.armEmptyTimer()
	}
	j := newJoinReq(rc, r, reply, session, rebalance)
	g.join(j)
	// A group created for a join that failed holds nothing: forget it.
	if g.state == stateEmpty && len(g.members) == 0 && len(g.pending) == 0 && g.generation == 0 && g.live() {
		s.drop(g.id, g)
		g.transitionTo(stateDead)
		s.emit(g.event(EventGroupDeleted))
	}
}

// newJoinReq builds the joinReq of r, copying its protocols (the
// request's memory belongs to the caller).
func newJoinReq(rc RequestContext, r *kmsg.JoinGroupRequest, reply func(kmsg.Response), session, rebalance time.Duration) *joinReq {
	j := &joinReq{rc: rc, r: r, reply: reply, session: session, rebalance: rebalance}
	if r.InstanceID != nil {
		j.instanceID = *r.InstanceID
	}
	j.protocols = copyProtocols(r.Protocols)
	return j
}

// joinReq is a JoinGroup being served.
type joinReq struct {
	rc         RequestContext
	r          *kmsg.JoinGroupRequest
	reply      func(kmsg.Response)
	session    time.Duration
	rebalance  time.Duration
	instanceID string
	protocols  []kmsg.JoinGroupRequestProtocol
}

// join dispatches a JoinGroup to the new- or known-member path.
func (g *classicGroup) join(j *joinReq) {
	if !g.acceptJoiningMember(j.r.MemberID) {
		// Kafka kicks out the late rejoiner; the join may now be
		// complete without it.
		if p, ok := g.pending[j.r.MemberID]; ok {
			stopTimer(p.timer)
			delete(g.pending, j.r.MemberID)
		}
		j.reply(joinError(errGroupMaxSizeReached, ""))
		if m, ok := g.members[j.r.MemberID]; ok {
			g.remove(m.id)
			g.emitMember(EventMemberLeft, m, "group_max_size")
			g.maybeCompleteJoin()
		}
		return
	}
	if j.r.MemberID == "" {
		g.joinNewMember(j)
	} else {
		g.joinKnownMember(j)
	}
}

// acceptJoiningMember applies group.max.size as Kafka does.
func (g *classicGroup) acceptJoiningMember(memberID string) bool {
	max := g.s.e.cfg.MaxGroupSize
	if max == 0 {
		return true
	}
	switch g.state {
	case stateEmpty, stateDead:
		return true
	case statePreparingRebalance:
		if m, ok := g.members[memberID]; ok && m.joinReply != nil {
			return true
		}
		return g.awaitingJoin < max
	default:
		if _, ok := g.members[memberID]; ok {
			return true
		}
		return len(g.members) < max
	}
}

// joinNewMember serves a JoinGroup with an empty member id.
func (g *classicGroup) joinNewMember(j *joinReq) {
	if g.state == stateDead {
		j.reply(joinError(errCoordinatorNotAvailable, ""))
		return
	}
	if !g.supportsProtocols(j.r.ProtocolType, j.protocols) {
		j.reply(joinError(errInconsistentGroupProtocol, ""))
		return
	}
	prefix := j.rc.ClientID
	if j.instanceID != "" {
		prefix = j.instanceID
	}
	id := newMemberID(prefix)
	switch {
	case j.instanceID != "":
		if _, known := g.static[j.instanceID]; known {
			g.replaceStaticMember(j, id)
		} else {
			g.addMember(j, id)
		}
	case j.r.Version >= 4:
		p := &pendingMember{id: id}
		g.pending[id] = p
		g.armPendingTimer(p, j.session)
		j.reply(joinError(errMemberIDRequired, id))
	default:
		g.addMember(j, id)
	}
}

// joinKnownMember serves a JoinGroup with a member id.
func (g *classicGroup) joinKnownMember(j *joinReq) {
	id := j.r.MemberID
	if g.state == stateDead {
		j.reply(joinError(errCoordinatorNotAvailable, id))
		return
	}
	if !g.supportsProtocols(j.r.ProtocolType, j.protocols) {
		j.reply(joinError(errInconsistentGroupProtocol, id))
		return
	}
	if p, ok := g.pending[id]; ok {
		stopTimer(p.timer)
		delete(g.pending, id)
		g.addMember(j, id)
		return
	}
	if code := g.validateMember(id, j.r.InstanceID); code != errNone {
		j.reply(joinError(code, id))
		return
	}
	m := g.members[id]
	m.clientID, m.clientHost = j.rc.ClientID, j.rc.ClientHost
	switch g.state {
	case statePreparingRebalance:
		g.updateMember(m, j)
		g.maybeRebalanceOrCompleteJoin(CauseMetadataChanged, m)
	case stateCompletingRebalance:
		if m.sameProtocols(j.protocols) {
			// The join response was lost: send it again.
			j.reply(g.currentJoinResponse(m, m.id == g.leader, g.leader, false))
			return
		}
		g.updateMember(m, j)
		g.prepareRebalance(CauseMetadataChanged, m)
	case stateStable:
		if m.id == g.leader {
			g.updateMember(m, j)
			g.prepareRebalance(CauseLeaderRejoined, m)
		} else if !m.sameProtocols(j.protocols) {
			g.updateMember(m, j)
			g.prepareRebalance(CauseMetadataChanged, m)
		} else {
			j.reply(g.currentJoinResponse(m, false, g.leader, false))
		}
	default:
		j.reply(joinError(errUnknownMemberID, id))
	}
}

// currentJoinResponse answers a JoinGroup from the current generation
// without a rebalance; withMembers includes the member list (leader).
func (g *classicGroup) currentJoinResponse(m *classicMember, withMembers bool, leader string, skip bool) *kmsg.JoinGroupResponse {
	resp := kmsg.NewPtrJoinGroupResponse()
	pt, proto := g.protocolType, g.protocol
	resp.Generation = g.generation
	resp.ProtocolType = &pt
	resp.Protocol = &proto
	resp.LeaderID = leader
	resp.MemberID = m.id
	resp.SkipAssignment = skip
	if withMembers {
		for _, id := range g.order {
			o := g.members[id]
			jm := kmsg.NewJoinGroupResponseMember()
			jm.MemberID = o.id
			if o.instanceID != "" {
				iid := o.instanceID
				jm.InstanceID = &iid
			}
			jm.ProtocolMetadata = o.metadataFor(g.protocol)
			resp.Members = append(resp.Members, jm)
		}
	}
	return resp
}

// updateMember applies a rejoin's protocols and timeouts and parks it.
func (g *classicGroup) updateMember(m *classicMember, j *joinReq) {
	g.setProtocols(m, j.protocols)
	m.sessionTimeout, m.rebalanceTimeout = j.session, j.rebalance
	g.parkJoin(m, j.reply)
}

// addMember adds a new member with a parked JoinGroup and moves the group.
func (g *classicGroup) addMember(j *joinReq, id string) {
	m := &classicMember{
		id:               id,
		instanceID:       j.instanceID,
		clientID:         j.rc.ClientID,
		clientHost:       j.rc.ClientHost,
		protocols:        j.protocols,
		sessionTimeout:   j.session,
		rebalanceTimeout: j.rebalance,
		joinReply:        j.reply,
		joinAt:           g.s.e.clock.Now(),
		isNew:            true,
	}
	g.add(m, j.r.ProtocolType)
	if g.state == statePreparingRebalance && g.prevState == stateEmpty {
		g.newMemberAdded = true
	}
	g.armMemberTimer(m, g.s.e.cfg.NewMemberJoinTimeout)
	g.emitMember(EventMemberJoined, m, "")
	g.maybeRebalanceOrCompleteJoin(CauseMemberJoined, m)
}

// replaceStaticMember hands a known instance id to a new member id
// (KIP-345): the old id is fenced, the new one inherits its assignment
// and leadership.
func (g *classicGroup) replaceStaticMember(j *joinReq, newID string) {
	oldID := g.static[j.instanceID]
	old := g.members[oldID]
	oldLeader := g.leader
	oldProtocols := old.protocols

	// Fence the old member: its parked requests learn it was replaced.
	if old.joinReply != nil {
		g.awaitingJoin--
		old.answerJoin(joinError(errFencedInstanceID, oldID))
	}
	if old.syncReply != nil {
		old.answerSync(syncError(errFencedInstanceID))
	}
	stopTimer(old.timer)
	nm := &classicMember{
		id:               newID,
		instanceID:       j.instanceID,
		clientID:         j.rc.ClientID,
		clientHost:       j.rc.ClientHost,
		protocols:        old.protocols,
		sessionTimeout:   old.sessionTimeout,
		rebalanceTimeout: old.rebalanceTimeout,
		assignment:       old.assignment,
		owned:            old.owned,
	}
	delete(g.members, oldID)
	g.members[newID] = nm
	for i, id := range g.order {
		if id == oldID {
			g.order[i] = newID
		}
	}
	g.static[j.instanceID] = newID
	if g.leader == oldID {
		g.leader = newID
	}
	if _, ok := g.pendingSync[oldID]; ok {
		delete(g.pendingSync, oldID)
		g.pendingSync[newID] = struct{}{}
	}
	g.emitMember(EventMemberFenced, old, "")
	g.emitMember(EventMemberJoined, nm, "")

	g.rearmSession(nm)
	g.setProtocols(nm, j.protocols)
	nm.sessionTimeout, nm.rebalanceTimeout = j.session, j.rebalance

	switch g.state {
	case stateStable:
		if g.selectProtocol() == g.protocol {
			// Nothing changes for the group: no rebalance. The new
			// member id is persisted before the member learns it.
			var resp *kmsg.JoinGroupResponse
			if j.r.Version >= 9 && g.leader == newID {
				resp = g.currentJoinResponse(nm, true, newID, true)
			} else {
				resp = g.currentJoinResponse(nm, false, oldLeader, false)
			}
			if g.s.e.meta == nil {
				j.reply(resp)
				return
			}
			// A failed write drops the group: the store still holds
			// the old member id, and memory must not run ahead of it
			// (the next request reloads the group, Stable at its
			// stored generation).
			reply, log, gid := j.reply, g.s.e.log, g.id
			g.s.saveMeta(g.id, g.record(nil), func(err error) {
				if err != nil {
					code := storeErrorCode(err)
					reply(joinError(code, ""))
					if errors.Is(err, errUnloaded) || errors.Is(err, errEngineClosed) {
						return // the group is gone already
					}
					log.Warn("groupstate: persisting a static member's replacement failed; dropping the group", "group", gid, "member", newID, "err", err)
					if g.live() {
						g.s.unloadClassic(g, code, CauseStoreError)
					}
					return
				}
				reply(resp)
			}, func() { reply(joinError(errCoordinatorNotAvailable, "")) })
			return
		}
		g.parkJoin(nm, j.reply)
		g.prepareRebalance(CauseStaticMemberReplaced, nm)
	case stateCompletingRebalance:
		g.parkJoin(nm, j.reply)
		g.prepareRebalance(CauseStaticMemberReplaced, nm)
	case statePreparingRebalance:
		g.parkJoin(nm, j.reply)
		g.maybeCompleteJoin()
	default:
		// Empty or Dead groups have no static members; restore sanity.
		g.setProtocols(nm, oldProtocols)
		j.reply(joinError(errUnknownMemberID, newID))
	}
}
