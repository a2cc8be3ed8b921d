package groupstate

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// metaStore is a MemoryStore whose group metadata calls can be observed,
// held and failed.
type metaStore struct {
	*MemoryStore

	mu        sync.Mutex
	saves     []string // group ids saved, in order
	deletes   []string // group ids tombstoned, in order
	loads     []string // group ids loaded, in order
	holdSave  chan struct{}
	holdLoad  chan struct{}
	failSave  error
	failLoads int // the next failLoads loads fail
}

func newMetaStore() *metaStore { return &metaStore{MemoryStore: NewMemoryStore()} }

func (s *metaStore) SaveGroupMetadata(ctx context.Context, group string, rec []byte) error {
	s.mu.Lock()
	s.saves = append(s.saves, group)
	hold, fail := s.holdSave, s.failSave
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail != nil {
		return fail
	}
	return s.MemoryStore.SaveGroupMetadata(ctx, group, rec)
}

func (s *metaStore) DeleteGroupMetadata(ctx context.Context, group string) error {
	s.mu.Lock()
	s.deletes = append(s.deletes, group)
	s.mu.Unlock()
	return s.MemoryStore.DeleteGroupMetadata(ctx, group)
}

func (s *metaStore) LoadGroupMetadata(ctx context.Context, group string) ([]byte, bool, error) {
	s.mu.Lock()
	s.loads = append(s.loads, group)
	hold := s.holdLoad
	fail := s.failLoads > 0
	if fail {
		s.failLoads--
	}
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	if fail {
		return nil, false, kerr.NotLeaderForPartition
	}
	return s.MemoryStore.LoadGroupMetadata(ctx, group)
}

// counts returns how many saves, tombstones and loads group had.
func (s *metaStore) counts(group string) (saves, deletes, loads int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	count := func(l []string) int {
		n := 0
		for _, g := range l {
			if g == group {
				n++
			}
		}
		return n
	}
	return count(s.saves), count(s.deletes), count(s.loads)
}

// newMetaHarness builds a harness over store (a fresh one if nil), as a
// restarted kproxy over the same upstream cluster would be.
func newMetaHarness(t *testing.T, store *metaStore, opts ...harnessConfig) (*harness, *metaStore) {
	t.Helper()
	if store == nil {
		store = newMetaStore()
	}
	h := newHarness(t, append([]harnessConfig{func(c *Config) { c.Store = store }}, opts...)...)
	h.store = store.MemoryStore
	return h, store
}

// storedRecord decodes the record the store holds for group.
func storedRecord(t *testing.T, s *MemoryStore, group string) (*kmsg.GroupMetadataValue, bool) {
	t.Helper()
	rec, ok, err := s.LoadGroupMetadata(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return nil, false
	}
	v, err := decodeGroupRecord(rec)
	if err != nil {
		t.Fatalf("stored record of %s: %v", group, err)
	}
	return v, true
}

