package proxy

// Members whose requests stopped reaching their group's owner (docs/fleet.md,
// "When the network misbehaves").
//
// A group's coordinator expels a member a session timeout after it last
// heard from it and then gives its partitions to the others: a classic
// member's own session timeout (Kafka's GroupCoordinator, later
// GroupMetadataManager, schedules the expiry on every heartbeat, join and
// sync of a known member), a KIP-848 member's the group's
// group.consumer.session.timeout.ms (GroupMetadataManager re-arms it on
// every ConsumerGroupHeartbeat it serves). A member whose requests cannot
// reach the owner learns nothing of that: behind a relaying kproxy whose
// peer link to the owner is cut, or on a kproxy that owned the group and
// lost its fleet lease (cut off from the brokers, it cannot know the new
// owner), its requests get COORDINATOR_NOT_AVAILABLE, which every client
// retries while keeping its partitions. So the router remembers, per
// member whose requests it routes (relayed or served here), the last
// moment an owner certainly had the member alive, and once an owner could
// have expired it (that moment plus the session timeout, minus a margin)
// and the member's requests are not getting through, it answers the
// member's requests itself with UNKNOWN_MEMBER_ID: what the owner answers
// a member it expired (GroupMetadataManager removes an expired member; a
// later request naming it fails with UnknownMemberIdException, for a
// classic and a KIP-848 member alike). Every client treats it as the end
// of its membership:
//
//   - classic: Kafka's AbstractCoordinator resets its generation and
//     member id (resetGenerationOnResponseError) and ConsumerCoordinator
//     then calls onPartitionsLost before rejoining; franz-go's heartbeat
//     loop returns the error, its manage loop calls OnPartitionsLost, and
//     its JoinGroup handling rejoins without a member id.
//   - KIP-848: Kafka's consumer (AbstractHeartbeatRequestManager) fences
//     itself on UNKNOWN_MEMBER_ID as on FENCED_MEMBER_EPOCH
//     (transitionToFenced: onPartitionsLost, then a join with epoch 0 under
//     the same member id); franz-go's manage848 abandons its assignment
//     (OnPartitionsLost) and rejoins with epoch 0 under a new member id.
//     So a KIP-848 join (epoch 0) is always let through, whatever the
//     member id.
//
// A new owner loads a moved group with fresh session timers (docs/fleet.md,
// "Takeover and handover"), no earlier than the old owner's last answer, so
// the bound holds across a move as well.

