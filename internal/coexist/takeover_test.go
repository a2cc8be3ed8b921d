package coexist

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/proxy"
)

// fakeTakeoverStore answers DescribeClassicGroup with a set group and
// records the takeovers asked of it.
type fakeTakeoverStore struct {
	mu       sync.Mutex
	group    kmsg.DescribeGroupsResponseGroup
	prepared map[string][]TakeoverMember
	records  map[string][]byte
	ready    map[string]bool
}

func (s *fakeTakeoverStore) DescribeClassicGroup(context.Context, string) (kmsg.DescribeGroupsResponseGroup, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.group, nil
}

func (s *fakeTakeoverStore) PrepareTakeover(group string, rec []byte, members []TakeoverMember) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prepared[group], s.records[group] = members, rec
	return nil
}

func (s *fakeTakeoverStore) TakeoverReady(group string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready[group] = true
}

func newTestWatcher(t *testing.T, owns func(string) bool) (*forwardWatcher, *fakeTakeoverStore) {
	t.Helper()
	st := &fakeTakeoverStore{prepared: map[string][]TakeoverMember{}, records: map[string][]byte{}, ready: map[string]bool{}}
	fw := newForwardSet(nil)
	fw.mark("g")
	w := newForwardWatcher(fw, st, owns, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.settle = 0
	return w, st
}

// joinSync runs member id through a watched JoinGroup and SyncGroup of
// group g at generation gen.
func joinSync(w *forwardWatcher, id string, gen int32, leader string) {
	watchJoin(w, id, gen, leader)
	watchSync(w, id, gen)(kmsg.NewPtrSyncGroupResponse())
}

// watchJoin runs member id through a watched JoinGroup of group g
// answered at generation gen with leader.
func watchJoin(w *forwardWatcher, id string, gen int32, leader string) {
	jq := kmsg.NewPtrJoinGroupRequest()
	jq.Group, jq.ProtocolType, jq.SessionTimeoutMillis, jq.RebalanceTimeoutMillis = "g", "consumer", 10000, 30000
	jq.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte("sub-" + id)}}
	done := w.Watch(proxy.Client{ID: "client-" + id, Host: "10.0.0.1"}, "g", jq)
	jr := kmsg.NewPtrJoinGroupResponse()
	jr.MemberID, jr.Generation, jr.LeaderID = id, gen, leader
	p := "range"
	jr.Protocol = &p
	done(jr)
}

// watchSync sends member id's SyncGroup of generation gen through the
// watcher and returns what answers it.
func watchSync(w *forwardWatcher, id string, gen int32) func(kmsg.Response) {
	sq := kmsg.NewPtrSyncGroupRequest()
	sq.Group, sq.MemberID, sq.Generation = "g", id, gen
	return w.Watch(proxy.Client{ID: "client-" + id, Host: "10.0.0.1"}, "g", sq)
}

func describedGroup(ids ...string) kmsg.DescribeGroupsResponseGroup {
	d := kmsg.NewDescribeGroupsResponseGroup()
	d.Group, d.State, d.ProtocolType, d.Protocol = "g", "Stable", "consumer", "range"
	for _, id := range ids {
		m := kmsg.NewDescribeGroupsResponseGroupMember()
		m.MemberID, m.ProtocolMetadata, m.MemberAssignment = id, []byte("sub-"+id), []byte("asg-"+id)
		d.Members = append(d.Members, m)
	}
	return d
}