func TestGroupMetadataPersistedAtTheRightMoments(t *testing.T) {
	h, store := newMetaHarness(t, nil)
	ids, gen := h.joinedGroup("g", 2)
	if _, ok := storedRecord(t, h.store, "g"); ok {
		t.Fatal("a group in CompletingRebalance was persisted")
	}

	// The leader's SyncGroup is persisted before anyone is answered.
	hold := make(chan struct{})
	store.mu.Lock()
	store.holdSave = hold
	store.mu.Unlock()
	follower := h.send(syncReq("g", ids[1], gen, nil))
	assign := map[string][]byte{ids[0]: assignment("t", 0, 2), ids[1]: assignment("t", 1)}
	leader := h.send(syncReq("g", ids[0], gen, assign))
	h.flushLoops()
	time.Sleep(20 * time.Millisecond)
	for _, c := range []*call{follower, leader} {
		select {
		case r := <-c.ch:
			t.Fatalf("sync answered before the write was durable: %+v", r)
		default:
		}
	}
	if snap, _ := h.e.Group("g"); snap.State != "CompletingRebalance" {
		t.Fatalf("state during the write: %s", snap.State)
	}
	// A heartbeat during the write is fine.
	if code := h.heartbeat("g", ids[1], gen); code != 0 {
		t.Fatalf("heartbeat during the write: %s", errName(code))
	}
	store.mu.Lock()
	store.holdSave = nil
	store.mu.Unlock()
	close(hold)
	for i, c := range []*call{leader, follower} {
		r := c.wait().(*kmsg.SyncGroupResponse)
		if r.ErrorCode != 0 || string(r.MemberAssignment) != string(assign[ids[i]]) {
			t.Fatalf("sync %d: %s %x", i, errName(r.ErrorCode), r.MemberAssignment)
		}
	}
	v, ok := storedRecord(t, h.store, "g")
	if !ok {
		t.Fatal("no record after the leader's sync")
	}
	if v.Generation != gen || v.ProtocolType != "consumer" || v.Protocol == nil || *v.Protocol != "range" ||
		v.Leader == nil || *v.Leader != ids[0] || len(v.Members) != 2 {
		t.Fatalf("record: %+v", v)
	}
	for i, m := range v.Members {
		if m.MemberID != ids[i] || string(m.Assignment) != string(assign[ids[i]]) ||
			m.SessionTimeoutMillis != 10000 || m.RebalanceTimeoutMillis != 30000 ||
			m.ClientID != "client" || m.ClientHost != "10.0.0.1" || string(m.Subscription) != string(protocol("range", "t").Metadata) {
			t.Fatalf("member %d: %+v", i, m)
		}
	}
	saves, _, _ := store.counts("g")

	// Steady state writes nothing.
	for range 3 {
		h.advance(5 * time.Second)
		for _, id := range ids {
			if code := h.heartbeat("g", id, gen); code != 0 {
				t.Fatalf("heartbeat: %s", errName(code))
			}
		}
		if code := commitCode(t, h.do(commitReq(8, "g", ids[0], gen, 0, 5))); code != 0 {
			t.Fatalf("commit: %s", errName(code))
		}
	}
	if s, _, _ := store.counts("g"); s != saves {
		t.Fatalf("steady state wrote %d records", s-saves)
	}

	// Everyone leaves: the join completes into Empty and is persisted.
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Version = 3
	lv.Group = "g"
	lv.Members = []kmsg.LeaveGroupRequestMember{{MemberID: ids[0]}, {MemberID: ids[1]}}
	h.do(lv)
	h.flush()
	v, ok = storedRecord(t, h.store, "g")
	if !ok || v.Generation != gen+1 || len(v.Members) != 0 || v.Protocol != nil || v.ProtocolType != "consumer" {
		t.Fatalf("record after everyone left: %+v %v", v, ok)
	}

	// DeleteGroups tombstones it.
	d := kmsg.NewPtrDeleteGroupsRequest()
	d.Groups = []string{"g"}
	if r := h.do(d).(*kmsg.DeleteGroupsResponse); r.Groups[0].ErrorCode != 0 {
		t.Fatalf("delete: %s", errName(r.Groups[0].ErrorCode))
	}
	h.flush()
	if _, ok := storedRecord(t, h.store, "g"); ok {
		t.Fatal("record survived DeleteGroups")
	}
	if _, dels, loads := store.counts("g"); dels != 1 || loads != 1 {
		t.Fatalf("tombstones %d, loads %d; want 1 and 1", dels, loads)
	}
}

func TestEmptyGroupExpiryTombstones(t *testing.T) {
	h, store := newMetaHarness(t, nil, func(c *Config) { c.EmptyGroupRetention = time.Hour })
	ids, _ := h.stableGroup("e", 1)
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Group, lv.MemberID = "e", ids[0]
	h.do(lv)
	h.flush()
	if v, ok := storedRecord(t, h.store, "e"); !ok || len(v.Members) != 0 {
		t.Fatalf("empty record: %+v %v", v, ok)
	}
	h.advance(time.Hour + time.Second)
	if _, ok := h.e.Group("e"); ok {
		t.Fatal("the empty group was not forgotten")
	}
	if _, ok := storedRecord(t, h.store, "e"); ok {
		t.Fatal("the forgotten group's record survived")
	}
	if _, dels, _ := store.counts("e"); dels != 1 {
		t.Fatalf("%d tombstones", dels)
	}
}

