package groupstate

import (
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestTransitionTable(t *testing.T) {
	all := []classicGroupState{stateEmpty, statePreparingRebalance, stateCompletingRebalance, stateStable, stateDead}
	legal := map[[2]classicGroupState]bool{
		{statePreparingRebalance, stateEmpty}:               true,
		{stateStable, statePreparingRebalance}:              true,
		{stateCompletingRebalance, statePreparingRebalance}: true,
		{stateEmpty, statePreparingRebalance}:               true,
		{statePreparingRebalance, stateCompletingRebalance}: true,
		{stateCompletingRebalance, stateStable}:             true,
	}
	for _, from := range all {
		for _, to := range all {
			want := legal[[2]classicGroupState{from, to}] || to == stateDead
			if got := canTransition(from, to); got != want {
				t.Errorf("%v → %v: got %v, want %v", from, to, got, want)
			}
		}
	}
	if stateCompletingRebalance.String() != "CompletingRebalance" || classicGroupState(9).String() != "classicGroupState(9)" {
		t.Errorf("String: %q %q", stateCompletingRebalance, classicGroupState(9))
	}
}

func TestIllegalTransitionRefused(t *testing.T) {
	h := newHarness(t)
	s := h.e.shards[0]
	done := make(chan bool)
	s.post(func() {
		g := newClassicGroup(s, "x")
		ok := g.transitionTo(stateStable) // Empty → Stable is illegal
		done <- ok || g.state != stateEmpty
	})
	if <-done {
		t.Fatal("Empty → Stable was allowed")
	}
	if h.e.illegalTransitions.Swap(0) != 1 {
		t.Fatal("illegal transition not counted")
	}
}

func TestHeartbeatAndSessionExpiry(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 1)
	h.takeEvents("g")
	// Heartbeats are answered at once and keep the member alive.
	for i := 0; i < 5; i++ {
		h.advance(9 * time.Second)
		if code := h.heartbeat("g", ids[0], gen); code != 0 {
			t.Fatalf("heartbeat %d: %s", i, errName(code))
		}
	}
	// Silence past the 10s session timeout expires the member.
	h.advance(10*time.Second + time.Millisecond)
	snap, ok := h.e.Group("g")
	if !ok || snap.State != "Empty" || len(snap.Members) != 0 || snap.Generation != gen+1 {
		t.Fatalf("after expiry: %+v", snap)
	}
	got := kinds(h.takeEvents("g"))
	want := []string{"member_expired(session_timeout)", "rebalance_started(member_expired)", "rebalance_aborted", "group_empty"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if code := h.heartbeat("g", ids[0], gen); code != errUnknownMemberID {
		t.Fatalf("heartbeat of expired member: %s", errName(code))
	}
}

func TestHeartbeatErrors(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 2)
	inst := "nobody"
	hbInst := hb("g", ids[0], gen)
	hbInst.InstanceID = &inst
	// The first request for a group id loads its metadata; a heartbeat
	// during the load is answered NONE, as Kafka's coordinator does while
	// loading (it answers COORDINATOR_LOAD_IN_PROGRESS to the other APIs).
	if code := h.heartbeat("nope", ids[0], gen); code != 0 {
		t.Fatalf("heartbeat while loading: %s", errName(code))
	}
	h.flush() // the load completes
	for _, tc := range []struct {
		name string
		req  *kmsg.HeartbeatRequest
		want int16
	}{
		{"ok", hb("g", ids[1], gen), 0},
		{"empty group id", hb("", ids[0], gen), errInvalidGroupID},
		{"missing group", hb("nope", ids[0], gen), errUnknownMemberID},
		{"unknown member", hb("g", "who", gen), errUnknownMemberID},
		{"unknown instance", hbInst, errUnknownMemberID},
		{"old generation", hb("g", ids[0], gen-1), errIllegalGeneration},
	} {
		if code := h.do(tc.req).(*kmsg.HeartbeatResponse).ErrorCode; code != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, errName(code), errName(tc.want))
		}
	}
	// During a rebalance heartbeats say REBALANCE_IN_PROGRESS and still
	// keep the member alive.
	h.send(jr{group: "g", member: ids[0], version: 9}.req()) // leader rejoin
	for i := 0; i < 3; i++ {
		h.advance(8 * time.Second)
		if code := h.heartbeat("g", ids[1], gen); code != errRebalanceInProgress {
			t.Fatalf("heartbeat during rebalance: %s", errName(code))
		}
	}
	if snap, _ := h.e.Group("g"); len(snap.Members) != 2 {
		t.Fatalf("member lost while heartbeating: %+v", snap)
	}
}

func TestSessionTimeoutBounds(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		session time.Duration
		want    int16
	}{
		{5999 * time.Millisecond, errInvalidSessionTimeout},
		{6 * time.Second, errMemberIDRequired},
		{30 * time.Minute, errMemberIDRequired},
		{30*time.Minute + time.Millisecond, errInvalidSessionTimeout},
	} {
		r := h.do(jr{group: "g", version: 9, session: tc.session}.req()).(*kmsg.JoinGroupResponse)
		if r.ErrorCode != tc.want {
			t.Errorf("session %v: %s, want %s", tc.session, errName(r.ErrorCode), errName(tc.want))
		}
	}
	r := h.do(jr{group: "", version: 9}.req()).(*kmsg.JoinGroupResponse)
	if r.ErrorCode != errInvalidGroupID {
		t.Errorf("empty group id: %s", errName(r.ErrorCode))
	}
}

