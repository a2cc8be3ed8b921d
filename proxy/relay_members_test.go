package proxy

import (
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// joined returns a tracker that relayed member m's JoinGroup (session s)
// answered at t0.
func joined(t *testing.T, disabled bool, k memberKey, s time.Duration, t0 time.Time) *memberTracker {
	t.Helper()
	tr := newMemberTracker(slog.New(slog.DiscardHandler), disabled)
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.MemberID = k.member
	tr.end(memberKey{k.group, ""}, s, false, t0, t0, resp, outcomeOK)
	if tr.size() != 1 {
		t.Fatalf("after a join, %d members tracked, want 1", tr.size())
	}
	return tr
}

func heartbeat(tr *memberTracker, k memberKey, at time.Time, code int16, o outcome) (expired bool) {
	expired, counted := tr.begin(k, at)
	if expired {
		return true
	}
	var resp kmsg.Response
	if o == outcomeOK {
		hb := kmsg.NewPtrHeartbeatResponse()
		hb.ErrorCode = code
		resp = hb
	}
	tr.end(k, 0, counted, at, at, resp, o)
	return false
}

// TestRelayTellsCutOffMemberToGiveUp: once a member's requests stop
// reaching the owner, the relay answers them UNKNOWN_MEMBER_ID from its
// session timeout minus the margin after the last one that did, and
// from then on.
func TestRelayTellsCutOffMemberToGiveUp(t *testing.T) {
	k := memberKey{"g", "m1"}
	const s = 10 * time.Second
	t0 := time.Unix(1000, 0)
	tr := joined(t, false, k, s, t0)
	last := t0.Add(3 * time.Second)
	if heartbeat(tr, k, last, 0, outcomeOK) {
		t.Fatal("a member on a healthy link was told to give up")
	}
	giveUp := last.Add(s - giveUpMargin(s))
	for at := last.Add(300 * time.Millisecond); at.Before(giveUp); at = at.Add(300 * time.Millisecond) {
		if heartbeat(tr, k, at, 0, outcomeOwnerDown) {
			t.Fatalf("told to give up %v after the last heartbeat that reached the owner, before %v", at.Sub(last), s-giveUpMargin(s))
		}
	}
	if !heartbeat(tr, k, giveUp, 0, outcomeOwnerDown) {
		t.Fatalf("not told to give up %v after the last heartbeat that reached the owner", giveUp.Sub(last))
	}
	lastSeen := giveUp.Add(10 * time.Second)
	if exp, _ := tr.begin(k, lastSeen); !exp {
		t.Fatal("a member told to give up was relayed again")
	}
	// The member rejoins under a new id; the old one is forgotten by the
	// sweep once not seen for three sessions.
	tr.begin(memberKey{"g", "other"}, lastSeen.Add(forgetAfter(s)+2*memberSweepEvery))
	if n := tr.size(); n != 0 {
		t.Errorf("%d members tracked three sessions after the last was seen, want 0", n)
	}
}

// TestRelayKeepsMembersOnHealthyLink: a member that is merely quiet (no
// request failed) is never answered by the relay, however long, and one
// whose requests got through again is not either.
func TestRelayKeepsMembersOnHealthyLink(t *testing.T) {
	k := memberKey{"g", "m1"}
	const s = 10 * time.Second
	t0 := time.Unix(1000, 0)
	tr := joined(t, false, k, s, t0)
	if heartbeat(tr, k, t0.Add(3*s), 0, outcomeOK) {
		t.Fatal("a quiet member on a healthy link was told to give up")
	}
	// A failure, then the owner answers again (REBALANCE_IN_PROGRESS
	// renews the session too).
	heartbeat(tr, k, t0.Add(3*s+time.Second), 0, outcomeOwnerDown)
	if heartbeat(tr, k, t0.Add(3*s+2*time.Second), errRebalanceInProgress, outcomeOK) {
		t.Fatal("told to give up although the heartbeat before reached the owner")
	}
	if heartbeat(tr, k, t0.Add(4*s), 0, outcomeOK) {
		t.Fatal("told to give up on a healthy link")
	}
	// A request in flight when the link fails holds the verdict back.
	at := t0.Add(4*s + 2*time.Second)
	heartbeat(tr, k, at, 0, outcomeOwnerDown)
	if exp, counted := tr.begin(k, at.Add(time.Second)); exp || !counted {
		t.Fatalf("begin: expired %v counted %v, want a relayed request", exp, counted)
	}
	if exp, _ := tr.begin(k, at.Add(s)); exp {
		t.Fatal("told to give up with a request in flight")
	}
	// LeaveGroup forgets the member; UNKNOWN_MEMBER_ID from the owner too.
	tr.left(&kmsg.LeaveGroupRequest{Group: "g", Members: []kmsg.LeaveGroupRequestMember{{MemberID: "m1"}}})
	if tr.size() != 0 {
		t.Fatal("a member that left is still tracked")
	}
	tr = joined(t, false, k, s, t0)
	heartbeat(tr, k, t0.Add(time.Second), errUnknownMemberID, outcomeOK)
	if tr.size() != 0 {
		t.Fatal("a member the owner does not know is still tracked")
	}
}

// TestRelayKeepCutOffMembers: with KeepCutOffMembers the relay never
// answers for the owner.
func TestRelayKeepCutOffMembers(t *testing.T) {
	k := memberKey{"g", "m1"}
	const s = 10 * time.Second
	t0 := time.Unix(1000, 0)
	tr := joined(t, true, k, s, t0)
	for at := t0; at.Before(t0.Add(2 * s)); at = at.Add(time.Second) {
		if heartbeat(tr, k, at, 0, outcomeOwnerDown) {
			t.Fatal("told a member to give up with KeepCutOffMembers")
		}
	}
}

// TestRelayMemberTrackingAllocs guards the hot path: a relayed request
// of a known member costs no allocation in the tracker.
func TestRelayMemberTrackingAllocs(t *testing.T) {
	k := memberKey{"g", "m1"}
	t0 := time.Now()
	tr := joined(t, false, k, 10*time.Second, t0)
	resp := kmsg.NewPtrHeartbeatResponse()
	allocs := testing.AllocsPerRun(1000, func() {
		_, counted := tr.begin(k, t0)
		tr.end(k, 0, counted, t0, t0, resp, outcomeOK)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per tracked request, want 0", allocs)
	}
}
