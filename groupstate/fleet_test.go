package groupstate

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// These tests run two engines over one FencedMemoryStore, as two
// kproxies of a fleet over one cluster (docs/fleet.md): ownership of a
// groups-topic partition moves between them, gracefully (Owns false and
// Unload, then a claim) or not (a claim fences a paused owner).

// fetchedOffsets reads offsets of topic "t" through the engine
// (OffsetFetch v8), failing on any error.
func (h *harness) fetchedOffsets(group string, partitions ...int32) []int64 {
	h.t.Helper()
	r := kmsg.NewPtrOffsetFetchRequest()
	r.Version = 8
	rg := kmsg.NewOffsetFetchRequestGroup()
	rg.Group = group
	rg.Topics = []kmsg.OffsetFetchRequestGroupTopic{{Topic: "t", Partitions: partitions}}
	r.Groups = []kmsg.OffsetFetchRequestGroup{rg}
	resp := h.do(r).(*kmsg.OffsetFetchResponse)
	if len(resp.Groups) != 1 || resp.Groups[0].ErrorCode != errNone || len(resp.Groups[0].Topics) != 1 {
		h.t.Fatalf("offset fetch of %s: %+v", group, resp.Groups)
	}
	var out []int64
	for _, p := range resp.Groups[0].Topics[0].Partitions {
		if p.ErrorCode != errNone {
			h.t.Fatalf("offset fetch of %s/%d: %s", group, p.Partition, errName(p.ErrorCode))
		}
		out = append(out, p.Offset)
	}
	return out
}

// takeLoopEvents is takeEvents without waiting for group metadata
// operations (some are held).
func (h *harness) takeLoopEvents(group string) []Event {
	h.flushLoops()
	h.mu.Lock()
	defer h.mu.Unlock()
	var out, rest []Event
	for _, ev := range h.events {
		if ev.Group == group {
			out = append(out, ev)
		} else {
			rest = append(rest, ev)
		}
	}
	h.events = rest
	return out
}

// TestFleetOwnershipMoveKeepsGroupStable: a classic group stable under A
// moves to B; its members go on at B at the same generation, without a
// rebalance, and the offsets committed at A are there.
func TestFleetOwnershipMoveKeepsGroupStable(t *testing.T) {
	fs := newFencedMemoryStore(4)
	a := newFleetMember(t, fs, "A")
	b := newFleetMember(t, fs, "B")
	a.w.claimAll()
	baseTimers := a.clock.pendingTimers()
	ids, gen := a.stableGroup("g", 3)
	for i, id := range ids {
		if code := commitCode(t, a.do(commitReq(8, "g", id, gen, int32(i), int64(100+i)))); code != errNone {
			t.Fatalf("commit at A: %s", errName(code))
		}
	}
	a.takeEvents("g")

	p := fs.partition("g")
	a.release(p)
	b.w.claim(p)

	evs := a.takeEvents("g")
	if got := kinds(evs); !slices.Equal(got, []string{"group_unloaded(unloaded)"}) {
		t.Fatalf("A's events at the move: %v", got)
	}
	if evs[0].State != "Stable" || evs[0].Generation != gen || len(evs[0].Members) != 3 {
		t.Fatalf("unload event: %+v", evs[0])
	}
	if _, ok := a.e.Group("g"); ok {
		t.Fatal("A still holds the group after Unload")
	}
	if n := a.clock.pendingTimers(); n != baseTimers {
		t.Fatalf("A has %d timers armed after Unload, %d before the group", n, baseTimers)
	}
	if code := a.heartbeat("g", ids[0], gen); code != errNotCoordinator {
		t.Fatalf("heartbeat at A after the move: %s", errName(code))
	}

	// The members' next heartbeats reach B: NONE at the same generation
	// (the first one is answered while the group loads).
	for range 2 {
		for _, id := range ids {
			if code := b.heartbeat("g", id, gen); code != errNone {
				t.Fatalf("heartbeat of %s at B: %s", id, errName(code))
			}
		}
		b.flush()
	}
	snap, ok := b.e.Group("g")
	if !ok || snap.State != "Stable" || snap.Generation != gen || snap.Leader != ids[0] || len(snap.Members) != 3 {
		t.Fatalf("B's group: %+v", snap)
	}
	for i, m := range snap.Members {
		if m.MemberID != ids[i] || !bytes.Equal(m.Assignment, assignment("t", int32(i))) {
			t.Fatalf("B's member %d: %+v", i, m)
		}
	}
	if got := kinds(b.takeEvents("g")); !slices.Equal(got, []string{"group_loaded"}) {
		t.Fatalf("B's events: %v (a move must not rebalance)", got)
	}
	if got := b.fetchedOffsets("g", 0, 1, 2); !slices.Equal(got, []int64{100, 101, 102}) {
		t.Fatalf("offsets at B: %v", got)
	}
	// A follower that missed its SyncGroup answer gets its assignment
	// from B, and commits at B are accepted at that generation.
	if r := b.do(syncReq("g", ids[1], gen, nil)).(*kmsg.SyncGroupResponse); r.ErrorCode != errNone || !bytes.Equal(r.MemberAssignment, assignment("t", 1)) {
		t.Fatalf("sync at B: %s %x", errName(r.ErrorCode), r.MemberAssignment)
	}
	if code := commitCode(t, b.do(commitReq(8, "g", ids[1], gen, 1, 201))); code != errNone {
		t.Fatalf("commit at B: %s", errName(code))
	}
	if got := b.storedOffset("g", 1); got != 201 {
		t.Fatalf("stored offset after B's commit: %d", got)
	}
}