func TestMemberIDRequired(t *testing.T) {
	h := newHarness(t)
	// v4+: a dynamic member gets MEMBER_ID_REQUIRED and an id.
	for v := int16(4); v <= 9; v++ {
		r := h.do(jr{group: "g", version: v}.req()).(*kmsg.JoinGroupResponse)
		if r.ErrorCode != errMemberIDRequired || r.MemberID == "" {
			t.Fatalf("v%d: %s id %q", v, errName(r.ErrorCode), r.MemberID)
		}
	}
	// v3 and older are added at once.
	h2 := newHarness(t)
	for v := int16(0); v <= 3; v++ {
		g := "old" + string(rune('0'+v))
		r := joinResp(t, h2.send(jr{group: g, version: v}.req()), 0)
		if r.MemberID == "" || r.LeaderID != r.MemberID || r.Generation != 1 {
			t.Fatalf("v%d: %+v", v, r)
		}
	}
	// A pending member that never comes back expires after its session
	// timeout and stops blocking the join.
	h3 := newHarness(t)
	r := h3.do(jr{group: "p", version: 9}.req()).(*kmsg.JoinGroupResponse)
	a := r.MemberID
	h3.do(jr{group: "p", version: 9}.req()) // a second pending id, never used
	c := h3.send(jr{group: "p", member: a, version: 9}.req())
	c.parked(h3)
	h3.advance(10*time.Second + time.Millisecond)
	jrA := joinResp(t, c, 0)
	if jrA.LeaderID != a || len(jrA.Members) != 1 {
		t.Fatalf("join after pending expiry: %+v", jrA)
	}
	// Joining with an unknown id to a missing group.
	r = h3.do(jr{group: "missing", member: "x", version: 9}.req()).(*kmsg.JoinGroupResponse)
	if r.ErrorCode != errUnknownMemberID {
		t.Fatalf("unknown member on missing group: %s", errName(r.ErrorCode))
	}
	if _, ok := h3.e.Group("missing"); ok {
		t.Fatal("a failed join left a group behind")
	}
}

func TestJoinV0RebalanceTimeoutIsSessionTimeout(t *testing.T) {
	h := newHarness(t)
	a := joinResp(t, h.send(jr{group: "g", version: 0, session: 10 * time.Second, rebalance: time.Hour}.req()), 0)
	b := h.send(jr{group: "g", version: 0, session: 10 * time.Second, rebalance: time.Hour}.req())
	b.parked(h)
	// A never rejoins; the join must complete after 10s (the session
	// timeout), not after an hour.
	h.advance(10*time.Second + time.Millisecond)
	rb := joinResp(t, b, 0)
	if rb.Generation != 2 || rb.LeaderID != rb.MemberID || rb.MemberID == a.MemberID {
		t.Fatalf("v0 join: %+v", rb)
	}
}

func TestRebalanceOnJoinLeaderAndFollowers(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 1)
	a := ids[0]
	h.takeEvents("g")
	cb, b := h.joinNew(jr{group: "g"})
	cb.parked(h)
	if code := h.heartbeat("g", a, gen); code != errRebalanceInProgress {
		t.Fatalf("leader heartbeat: %s", errName(code))
	}
	ca := h.send(jr{group: "g", member: a, version: 9, protocols: []kmsg.JoinGroupRequestProtocol{protocol("range", "t")}}.req())
	ra, rb := joinResp(t, ca, 0), joinResp(t, cb, 0)
	if ra.Generation != gen+1 || rb.Generation != gen+1 || ra.LeaderID != a || rb.LeaderID != a {
		t.Fatalf("join responses: %+v %+v", ra, rb)
	}
	if len(ra.Members) != 2 || len(rb.Members) != 0 {
		t.Fatalf("leader got %d members, follower %d", len(ra.Members), len(rb.Members))
	}
	if *ra.Protocol != "range" || *ra.ProtocolType != "consumer" {
		t.Fatalf("protocol %q type %q", *ra.Protocol, *ra.ProtocolType)
	}
	// The follower's SyncGroup waits for the leader's.
	sb := h.send(syncReq("g", b, ra.Generation, nil))
	sb.parked(h)
	if code := h.heartbeat("g", b, ra.Generation); code != 0 {
		t.Fatalf("heartbeat in CompletingRebalance: %s", errName(code))
	}
	want := assignment("t", 7)
	sa := h.send(syncReq("g", a, ra.Generation, map[string][]byte{a: assignment("t", 1), b: want}))
	if got := sb.wait().(*kmsg.SyncGroupResponse); string(got.MemberAssignment) != string(want) || *got.Protocol != "range" {
		t.Fatalf("follower assignment %x, want %x", got.MemberAssignment, want)
	}
	if got := sa.wait().(*kmsg.SyncGroupResponse); got.ErrorCode != 0 {
		t.Fatalf("leader sync: %s", errName(got.ErrorCode))
	}
	// A late duplicate sync in Stable gets the stored assignment at once.
	if got := h.do(syncReq("g", b, ra.Generation, nil)).(*kmsg.SyncGroupResponse); string(got.MemberAssignment) != string(want) {
		t.Fatal("stable sync did not return the stored assignment")
	}
	evs := h.takeEvents("g")
	got := kinds(evs)
	wantKinds := []string{"member_joined", "rebalance_started(member_joined)", "join_completed", "sync_completed"}
	if !slices.Equal(got, wantKinds) {
		t.Fatalf("events %v, want %v", got, wantKinds)
	}
	if evs[1].Member == nil || evs[1].Member.MemberID != b {
		t.Fatalf("rebalance cause member: %+v", evs[1].Member)
	}
	if len(evs[2].Members) != 2 || len(evs[3].Members) != 2 || string(evs[3].Members[1].Assignment) != string(want) {
		t.Fatalf("join/sync event members: %+v / %+v", evs[2].Members, evs[3].Members)
	}
}