// TestTakeoverLocal: the members a kproxy forwards are taken over once
// the cluster's group is Stable with exactly them, at their generation,
// with the cluster's assignments and their own subscriptions; not while
// one of them is unsynced or a request of the group is on its way, nor
// when the cluster lists a member kproxy does not forward.
func TestTakeoverLocal(t *testing.T) {
	ctx := context.Background()
	w, st := newTestWatcher(t, nil)
	joinSync(w, "m1", 7, "m1")
	joinSync(w, "m2", 7, "m1")

	st.group = describedGroup("m1", "m2", "direct")
	owned, _ := w.candidates()
	if len(owned) != 1 {
		t.Fatalf("candidates %v, want g", owned)
	}
	if err := w.tryTakeover(ctx, "g"); err != nil || len(st.prepared) != 0 {
		t.Fatalf("took over a group with a direct member (err %v, prepared %v)", err, st.prepared)
	}

	// A SyncGroup on its way holds the takeover off; a heartbeat does
	// not (members send them all the time).
	sq := kmsg.NewPtrSyncGroupRequest()
	sq.Group, sq.MemberID, sq.Generation = "g", "m1", 7
	syncDone := w.Watch(proxy.Client{ID: "client-m1", Host: "10.0.0.1"}, "g", sq)
	if owned, _ := w.candidates(); len(owned) != 0 {
		t.Fatalf("candidate with a SyncGroup in flight: %v", owned)
	}
	syncDone(kmsg.NewPtrSyncGroupResponse())
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group, hb.MemberID, hb.Generation = "g", "m2", 7
	answer := w.Watch(proxy.Client{ID: "client-m2", Host: "10.0.0.1"}, "g", hb)
	if owned, _ := w.candidates(); len(owned) != 1 {
		t.Fatalf("not a candidate with only a heartbeat in flight: %v", owned)
	}
	// REBALANCE_IN_PROGRESS: m2 rejoins, no takeover until it synced.
	hr := kmsg.NewPtrHeartbeatResponse()
	hr.ErrorCode = kerr.RebalanceInProgress.Code
	answer(hr)
	if owned, _ := w.candidates(); len(owned) != 0 {
		t.Fatalf("candidate while a member rebalances: %v", owned)
	}
	joinSync(w, "m1", 8, "m1")
	joinSync(w, "m2", 8, "m1")

	// A heartbeat on its way when the group is taken over: the anchor
	// may join only once it arrived.
	hb.Generation = 8
	answer = w.Watch(proxy.Client{ID: "client-m2", Host: "10.0.0.1"}, "g", hb)
	st.group = describedGroup("m1", "m2")
	if err := w.tryTakeover(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	w.candidates() // the loop's next tick must not forget what is on its way
	w.finishReleases()
	if st.ready["g"] {
		t.Fatal("the anchor may join while a member's heartbeat is on its way to the cluster")
	}
	answer(kmsg.NewPtrHeartbeatResponse())
	w.finishReleases()
	if len(st.prepared["g"]) != 2 || !st.ready["g"] || w.fw.Forwarded("g") {
		t.Fatalf("prepared %v, ready %v, still forwarded %v", st.prepared, st.ready, w.fw.Forwarded("g"))
	}
	var v kmsg.GroupMetadataValue
	if err := v.ReadFrom(st.records["g"]); err != nil {
		t.Fatal(err)
	}
	if v.Generation != 8 || *v.Leader != "m1" || *v.Protocol != "range" || len(v.Members) != 2 ||
		string(v.Members[0].Subscription) != "sub-m1" || string(v.Members[1].Assignment) != "asg-m2" ||
		v.Members[0].SessionTimeoutMillis != 10000 || v.Members[0].ClientHost != "10.0.0.1" {
		t.Fatalf("record %+v", v)
	}
}

// TestTakeoverFleet: the owner counts the members other kproxies report,
// answers them "release" once it takes the group over, and completes the
// takeover only when each said it stopped forwarding with nothing on its
// way. Reports travel as kproxy messages over a real peer wire.
func TestTakeoverFleet(t *testing.T) {
	ctx := context.Background()
	owner, st := newTestWatcher(t, func(string) bool { return true })
	relay, _ := newTestWatcher(t, func(string) bool { return false })
	relay.id = "relay-1"
	joinSync(relay, "m1", 3, "m1")
	_, reports := relay.candidates()
	if len(reports) != 1 || len(reports[0].Members) != 1 {
		t.Fatalf("relay's reports %+v", reports)
	}
	relay.send = peerWire(t, owner)
	if release, _ := relay.sendReport(ctx, reports[0]); release {
		t.Fatal("first report answered release")
	}
	st.group = describedGroup("m1")
	if err := owner.tryTakeover(ctx, "g"); err != nil || len(st.prepared) != 1 {
		t.Fatalf("owner did not take over (err %v)", err)
	}
	if release, members := relay.sendReport(ctx, reports[0]); !release || !slices.Equal(members, []string{"m1"}) {
		t.Fatalf("report during the takeover answered release=%v members=%v", release, members)
	}
	owner.finishReleases()
	if st.ready["g"] {
		t.Fatal("takeover completed before the relay stopped forwarding")
	}
	relay.sendReport(ctx, memberReport{Group: "g", From: "relay-1", Released: true})
	owner.finishReleases()
	if !st.ready["g"] {
		t.Fatal("takeover not completed after the relay stopped forwarding")
	}
}

// peerWire returns a send function that carries kproxy messages to
// owner's report handler over a peer server and a router, as in a fleet
// where owner owns every group.
func peerWire(t *testing.T, owner *forwardWatcher) func(context.Context, string, string, int16, []byte) ([]byte, error) {
	t.Helper()
	msgs := proxy.NewPeerMessages()
	msgs.Handle(reportType, reportVersion, owner.handleReport)
	ps, err := proxy.NewPeerServer(proxy.PeerServerConfig{Listen: "127.0.0.1:0", Coordinator: &countingCoordinator{}, Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ps.Close)
	r := proxy.NewRouter(proxy.RouterConfig{Locator: remoteLocator(ps.Addr())})
	t.Cleanup(r.Close)
	return r.SendPeer
}

// remoteLocator locates every group at one peer address.
type remoteLocator string

func (l remoteLocator) Locate(string) (bool, string, bool) { return false, string(l), true }
func (remoteLocator) Changed() <-chan struct{}             { return nil }
func (l remoteLocator) Peers() []string                    { return []string{string(l)} }

// TestTakeoverReportMalformed: a report that does not decode, or names
// no group, is refused as malformed and recorded nowhere.
func TestTakeoverReportMalformed(t *testing.T) {
	owner, _ := newTestWatcher(t, func(string) bool { return true })
	send := peerWire(t, owner)
	for _, payload := range []string{"{not json", `{"from":"relay-1"}`, `{"group":"g"}`} {
		if _, err := send(context.Background(), "g", reportType, reportVersion, []byte(payload)); !errors.Is(err, proxy.ErrPeerMalformed) {
			t.Fatalf("report %s: %v", payload, err)
		}
	}
	owner.mu.Lock()
	n := len(owner.remote)
	owner.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d groups recorded from malformed reports", n)
	}
}

// TestLegacyReportGuard: a takeover report in the JoinGroup disguise of
// an earlier version is refused without reaching the engine; the same
// JoinGroup from a client's connection goes to the engine.
func TestLegacyReportGuard(t *testing.T) {
	engine := &countingCoordinator{}
	guard := legacyReportGuard{Coordinator: engine}
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group, req.ProtocolType = "g", legacyReportProtocolType
	req.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "report", Metadata: []byte("{}")}}
	var code int16 = -1
	guard.Handle(proxy.Client{ID: legacyReportClientID}, req, func(resp kmsg.Response) {
		code = resp.(*kmsg.JoinGroupResponse).ErrorCode
	})
	if code != 42 || engine.asked != 0 {
		t.Fatalf("legacy report: code %d, engine asked %d times", code, engine.asked)
	}
	guard.Handle(proxy.Client{ID: legacyReportClientID, Host: "10.0.0.9"}, req, func(kmsg.Response) {})
	if engine.asked != 1 {
		t.Fatal("a JoinGroup from a client address did not reach the engine")
	}
}