// TestRestartResumesWithoutRebalance is the point of it all: a second
// engine over the same store serves the old generation's heartbeats,
// syncs and commits as if nothing happened.
func TestRestartResumesWithoutRebalance(t *testing.T) {
	h1, store := newMetaHarness(t, nil, func(c *Config) { c.CheckCommitOwnership = true })
	ids, gen := h1.stableGroup("g", 3)
	h1.e.Close()

	h2, _ := newMetaHarness(t, store, func(c *Config) { c.CheckCommitOwnership = true })
	// A commit of the old generation is served (it waits for the load).
	if code := commitCode(t, h2.do(commitReq(8, "g", ids[1], gen, 1, 17))); code != 0 {
		t.Fatalf("commit after restart: %s", errName(code))
	}
	// Ownership survived: a partition the member was not assigned is
	// refused.
	if code := commitCode(t, h2.do(commitReq(8, "g", ids[1], gen, 2, 17))); code != errIllegalGeneration {
		t.Fatalf("commit of a partition not owned: %s", errName(code))
	}
	snap, ok := h2.e.Group("g")
	if !ok || snap.State != "Stable" || snap.Generation != gen || snap.Leader != ids[0] || len(snap.Members) != 3 {
		t.Fatalf("loaded group: %+v", snap)
	}
	for i, m := range snap.Members {
		if m.MemberID != ids[i] || string(m.Assignment) != string(assignment("t", int32(i))) || m.ClientID != "client" {
			t.Fatalf("loaded member %d: %+v", i, m)
		}
	}
	for _, id := range ids {
		if code := h2.heartbeat("g", id, gen); code != 0 {
			t.Fatalf("heartbeat after restart: %s", errName(code))
		}
	}
	// A member that re-syncs (lost response) gets its stored assignment.
	r := h2.do(syncReq("g", ids[2], gen, nil)).(*kmsg.SyncGroupResponse)
	if r.ErrorCode != 0 || string(r.MemberAssignment) != string(assignment("t", 2)) {
		t.Fatalf("sync after restart: %s %x", errName(r.ErrorCode), r.MemberAssignment)
	}
	// A follower rejoining with unchanged metadata gets the current
	// generation back, no rebalance.
	jresp := joinResp(t, h2.send(jr{group: "g", member: ids[1], version: 9}.req()), 0)
	if jresp.Generation != gen || jresp.LeaderID != ids[0] {
		t.Fatalf("follower rejoin: %+v", jresp)
	}
	// Describe shows the loaded group.
	dreq := kmsg.NewPtrDescribeGroupsRequest()
	dreq.Groups = []string{"g"}
	dg := h2.do(dreq).(*kmsg.DescribeGroupsResponse).Groups[0]
	if dg.State != "Stable" || dg.Protocol != "range" || len(dg.Members) != 3 || dg.Members[0].ClientHost != "10.0.0.1" {
		t.Fatalf("describe: %+v", dg)
	}

	// Two members keep heartbeating; the third never comes back and
	// expires after its session timeout (10s), which starts the only
	// rebalance.
	for range 4 {
		h2.advance(4 * time.Second)
		for _, id := range ids[:2] {
			code := h2.heartbeat("g", id, gen)
			if code == errRebalanceInProgress {
				continue
			}
			if code != 0 {
				t.Fatalf("heartbeat: %s", errName(code))
			}
		}
	}
	var evs []string
	for _, ev := range kinds(h2.takeEvents("g")) {
		if ev != "offsets_committed" {
			evs = append(evs, ev)
		}
	}
	want := []string{"group_loaded", "member_expired(session_timeout)", "rebalance_started(member_expired)"}
	if !slices.Equal(evs, want) {
		t.Fatalf("events after restart %v, want %v", evs, want)
	}
	snap, _ = h2.e.Group("g")
	if snap.State != "PreparingRebalance" || len(snap.Members) != 2 {
		t.Fatalf("after expiry: %+v", snap)
	}
	if h2.clock.pendingTimers() == 0 {
		t.Fatal("no timer armed for the loaded members")
	}
}