// TestFleetZombieOwnerWritesNothing: A is paused (neither told nor
// unloaded) while B claims its partitions; A's commit and leader
// SyncGroup then fail NOT_COORDINATOR and nothing of A's reaches the
// store.
func TestFleetZombieOwnerWritesNothing(t *testing.T) {
	fs := newFencedMemoryStore(4)
	a := newFleetMember(t, fs, "A")
	b := newFleetMember(t, fs, "B")
	a.w.claimAll()
	ids, gen := a.stableGroup("g", 2)
	if code := commitCode(t, a.do(commitReq(8, "g", ids[0], gen, 0, 10))); code != errNone {
		t.Fatalf("commit at A: %s", errName(code))
	}
	hIDs, hGen := a.joinedGroup("h", 2) // CompletingRebalance
	a.takeEvents("h")
	before := fs.writesBy("A")

	b.w.claimAll()

	if code := commitCode(t, a.do(commitReq(8, "g", ids[0], gen, 0, 20))); code != errNotCoordinator {
		t.Fatalf("zombie commit: %s", errName(code))
	}
	follower := a.send(syncReq("h", hIDs[1], hGen, nil))
	leader := a.send(syncReq("h", hIDs[0], hGen, map[string][]byte{hIDs[0]: assignment("t", 0), hIDs[1]: assignment("t", 1)}))
	for i, c := range []*call{leader, follower} {
		if r := c.wait().(*kmsg.SyncGroupResponse); r.ErrorCode != errNotCoordinator || len(r.MemberAssignment) != 0 {
			t.Fatalf("zombie sync %d: %s %x", i, errName(r.ErrorCode), r.MemberAssignment)
		}
	}
	a.flush()
	if n := fs.writesBy("A"); n != before {
		t.Fatalf("the zombie wrote %d times after it was fenced", n-before)
	}
	if got := a.storedOffset("g", 0); got != 10 {
		t.Fatalf("stored offset after the zombie's commit: %d", got)
	}
	if _, ok := storedRecord(t, fs.MemoryStore, "h"); ok {
		t.Fatal("the zombie's assignments of h were stored")
	}
	if got := kinds(a.takeEvents("h")); !slices.Equal(got, []string{"group_unloaded(store_error)"}) {
		t.Fatalf("zombie's events for h: %v", got)
	}
	if _, ok := a.e.Group("h"); ok {
		t.Fatal("the zombie still holds h after its write was fenced")
	}

	// B serves g from the store: Stable at the stored generation, the
	// offset committed before the fence.
	for range 2 {
		for _, id := range ids {
			if code := b.heartbeat("g", id, gen); code != errNone {
				t.Fatalf("heartbeat at B: %s", errName(code))
			}
		}
		b.flush()
	}
	if snap, _ := b.e.Group("g"); snap.State != "Stable" || snap.Generation != gen {
		t.Fatalf("B's group: %+v", snap)
	}
	if got := b.fetchedOffsets("g", 0); !slices.Equal(got, []int64{10}) {
		t.Fatalf("offset at B: %v", got)
	}
}