// countingCoordinator counts the requests it is asked and answers
// each with an empty response.
type countingCoordinator struct{ asked int }

func (c *countingCoordinator) Handle(_ proxy.Client, req kmsg.Request, reply func(kmsg.Response)) {
	c.asked++
	reply(req.ResponseKind())
}

// TestTakeoverRecordStaticLeaderReplaced: static members moved behind
// kproxy one at a time replace their direct instances without a
// rebalance (KIP-345), so each heard of the leader of its time. The
// record names a leader that is still a member (the one the last
// replaced leader's successor heard of), and any member when none is.
func TestTakeoverRecordStaticLeaderReplaced(t *testing.T) {
	d := describedGroup("m4", "m5", "m6")
	watched := map[string]*watchedMember{
		// m4 joined while the old leader (m3-old) led; m5 too; m6
		// replaced m3-old and heard of itself.
		"m4": {protocolType: "consumer", protocol: "range", generation: 5, leader: "m3-old"},
		"m5": {protocolType: "consumer", protocol: "range", generation: 5, leader: "m3-old"},
		"m6": {protocolType: "consumer", protocol: "range", generation: 5, leader: "m6"},
	}
	rec, _, gen, ok := takeoverRecord(d, watched)
	if !ok || gen != 5 {
		t.Fatalf("takeoverRecord: ok %v gen %d", ok, gen)
	}
	var v kmsg.GroupMetadataValue
	if err := v.ReadFrom(rec); err != nil {
		t.Fatal(err)
	}
	if v.Leader == nil || *v.Leader != "m6" {
		t.Fatalf("leader %v, want m6", v.Leader)
	}
	watched["m6"].leader = "m2-old"
	rec, _, _, ok = takeoverRecord(d, watched)
	if !ok {
		t.Fatal("no record when every leader heard of was replaced")
	}
	if err := v.ReadFrom(rec); err != nil {
		t.Fatal(err)
	}
	if v.Leader == nil || *v.Leader != "m4" {
		t.Fatalf("leader %v, want the first member, m4", v.Leader)
	}
}

