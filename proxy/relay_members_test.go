package proxy

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// joined returns a tracker that relayed member m's JoinGroup (session s)
// answered at t0.
func joined(t *testing.T, disabled bool, k memberKey, s time.Duration, t0 time.Time) *memberTracker {
	t.Helper()
	tr := newMemberTracker(slog.New(slog.DiscardHandler), disabled, 0, nil)
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.MemberID = k.member
	tr.end(memberReq{key: memberKey{k.group, ""}, session: s}, false, t0, t0, resp, outcomeOK)
	if tr.size() != 1 {
		t.Fatalf("after a join, %d members tracked, want 1", tr.size())
	}
	return tr
}

func heartbeat(tr *memberTracker, k memberKey, at time.Time, code int16, o outcome) (expired bool) {
	expired, counted := tr.begin(memberReq{key: k}, at)
	if expired {
		return true
	}
	var resp kmsg.Response
	if o == outcomeOK {
		hb := kmsg.NewPtrHeartbeatResponse()
		hb.ErrorCode = code
		resp = hb
	}
	tr.end(memberReq{key: k}, counted, at, at, resp, o)
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
	if exp, _ := tr.begin(memberReq{key: k}, lastSeen); !exp {
		t.Fatal("a member told to give up was relayed again")
	}
	// The member rejoins under a new id; the old one is forgotten by the
	// sweep once not seen for three sessions.
	tr.begin(memberReq{key: memberKey{"g", "other"}}, lastSeen.Add(forgetAfter(s)+2*memberSweepEvery))
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
	if exp, counted := tr.begin(memberReq{key: k}, at.Add(time.Second)); exp || !counted {
		t.Fatalf("begin: expired %v counted %v, want a relayed request", exp, counted)
	}
	if exp, _ := tr.begin(memberReq{key: k}, at.Add(s)); exp {
		t.Fatal("told to give up with a request in flight")
	}
	// An OffsetCommit in flight does not hold it back: its answer does
	// not renew the session.
	tr = joined(t, false, k, s, t0)
	heartbeat(tr, k, t0.Add(time.Second), 0, outcomeOwnerDown)
	if exp, counted := tr.begin(memberReq{key: k, commit: true}, t0.Add(2*time.Second)); exp || counted {
		t.Fatalf("a commit: expired %v counted %v, want relayed and not counted", exp, counted)
	}
	if exp, _ := tr.begin(memberReq{key: k}, t0.Add(s)); !exp {
		t.Fatal("a commit in flight held the verdict back")
	}
	tr = joined(t, false, k, s, t0)
	at = t0.Add(4*s + 2*time.Second)
	heartbeat(tr, k, at, 0, outcomeOwnerDown)
	tr.begin(memberReq{key: k}, at.Add(time.Second))
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
		_, counted := tr.begin(memberReq{key: k}, t0)
		tr.end(memberReq{key: k}, counted, t0, t0, resp, outcomeOK)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per tracked request, want 0", allocs)
	}
}

// heartbeat848 routes a ConsumerGroupHeartbeat of member k with epoch
// at at; the owner answers code (with the member id) when o is
// outcomeOK.
func heartbeat848(tr *memberTracker, k memberKey, epoch int32, at time.Time, code int16, o outcome) (expired bool) {
	q := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	q.Group, q.MemberID, q.MemberEpoch = k.group, k.member, epoch
	mr, ok := memberOf(q)
	if !ok {
		panic("not a member request")
	}
	expired, counted := tr.begin(mr, at)
	if expired {
		return true
	}
	var resp kmsg.Response
	if o == outcomeOK {
		r := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		r.ErrorCode = code
		if code == 0 {
			r.MemberID, r.MemberEpoch = &k.member, max(epoch, 1)
		}
		resp = r
	}
	tr.end(mr, counted, at, at, resp, o)
	return false
}