import (
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// memberKey names a group member.
type memberKey struct{ group, member string }

// relayedMember is what the router knows of one member. Guarded by the
// tracker's mu.
type relayedMember struct {
	// session is the member's session timeout: a classic member's from
	// its JoinGroup, a KIP-848 member's the tracker's consumer session.
	session time.Duration
	// alive is the latest moment an owner certainly had the member
	// alive: the send time of a Heartbeat, SyncGroup or
	// ConsumerGroupHeartbeat an owner answered as from a known member,
	// or when a JoinGroup's answer arrived (the owner restarts every
	// member's session when a join completes).
	alive time.Time
	// seen is when a request of the member was last routed or
	// answered; a member not seen for forgetAfter is forgotten.
	seen time.Time
	// failing: the last routed request of the member did not reach a
	// serving owner (no answer: the owner unreachable, silent, timed
	// out; no owner at all; or an owner's NOT_COORDINATOR,
	// COORDINATOR_NOT_AVAILABLE or COORDINATOR_LOAD_IN_PROGRESS).
	failing bool
	// failedAt is where that request went: an owner's peer address,
	// destLocal, or "" when it found no owner. A request for another
	// destination (the group moved) is let through once.
	failedAt string
	// inFlight counts the member's requests routed and not answered
	// whose answer may renew its session (all but OffsetCommit): while
	// one is in flight, the owner may have heard from the member later
	// than alive.
	inFlight int
	// told: the member was answered UNKNOWN_MEMBER_ID; it keeps getting
	// that answer under this member id until forgotten (a KIP-848 join
	// forgets it).
	told bool
}

// giveUpMargin is how long before an owner can expire a member the
// router starts telling it to give up: a fifth of its session timeout.
// The member learns at its next request, so the margin must cover a
// heartbeat interval (Kafka's and franz-go's defaults are 3s of a 45s
// session for a classic member, a fifteenth; 5s of 45s for a KIP-848
// member, a ninth) and some of the retry backoff of a client whose
// requests failed with COORDINATOR_NOT_AVAILABLE; the owner also needs
// a rebalance before another member is given the partitions.
func giveUpMargin(session time.Duration) time.Duration { return session / 5 }

// forgetAfter is how long a member not seen is remembered: three
// session timeouts (the owner has expired it long before).
func forgetAfter(session time.Duration) time.Duration {
	return 3 * max(session, 10*time.Second)
}

// memberSweepEvery is how often the tracker forgets members not seen
// for forgetAfter.
const memberSweepEvery = 5 * time.Second

// memberTracker holds the routed members. Every field but the immutable
// ones is guarded by mu; its methods are called by the sessions' and the
// peer connections' goroutines and by the local coordinator's replies.
type memberTracker struct {
	log *slog.Logger // immutable

	// disabled turns the verdict off (the tracking goes on); for
	// measuring what members see without it. Immutable after newRouter.
	disabled bool
	// consumerSession is the session timeout of KIP-848 members
	// (group.consumer.session.timeout.ms); zero: they are not tracked.
	// Immutable after newRouter.
	consumerSession time.Duration
	// consumerSessionOf, when set, gives a group's own session timeout
	// (RouterConfig.ConsumerSessionTimeoutOf). Immutable after newRouter.
	consumerSessionOf func(group string) time.Duration

	mu        sync.Mutex
	members   map[memberKey]*relayedMember // guarded by mu
	told      map[string]int               // guarded by mu: per group, members told and not yet forgotten
	nextSweep time.Time                    // guarded by mu
}

func newMemberTracker(log *slog.Logger, disabled bool, consumerSession time.Duration, sessionOf func(string) time.Duration) *memberTracker {
	return &memberTracker{log: log, disabled: disabled, consumerSession: consumerSession, consumerSessionOf: sessionOf,
		members: map[memberKey]*relayedMember{}, told: map[string]int{}}
}

// consumerSessionFor is the session timeout the owners give group's
// KIP-848 members; zero: they are not tracked.
func (t *memberTracker) consumerSessionFor(group string) time.Duration {
	if t.consumerSession <= 0 {
		return 0
	}
	if t.consumerSessionOf != nil {
		if d := t.consumerSessionOf(group); d > 0 {
			return d
		}
	}
	return t.consumerSession
}

// destLocal is memberReq.dest for the local engine.
const destLocal = "\x00local"

// memberReq is what a routed request says of the member it speaks for.
type memberReq struct {
	key memberKey
	// session is a classic JoinGroup's session timeout.
	session time.Duration
	// join848 is a KIP-848 join (epoch 0): never answered by the
	// tracker, it forgets a member told under the same id.
	join848 bool
	// dest is where the router sends the request: an owner's peer
	// address, destLocal (the local engine, which owns the group and
	// answers for its members itself: never a verdict), or "" when the
	// group has no owner (check).
	dest string
	// commit is an OffsetCommit: its answer does not renew the
	// member's session, so it does not hold the verdict back while in
	// flight (a commit waits for the store, up to its timeout, on an
	// owner cut off from the cluster).
	commit bool
}

// memberOf says which member a routed request speaks for: a JoinGroup
// (its member id may be empty; the answer names it), the Heartbeat,
// SyncGroup and OffsetCommit of a member (not the simple commit of a
// group without members), and a ConsumerGroupHeartbeat (joins, with
// epoch 0, and heartbeats; a leave is handled apart). LeaveGroup is
// handled apart.
func memberOf(req kmsg.Request) (mr memberReq, ok bool) {
	switch q := req.(type) {
	case *kmsg.JoinGroupRequest:
		return memberReq{key: memberKey{q.Group, q.MemberID}, session: time.Duration(max(q.SessionTimeoutMillis, 0)) * time.Millisecond}, true
	case *kmsg.HeartbeatRequest:
		return memberReq{key: memberKey{q.Group, q.MemberID}}, q.MemberID != ""
	case *kmsg.SyncGroupRequest:
		return memberReq{key: memberKey{q.Group, q.MemberID}}, q.MemberID != ""
	case *kmsg.OffsetCommitRequest:
		return memberReq{key: memberKey{q.Group, q.MemberID}, commit: true}, q.MemberID != "" && q.Generation >= 0
	case *kmsg.ConsumerGroupHeartbeatRequest:
		return memberReq{key: memberKey{q.Group, q.MemberID}, join848: q.MemberEpoch == 0}, q.MemberEpoch >= 0
	}
	return memberReq{}, false
}

// begin is called before routing a request of member mr. expired=true
// means the router answers it UNKNOWN_MEMBER_ID instead: the member's
// requests stopped reaching an owner and the owner could have expired
// it. Otherwise counted says whether end must count the request out.
func (t *memberTracker) begin(mr memberReq, now time.Time) (expired, counted bool) {
	return t.beginCounting(mr, now, true)
}

// check is begin for a request that is not routed anywhere yet (it waits
// for an owner): it only says whether the router answers it
// UNKNOWN_MEMBER_ID.
func (t *memberTracker) check(mr memberReq, now time.Time) (expired bool) {
	expired, _ = t.beginCounting(mr, now, false)
	return expired
}

func (t *memberTracker) beginCounting(mr memberReq, now time.Time, count bool) (expired, counted bool) {
	if mr.key.member == "" {
		return false, false
	}
	k := mr.key
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepLocked(now)
	m := t.members[k]
	if m == nil {
		return false, false
	}
	m.seen = now
	if mr.join848 {
		if m.told {
			// The member gave up and rejoins: what the owner
			// answers decides from here.
			t.forgetLocked(k)
			return false, false
		}
	} else if m.told {
		return true, false
	} else if t.verdictLocked(k, m, mr.dest, now) {
		return true, false
	}
	if !count || mr.commit {
		return false, false
	}
	m.inFlight++
	return false, true
}

// verdictLocked decides whether member k is told to give up now, and
// marks it told if so.
//
// An owner that will get the request answers for its member itself: the
// local engine always, and a peer the member's last request did not fail
// at (the group moved there; its new owner loaded it with fresh session
// timers). A verdict is given when the request goes nowhere (no owner)
// or where the last one failed.
func (t *memberTracker) verdictLocked(k memberKey, m *relayedMember, dest string, now time.Time) bool {
	if t.disabled || !m.failing || m.inFlight != 0 || m.session <= 0 ||
		dest == destLocal || (dest != "" && dest != m.failedAt) ||
		now.Sub(m.alive) < m.session-giveUpMargin(m.session) {
		return false
	}
	m.told = true
	t.told[k.group]++
	if t.told[k.group] == 1 {
		t.log.Warn("owner unreachable past a member's session: its requests are answered UNKNOWN_MEMBER_ID, so that it gives up its partitions before an owner gives them away",
			"group", k.group, "member_id", k.member, "session_timeout", m.session.String(),
			"last_reached_owner", now.Sub(m.alive).Round(time.Millisecond).String())
	}
	return true
}

// untilVerdict says, for a request of member mr that just failed at now,
// how long until the member is told to give up: ok is false when no
// verdict is coming (not tracked, disabled, no session, not failing
// where this request went, or another request in flight that may renew
// the session), and wait <= 0 means now.
func (t *memberTracker) untilVerdict(mr memberReq, now time.Time) (wait time.Duration, ok bool) {
	if t.disabled || mr.key.member == "" || mr.join848 {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.members[mr.key]
	if m == nil || m.told || !m.failing || m.inFlight != 0 || m.session <= 0 ||
		mr.dest == destLocal || m.failedAt != mr.dest {
		return 0, false
	}
	return m.alive.Add(m.session - giveUpMargin(m.session)).Sub(now), true
}

// noOwner records that a request of member mr found no owner (it was
// answered COORDINATOR_NOT_AVAILABLE without being sent anywhere).
func (t *memberTracker) noOwner(mr memberReq, now time.Time) {
	if mr.key.member == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.members[mr.key]; m != nil {
		m.seen, m.failing, m.failedAt = now, true, ""
	}
}

// Error codes that say a request did not reach a serving owner.
const (
	errCoordinatorLoadInProgress int16 = 14 // COORDINATOR_LOAD_IN_PROGRESS
	errNotCoordinator            int16 = 16 // NOT_COORDINATOR
	errFencedMemberEpoch         int16 = 110
)

// notServed reports whether code says the request found no serving owner.
func notServed(code int16) bool {
	return code == errCoordinatorNotAvailable || code == errNotCoordinator || code == errCoordinatorLoadInProgress
}

// end is told how a routed request of member mr sent at sent ended: o,
// and the owner's answer when o is outcomeOK; now is when it ended.
func (t *memberTracker) end(mr memberReq, counted bool, sent, now time.Time, resp kmsg.Response, o outcome) {
	k := mr.key
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.members[k]
	if m != nil {
		if counted && m.inFlight > 0 {
			m.inFlight--
		}
		m.seen = now
	}
	if o != outcomeOK {
		if m != nil {
			m.failing, m.failedAt = true, mr.dest
		}
		return
	}
	code := answerCode(resp)
	if m != nil {
		m.failing, m.failedAt = notServed(code), mr.dest
	}
	switch r := resp.(type) {
	case *kmsg.JoinGroupResponse:
		switch {
		case r.ErrorCode == 0 && r.MemberID != "":
			j := t.addLocked(memberKey{k.group, r.MemberID}, mr.session, now)
			j.alive = now
		case r.ErrorCode == errUnknownMemberID:
			t.forgetLocked(k)
		}
	case *kmsg.HeartbeatResponse:
		t.answeredLocked(m, k, r.ErrorCode, sent)
	case *kmsg.SyncGroupResponse:
		t.answeredLocked(m, k, r.ErrorCode, sent)
	case *kmsg.ConsumerGroupHeartbeatResponse:
		switch r.ErrorCode {
		case 0:
			session := t.consumerSessionFor(k.group)
			if session <= 0 {
				return
			}
			id := k.member
			if r.MemberID != nil && *r.MemberID != "" {
				id = *r.MemberID // v0: the owner mints it on the join
			}
			c := t.members[memberKey{k.group, id}]
			if c == nil {
				c = t.addLocked(memberKey{k.group, id}, session, now)
			}
			c.session = session // the group's own may change (a GROUP config)
			// The owner re-arms the session when it serves the
			// heartbeat, after it was sent.
			if sent.After(c.alive) {
				c.alive = sent
			}
		case errUnknownMemberID, errFencedMemberEpoch:
			// The owner fenced it; the member rejoins with epoch 0.
			t.forgetLocked(k)
		}
	}
}

// addLocked starts tracking member k (or restarts it), not failing.
func (t *memberTracker) addLocked(k memberKey, session time.Duration, now time.Time) *relayedMember {
	m := t.members[k]
	if m == nil {
		m = &relayedMember{}
		t.members[k] = m
	}
	if m.told {
		t.untellLocked(k.group)
		m.told = false
	}
	m.session, m.seen, m.failing = session, now, false
	return m
}

// answerCode is the error code of a routed member request's answer (an
// OffsetCommit's first partition's).
func answerCode(resp kmsg.Response) int16 {
	switch r := resp.(type) {
	case *kmsg.JoinGroupResponse:
		return r.ErrorCode
	case *kmsg.HeartbeatResponse:
		return r.ErrorCode
	case *kmsg.SyncGroupResponse:
		return r.ErrorCode
	case *kmsg.ConsumerGroupHeartbeatResponse:
		return r.ErrorCode
	case *kmsg.OffsetCommitResponse:
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				return p.ErrorCode
			}
		}
	}
	return 0
}