// TestTakeoverLateAnswersOfAnOlderGeneration: a heartbeat or SyncGroup
// sent at one generation and answered after the member's rejoin into the
// next (ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS about a rebalance that
// is over) changes nothing: the member stays known, synced at its new
// generation, and the group is taken over. Forgetting it would hold the
// takeover off for as long as the group stays stable (nothing makes a
// stable member join again).
func TestTakeoverLateAnswersOfAnOlderGeneration(t *testing.T) {
	ctx := context.Background()
	w, st := newTestWatcher(t, nil)
	c := proxy.Client{ID: "client-m1", Host: "10.0.0.1"}
	joinSync(w, "m1", 4, "m1")
	joinSync(w, "m2", 4, "m1")

	late := func(id string, gen int32) (hb func(kmsg.Response), sync func(kmsg.Response)) {
		h := kmsg.NewPtrHeartbeatRequest()
		h.Group, h.MemberID, h.Generation = "g", id, gen
		s := kmsg.NewPtrSyncGroupRequest()
		s.Group, s.MemberID, s.Generation = "g", id, gen
		return w.Watch(c, "g", h), w.Watch(c, "g", s)
	}
	hb1, sync1 := late("m1", 4)
	hb2, sync2 := late("m2", 4)
	joinSync(w, "m1", 5, "m1")
	joinSync(w, "m2", 5, "m1")

	illegal := kmsg.NewPtrHeartbeatResponse()
	illegal.ErrorCode = kerr.IllegalGeneration.Code
	hb1(illegal)
	rebalancing := kmsg.NewPtrHeartbeatResponse()
	rebalancing.ErrorCode = kerr.RebalanceInProgress.Code
	hb2(rebalancing)
	unknown := kmsg.NewPtrSyncGroupResponse()
	unknown.ErrorCode = kerr.IllegalGeneration.Code
	sync2(unknown)
	sync1(kmsg.NewPtrSyncGroupResponse()) // of generation 4: not a sync of 5

	st.group = describedGroup("m1", "m2")
	if owned, _ := w.candidates(); len(owned) != 1 {
		w.mu.Lock()
		all, _ := w.mergedLocked("g", time.Now())
		w.mu.Unlock()
		t.Fatalf("not a candidate after late answers of generation 4: %s", describeMembers(all))
	}
	if err := w.tryTakeover(ctx, "g"); err != nil || len(st.prepared["g"]) != 2 {
		t.Fatalf("takeover: err %v, prepared %v", err, st.prepared)
	}

	// The same errors about the member's current generation still count.
	w2, _ := newTestWatcher(t, nil)
	joinSync(w2, "m1", 5, "m1")
	h := kmsg.NewPtrHeartbeatRequest()
	h.Group, h.MemberID, h.Generation = "g", "m1", 5
	w2.Watch(c, "g", h)(illegal)
	w2.mu.Lock()
	_, kept := w2.groups["g"].members["m1"]
	w2.mu.Unlock()
	if kept {
		t.Fatal("ILLEGAL_GENERATION at the member's own generation did not end its membership")
	}
}

// TestTakeoverTickBetweenJoinAndSync: the loop's tick between a member's
// JoinGroup answer and its SyncGroup answer keeps the member (it was
// just answered), so its sync counts and the group is taken over.
func TestTakeoverTickBetweenJoinAndSync(t *testing.T) {
	ctx := context.Background()
	w, st := newTestWatcher(t, nil)
	watchJoin(w, "m1", 3, "m1")
	syncDone := watchSync(w, "m1", 3)
	w.candidates() // the tick
	syncDone(kmsg.NewPtrSyncGroupResponse())

	st.group = describedGroup("m1")
	if owned, _ := w.candidates(); len(owned) != 1 {
		w.mu.Lock()
		all, _ := w.mergedLocked("g", time.Now())
		w.mu.Unlock()
		t.Fatalf("not a candidate after a tick between join and sync: %q", describeMembers(all))
	}
	if err := w.tryTakeover(ctx, "g"); err != nil || len(st.prepared["g"]) != 1 {
		t.Fatalf("takeover: err %v, prepared %v", err, st.prepared)
	}
}

// TestTakeoverSettleSampledAtTicks: a group first found ready at one
// check is a candidate at the check one settle time later even if that
// check comes a little early (the ticker's jitter), not only at the one
// after; and not before.
func TestTakeoverSettleSampledAtTicks(t *testing.T) {
	w, _ := newTestWatcher(t, nil)
	w.settle = 3 * takeoverInterval
	joinSync(w, "m1", 7, "m1")
	if owned, _ := w.candidates(); len(owned) != 0 {
		t.Fatalf("candidates %v at the first ready check", owned)
	}
	w.mu.Lock()
	w.readySince["g"] = time.Now().Add(-(2*takeoverInterval + takeoverInterval/4))
	w.mu.Unlock()
	if owned, _ := w.candidates(); len(owned) != 0 {
		t.Fatalf("candidates %v two checks after the group was ready", owned)
	}
	w.mu.Lock()
	w.readySince["g"] = time.Now().Add(-(w.settle - time.Millisecond))
	w.mu.Unlock()
	if owned, _ := w.candidates(); len(owned) != 1 {
		t.Fatalf("candidates %v at the check a settle time (less a millisecond) after the group was ready, want g", owned)
	}
}