// notAnswered asserts that c has no answer after the loops ran and a
// short real wait (store calls run on their own goroutines).
func notAnswered(t *testing.T, h *harness, c *call, what string) {
	t.Helper()
	h.flushLoops()
	time.Sleep(20 * time.Millisecond)
	h.flushLoops()
	select {
	case r := <-c.ch:
		t.Fatalf("%s answered before its write returned: %+v", what, r)
	default:
	}
}

// TestFleetConsumerHeartbeatAnsweredAfterDurableWrite: a KIP-848
// heartbeat that changes the assignment is answered only once its write
// returned; a write that fails (the writer was fenced) answers
// NOT_COORDINATOR without an assignment, and the new owner serves the
// group from what was durable.
func TestFleetConsumerHeartbeatAnsweredAfterDurableWrite(t *testing.T) {
	fs := newFencedMemoryStore(4)
	fs.SetTopic("t", 4)
	a := newFleetMember(t, fs, "A")
	b := newFleetMember(t, fs, "B")
	ca, cb := &consumerHarness{a.harness}, &consumerHarness{b.harness}
	ca.refresh()
	cb.refresh()
	a.w.claimAll()
	m1 := ca.join("g", "m1", "t")
	ca.settle("g", m1)
	if m1.owned.size() != 4 {
		t.Fatalf("m1 owns %v", m1.owned)
	}
	a.flush()

	// m2's join moves the group epoch and m2's assignment: no answer
	// while its write is held.
	hold := make(chan struct{})
	a.w.setHold(true, hold)
	j2 := a.send(consumerJoin("g", "m2", "t"))
	notAnswered(t, a.harness, j2, "m2's join")
	// m1's heartbeat would now revoke: it waits for a write too.
	b1 := a.send(consumerBeat("g", "m1", m1.epoch, m1.owned))
	notAnswered(t, a.harness, b1, "m1's heartbeat")
	a.w.setHold(true, nil)
	close(hold)
	r2 := j2.wait().(*kmsg.ConsumerGroupHeartbeatResponse)
	if r2.ErrorCode != errNone || r2.MemberEpoch != 2 {
		t.Fatalf("m2's join after the write: %s epoch %d", errName(r2.ErrorCode), r2.MemberEpoch)
	}
	m2 := &client{id: "m2"}
	m2.applyResp(r2)
	r1 := b1.wait().(*kmsg.ConsumerGroupHeartbeatResponse)
	if r1.ErrorCode != errNone || r1.Assignment == nil {
		t.Fatalf("m1's heartbeat after the write: %s %+v", errName(r1.ErrorCode), r1.Assignment)
	}
	m1.applyResp(r1)
	if m1.owned.size() != 2 {
		t.Fatalf("m1 owns %v after revoking", m1.owned)
	}
	a.flush()
	durable, _, _ := fs.LoadGroupMetadata(context.Background(), "g")

	// m1 reports its revocation, which hands m2 its partitions; B claims
	// the partition while that write is held: the write fails and m2 is
	// not told of partitions the store never recorded.
	hold = make(chan struct{})
	a.w.setHold(true, hold)
	c1 := a.send(consumerBeat("g", "m1", m1.epoch, m1.owned))
	notAnswered(t, a.harness, c1, "m1's revocation")
	b.w.claimAll()
	a.w.setHold(true, nil)
	close(hold)
	r := c1.wait().(*kmsg.ConsumerGroupHeartbeatResponse)
	if r.ErrorCode != errNotCoordinator || r.Assignment != nil || r.MemberEpoch != 0 {
		t.Fatalf("heartbeat whose write was fenced: %s epoch %d assignment %+v", errName(r.ErrorCode), r.MemberEpoch, r.Assignment)
	}
	a.flush()
	if got := kinds(a.takeEvents("g")); !slices.Contains(got, "group_unloaded(store_error)") {
		t.Fatalf("A's events: %v", got)
	}
	if _, ok := a.e.Group("g"); ok {
		t.Fatal("A still holds the group after its write was fenced")
	}
	if rec, _, _ := fs.LoadGroupMetadata(context.Background(), "g"); !bytes.Equal(rec, durable) {
		t.Fatal("the fenced write changed the stored record")
	}

	// B serves the group from the store; m1 and m2 settle there.
	b.takeEvents("g")
	cb.settle("g", m1, m2)
	if m1.owned.size() != 2 || m2.owned.size() != 2 {
		t.Fatalf("after settling at B: m1 %v m2 %v", m1.owned, m2.owned)
	}
	for _, ev := range b.takeEvents("g") {
		if ev.Kind == EventMemberExpired || ev.Kind == EventMemberLeft {
			t.Fatalf("B lost a member: %+v", ev)
		}
	}
}