func TestRejoinInStable(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 2)
	leader, follower := ids[0], ids[1]
	// An unchanged follower rejoin is answered at once without a rebalance.
	r := joinResp(t, h.send(jr{group: "g", member: follower, version: 9}.req()), 0)
	if r.Generation != gen || len(r.Members) != 0 || r.LeaderID != leader {
		t.Fatalf("unchanged follower: %+v", r)
	}
	if snap, _ := h.e.Group("g"); snap.State != "Stable" {
		t.Fatalf("state %s", snap.State)
	}
	h.takeEvents("g")
	// A follower with new metadata triggers a rebalance.
	cf := h.send(jr{group: "g", member: follower, version: 9, protocols: []kmsg.JoinGroupRequestProtocol{protocol("range", "t", "u")}}.req())
	cf.parked(h)
	evs := h.takeEvents("g")
	if len(evs) != 1 || evs[0].Cause != CauseMetadataChanged {
		t.Fatalf("events %v", kinds(evs))
	}
	cl := h.send(jr{group: "g", member: leader, version: 9}.req())
	joinResp(t, cl, 0)
	joinResp(t, cf, 0)
	h.syncAll("g", gen+1, ids, nil)
	// The leader rejoining always rebalances.
	cl = h.send(jr{group: "g", member: leader, version: 9}.req())
	cl.parked(h)
	if evs := h.takeEvents("g"); len(evs) < 1 || evs[len(evs)-1].Cause != CauseLeaderRejoined {
		t.Fatalf("events %v", kinds(evs))
	}
}

func TestLostJoinResponseInCompletingRebalance(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.joinedGroup("g", 2)
	// Same protocols: the join response is sent again.
	r := joinResp(t, h.send(jr{group: "g", member: ids[0], version: 9}.req()), 0)
	if r.Generation != gen || len(r.Members) != 2 || r.LeaderID != ids[0] {
		t.Fatalf("resent leader join: %+v", r)
	}
	// Changed protocols: a rebalance, and the parked syncs are told.
	s1 := h.send(syncReq("g", ids[1], gen, nil))
	s1.parked(h)
	c := h.send(jr{group: "g", member: ids[1], version: 9, protocols: []kmsg.JoinGroupRequestProtocol{protocol("range", "x")}}.req())
	c.parked(h)
	if got := s1.wait().(*kmsg.SyncGroupResponse); got.ErrorCode != errRebalanceInProgress {
		t.Fatalf("parked sync: %s", errName(got.ErrorCode))
	}
	if evs := kinds(h.takeEvents("g")); !slices.Contains(evs, "rebalance_aborted(metadata_changed)") {
		t.Fatalf("events %v", evs)
	}
}

func TestRebalanceOnLeave(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 3)
	h.takeEvents("g")
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Version = 5
	lv.Group = "g"
	reason := "shutting down"
	lv.Members = []kmsg.LeaveGroupRequestMember{{MemberID: ids[1], Reason: &reason}, {MemberID: "ghost"}, {MemberID: ids[2]}}
	resp := h.do(lv).(*kmsg.LeaveGroupResponse)
	if resp.ErrorCode != 0 || len(resp.Members) != 3 {
		t.Fatalf("leave: %+v", resp)
	}
	for i, want := range []int16{0, errUnknownMemberID, 0} {
		if resp.Members[i].ErrorCode != want {
			t.Errorf("member %d: %s want %s", i, errName(resp.Members[i].ErrorCode), errName(want))
		}
	}
	got := kinds(h.takeEvents("g"))
	want := []string{"member_left(shutting down)", "member_left", "rebalance_started(member_left)"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	r := joinResp(t, h.send(jr{group: "g", member: ids[0], version: 9}.req()), 0)
	if r.Generation != gen+1 || len(r.Members) != 1 {
		t.Fatalf("after leave: %+v", r)
	}
	// v0: single member, top-level error.
	lv0 := kmsg.NewPtrLeaveGroupRequest()
	lv0.Version = 0
	lv0.Group, lv0.MemberID = "g", "ghost"
	if code := h.do(lv0).(*kmsg.LeaveGroupResponse).ErrorCode; code != errUnknownMemberID {
		t.Fatalf("v0 leave of ghost: %s", errName(code))
	}
	lv0.MemberID = ids[0]
	if code := h.do(lv0).(*kmsg.LeaveGroupResponse).ErrorCode; code != 0 {
		t.Fatalf("v0 leave: %s", errName(code))
	}
	if snap, _ := h.e.Group("g"); snap.State != "Empty" {
		t.Fatalf("state after last leave: %s", snap.State)
	}
	lv0.Group = "missing"
	if code := h.do(lv0).(*kmsg.LeaveGroupResponse).ErrorCode; code != errUnknownMemberID {
		t.Fatalf("v0 leave of missing group: %s", errName(code))
	}
	lv.Group = "missing"
	if r := h.do(lv).(*kmsg.LeaveGroupResponse); r.ErrorCode != 0 || len(r.Members) != 3 || r.Members[0].ErrorCode != errUnknownMemberID {
		t.Fatalf("v5 leave of missing group: %+v", r)
	}
}

