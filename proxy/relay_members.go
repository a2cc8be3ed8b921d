package proxy

// Members behind a relay that cannot reach their owner (docs/fleet.md,
// "When the network misbehaves").
//
// A classic group's coordinator expels a member a session timeout after
// it last heard from it (Kafka's GroupCoordinator, later
// GroupMetadataManager, schedules the expiry on every heartbeat, join and
// sync of a known member) and then gives its partitions to the others.
// A member behind a relaying kproxy whose peer link to the owner is cut
// learns nothing of that: its requests get COORDINATOR_NOT_AVAILABLE,
// which every client retries while keeping its partitions. So the relay
// remembers, per member whose requests it relays, the last moment the
// owner certainly had the member alive, and once the owner could have
// expired it (that moment plus the session timeout, minus a margin) and
// the member's requests are not getting through, it answers the member's
// Heartbeat, SyncGroup, OffsetCommit and JoinGroup itself with
// UNKNOWN_MEMBER_ID: what the owner answers a member it expired. Every
// client treats it as the end of its membership: Kafka's
// AbstractCoordinator resets its generation and member id
// (resetGenerationOnResponseError) and ConsumerCoordinator then calls
// onPartitionsLost before rejoining; franz-go's heartbeat loop returns
// the error and its manage loop calls OnPartitionsLost, and its
// JoinGroup handling rejoins without a member id.

import (
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// memberKey names a classic group member.
type memberKey struct{ group, member string }

// relayedMember is what the relay knows of one member. Guarded by the
// tracker's mu.
type relayedMember struct {
	// session is the member's session timeout, from its JoinGroup.
	session time.Duration
	// alive is the latest moment the owner certainly had the member
	// alive: the send time of a Heartbeat or SyncGroup the owner answered
	// as from a known member, or when a JoinGroup's answer arrived (the
	// owner restarts every member's session when a join completes).
	alive time.Time
	// seen is when a request of the member was last relayed or
	// answered; a member not seen for forgetAfter is forgotten.
	seen time.Time
	// failing: the last relayed request of the member did not reach the
	// owner (no answer: the owner unreachable, silent, timed out).
	failing bool
	// inFlight counts the member's requests relayed and not answered.
	inFlight int
	// told: the member was answered UNKNOWN_MEMBER_ID; it keeps getting
	// that answer under this member id until forgotten.
	told bool
}

// giveUpMargin is how long before the owner can expire a member the
// relay starts telling it to give up: a fifth of its session timeout.
// The member learns at its next request, so the margin must cover a
// heartbeat interval (Kafka's and franz-go's defaults are 3s of a 45s
// session, a fifteenth) and some of the retry backoff of a client whose
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

// memberTracker holds the relayed members. Every field but the immutable
// ones is guarded by mu; its methods are called by the sessions' and the
// peer connections' goroutines.
type memberTracker struct {
	log *slog.Logger // immutable

	// disabled turns the verdict off (the tracking goes on); for
	// measuring what members see without it. Immutable after newRouter.
	disabled bool

	mu        sync.Mutex
	members   map[memberKey]*relayedMember // guarded by mu
	told      map[string]int               // guarded by mu: per group, members told and not yet forgotten
	nextSweep time.Time                    // guarded by mu
}

func newMemberTracker(log *slog.Logger, disabled bool) *memberTracker {
	return &memberTracker{log: log, disabled: disabled, members: map[memberKey]*relayedMember{}, told: map[string]int{}}
}

// relayedMemberOf says which member a relayed request speaks for: a
// JoinGroup (its member id may be empty; the answer names it), and the
// Heartbeat, SyncGroup and OffsetCommit of a member (not the simple
// commit of a group without members). LeaveGroup is handled apart.
func relayedMemberOf(req kmsg.Request) (key memberKey, session time.Duration, ok bool) {
	switch q := req.(type) {
	case *kmsg.JoinGroupRequest:
		return memberKey{q.Group, q.MemberID}, time.Duration(max(q.SessionTimeoutMillis, 0)) * time.Millisecond, true
	case *kmsg.HeartbeatRequest:
		return memberKey{q.Group, q.MemberID}, 0, q.MemberID != ""
	case *kmsg.SyncGroupRequest:
		return memberKey{q.Group, q.MemberID}, 0, q.MemberID != ""
	case *kmsg.OffsetCommitRequest:
		return memberKey{q.Group, q.MemberID}, 0, q.MemberID != "" && q.Generation >= 0
	}
	return memberKey{}, 0, false
}

// begin is called before relaying a request of member k. expired=true
// means the relay answers it UNKNOWN_MEMBER_ID instead: the member's
// requests stopped reaching the owner and the owner could have expired
// it. Otherwise counted says whether end must count the request out.
func (t *memberTracker) begin(k memberKey, now time.Time) (expired, counted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepLocked(now)
	m := t.members[k]
	if m == nil {
		return false, false
	}
	m.seen = now
	if m.told {
		return true, false
	}
	if !t.disabled && m.failing && m.inFlight == 0 && m.session > 0 &&
		now.Sub(m.alive) >= m.session-giveUpMargin(m.session) {
		m.told = true
		t.told[k.group]++
		if t.told[k.group] == 1 {
			t.log.Warn("owner unreachable past a member's session: its requests are answered UNKNOWN_MEMBER_ID, so that it gives up its partitions before the owner gives them away",
				"group", k.group, "member_id", k.member, "session_timeout", m.session.String(),
				"last_reached_owner", now.Sub(m.alive).Round(time.Millisecond).String())
		}
		return true, false
	}
	m.inFlight++
	return false, true
}

// end is told how a relayed request of member k sent at sent ended: o,
// and the owner's answer when o is outcomeOK. session is a JoinGroup's
// session timeout; now is when it ended.
func (t *memberTracker) end(k memberKey, session time.Duration, counted bool, sent, now time.Time, resp kmsg.Response, o outcome) {
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
			m.failing = true
		}
		return
	}
	if m != nil {
		m.failing = false
	}
	switch r := resp.(type) {
	case *kmsg.JoinGroupResponse:
		switch {
		case r.ErrorCode == 0 && r.MemberID != "":
			jk := memberKey{k.group, r.MemberID}
			j := t.members[jk]
			if j == nil {
				j = &relayedMember{}
				t.members[jk] = j
			}
			j.session, j.alive, j.seen, j.failing = session, now, now, false
		case r.ErrorCode == errUnknownMemberID:
			t.forgetLocked(k)
		}
	case *kmsg.HeartbeatResponse:
		t.answeredLocked(m, k, r.ErrorCode, sent)
	case *kmsg.SyncGroupResponse:
		t.answeredLocked(m, k, r.ErrorCode, sent)
	}
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

func (t *memberTracker) forgetLocked(k memberKey) {
	m := t.members[k]
	if m == nil {
		return
	}
	delete(t.members, k)
	if m.told {
		if t.told[k.group]--; t.told[k.group] <= 0 {
			delete(t.told, k.group)
		}
	}
}

// sweepLocked forgets, every memberSweepEvery, the members not seen for
// forgetAfter their session: the tracker holds only members whose
// requests this relay carried recently.
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