// TestRelayKIP848GroupOwnSession: a group with a session timeout of its
// own (a GROUP config) has its cut-off members told by that session, not
// the engine-wide one, and a change of it applies from the next answer.
func TestRelayKIP848GroupOwnSession(t *testing.T) {
	k := memberKey{"g", "m848"}
	const engine = 45 * time.Second
	var own atomic.Int64
	own.Store(int64(10 * time.Second))
	tr := newMemberTracker(slog.New(slog.DiscardHandler), false, engine, func(group string) time.Duration {
		if group != "g" {
			return 0
		}
		return time.Duration(own.Load())
	})
	t0 := time.Unix(1000, 0)
	heartbeat848(tr, k, 0, t0, 0, outcomeOK)
	giveUp := func(s time.Duration) time.Time { return t0.Add(s - giveUpMargin(s)) }
	if heartbeat848(tr, k, 1, giveUp(10*time.Second).Add(-time.Millisecond), 0, outcomeOwnerDown) {
		t.Fatal("told to give up before the group's 10s session minus the margin")
	}
	if !heartbeat848(tr, k, 1, giveUp(10*time.Second), 0, outcomeOwnerDown) {
		t.Fatal("not told to give up by the group's 10s session minus the margin (the engine's 45s used)")
	}
	// The group's session grows to 50s: from the next answer on.
	own.Store(int64(50 * time.Second))
	heartbeat848(tr, k, 0, t0, 0, outcomeOK)
	if heartbeat848(tr, k, 1, giveUp(45*time.Second), 0, outcomeOwnerDown) {
		t.Fatal("told to give up by the engine's 45s where the group's session is 50s")
	}
	if !heartbeat848(tr, k, 1, giveUp(50*time.Second), 0, outcomeOwnerDown) {
		t.Fatal("not told to give up by the group's 50s session")
	}
	// Another group keeps the engine's.
	o := memberKey{"other", "m"}
	heartbeat848(tr, o, 0, t0, 0, outcomeOK)
	if heartbeat848(tr, o, 1, giveUp(engine).Add(-time.Millisecond), 0, outcomeOwnerDown) ||
		!heartbeat848(tr, o, 1, giveUp(engine), 0, outcomeOwnerDown) {
		t.Fatal("another group's member not told by the engine's session")
	}
}

// TestRelayTellsCutOffKIP848MemberToGiveUp: a KIP-848 member is tracked
// from the owner's answers with the consumer session timeout, told
// UNKNOWN_MEMBER_ID once its heartbeats stopped reaching the owner for
// the session minus the margin, and let through again when it rejoins
// with epoch 0 under the same id (as Kafka's consumer does).
func TestRelayTellsCutOffKIP848MemberToGiveUp(t *testing.T) {
	k := memberKey{"g", "m848"}
	const s = 5 * time.Second
	tr := newMemberTracker(slog.New(slog.DiscardHandler), false, s, nil)
	t0 := time.Unix(1000, 0)
	if heartbeat848(tr, k, 0, t0, 0, outcomeOK) || tr.size() != 1 {
		t.Fatalf("a KIP-848 join: %d members tracked, want 1", tr.size())
	}
	last := t0.Add(2 * time.Second)
	heartbeat848(tr, k, 1, last, 0, outcomeOK)
	giveUp := last.Add(s - giveUpMargin(s))
	for at := last.Add(500 * time.Millisecond); at.Before(giveUp); at = at.Add(500 * time.Millisecond) {
		if heartbeat848(tr, k, 1, at, 0, outcomeOwnerDown) {
			t.Fatalf("told to give up %v after the last heartbeat that reached the owner", at.Sub(last))
		}
	}
	if !heartbeat848(tr, k, 1, giveUp, 0, outcomeOwnerDown) {
		t.Fatalf("not told to give up %v after the last heartbeat that reached the owner", giveUp.Sub(last))
	}
	// Its commits are answered too.
	if exp, _ := tr.begin(memberReq{key: k}, giveUp.Add(time.Millisecond)); !exp {
		t.Fatal("a told member's OffsetCommit was relayed")
	}
	// The rejoin (epoch 0, same id) goes to the owner, and from its
	// answer on the member is tracked afresh.
	if heartbeat848(tr, k, 0, giveUp.Add(time.Second), 0, outcomeOK) {
		t.Fatal("a KIP-848 rejoin was answered by the relay")
	}
	if heartbeat848(tr, k, 1, giveUp.Add(2*time.Second), 0, outcomeOK) {
		t.Fatal("the rejoined member was told to give up")
	}
	// The owner's own UNKNOWN_MEMBER_ID and FENCED_MEMBER_EPOCH forget
	// it, as does a leave.
	for _, code := range []int16{errUnknownMemberID, errFencedMemberEpoch} {
		heartbeat848(tr, k, 0, t0, 0, outcomeOK)
		heartbeat848(tr, k, 3, t0, code, outcomeOK)
		if tr.size() != 0 {
			t.Errorf("after the owner answered %d, %d members tracked", code, tr.size())
		}
	}
	heartbeat848(tr, k, 0, t0, 0, outcomeOK)
	tr.left848(k.group, k.member)
	if tr.size() != 0 {
		t.Error("a member that left is still tracked")
	}
	// Without a consumer session timeout KIP-848 members are not
	// tracked.
	none := newMemberTracker(slog.New(slog.DiscardHandler), false, 0, nil)
	heartbeat848(none, k, 0, t0, 0, outcomeOK)
	if none.size() != 0 {
		t.Error("a KIP-848 member tracked without a consumer session timeout")
	}
}