// TestListGroupsLoadsStoredGroups: right after a restart, ListGroups
// shows a group with offsets as what it was, not as a simple group.
func TestListGroupsLoadsStoredGroups(t *testing.T) {
	h1, store := newMetaHarness(t, nil)
	ids, gen := h1.stableGroup("g", 2)
	if code := commitCode(t, h1.do(commitReq(8, "g", ids[0], gen, 0, 1))); code != 0 {
		t.Fatalf("commit: %s", errName(code))
	}
	h1.do(commitReq(8, "simple", "", -1, 0, 1))
	h1.e.Close()

	h2, _ := newMetaHarness(t, store)
	l := kmsg.NewPtrListGroupsRequest()
	l.Version = 4
	resp := h2.do(l).(*kmsg.ListGroupsResponse)
	got := map[string]string{}
	for _, g := range resp.Groups {
		got[g.Group] = g.ProtocolType + "/" + g.GroupState
	}
	if resp.ErrorCode != 0 || len(got) != 2 || got["g"] != "consumer/Stable" || got["simple"] != "/Empty" {
		t.Fatalf("list after restart: %v", got)
	}
	if code := h2.heartbeat("g", ids[1], gen); code != 0 {
		t.Fatalf("heartbeat after the list loaded the group: %s", errName(code))
	}
}

func TestRestartStaticMember(t *testing.T) {
	h1, store := newMetaHarness(t, nil)
	ra := joinResp(t, h1.send(jr{group: "s", instance: "a", version: 9}.req()), 0)
	cb := h1.send(jr{group: "s", instance: "b", version: 9}.req()) // parks: a must rejoin
	cb.parked(h1)
	joinResp(t, h1.send(jr{group: "s", member: ra.MemberID, instance: "a", version: 9}.req()), 0)
	joinResp(t, cb, 0)
	snap, _ := h1.e.Group("s")
	if snap.State != "CompletingRebalance" || len(snap.Members) != 2 {
		t.Fatalf("static group: %+v", snap)
	}
	ids := []string{snap.Leader}
	for _, m := range snap.Members {
		if m.MemberID != snap.Leader {
			ids = append(ids, m.MemberID)
		}
	}
	gen := snap.Generation
	h1.syncAll("s", gen, ids, nil)
	h1.e.Close()

	h2, _ := newMetaHarness(t, store)
	// Instance "b" (a follower) restarts: it joins with no member id and
	// takes its place back without a rebalance, after the replacement is
	// persisted.
	iid := "b"
	var bOld string
	for _, m := range snap.Members {
		if m.InstanceID == "b" {
			bOld = m.MemberID
		}
	}
	r := joinResp(t, h2.send(jr{group: "s", instance: "b", version: 9}.req()), 0)
	if r.Generation != gen || r.MemberID == bOld || r.LeaderID != ids[0] {
		t.Fatalf("static rejoin after restart: %+v (old id %s)", r, bOld)
	}
	v, ok := storedRecord(t, h2.store, "s")
	if !ok || v.Generation != gen {
		t.Fatalf("record after replacement: %+v", v)
	}
	found := false
	for _, m := range v.Members {
		found = found || (m.MemberID == r.MemberID && m.InstanceID != nil && *m.InstanceID == "b")
	}
	if !found {
		t.Fatalf("the replacement was not persisted: %+v", v.Members)
	}
	sr := syncReq("s", r.MemberID, r.Generation, nil)
	sr.InstanceID = &iid
	s := h2.do(sr).(*kmsg.SyncGroupResponse)
	want := assignment("t", 1)
	if ids[1] != bOld {
		want = assignment("t", 0)
	}
	if s.ErrorCode != 0 || string(s.MemberAssignment) != string(want) {
		t.Fatalf("inherited assignment after restart: %s %x", errName(s.ErrorCode), s.MemberAssignment)
	}
	old := hb("s", bOld, gen)
	old.InstanceID = &iid
	if code := h2.do(old).(*kmsg.HeartbeatResponse).ErrorCode; code != errFencedInstanceID {
		t.Fatalf("old instance heartbeat: %s", errName(code))
	}
	evs := kinds(h2.takeEvents("s"))
	if !slices.Equal(evs, []string{"group_loaded", "member_fenced", "member_joined"}) {
		t.Fatalf("events %v", evs)
	}
	// And a third engine sees the new member id.
	h2.e.Close()
	h3, _ := newMetaHarness(t, store)
	h3.do(commitReq(8, "s", "", -1, 0, 1)) // loads the group
	nb := hb("s", r.MemberID, gen)
	nb.InstanceID = &iid
	if code := h3.do(nb).(*kmsg.HeartbeatResponse).ErrorCode; code != 0 {
		t.Fatalf("replaced member after a second restart: %s", errName(code))
	}
}