func TestNonRejoinersRemovedAfterRebalanceTimeout(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 3)
	h.takeEvents("g")
	// A new member triggers a rebalance; the leader and the new member
	// rejoin, member 1 keeps heartbeating but never rejoins, member 2 is
	// silent.
	cn, n := h.joinNew(jr{group: "g"})
	cl := h.send(jr{group: "g", member: ids[0], version: 9}.req())
	for i := 0; i < 3; i++ {
		h.advance(9 * time.Second)
		h.heartbeat("g", ids[1], gen)
		h.heartbeat("g", ids[0], gen)
	}
	cl.parked(h)
	h.advance(3*time.Second + time.Millisecond) // 30s rebalance timeout reached
	rl, rn := joinResp(t, cl, 0), joinResp(t, cn, 0)
	if rl.Generation != gen+1 || len(rl.Members) != 2 || rn.LeaderID != ids[0] {
		t.Fatalf("after timeout: %+v / %+v", rl, rn)
	}
	snap, _ := h.e.Group("g")
	if len(snap.Members) != 2 {
		t.Fatalf("members %+v", snap.Members)
	}
	for _, m := range snap.Members {
		if m.MemberID != ids[0] && m.MemberID != n {
			t.Fatalf("unexpected member %s", m.MemberID)
		}
	}
	evs := kinds(h.takeEvents("g"))
	if !slices.Contains(evs, "member_expired(join_timeout)") {
		t.Fatalf("events %v", evs)
	}
}

func TestLeaderReplacedWhenItDoesNotRejoin(t *testing.T) {
	h := newHarness(t)
	ids, _ := h.stableGroup("g", 2)
	cn, n := h.joinNew(jr{group: "g"})
	cf := h.send(jr{group: "g", member: ids[1], version: 9}.req())
	h.advance(30*time.Second + time.Millisecond)
	rf, rn := joinResp(t, cf, 0), joinResp(t, cn, 0)
	if rf.LeaderID != ids[1] || rn.LeaderID != ids[1] || len(rf.Members) != 2 {
		t.Fatalf("leader %s/%s, want %s; members %d", rf.LeaderID, rn.LeaderID, ids[1], len(rf.Members))
	}
	_ = n
}

func TestProtocolSelection(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.InitialRebalanceDelay = time.Second })
	rr, rg, st := protocol("roundrobin", "t"), protocol("range", "t"), protocol("sticky", "t")
	var calls []*call
	for _, ps := range [][]kmsg.JoinGroupRequestProtocol{{rg, rr, st}, {rr, rg}, {rr, rg, st}} {
		c, _ := h.joinNew(jr{group: "g", protocols: ps})
		calls = append(calls, c)
	}
	// Not supported by everyone: refused.
	for _, tc := range []struct {
		name  string
		ptype string
		ps    []kmsg.JoinGroupRequestProtocol
	}{
		{"no common protocol", "consumer", []kmsg.JoinGroupRequestProtocol{st}},
		{"other protocol type", "connect", []kmsg.JoinGroupRequestProtocol{rr}},
	} {
		r := h.do(jr{group: "g", version: 9, ptype: tc.ptype, protocols: tc.ps}.req()).(*kmsg.JoinGroupResponse)
		if r.ErrorCode != errInconsistentGroupProtocol {
			t.Errorf("%s: %s", tc.name, errName(r.ErrorCode))
		}
	}
	// Members were added before the first 1s step, so the delay is
	// extended once more.
	h.advance(time.Second)
	calls[0].parked(h)
	h.advance(time.Second)
	for _, c := range calls {
		if r := joinResp(t, c, 0); *r.Protocol != "roundrobin" {
			t.Fatalf("selected %q, want roundrobin (2 votes of 3)", *r.Protocol)
		}
	}
	// An empty group needs a protocol type and protocols.
	r := h.do(jr{group: "e", version: 3, protocols: []kmsg.JoinGroupRequestProtocol{}}.req()).(*kmsg.JoinGroupResponse)
	if r.ErrorCode != errInconsistentGroupProtocol {
		t.Fatalf("empty protocols: %s", errName(r.ErrorCode))
	}
}