// TestMemberGivesUpWithoutOwner: answers that say no owner serves the
// group (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, or no owner at
// all, as on a kproxy whose fleet lease ran out) count as requests that
// did not reach an owner.
func TestMemberGivesUpWithoutOwner(t *testing.T) {
	k := memberKey{"g", "m1"}
	const s = 10 * time.Second
	t0 := time.Unix(1000, 0)
	tr := joined(t, false, k, s, t0)
	heartbeat(tr, k, t0.Add(time.Second), 0, outcomeOK)
	heartbeat(tr, k, t0.Add(2*time.Second), errNotCoordinator, outcomeOK)
	mr := memberReq{key: k}
	tr.noOwner(mr, t0.Add(3*time.Second))
	heartbeat(tr, k, t0.Add(4*time.Second), errCoordinatorLoadInProgress, outcomeOK)
	tr.noOwner(mr, t0.Add(5*time.Second))
	giveUp := t0.Add(time.Second + s - giveUpMargin(s))
	if tr.check(mr, giveUp.Add(-time.Millisecond)) {
		t.Fatal("told before the session minus the margin")
	}
	if !tr.check(mr, giveUp) {
		t.Fatal("not told after the session minus the margin without an owner")
	}
	// A request for another owner than the one the last failed at (the
	// group moved) is let through once; one for the local engine always.
	tr = joined(t, false, k, s, t0)
	fail := func(dest string, at time.Time) {
		mr := memberReq{key: k, dest: dest}
		exp, counted := tr.begin(mr, at)
		if exp {
			t.Fatalf("told at %v going to %q", at.Sub(t0), dest)
		}
		tr.end(mr, counted, at, at, nil, outcomeOwnerDown)
	}
	fail("x:1", t0.Add(time.Second))
	late := t0.Add(2 * s)
	fail("y:1", late)
	fail(destLocal, late.Add(time.Millisecond))
	fail(destLocal, late.Add(2*time.Millisecond))
	fail("x:1", late.Add(3*time.Millisecond))
	if exp, _ := tr.begin(memberReq{key: k, dest: "x:1"}, late.Add(4*time.Millisecond)); !exp {
		t.Fatal("not told going where its last request failed")
	}
	// A member answered by a serving owner in between is kept.
	tr = joined(t, false, k, s, t0)
	tr.noOwner(mr, t0.Add(time.Second))
	heartbeat(tr, k, t0.Add(2*time.Second), 0, outcomeOK)
	if tr.check(mr, t0.Add(s)) {
		t.Fatal("told to give up although its last heartbeat reached an owner")
	}
}