// answeredLocked records the owner's answer code to a Heartbeat or
// SyncGroup of member k sent at sent.
func (t *memberTracker) answeredLocked(m *relayedMember, k memberKey, code int16, sent time.Time) {
	if m == nil {
		return
	}
	switch code {
	case 0, errRebalanceInProgress:
		if sent.After(m.alive) {
			m.alive = sent
		}
	case errUnknownMemberID:
		t.forgetLocked(k)
	}
}

// left forgets the members a LeaveGroup the owner answered named.
func (t *memberTracker) left(q *kmsg.LeaveGroupRequest) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if q.MemberID != "" {
		t.forgetLocked(memberKey{q.Group, q.MemberID})
	}
	for _, lm := range q.Members {
		t.forgetLocked(memberKey{q.Group, lm.MemberID})
	}
}

// left848 forgets the KIP-848 member whose leave (epoch -1 or -2) the
// owner answered.
func (t *memberTracker) left848(group, member string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetLocked(memberKey{group, member})
}

func (t *memberTracker) forgetLocked(k memberKey) {
	m := t.members[k]
	if m == nil {
		return
	}
	delete(t.members, k)
	if m.told {
		t.untellLocked(k.group)
	}
}

func (t *memberTracker) untellLocked(group string) {
	if t.told[group]--; t.told[group] <= 0 {
		delete(t.told, group)
	}
}

// sweepLocked forgets, every memberSweepEvery, the members not seen for
// forgetAfter their session: the tracker holds only members whose
// requests this router carried recently.
func (t *memberTracker) sweepLocked(now time.Time) {
	if now.Before(t.nextSweep) {
		return
	}
	t.nextSweep = now.Add(memberSweepEvery)
	for k, m := range t.members {
		if now.Sub(m.seen) > forgetAfter(m.session) {
			t.forgetLocked(k)
		}
	}
}

// size is the number of members remembered.
func (t *memberTracker) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.members)
}