func TestInitialRebalanceDelay(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.InitialRebalanceDelay = 3 * time.Second })
	ca, _ := h.joinNew(jr{group: "g", rebalance: 10 * time.Second})
	h.advance(2 * time.Second)
	cb, _ := h.joinNew(jr{group: "g", rebalance: 10 * time.Second})
	// Everyone joined, but the initial rebalance never completes early.
	h.advance(999 * time.Millisecond) // t = 2.999s
	ca.parked(h)
	// At 3s a member had been added: the delay is extended by
	// min(3s, 10s-3s) = 3s.
	h.advance(time.Millisecond) // t = 3s
	ca.parked(h)
	h.advance(3*time.Second - time.Millisecond)
	ca.parked(h)
	h.advance(time.Millisecond) // t = 6s: nobody new, complete.
	ra, rb := joinResp(t, ca, 0), joinResp(t, cb, 0)
	if ra.Generation != 1 || rb.Generation != 1 || ra.LeaderID != rb.LeaderID {
		t.Fatalf("initial join: %+v %+v", ra, rb)
	}
	// The delay applies only when leaving Empty: a later joiner
	// rebalances at once once everyone is in.
	cc, _ := h.joinNew(jr{group: "g", rebalance: 10 * time.Second})
	c1 := h.send(jr{group: "g", member: ra.MemberID, version: 9}.req())
	c2 := h.send(jr{group: "g", member: rb.MemberID, version: 9}.req())
	for _, c := range []*call{cc, c1, c2} {
		if r := joinResp(t, c, 0); r.Generation != 2 {
			t.Fatalf("second rebalance generation %d", r.Generation)
		}
	}
}

func TestInitialRebalanceDelayBoundedByRebalanceTimeout(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.InitialRebalanceDelay = 3 * time.Second })
	ca, _ := h.joinNew(jr{group: "g", rebalance: 7 * time.Second})
	// A join every 2.5s would extend forever; the rebalance timeout caps
	// the total at max(7s, delay) = 3 + 3 + 1.
	for i := 0; i < 2; i++ {
		h.advance(2500 * time.Millisecond)
		h.joinNew(jr{group: "g", rebalance: 7 * time.Second})
	}
	h.advance(7*time.Second - 5*time.Second - time.Millisecond)
	ca.parked(h)
	h.advance(time.Millisecond)
	if r := joinResp(t, ca, 0); len(r.Members) != 3 {
		t.Fatalf("members %d", len(r.Members))
	}
}

func TestGroupMaxSize(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxGroupSize = 2 })
	ids, _ := h.stableGroup("g", 2)
	r := h.do(jr{group: "g", version: 3}.req()).(*kmsg.JoinGroupResponse)
	if r.ErrorCode != errGroupMaxSizeReached || r.MemberID != "" {
		t.Fatalf("third member: %s id %q", errName(r.ErrorCode), r.MemberID)
	}
	// Existing members still rejoin.
	c0 := h.send(jr{group: "g", member: ids[0], version: 9}.req())
	c1 := h.send(jr{group: "g", member: ids[1], version: 9}.req())
	joinResp(t, c0, 0)
	joinResp(t, c1, 0)
	if snap, _ := h.e.Group("g"); len(snap.Members) != 2 {
		t.Fatalf("members %d", len(snap.Members))
	}
}

// TestGroupMaxSizeKicksLateRejoiner checks that, while preparing, the limit counts
// members awaiting join. The leader rejoins, a newcomer fills the second
// slot, and the member that rejoins last is refused and removed; the join
// then completes without it.

func TestGroupMaxSizeKicksLateRejoiner(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxGroupSize = 2 })
	ids, gen := h.stableGroup("g", 2)
	cl := h.send(jr{group: "g", member: ids[0], version: 9}.req())
	cn, n := h.joinNew(jr{group: "g"})
	late := h.do(jr{group: "g", member: ids[1], version: 9}.req()).(*kmsg.JoinGroupResponse)
	if late.ErrorCode != errGroupMaxSizeReached {
		t.Fatalf("late rejoiner: %s", errName(late.ErrorCode))
	}
	rl, rn := joinResp(t, cl, 0), joinResp(t, cn, 0)
	if rl.Generation != gen+1 || len(rl.Members) != 2 || rn.MemberID != n {
		t.Fatalf("join after kick: %+v %+v", rl, rn)
	}
	if evs := kinds(h.takeEvents("g")); !slices.Contains(evs, "member_left(group_max_size)") {
		t.Fatalf("events %v", evs)
	}
}

func TestPendingSyncTimeout(t *testing.T) {
	// The leader syncs, the follower never does: it is removed after the
	// rebalance timeout and the group rebalances (KAFKA-12890).
	h := newHarness(t)
	ids, gen := h.joinedGroup("g", 2)
	sl := h.send(syncReq("g", ids[0], gen, map[string][]byte{ids[0]: assignment("t", 0)}))
	if r := sl.wait().(*kmsg.SyncGroupResponse); r.ErrorCode != 0 {
		t.Fatalf("leader sync %s", errName(r.ErrorCode))
	}
	h.takeEvents("g")
	for i := 0; i < 4; i++ { // both keep heartbeating
		h.advance(8 * time.Second)
		h.heartbeat("g", ids[0], gen)
		h.heartbeat("g", ids[1], gen)
	}
	evs := kinds(h.takeEvents("g"))
	want := []string{"member_expired(sync_timeout)", "rebalance_started(sync_timeout)"}
	if !slices.Equal(evs, want) {
		t.Fatalf("events %v, want %v", evs, want)
	}
	snap, _ := h.e.Group("g")
	if len(snap.Members) != 1 || snap.Members[0].MemberID != ids[0] || snap.State != "PreparingRebalance" {
		t.Fatalf("after sync timeout: %+v", snap)
	}

	// The leader never syncs: followers' parked syncs are released with
	// REBALANCE_IN_PROGRESS when the sync timer removes the leader.
	h2 := newHarness(t)
	ids, gen = h2.joinedGroup("g", 2)
	sf := h2.send(syncReq("g", ids[1], gen, nil))
	h2.advance(30*time.Second + time.Millisecond)
	if r := sf.wait().(*kmsg.SyncGroupResponse); r.ErrorCode != errRebalanceInProgress {
		t.Fatalf("follower sync after leader vanished: %s", errName(r.ErrorCode))
	}
}