// leaseLocator locates every group here until set(true), then nowhere
// (a kproxy whose fleet lease ran out while cut off from the cluster)
// until set(false) (the group claimed here again); each set is a table
// change (Changed).
type leaseLocator struct {
	mu      sync.Mutex
	lost    bool          // guarded by mu
	changed chan struct{} // guarded by mu
}

func newLeaseLocator() *leaseLocator { return &leaseLocator{changed: make(chan struct{})} }

func (l *leaseLocator) Locate(string) (bool, string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lost, "", !l.lost
}

func (l *leaseLocator) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *leaseLocator) Peers() []string { return nil }

func (l *leaseLocator) set(lost bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost = lost
	close(l.changed)
	l.changed = make(chan struct{})
}

// answerAll is a local coordinator that answers a JoinGroup with member
// id "m1" and every other request without error.
type answerAll struct{}

func (answerAll) Handle(_ Client, req kmsg.Request, reply func(kmsg.Response)) {
	switch q := req.(type) {
	case *kmsg.JoinGroupRequest:
		r := kmsg.NewPtrJoinGroupResponse()
		r.MemberID = "m1"
		reply(r)
	case *kmsg.ConsumerGroupHeartbeatRequest:
		r := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		r.MemberID, r.MemberEpoch = &q.MemberID, max(q.MemberEpoch, 1)
		reply(r)
	default:
		reply(codec.GroupErrorResponse(req, 0))
	}
}

// joinM1 joins member m1 (answerAll's id) to group g through r with
// session.
func joinM1(t *testing.T, r *Router, c Client, session time.Duration) {
	t.Helper()
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.SessionTimeoutMillis, join.ProtocolType = "g", int32(session/time.Millisecond), "consumer"
	if got := handle(t, r, c, join).(*kmsg.JoinGroupResponse); got.ErrorCode != 0 || got.MemberID != "m1" {
		t.Fatalf("join: %+v", got)
	}
}

// TestRouterTellsLocalMembersAfterLeaseLoss: the members a kproxy serves
// itself are told UNKNOWN_MEMBER_ID once its groups have had no owner
// for their session minus the margin since their last heartbeat it
// answered, classic and KIP-848 alike; before that they get
// COORDINATOR_NOT_AVAILABLE.
func TestRouterTellsLocalMembersAfterLeaseLoss(t *testing.T) {
	const session = 600 * time.Millisecond
	loc := newLeaseLocator()
	r := NewRouter(RouterConfig{Local: answerAll{}, Locator: loc, WaitForOwner: 10 * time.Millisecond, ConsumerSessionTimeout: session})
	defer r.Close()
	c := Client{ID: "test"}
	joinM1(t, r, c, session)
	hb848 := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	hb848.Group, hb848.MemberID, hb848.MemberEpoch = "g848", "k1", 0
	checkCodes(t, "KIP-848 join", handle(t, r, c, hb848), 0)
	hb848.MemberEpoch = 1
	lastOK := time.Now()
	checkCodes(t, "heartbeat", handle(t, r, c, heartbeatFor("g", "m1")), 0)
	checkCodes(t, "KIP-848 heartbeat", handle(t, r, c, hb848), 0)
	loc.set(true)
	giveUp := lastOK.Add(session - giveUpMargin(session))
	told, told848 := false, false
	for !told || !told848 {
		// A request that fails shortly before the moment waits for
		// it; none is told before it.
		code := codesOf(t, handle(t, r, c, heartbeatFor("g", "m1")))[0]
		before := time.Now().Before(giveUp)
		code848 := codesOf(t, handle(t, r, c, hb848))[0]
		before848 := time.Now().Before(giveUp) // its last answer was later than the classic member's
		switch {
		case before && code != errCoordinatorNotAvailable, before848 && code848 != errCoordinatorNotAvailable:
			t.Fatalf("%v after the last answered heartbeat: codes %d and %d, want COORDINATOR_NOT_AVAILABLE", time.Since(lastOK), code, code848)
		case time.Since(lastOK) > session:
			t.Fatalf("not told to give up %v after the last answered heartbeat (codes %d, %d)", time.Since(lastOK), code, code848)
		}
		told, told848 = code == errUnknownMemberID, code848 == errUnknownMemberID
		time.Sleep(20 * time.Millisecond)
	}
	// The KIP-848 member's rejoin with epoch 0 is let through (and finds
	// no owner).
	hb848.MemberEpoch = 0
	checkCodes(t, "KIP-848 rejoin", handle(t, r, c, hb848), errCoordinatorNotAvailable)
}