// TestConsumerHeartbeatFailedWriteDropsGroup: a heartbeat whose write
// fails gets the store error's code, and the group reloads from the
// store at the next request, as durable as it was.
func TestConsumerHeartbeatFailedWriteDropsGroup(t *testing.T) {
	h, store := newMetaHarness(t, nil)
	store.SetTopic("t", 2)
	c := &consumerHarness{h}
	c.refresh()
	m1 := c.join("g", "m1", "t")
	c.settle("g", m1)
	c.flush()
	c.takeEvents("g")
	store.mu.Lock()
	store.failSave = errors.New("disk on fire")
	store.mu.Unlock()
	resp := c.do(consumerJoin("g", "m2", "t")).(*kmsg.ConsumerGroupHeartbeatResponse)
	if resp.ErrorCode != errCoordinatorNotAvailable || resp.Assignment != nil {
		t.Fatalf("join whose write failed: %s %+v", errName(resp.ErrorCode), resp.Assignment)
	}
	c.flush()
	if got := kinds(c.takeEvents("g")); !slices.Contains(got, "group_unloaded(store_error)") {
		t.Fatalf("events: %v", got)
	}
	store.mu.Lock()
	store.failSave = nil
	store.mu.Unlock()
	// The group comes back from the store: m1 at its epoch, no m2.
	c.beat("g", m1)
	c.flush()
	d := c.describe("g")
	if d.Epoch != 1 || len(d.Members) != 1 || d.Members[0].MemberID != "m1" {
		t.Fatalf("reloaded group: %+v", d)
	}
	if got := kinds(c.takeEvents("g")); !slices.Contains(got, "group_loaded") {
		t.Fatalf("events after the reload: %v", got)
	}
	m2 := c.join("g", "m2", "t")
	c.settle("g", m1, m2)
}