func TestSyncErrors(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.joinedGroup("g", 2)
	bad := "other"
	wrongType := syncReq("g", ids[0], gen, nil)
	wrongType.ProtocolType = &bad
	wrongName := syncReq("g", ids[0], gen, nil)
	wrongName.Protocol = &bad
	oldV := syncReq("g", ids[1], gen, nil)
	oldV.Version = 4
	oldV.Protocol = &bad // ignored below v5
	for _, tc := range []struct {
		name string
		req  *kmsg.SyncGroupRequest
		want int16
	}{
		{"empty group id", syncReq("", ids[0], gen, nil), errInvalidGroupID},
		{"missing group", syncReq("nope", ids[0], gen, nil), errUnknownMemberID},
		{"unknown member", syncReq("g", "who", gen, nil), errUnknownMemberID},
		{"illegal generation", syncReq("g", ids[0], gen+1, nil), errIllegalGeneration},
		{"v5 protocol type", wrongType, errInconsistentGroupProtocol},
		{"v5 protocol name", wrongName, errInconsistentGroupProtocol},
	} {
		if code := h.do(tc.req).(*kmsg.SyncGroupResponse).ErrorCode; code != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, errName(code), errName(tc.want))
		}
	}
	c := h.send(oldV)
	c.parked(h)
	// Rebalancing: REBALANCE_IN_PROGRESS (and the parked one too).
	h.send(jr{group: "g", member: ids[1], version: 9, protocols: []kmsg.JoinGroupRequestProtocol{protocol("range", "z")}}.req())
	if r := c.wait().(*kmsg.SyncGroupResponse); r.ErrorCode != errRebalanceInProgress {
		t.Fatalf("parked v4 sync: %s", errName(r.ErrorCode))
	}
	if code := h.do(syncReq("g", ids[0], gen, nil)).(*kmsg.SyncGroupResponse).ErrorCode; code != errRebalanceInProgress {
		t.Fatalf("sync while preparing: %s", errName(code))
	}
}

func TestEmptyAssignmentFilled(t *testing.T) {
	for _, tc := range []struct {
		ptype string
		empty bool // true: zero bytes expected; false: an encoded empty consumer assignment
	}{
		{"consumer", false},
		{"connect", true},
	} {
		t.Run(tc.ptype, func(t *testing.T) {
			h := newHarness(t)
			var ids []string
			for i := 0; i < 2; i++ {
				r := h.do(jr{group: "g", version: 9, ptype: tc.ptype}.req()).(*kmsg.JoinGroupResponse)
				ids = append(ids, r.MemberID)
			}
			c0 := h.send(jr{group: "g", member: ids[0], version: 9, ptype: tc.ptype}.req())
			c1 := h.send(jr{group: "g", member: ids[1], version: 9, ptype: tc.ptype}.req())
			r0, r1 := joinResp(t, c0, 0), joinResp(t, c1, 0)
			leader, follower := r0.LeaderID, r0.MemberID
			if follower == leader {
				follower = r1.MemberID
			}
			sf := h.send(syncReq("g", follower, r0.Generation, nil))
			// The leader leaves the follower out entirely (sarama #2290).
			h.do(syncReq("g", leader, r0.Generation, map[string][]byte{leader: assignment("t", 0)}))
			got := sf.wait().(*kmsg.SyncGroupResponse).MemberAssignment
			if tc.empty {
				if len(got) != 0 {
					t.Fatalf("got %x, want empty", got)
				}
				return
			}
			var a kmsg.ConsumerMemberAssignment
			if len(got) == 0 {
				t.Fatal("zero bytes sent for a consumer assignment")
			}
			if err := a.ReadFrom(got); err != nil || len(a.Topics) != 0 {
				t.Fatalf("decode %x: %v %+v", got, err, a)
			}
		})
	}
}