// heldCommits is a local coordinator that holds every OffsetCommit until
// release is closed, as an engine whose store write hangs.
type heldCommits struct{ release chan struct{} }

func (h heldCommits) Handle(_ Client, req kmsg.Request, reply func(kmsg.Response)) {
	go func() {
		<-h.release
		reply(codec.GroupErrorResponse(req, 0))
	}()
}

// TestRouterAnswersHeldCommitWhenGroupMoves: a local OffsetCommit held
// by the store is answered COORDINATOR_NOT_AVAILABLE soon after its
// group stops being served here, not when the store gives up, and the
// engine's late answer is dropped; while the group is served here it
// waits.
func TestRouterAnswersHeldCommitWhenGroupMoves(t *testing.T) {
	loc := newLeaseLocator()
	h := heldCommits{release: make(chan struct{})}
	r := NewRouter(RouterConfig{Local: h, Locator: loc})
	defer r.Close()
	commit := kmsg.NewPtrOffsetCommitRequest()
	commit.Group, commit.MemberID, commit.Generation = "g", "m1", 1
	commit.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 5}}}}
	var answers atomic.Int32
	got := make(chan kmsg.Response, 2)
	r.Handle(Client{}, commit, func(resp kmsg.Response) { answers.Add(1); got <- resp })
	select {
	case resp := <-got:
		t.Fatalf("answered while the group is served here and the store holds it: %+v", resp)
	case <-time.After(3 * localMovedCheck):
	}
	lost := time.Now()
	loc.set(true)
	checkCodes(t, "held commit after the group moved", waitReply(t, got, 2*time.Second), errCoordinatorNotAvailable)
	if took := time.Since(lost); took > 4*localMovedCheck {
		t.Errorf("answered %v after the group moved, want within %v", took, 4*localMovedCheck)
	}
	close(h.release)
	time.Sleep(100 * time.Millisecond)
	if n := answers.Load(); n != 1 {
		t.Errorf("%d answers, want 1 (the engine's late answer dropped)", n)
	}
}

// TestPeerServerAnswersHeldCommitWhenGroupMoves: the owner's side of
// the same. A relayed OffsetCommit the owner's store holds is answered
// COORDINATOR_NOT_AVAILABLE soon after the group stops being served
// there (PeerServerConfig.Serving), so the relaying kproxy learns it
// well before the relay timeout and sends it to the group's next owner
// (relay_follow.go); while it is served there it waits.
func TestPeerServerAnswersHeldCommitWhenGroupMoves(t *testing.T) {
	h := heldCommits{release: make(chan struct{})}
	defer close(h.release)
	var served atomic.Bool
	served.Store(true)
	ps, err := NewPeerServer(PeerServerConfig{Listen: "127.0.0.1:0", Coordinator: h, Logger: testLogger(t),
		Serving: func(group string) bool { return group != "g" || served.Load() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ps.Close)
	const relayTimeout = 10 * time.Second
	next, err := NewPeerServer(PeerServerConfig{Listen: "127.0.0.1:0", Coordinator: answerAll{}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(next.Close)
	loc := newTestLocator("", map[string]string{"g": ps.Addr()})
	r := NewRouter(RouterConfig{Locator: loc, Logger: testLogger(t), RelayTimeout: relayTimeout})
	defer r.Close()
	commit := kmsg.NewPtrOffsetCommitRequest()
	commit.Group, commit.MemberID, commit.Generation = "g", "m1", 1
	commit.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 5}}}}
	got := handleAsync(r, Client{}, commit)
	select {
	case resp := <-got:
		t.Fatalf("answered while the group is served at the owner and its store holds the commit: %+v", resp)
	case <-time.After(3 * localMovedCheck):
	}
	lost := time.Now()
	served.Store(false)
	loc.set("g", next.Addr())
	checkCodes(t, "relayed held commit after the group moved", waitReply(t, got, relayTimeout/2), 0)
	if took := time.Since(lost); took > 4*localMovedCheck {
		t.Errorf("answered %v after the group moved, want within %v", took, 4*localMovedCheck)
	}
}

