package groupstate

import (
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/share"
)

// ShareGroupHeartbeat (key 76), version 1 (KIP-932; v0 was Kafka 4.0's
// early access and is not served).
//
// A member joins with epoch 0 (its own member id, its subscribed topic
// names), heartbeats at its epoch and leaves with -1; share.Group keeps
// Kafka's epoch rules and the simple assignor, and a member moves
// straight to its target assignment (no revocation phase). A member
// that leaves keeps the records it acquired: as in Kafka, where the
// group coordinator does not touch share-partitions, they come back when
// its share session closes (internal/shares: a ShareFetch or
// ShareAcknowledge at epoch -1, or its connection's close, as
// SharePartitionManager.releaseSession) or their locks run out, so the
// acknowledgements a client sends on close after its leave heartbeat
// still apply. A member whose session expires gives its records back
// (kproxy's own rule). An id held by
// a group of another kind answers GROUP_ID_NOT_FOUND "Group G is not a
// share group.", as Kafka's GroupMetadataManager does.

// shareHeartbeat serves a ShareGroupHeartbeat on the owning loop. A
// joining member that subscribes to a topic the topic cache does not
// know yet (most often created just before) waits for a refresh first,
// as a KIP-848 member does (waitsForTopics), so that its first answer
// carries its assignment; waited says it did.
func (s *shard) shareHeartbeat(rc RequestContext, r *kmsg.ShareGroupHeartbeatRequest, reply func(kmsg.Response), waited bool) {
	if !waited && r.MemberEpoch == 0 && s.shareWaitsForTopics(r.SubscribedTopicNames) {
		s.e.awaitTopics(s.e.clock.Now(), func() {
			s.e.onGroup(r.GroupID, r, reply, func(s *shard) { s.shareHeartbeat(rc, r, reply, true) })
		})
		return
	}
	fail := func(code int16, msg string) {
		resp := kmsg.NewPtrShareGroupHeartbeatResponse()
		resp.ErrorCode = code
		if msg != "" {
			resp.ErrorMessage = &msg
		}
		reply(resp)
	}
	if kind, held := s.kindOf(r.GroupID); held && kind != KindShare {
		fail(errGroupIDNotFound, notKindText(r.GroupID, KindShare))
		return
	}
	g, ok := s.shareOf(r.GroupID)
	created := false
	if !ok {
		if r.MemberEpoch != 0 {
			// Kafka: a heartbeat past the first for a group that does
			// not exist (GroupMetadataManager.shareGroup).
			fail(errGroupIDNotFound, "Group "+r.GroupID+" not found.")
			return
		}
		g = newShareGroup(s, r.GroupID)
		s.groups[r.GroupID] = g
		created = true
	}
	set := g.settings()
	before := memberSet(g.g.Members())
	prevEpoch, prevAssigned := g.g.Epoch(), g.g.AssignmentEpoch()
	prevSubs := g.g.Subscription(r.MemberID)
	resp := g.g.Heartbeat(r, shareTopics{s.e.topicsNow()}, s.e.clock.Now(), share.GroupConfig{
		SessionTimeout: set.SessionTimeout, HeartbeatInterval: set.HeartbeatInterval, MaxSize: set.MaxSize,
	})
	if resp.ErrorCode == errNone {
		g.g.SetClientInfo(r.MemberID, rc.ClientID, rc.ClientHost)
	}
	after := memberSet(g.g.Members())
	if created && resp.ErrorCode != errNone && len(after) == 0 {
		s.drop(g.id, g)
		reply(resp)
		return
	}
	if created {
		s.emit(g.event(EventGroupCreated))
	}
	// Only the heartbeating member can join or leave here; the cause
	// of an epoch bump is that, else its subscription or the
	// subscribed topics.
	cause, by := CauseTopicsChanged, &Member{MemberID: r.MemberID, ClientID: rc.ClientID, ClientHost: rc.ClientHost}
	if r.SubscribedTopicNames != nil && !slices.Equal(prevSubs, g.g.Subscription(r.MemberID)) {
		cause = CauseSubscriptionChanged
	}
	for id := range before {
		if _, still := after[id]; !still {
			g.markDirty()
			cause = CauseMemberLeft
			if s.e.cfg.Events != nil {
				ev := g.event(EventMemberLeft)
				ev.Member = &Member{MemberID: id}
				s.emit(ev)
			}
		}
	}
	for id := range after {
		if _, was := before[id]; !was {
			cause = CauseMemberJoined
			if s.e.cfg.Events != nil {
				ev := g.event(EventMemberJoined)
				ev.Member = &Member{MemberID: id, ClientID: rc.ClientID, ClientHost: rc.ClientHost}
				s.emit(ev)
			}
		}
	}
	g.emitEpoch(cause, by, prevEpoch, prevAssigned)
	g.noteState()
	g.armSessionTimer()
	if created || resp.ErrorCode == errNone && resp.MemberEpoch != r.MemberEpoch || len(before) != len(after) {
		g.markDirty()
	}
	// A new epoch or assignment is answered once durable.
	g.persistThen(func(code int16) {
		if code != errNone {
			fail(code, "")
			return
		}
		reply(resp)
	})
}

// shareWaitsForTopics reports whether a topic of names is missing from
// the topic cache.
func (s *shard) shareWaitsForTopics(names []string) bool {
	if _, ok := s.e.cfg.Store.(TopicMetadataStore); !ok {
		return false
	}
	snap, known := s.e.topicsNow(), s.e.topicsKnown()
	for _, n := range names {
		if _, ok := snap.byName[n]; !ok || !known {
			return true
		}
	}
	return false
}

// memberSet returns ids as a set.
func memberSet(ids []string) map[string]struct{} {
	set := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		set[id] = struct{}{}
	}
	return set
}

// shareTopics is the engine's topic cache as share.Group reads it.
type shareTopics struct{ t *topicSnapshot }

func (v shareTopics) TopicByName(name string) ([16]byte, int32, bool) {
	ti, ok := v.t.byName[name]
	return ti.ID, ti.Partitions, ok
}

func (v shareTopics) TopicByID(id [16]byte) (string, bool) {
	name, ok := v.t.byID[id]
	return name, ok
}