func TestStaticMemberReplacedWithoutRebalance(t *testing.T) {
	for _, version := range []int16{5, 8, 9} {
		t.Run("v"+string(rune('0'+version)), func(t *testing.T) {
			h := newHarness(t)
			ca := h.send(jr{group: "g", instance: "a", version: version}.req())
			ra := joinResp(t, ca, 0)
			cb := h.send(jr{group: "g", instance: "b", version: version}.req())
			cb.parked(h)
			ca = h.send(jr{group: "g", member: ra.MemberID, instance: "a", version: version}.req())
			ra, rb := joinResp(t, ca, 0), joinResp(t, cb, 0)
			oldA := ra.MemberID
			if ra.LeaderID != oldA {
				t.Fatalf("leader %s, want %s", ra.LeaderID, oldA)
			}
			h.syncAll("g", ra.Generation, []string{oldA, rb.MemberID}, map[string][]byte{oldA: assignment("t", 0), rb.MemberID: assignment("t", 1)})
			h.takeEvents("g")

			// Instance "a" restarts with the same metadata.
			r := joinResp(t, h.send(jr{group: "g", instance: "a", version: version}.req()), 0)
			if r.MemberID == oldA || r.Generation != ra.Generation {
				t.Fatalf("replacement: %+v", r)
			}
			if version >= 9 {
				if !r.SkipAssignment || r.LeaderID != r.MemberID || len(r.Members) != 2 {
					t.Fatalf("v9 static leader: skip %v leader %s members %d", r.SkipAssignment, r.LeaderID, len(r.Members))
				}
			} else if r.LeaderID != oldA || len(r.Members) != 0 {
				t.Fatalf("v<9 must act as follower: leader %s members %d", r.LeaderID, len(r.Members))
			}
			snap, _ := h.e.Group("g")
			if snap.State != "Stable" || snap.Leader != r.MemberID {
				t.Fatalf("after replacement: %+v", snap)
			}
			// The new member inherits the assignment.
			s := h.do(syncReq("g", r.MemberID, r.Generation, nil)).(*kmsg.SyncGroupResponse)
			s3 := syncReq("g", r.MemberID, r.Generation, nil)
			iid := "a"
			s3.InstanceID = &iid
			if string(s.MemberAssignment) != string(assignment("t", 0)) {
				t.Fatalf("inherited assignment %x", s.MemberAssignment)
			}
			// The old id is fenced.
			old := hb("g", oldA, r.Generation)
			old.InstanceID = &iid
			if code := h.do(old).(*kmsg.HeartbeatResponse).ErrorCode; code != errFencedInstanceID {
				t.Fatalf("old member heartbeat: %s", errName(code))
			}
			evs := kinds(h.takeEvents("g"))
			if !slices.Equal(evs, []string{"member_fenced", "member_joined"}) {
				t.Fatalf("events %v", evs)
			}
		})
	}
}

func TestStaticMemberReplacementFencesParkedRequests(t *testing.T) {
	h := newHarness(t)
	ra := joinResp(t, h.send(jr{group: "g", instance: "a", version: 9}.req()), 0)
	cb := h.send(jr{group: "g", instance: "b", version: 9}.req())
	// b's join triggered a rebalance: a rejoins and both complete.
	joinResp(t, h.send(jr{group: "g", member: ra.MemberID, instance: "a", version: 9}.req()), 0)
	joinResp(t, cb, 0)
	snap, _ := h.e.Group("g")
	if snap.State != "CompletingRebalance" {
		t.Fatalf("state %s", snap.State)
	}
	// Follower b parks its sync; then instance b restarts: the parked
	// sync is fenced and, in CompletingRebalance, a rebalance starts
	// (KAFKA-9801).
	var bID string
	for _, m := range snap.Members {
		if m.InstanceID == "b" {
			bID = m.MemberID
		}
	}
	iid := "b"
	s := syncReq("g", bID, snap.Generation, nil)
	s.InstanceID = &iid
	sc := h.send(s)
	sc.parked(h)
	h.takeEvents("g")
	nb := h.send(jr{group: "g", instance: "b", version: 9}.req())
	if r := sc.wait().(*kmsg.SyncGroupResponse); r.ErrorCode != errFencedInstanceID {
		t.Fatalf("fenced sync: %s", errName(r.ErrorCode))
	}
	nb.parked(h)
	evs := kinds(h.takeEvents("g"))
	if !slices.Contains(evs, "rebalance_started(static_member_replaced)") {
		t.Fatalf("events %v", evs)
	}
}

func TestStaticMemberChangedProtocolRebalances(t *testing.T) {
	h := newHarness(t)
	ra := joinResp(t, h.send(jr{group: "g", instance: "a", version: 9, protocols: []kmsg.JoinGroupRequestProtocol{protocol("range", "t"), protocol("roundrobin", "t")}}.req()), 0)
	h.syncAll("g", ra.Generation, []string{ra.MemberID}, nil)
	c := h.send(jr{group: "g", instance: "a", version: 9, protocols: []kmsg.JoinGroupRequestProtocol{protocol("roundrobin", "t")}}.req())
	r := joinResp(t, c, 0)
	if r.Generation != ra.Generation+1 || *r.Protocol != "roundrobin" {
		t.Fatalf("after protocol change: %+v", r)
	}
}