func TestRequestsWaitForTheLoad(t *testing.T) {
	h1, store := newMetaHarness(t, nil)
	ids, gen := h1.stableGroup("g", 2)
	h1.e.Close()
	_, _, loadsBefore := store.counts("g")

	hold := make(chan struct{})
	store.mu.Lock()
	store.holdLoad = hold
	store.mu.Unlock()
	h2, _ := newMetaHarness(t, store)
	commit := h2.send(commitReq(8, "g", ids[0], gen, 0, 3))
	sync := h2.send(syncReq("g", ids[1], gen, nil))
	dreq := kmsg.NewPtrDescribeGroupsRequest()
	dreq.Groups = []string{"g"}
	desc := h2.send(dreq)
	h2.flushLoops()
	// A heartbeat during the load is answered NONE at once.
	hbc := h2.send(hb("g", ids[1], gen))
	select {
	case r := <-hbc.ch:
		if code := r.(*kmsg.HeartbeatResponse).ErrorCode; code != 0 {
			t.Fatalf("heartbeat while loading: %s", errName(code))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a heartbeat waited for the load")
	}
	for _, c := range []*call{commit, sync, desc} {
		select {
		case r := <-c.ch:
			t.Fatalf("served before the load: %+v", r)
		default:
		}
	}
	close(hold)
	if code := commitCode(t, commit.wait()); code != 0 {
		t.Fatalf("parked commit: %s", errName(code))
	}
	if r := sync.wait().(*kmsg.SyncGroupResponse); r.ErrorCode != 0 || string(r.MemberAssignment) != string(assignment("t", 1)) {
		t.Fatalf("parked sync: %s", errName(r.ErrorCode))
	}
	if dg := desc.wait().(*kmsg.DescribeGroupsResponse).Groups[0]; dg.State != "Stable" {
		t.Fatalf("parked describe: %+v", dg)
	}
	if _, _, loads := store.counts("g"); loads != loadsBefore+1 {
		t.Fatalf("%d loads, want 1", loads)
	}

	// A failed load answers COORDINATOR_LOAD_IN_PROGRESS; the next
	// request loads again.
	store.mu.Lock()
	store.failLoads = 1
	store.mu.Unlock()
	h3, _ := newMetaHarness(t, store)
	if code := commitCode(t, h3.do(commitReq(8, "g", ids[0], gen, 0, 4))); code != errCoordinatorLoadInProgress {
		t.Fatalf("commit during a failed load: %s", errName(code))
	}
	if code := commitCode(t, h3.do(commitReq(8, "g", ids[0], gen, 0, 4))); code != 0 {
		t.Fatalf("commit after the retried load: %s", errName(code))
	}

	// Closing the engine answers requests parked on a load.
	hold2 := make(chan struct{})
	defer close(hold2)
	store.mu.Lock()
	store.holdLoad = hold2
	store.mu.Unlock()
	h4, _ := newMetaHarness(t, store)
	parked := h4.send(commitReq(8, "g", ids[0], gen, 0, 5))
	h4.flushLoops()
	h4.e.Close()
	if code := commitCode(t, parked.wait()); code != errCoordinatorNotAvailable {
		t.Fatalf("parked commit at close: %s", errName(code))
	}
}

func TestSyncWriteFailureRebalances(t *testing.T) {
	h, store := newMetaHarness(t, nil)
	ids, gen := h.joinedGroup("g", 2)
	store.mu.Lock()
	store.failSave = kerr.NotLeaderForPartition
	store.mu.Unlock()
	follower := h.send(syncReq("g", ids[1], gen, nil))
	leader := h.send(syncReq("g", ids[0], gen, map[string][]byte{ids[0]: assignment("t", 0), ids[1]: assignment("t", 1)}))
	for _, c := range []*call{follower, leader} {
		if code := c.wait().(*kmsg.SyncGroupResponse).ErrorCode; code != errNotCoordinator {
			t.Fatalf("sync with a failing write: %s", errName(code))
		}
	}
	snap, _ := h.e.Group("g")
	if snap.State != "PreparingRebalance" {
		t.Fatalf("after a failed write: %+v", snap)
	}
	if evs := kinds(h.takeEvents("g")); !slices.Contains(evs, "rebalance_started(store_error)") {
		t.Fatalf("events %v", evs)
	}
	if _, ok := storedRecord(t, h.store, "g"); ok {
		t.Fatal("a record was stored by a failing write")
	}
}

func TestSyncRecordTooLargeGoesOnUnpersisted(t *testing.T) {
	h, store := newMetaHarness(t, nil)
	ids, gen := h.joinedGroup("g", 2)
	store.mu.Lock()
	store.failSave = kerr.MessageTooLarge
	store.mu.Unlock()
	got := h.syncAll("g", gen, ids, nil)
	if string(got[ids[1]]) != string(assignment("t", 1)) {
		t.Fatalf("assignment %x", got[ids[1]])
	}
	if snap, _ := h.e.Group("g"); snap.State != "Stable" || snap.Generation != gen {
		t.Fatalf("after an unpersistable sync: %+v", snap)
	}
	if _, ok := storedRecord(t, h.store, "g"); ok {
		t.Fatal("a record was stored")
	}
}

// TestReloadedEmptyGroupKeepsItsRetention: a group Empty for 40 of its 60
// minutes of retention before the restart is forgotten 20 minutes after.
func TestReloadedEmptyGroupKeepsItsRetention(t *testing.T) {
	retention := func(c *Config) { c.EmptyGroupRetention = time.Hour }
	h1, store := newMetaHarness(t, nil, retention)
	ids, _ := h1.stableGroup("g", 1)
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Group, lv.MemberID = "g", ids[0]
	h1.do(lv)
	h1.advance(40 * time.Minute)
	h1.e.Close()

	h2, _ := newMetaHarness(t, store, retention)
	h2.clock.mu.Lock()
	h2.clock.now = h1.clock.Now()
	h2.clock.mu.Unlock()
	if code := commitCode(t, h2.do(commitReq(8, "g", "", -1, 0, 1))); code != 0 {
		t.Fatalf("simple commit to the empty group: %s", errName(code))
	}
	if snap, ok := h2.e.Group("g"); !ok || snap.State != "Empty" {
		t.Fatalf("reloaded: %+v %v", snap, ok)
	}
	h2.advance(19 * time.Minute)
	if _, ok := h2.e.Group("g"); !ok {
		t.Fatal("forgotten before its retention ran out")
	}
	h2.advance(2 * time.Minute)
	if _, ok := h2.e.Group("g"); ok {
		t.Fatal("still held after its retention ran out")
	}
	if _, ok := storedRecord(t, h2.store, "g"); ok {
		t.Fatal("record survived the expiry")
	}
}

// TestWithoutGroupMetadata: a store with its metadata side hidden keeps
// the old behaviour (a restart forgets the members) and still resolves
// topic ids.
func TestWithoutGroupMetadata(t *testing.T) {
	mem := NewMemoryStore()
	plain := WithoutGroupMetadata(mem)
	if _, ok := plain.(GroupMetadataStore); ok {
		t.Fatal("the metadata side is still visible")
	}
	if _, ok := plain.(TopicResolver); !ok {
		t.Fatal("the topic resolver was hidden too")
	}
	if _, ok := WithoutGroupMetadata(offsetsOnlyStore{mem}).(TopicResolver); ok {
		t.Fatal("a store without a resolver gained one")
	}
	h1 := newHarness(t, func(c *Config) { c.Store = plain })
	ids, gen := h1.stableGroup("g", 1)
	h1.e.Close()
	if _, ok := storedRecord(t, mem, "g"); ok {
		t.Fatal("a record was stored through the hidden side")
	}
	h2 := newHarness(t, func(c *Config) { c.Store = plain })
	if code := h2.heartbeat("g", ids[0], gen); code != errUnknownMemberID {
		t.Fatalf("heartbeat after a restart without metadata: %s", errName(code))
	}
}

func TestEmptyGroupReloadKeepsGeneration(t *testing.T) {
	h1, store := newMetaHarness(t, nil)
	ids, gen := h1.stableGroup("g", 1)
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Group, lv.MemberID = "g", ids[0]
	h1.do(lv)
	h1.e.Close()

	h2, _ := newMetaHarness(t, store)
	dreq := kmsg.NewPtrDescribeGroupsRequest()
	dreq.Groups = []string{"g"}
	if dg := h2.do(dreq).(*kmsg.DescribeGroupsResponse).Groups[0]; dg.State != "Empty" || dg.ProtocolType != "consumer" {
		t.Fatalf("reloaded empty group: %+v", dg)
	}
	// The member is gone: its heartbeat is refused, and a new join
	// continues the generation sequence.
	if code := h2.heartbeat("g", ids[0], gen); code != errUnknownMemberID {
		t.Fatalf("heartbeat of a member that left: %s", errName(code))
	}
	_, gen2 := h2.stableGroup("g", 1)
	if gen2 != gen+2 {
		t.Fatalf("generation after reload %d, want %d", gen2, gen+2)
	}
}

func TestUnreadableRecordIsDropped(t *testing.T) {
	store := newMetaStore()
	if err := store.MemoryStore.SaveGroupMetadata(context.Background(), "bad", []byte{0, 99, 1, 2}); err != nil {
		t.Fatal(err)
	}
	h, _ := newMetaHarness(t, store)
	h.do(commitReq(8, "bad", "", -1, 0, 1))
	if code := h.heartbeat("bad", "m", 1); code != errUnknownMemberID {
		t.Fatalf("heartbeat against an unreadable record: %s", errName(code))
	}
	// A fresh group forms normally.
	if _, gen := h.stableGroup("bad", 1); gen != 1 {
		t.Fatalf("generation %d", gen)
	}
}

func TestGroupRecordRoundTrip(t *testing.T) {
	h, _ := newMetaHarness(t, nil)
	ids, gen := h.stableGroup("g", 2)
	v, ok := storedRecord(t, h.store, "g")
	if !ok || v.Version != groupRecordVersion || v.Generation != gen || *v.Leader != ids[0] {
		t.Fatalf("record: %+v", v)
	}
	for _, bad := range [][]byte{nil, {0}, {0, 4, 0}, {0, 3, 0, 1, 'x', 0, 0, 0, 1, 0xff, 0xff}} {
		if _, err := decodeGroupRecord(bad); err == nil {
			t.Fatalf("decoded %x", bad)
		}
	}
	rec, _, _ := h.store.LoadGroupMetadata(context.Background(), "g")
	if _, err := decodeGroupRecord(rec[:len(rec)-3]); err == nil {
		t.Fatal("decoded a truncated record")
	}
}

// BenchmarkSettlePersistCost compares settling a group of 100 members
// (fake clock, MemoryStore) with and without group metadata persistence:
// the cost of the engine's side of persisting (record encoding, the
// store round trip off the loop).
func BenchmarkSettlePersistCost(b *testing.B) {
	for _, mode := range []string{"offsets-only", "persist"} {
		b.Run(mode, func(b *testing.B) {
			h := newHarness(b, func(c *Config) {
				c.Events = nil
				if mode == "offsets-only" {
					c.Store = WithoutGroupMetadata(c.Store)
				}
			})
			i := 0
			for b.Loop() {
				group := fmt.Sprintf("g%d", i)
				i++
				ids, gen := h.joinedGroup(group, 100)
				h.syncAll(group, gen, ids, nil)
			}
		})
	}
}

// TestLoadWithoutARequest: Engine.Load installs a stored group with its
// members and their session timers as a first request would, with no
// request for it (an owner claiming the group's partition); a group it
// does not own, or already holds, is left alone.
func TestLoadWithoutARequest(t *testing.T) {
	h1, store := newMetaHarness(t, nil)
	ids, gen := h1.stableGroup("g", 2)
	h1.stableGroup("not-owned", 1)
	h1.e.Close()

	h2, _ := newMetaHarness(t, store, func(c *Config) { c.Owns = func(g string) bool { return g != "not-owned" } })
	h2.e.Load([]string{"g", "not-owned"})
	deadline := time.Now().Add(5 * time.Second)
	snap, ok := h2.e.Group("g")
	for !ok && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		snap, ok = h2.e.Group("g")
	}
	if !ok || snap.State != "Stable" || snap.Generation != gen || len(snap.Members) != 2 {
		t.Fatalf("group after Load: %+v (held %v)", snap, ok)
	}
	if _, ok := h2.e.Group("not-owned"); ok {
		t.Fatal("Load installed a group the engine does not own")
	}
	if _, _, loads := store.counts("not-owned"); loads != 1 {
		t.Fatalf("loads of the group not owned: %d, want 1 (the first engine's)", loads)
	}
	h2.e.Load([]string{"g"})
	h2.flush()
	time.Sleep(50 * time.Millisecond) // a load started would have reached the store
	if _, _, loads := store.counts("g"); loads != 2 {
		t.Fatalf("loads of g: %d, want 2 (one per engine)", loads)
	}
	// The members' sessions run from the load: silent, they expire.
	h2.advance(11 * time.Second)
	snap, _ = h2.e.Group("g")
	if len(snap.Members) != 0 {
		t.Fatalf("members %v did not expire after a load with no request: %+v", ids, snap)
	}
}