// TestUnloadAnswersParkedRequestsAndWritesNothing: Unload answers a
// parked JoinGroup, a queued commit and a request waiting for its load
// with NOT_COORDINATOR, lets the store call in flight answer with its
// result, and writes nothing afterwards however long the clock runs; a
// later claim loads the group as a restart does.
func TestUnloadAnswersParkedRequestsAndWritesNothing(t *testing.T) {
	fs := newFencedMemoryStore(4)
	a := newFleetMember(t, fs, "A")
	a.w.claimAll()
	baseTimers := a.clock.pendingTimers()
	ids, gen := a.stableGroup("g", 2)
	joining, _ := a.joinNew(jr{group: "g"}) // a rebalance; its JoinGroup parks
	joining.parked(a.harness)
	if snap, _ := a.e.Group("g"); snap.State != "PreparingRebalance" {
		t.Fatalf("state before the unload: %s", snap.State)
	}
	// A simple group's commit in flight (held) and one queued behind it.
	if code := commitCode(t, a.do(commitReq(8, "s", "", -1, 0, 1))); code != errNone {
		t.Fatalf("first commit of s: %s", errName(code))
	}
	holdCommit := make(chan struct{})
	a.w.setHold(false, holdCommit)
	inFlight := a.send(commitReq(8, "s", "", -1, 0, 2))
	queued := a.send(commitReq(8, "s", "", -1, 0, 3))
	notAnswered(t, a.harness, inFlight, "held commit")
	a.takeEvents("g")
	a.takeEvents("s")
	// A request parked on its group's load (l's record: a copy of g's).
	rec, _, _ := fs.LoadGroupMetadata(context.Background(), "g")
	if err := fs.MemoryStore.SaveGroupMetadata(context.Background(), "l", rec); err != nil {
		t.Fatal(err)
	}
	holdLoad := make(chan struct{})
	a.w.mu.Lock()
	a.w.holdLoad = holdLoad
	a.w.mu.Unlock()
	loading := a.send(commitReq(8, "l", "", -1, 0, 1))
	notAnswered(t, a.harness, loading, "commit waiting for its load")
	writes := fs.writesBy("A")

	unloaded := make(chan struct{})
	go func() {
		defer close(unloaded)
		a.releaseAll()
	}()

	// Parked requests are answered at once; Unload itself waits for the
	// store calls in flight (the held commit and load).
	if r := joinResp(t, joining, errNotCoordinator); r.MemberID == "" {
		t.Fatalf("parked join answered without its member id")
	}
	if code := commitCode(t, queued.wait()); code != errNotCoordinator {
		t.Fatalf("queued commit at unload: %s", errName(code))
	}
	if code := commitCode(t, loading.wait()); code != errNotCoordinator {
		t.Fatalf("commit waiting for its load at unload: %s", errName(code))
	}
	evs := a.takeLoopEvents("g")
	if got := kinds(evs); !slices.Equal(got, []string{"group_unloaded(unloaded)"}) || evs[0].State != "PreparingRebalance" {
		t.Fatalf("events at unload: %v %+v", got, evs)
	}
	time.Sleep(20 * time.Millisecond)
	select {
	case <-unloaded:
		t.Fatal("Unload returned while a store call of its groups was running")
	default:
	}
	// The store call in flight answers with the store's result and
	// touches no state.
	a.w.setHold(false, nil)
	close(holdCommit)
	if code := commitCode(t, inFlight.wait()); code != errNone {
		t.Fatalf("commit in flight at unload: %s", errName(code))
	}
	// l's partition is owned again before the load that was running at
	// the unload completes (as when a claim follows Unload before the
	// load's completion reached the loop): what it read is not
	// installed.
	a.w.claim(fs.partition("l"))
	a.w.mu.Lock()
	a.w.holdLoad = nil
	a.w.mu.Unlock()
	close(holdLoad)
	select {
	case <-unloaded:
	case <-time.After(5 * time.Second):
		t.Fatal("Unload did not return after the store calls in flight did")
	}
	a.flush()
	if got := kinds(a.takeEvents("s")); len(got) != 0 {
		t.Fatalf("events of s after the unload: %v", got)
	}
	if _, ok := a.e.Group("l"); ok {
		t.Fatal("a load that completed after the unload installed its group")
	}
	if groups := a.e.Groups(); len(groups) != 0 {
		t.Fatalf("groups held after the unload: %+v", groups)
	}
	if n := a.clock.pendingTimers(); n != baseTimers {
		t.Fatalf("%d timers armed after the unload, %d before", n, baseTimers)
	}
	a.advance(time.Hour)
	if n := fs.writesBy("A"); n != writes+1 {
		t.Fatalf("%d writes after the unload, want only the one in flight", n-writes)
	}
	if got := kinds(a.takeEvents("g")); len(got) != 0 {
		t.Fatalf("events of g after the unload: %v", got)
	}
	if got := a.storedOffset("s", 0); got != 2 {
		t.Fatalf("offset of s: %d", got)
	}

	// Claimed again: the group loads from the store, Stable at its stored
	// generation with the members that were durable.
	a.w.claimAll()
	for range 2 {
		for _, id := range ids {
			if code := a.heartbeat("g", id, gen); code != errNone {
				t.Fatalf("heartbeat after the claim: %s", errName(code))
			}
		}
		a.flush()
	}
	snap, _ := a.e.Group("g")
	if snap.State != "Stable" || snap.Generation != gen || len(snap.Members) != 2 {
		t.Fatalf("group after the claim: %+v", snap)
	}
	if got := kinds(a.takeEvents("g")); !slices.Equal(got, []string{"group_loaded"}) {
		t.Fatalf("events after the claim: %v", got)
	}
}