func TestStaticMemberSurvivesRebalanceWithoutRejoining(t *testing.T) {
	h := newHarness(t)
	ra := joinResp(t, h.send(jr{group: "g", instance: "a", version: 9}.req()), 0)
	cb := h.send(jr{group: "g", instance: "b", version: 9}.req())
	// a never rejoins: the join completes at the rebalance timeout and
	// static a stays a member.
	for i := 0; i < 4; i++ {
		h.advance(8 * time.Second)
		iid := "a"
		r := hb("g", ra.MemberID, ra.Generation)
		r.InstanceID = &iid
		h.do(r)
	}
	rb := joinResp(t, cb, 0)
	snap, _ := h.e.Group("g")
	if len(snap.Members) != 2 || rb.LeaderID != rb.MemberID {
		t.Fatalf("after timeout: %+v leader %s", snap.Members, rb.LeaderID)
	}
	// Leaving by instance id, without a member id.
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Version = 4
	lv.Group = "g"
	iid := "a"
	lv.Members = []kmsg.LeaveGroupRequestMember{{InstanceID: &iid}}
	if resp := h.do(lv).(*kmsg.LeaveGroupResponse); resp.Members[0].ErrorCode != 0 {
		t.Fatalf("leave by instance: %s", errName(resp.Members[0].ErrorCode))
	}
	// Fencing applies to leave with a wrong member id for an instance.
	iid2 := "b"
	lv.Members = []kmsg.LeaveGroupRequestMember{{MemberID: "stale", InstanceID: &iid2}}
	if resp := h.do(lv).(*kmsg.LeaveGroupResponse); resp.Members[0].ErrorCode != errFencedInstanceID {
		t.Fatalf("fenced leave: %s", errName(resp.Members[0].ErrorCode))
	}
}

func TestNewMemberJoinTimeout(t *testing.T) {
	// A new member that joins while a rebalance waits for a silent
	// member is expired by the new-member timeout, not kept forever
	// (KAFKA-7610), and its parked join is answered.
	h := newHarness(t, func(c *Config) { c.NewMemberJoinTimeout = 5 * time.Second })
	ids, _ := h.stableGroup("g", 1)
	c, _ := h.joinNew(jr{group: "g", session: 20 * time.Second, rebalance: 60 * time.Second})
	_ = ids
	h.advance(5*time.Second + time.Millisecond)
	if r := c.wait().(*kmsg.JoinGroupResponse); r.ErrorCode != errUnknownMemberID {
		t.Fatalf("expired new member: %s", errName(r.ErrorCode))
	}
	if evs := kinds(h.takeEvents("g")); !slices.Contains(evs, "member_expired(new_member_timeout)") {
		t.Fatalf("events %v", evs)
	}
}

func TestCloseAnswersParked(t *testing.T) {
	h := newHarness(t)
	ids, _ := h.stableGroup("g", 1)
	c, _ := h.joinNew(jr{group: "g"})
	c.parked(h)
	h.e.Close()
	if r := c.wait().(*kmsg.JoinGroupResponse); r.ErrorCode != errCoordinatorNotAvailable {
		t.Fatalf("parked join at close: %s", errName(r.ErrorCode))
	}
	if code := h.heartbeat("g", ids[0], 1); code != errCoordinatorNotAvailable {
		t.Fatalf("heartbeat after close: %s", errName(code))
	}
	if got := h.e.Groups(); len(got) != 0 {
		t.Fatalf("groups after close: %v", got)
	}
}

func TestSnapshots(t *testing.T) {
	h := newHarness(t)
	h.stableGroup("a", 2)
	h.stableGroup("b", 1)
	all := h.e.Groups()
	if len(all) != 2 || all[0].Group != "a" || len(all[0].Members) != 2 || all[1].State != "Stable" {
		t.Fatalf("snapshots %+v", all)
	}
	if all[0].Members[0].ClientHost != "10.0.0.1" || all[0].Members[0].Assignment == nil {
		t.Fatalf("member snapshot %+v", all[0].Members[0])
	}
}

func TestEmptyGroupForgottenAfterRetention(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.EmptyGroupRetention = time.Hour })
	ids, gen := h.stableGroup("g", 1)
	h.do(commitReq(8, "g", ids[0], gen, 0, 9))
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Group, lv.MemberID = "g", ids[0]
	h.do(lv)
	h.advance(59 * time.Minute)
	if snap, ok := h.e.Group("g"); !ok || snap.State != "Empty" || snap.ProtocolType != "consumer" {
		t.Fatalf("before retention: %+v %v", snap, ok)
	}
	// A handshake-only group (pending member that never joins) is
	// forgotten too.
	h.do(jr{group: "p", version: 9}.req())
	h.advance(time.Hour + time.Minute)
	for _, id := range []string{"g", "p"} {
		if _, ok := h.e.Group(id); ok {
			t.Fatalf("group %s still held after retention", id)
		}
	}
	// Its offsets remain: it is now a simple group.
	d := kmsg.NewPtrDescribeGroupsRequest()
	d.Version = 6
	d.Groups = []string{"g"}
	if r := h.do(d).(*kmsg.DescribeGroupsResponse); r.Groups[0].State != "Empty" || r.Groups[0].ErrorCode != 0 || h.storedOffset("g", 0) != 9 {
		t.Fatalf("after retention: %+v", r.Groups[0])
	}
	// A group that came back to life is not forgotten while it lives.
	ids, gen = h.stableGroup("g", 1)
	for elapsed := time.Duration(0); elapsed < 70*time.Minute; elapsed += 9 * time.Second {
		h.advance(9 * time.Second)
		if code := h.heartbeat("g", ids[0], gen); code != 0 {
			t.Fatalf("heartbeat: %s", errName(code))
		}
	}
	if snap, ok := h.e.Group("g"); !ok || snap.State != "Stable" {
		t.Fatalf("live group: %+v %v", snap, ok)
	}
}