func TestRecordHasMembers(t *testing.T) {
	classic := func(members int) []byte {
		v := kmsg.NewGroupMetadataValue()
		v.Version, v.ProtocolType, v.Generation = groupRecordVersion, "consumer", 3
		v.Protocol = kmsg.StringPtr("range")
		for i := range members {
			m := kmsg.NewGroupMetadataValueMember()
			m.MemberID, m.SessionTimeoutMillis = "m"+strconv.Itoa(i), 10_000
			v.Members = append(v.Members, m)
		}
		return v.AppendTo(nil)
	}
	consumer := func(doc string) []byte {
		return append(binary.BigEndian.AppendUint16(nil, consumerRecordMagic), doc...)
	}
	for _, c := range []struct {
		name string
		rec  []byte
		want bool
	}{
		{"classic with members", classic(2), true},
		{"classic empty", classic(0), false},
		{"consumer with members", consumer(`{"version":1,"epoch":4,"members":[{"id":"x"}]}`), true},
		{"consumer empty", consumer(`{"version":1,"epoch":4,"members":[]}`), false},
		{"share", binary.BigEndian.AppendUint16(nil, shareRecordMagic), false},
		{"unreadable", []byte{0, 3, 0xff}, false},
		{"consumer unreadable", consumer(`{`), false},
	} {
		if got := RecordHasMembers(c.rec); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