// TestNotOwnedGroupsAnswerNotCoordinator: a group Config.Owns refuses
// gets NOT_COORDINATOR from every API, in its slot of a multi-group
// request, is left out of ListGroups, and is never loaded or created.
func TestNotOwnedGroupsAnswerNotCoordinator(t *testing.T) {
	owns := func(g string) bool { return g != "" && !strings.HasPrefix(g, "x") }
	h, store := newMetaHarness(t, nil, func(c *Config) { c.Owns = owns })
	store.SetTopic("t", 2)
	c := &consumerHarness{h}
	c.refresh()
	// o: an owned simple group; xs: a group with offsets in the store
	// that this engine does not own.
	if code := commitCode(t, h.do(commitReq(8, "o", "", -1, 0, 1))); code != errNone {
		t.Fatalf("commit of o: %s", errName(code))
	}
	if _, err := store.MemoryStore.CommitOffsets(context.Background(), "xs", []kmsg.OffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1}}}}); err != nil {
		t.Fatal(err)
	}
	nc := []int16{errNotCoordinator}
	cases := map[int16]func() []int16{
		8: func() []int16 { return []int16{commitCode(t, h.do(commitReq(8, "x", "", -1, 0, 1)))} },
		9: func() []int16 {
			r := kmsg.NewPtrOffsetFetchRequest()
			r.Version = 5
			r.Group = "x"
			r.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "t", Partitions: []int32{0}}}
			top := h.do(r).(*kmsg.OffsetFetchResponse).ErrorCode
			r8 := kmsg.NewPtrOffsetFetchRequest()
			r8.Version = 8
			r8.Groups = []kmsg.OffsetFetchRequestGroup{{Group: "o"}, {Group: "x"}}
			resp := h.do(r8).(*kmsg.OffsetFetchResponse)
			return []int16{top, resp.Groups[0].ErrorCode, resp.Groups[1].ErrorCode}
		},
		11: func() []int16 {
			return []int16{h.do(jr{group: "x", version: 9}.req()).(*kmsg.JoinGroupResponse).ErrorCode}
		},
		12: func() []int16 { return []int16{h.heartbeat("x", "m", 1)} },
		13: func() []int16 {
			r := kmsg.NewPtrLeaveGroupRequest()
			r.Version = 3
			r.Group = "x"
			r.Members = []kmsg.LeaveGroupRequestMember{{MemberID: "m"}}
			return []int16{h.do(r).(*kmsg.LeaveGroupResponse).ErrorCode}
		},
		14: func() []int16 { return []int16{h.do(syncReq("x", "m", 1, nil)).(*kmsg.SyncGroupResponse).ErrorCode} },
		15: func() []int16 {
			r := kmsg.NewPtrDescribeGroupsRequest()
			r.Version = 5
			r.Groups = []string{"o", "x"}
			resp := h.do(r).(*kmsg.DescribeGroupsResponse)
			return []int16{resp.Groups[0].ErrorCode, resp.Groups[1].ErrorCode}
		},
		16: func() []int16 {
			r := kmsg.NewPtrListGroupsRequest()
			r.Version = 5
			resp := h.do(r).(*kmsg.ListGroupsResponse)
			var names []string
			for _, g := range resp.Groups {
				names = append(names, g.Group)
			}
			if !slices.Equal(names, []string{"o"}) {
				t.Errorf("ListGroups lists %v, want only the owned group o", names)
			}
			return []int16{resp.ErrorCode}
		},
		28: func() []int16 {
			r := kmsg.NewPtrTxnOffsetCommitRequest()
			r.Version = 3
			r.Group, r.TransactionalID, r.Generation = "x", "txn", -1
			r.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1}}}}
			return []int16{h.do(r).(*kmsg.TxnOffsetCommitResponse).Topics[0].Partitions[0].ErrorCode}
		},
		42: func() []int16 {
			r := kmsg.NewPtrDeleteGroupsRequest()
			r.Groups = []string{"x", "nobody"}
			resp := h.do(r).(*kmsg.DeleteGroupsResponse)
			return []int16{resp.Groups[1].ErrorCode, resp.Groups[0].ErrorCode}
		},
		47: func() []int16 {
			r := kmsg.NewPtrOffsetDeleteRequest()
			r.Group = "x"
			r.Topics = []kmsg.OffsetDeleteRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetDeleteRequestTopicPartition{{Partition: 0}}}}
			return []int16{h.do(r).(*kmsg.OffsetDeleteResponse).ErrorCode}
		},
		68: func() []int16 {
			return []int16{h.do(consumerJoin("x", "m", "t")).(*kmsg.ConsumerGroupHeartbeatResponse).ErrorCode}
		},
		69: func() []int16 {
			r := kmsg.NewPtrConsumerGroupDescribeRequest()
			r.Groups = []string{"o", "x"}
			resp := h.do(r).(*kmsg.ConsumerGroupDescribeResponse)
			return []int16{resp.Groups[0].ErrorCode, resp.Groups[1].ErrorCode}
		},
	}
	want := map[int16][]int16{
		9:  {errNotCoordinator, errNone, errNotCoordinator},
		15: {errNone, errNotCoordinator},
		16: {errNone},
		42: {errGroupIDNotFound, errNotCoordinator},
		69: {errGroupIDNotFound, errNotCoordinator},
	}
	for _, key := range codec.GroupKeys() {
		run, ok := cases[key]
		if !ok {
			t.Errorf("API key %d has no ownership case", key)
			continue
		}
		w, ok := want[key]
		if !ok {
			w = nc
		}
		if got := run(); !slices.Equal(got, w) {
			t.Errorf("key %d: %v, want %v", key, got, w)
		}
	}
	// An empty group id is invalid before it is anyone's.
	if code := h.do(jr{group: "", version: 9}.req()).(*kmsg.JoinGroupResponse).ErrorCode; code != errInvalidGroupID {
		t.Errorf("join of group \"\": %s", errName(code))
	}
	h.flush()
	for _, g := range []string{"x", "xs"} {
		if _, _, loads := store.counts(g); loads != 0 {
			t.Errorf("group %s, not owned, was loaded %d times", g, loads)
		}
	}
	for _, g := range h.e.Groups() {
		if !owns(g.Group) {
			t.Errorf("the engine holds group %s, which it does not own", g.Group)
		}
	}
	if got, _ := store.MemoryStore.FetchOffsets(context.Background(), "x", nil, false); len(got) != 0 {
		t.Errorf("offsets stored for x: %+v", got)
	}
}