// TestRouterNoVerdictOnceTheGroupMoved: a request that found no owner
// waits, shortly before the member's give-up moment, to be answered at
// that moment; if the group is served here by then (its partition was
// claimed meanwhile), the answer is COORDINATOR_NOT_AVAILABLE, not
// UNKNOWN_MEMBER_ID: the new owner answers for the member itself, and
// the member's next request reaches it.
func TestRouterNoVerdictOnceTheGroupMoved(t *testing.T) {
	const session = 1500 * time.Millisecond
	loc := newLeaseLocator()
	r := NewRouter(RouterConfig{Local: answerAll{}, Locator: loc, WaitForOwner: 10 * time.Millisecond})
	defer r.Close()
	c := Client{ID: "test"}
	joinM1(t, r, c, session)
	lastOK := time.Now()
	checkCodes(t, "heartbeat", handle(t, r, c, heartbeatFor("g", "m1")), 0)
	loc.set(true)
	giveUp := lastOK.Add(session - giveUpMargin(session))
	time.Sleep(time.Until(giveUp.Add(-400 * time.Millisecond)))
	got := make(chan kmsg.Response, 1)
	r.Handle(c, heartbeatFor("g", "m1"), func(resp kmsg.Response) { got <- resp })
	time.Sleep(200 * time.Millisecond)
	loc.set(false) // claimed here before the give-up moment
	select {
	case resp := <-got:
		checkCodes(t, "heartbeat waiting for the give-up moment", resp, errCoordinatorNotAvailable)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting heartbeat was never answered")
	}
	checkCodes(t, "heartbeat to the group's new owner", handle(t, r, c, heartbeatFor("g", "m1")), 0)
}

// TestRouterAnswersOnceTheGroupMoved: a member's request that found no
// owner waits for the member's give-up moment only while the group has
// none; once the group is located again (here: claimed by this kproxy)
// it is answered COORDINATOR_NOT_AVAILABLE at once, and the member's
// retry reaches the new owner. Held to the give-up moment, its answer
// held up every later answer on the member's connection.
func TestRouterAnswersOnceTheGroupMoved(t *testing.T) {
	const session = 3 * time.Second
	loc := newLeaseLocator()
	r := NewRouter(RouterConfig{Local: answerAll{}, Locator: loc, WaitForOwner: 10 * time.Millisecond})
	defer r.Close()
	c := Client{ID: "test"}
	joinM1(t, r, c, session)
	lastOK := time.Now()
	checkCodes(t, "heartbeat", handle(t, r, c, heartbeatFor("g", "m1")), 0)
	loc.set(true)
	giveUp := lastOK.Add(session - giveUpMargin(session))
	time.Sleep(time.Until(giveUp.Add(-1500 * time.Millisecond)))
	got := make(chan kmsg.Response, 1)
	r.Handle(c, heartbeatFor("g", "m1"), func(resp kmsg.Response) { got <- resp })
	time.Sleep(200 * time.Millisecond)
	moved := time.Now()
	loc.set(false) // claimed here, 1.3 s before the give-up moment
	select {
	case resp := <-got:
		checkCodes(t, "heartbeat waiting while the group had no owner", resp, errCoordinatorNotAvailable)
		if took := time.Since(moved); took > 500*time.Millisecond {
			t.Fatalf("answered %v after the group moved here (the give-up moment was %v after it)", took, giveUp.Sub(moved))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting heartbeat was never answered")
	}
	checkCodes(t, "heartbeat to the group's new owner", handle(t, r, c, heartbeatFor("g", "m1")), 0)
}