// TestFleetStaticReplacementAnsweredAfterDurableWrite: a static member's
// replacement in Stable is answered only once the record naming the new
// member id is written; if the write is fenced the JoinGroup gets
// NOT_COORDINATOR, A drops the group and the new owner serves the old,
// durable member id.
func TestFleetStaticReplacementAnsweredAfterDurableWrite(t *testing.T) {
	fs := newFencedMemoryStore(4)
	a := newFleetMember(t, fs, "A")
	b := newFleetMember(t, fs, "B")
	a.w.claimAll()
	ra := joinResp(t, a.send(jr{group: "s", instance: "a", version: 9}.req()), 0)
	cb := a.send(jr{group: "s", instance: "b", version: 9}.req()) // parks: a must rejoin
	cb.parked(a.harness)
	joinResp(t, a.send(jr{group: "s", member: ra.MemberID, instance: "a", version: 9}.req()), 0)
	joinResp(t, cb, 0)
	snap, _ := a.e.Group("s")
	ids := []string{snap.Leader}
	var bOld string
	for _, m := range snap.Members {
		if m.MemberID != snap.Leader {
			ids = append(ids, m.MemberID)
		}
		if m.InstanceID == "b" {
			bOld = m.MemberID
		}
	}
	gen := snap.Generation
	a.syncAll("s", gen, ids, nil)
	a.flush()

	// Instance b restarts: its JoinGroup waits for the write.
	hold := make(chan struct{})
	a.w.setHold(true, hold)
	c := a.send(jr{group: "s", instance: "b", version: 9}.req())
	notAnswered(t, a.harness, c, "the static replacement")
	a.w.setHold(true, nil)
	close(hold)
	r := joinResp(t, c, errNone)
	if r.Generation != gen || r.MemberID == bOld {
		t.Fatalf("replacement: %+v (old id %s)", r, bOld)
	}
	bNew := r.MemberID
	a.flush()

	// It restarts again, and B claims the partition while that write is
	// held: the write is fenced.
	hold = make(chan struct{})
	a.w.setHold(true, hold)
	c = a.send(jr{group: "s", instance: "b", version: 9}.req())
	notAnswered(t, a.harness, c, "the second static replacement")
	b.w.claimAll()
	a.w.setHold(true, nil)
	close(hold)
	if r := joinResp(t, c, errNotCoordinator); r.MemberID != "" || r.LeaderID != "" {
		t.Fatalf("fenced replacement: %+v", r)
	}
	a.flush()
	if _, ok := a.e.Group("s"); ok {
		t.Fatal("A still holds the group after its write was fenced")
	}
	v, ok := storedRecord(t, fs.MemoryStore, "s")
	if !ok {
		t.Fatal("no record of s")
	}
	var stored []string
	for _, m := range v.Members {
		stored = append(stored, m.MemberID)
	}
	if !slices.Contains(stored, bNew) || len(stored) != 2 {
		t.Fatalf("stored members %v, want the first replacement's %s", stored, bNew)
	}
	// At B the durable member id goes on.
	iid := "b"
	for range 2 {
		h := hb("s", bNew, gen)
		h.InstanceID = &iid
		if code := b.do(h).(*kmsg.HeartbeatResponse).ErrorCode; code != errNone {
			t.Fatalf("heartbeat of %s at B: %s", bNew, errName(code))
		}
		b.flush()
	}
}
