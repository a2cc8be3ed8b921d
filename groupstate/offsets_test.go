package groupstate

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestOffsetCommitValidation(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 2)
	cIDs, cGen := h.joinedGroup("c", 1) // CompletingRebalance
	pIDs, pGen := h.stableGroup("p", 2)
	h.send(jr{group: "p", member: pIDs[0], version: 9}.req()) // PreparingRebalance
	h.stableGroup("e", 1)
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Version = 0
	lv.Group = "e"
	snapE, _ := h.e.Group("e")
	lv.MemberID = snapE.Members[0].MemberID
	h.do(lv) // group "e" is Empty now
	iid := "x"
	fenced := commitReq(8, "g", ids[0], gen, 0, 1)
	fenced.InstanceID = &iid

	for _, tc := range []struct {
		name string
		req  *kmsg.OffsetCommitRequest
		want int16
	}{
		{"member of stable group", commitReq(8, "g", ids[1], gen, 0, 10), 0},
		{"v0 simple commit to missing group", commitReq(0, "simple0", "", 5, 0, 1), 0},
		{"simple commit to missing group", commitReq(8, "simple", "", -1, 0, 1), 0},
		{"missing group with generation v8", commitReq(8, "missing", "m", 1, 0, 1), errIllegalGeneration},
		{"missing group with generation v9", commitReq(9, "missing", "m", 1, 0, 1), errGroupIDNotFound},
		{"simple commit to stable group", commitReq(8, "g", "", -1, 0, 1), errUnknownMemberID},
		{"unknown member", commitReq(8, "g", "who", gen, 0, 1), errUnknownMemberID},
		{"wrong generation", commitReq(8, "g", ids[0], gen+1, 0, 1), errIllegalGeneration},
		{"unknown instance", fenced, errUnknownMemberID},
		{"completing rebalance", commitReq(8, "c", cIDs[0], cGen, 0, 1), errRebalanceInProgress},
		{"preparing rebalance uses the current generation", commitReq(8, "p", pIDs[1], pGen, 0, 1), 0},
		{"simple commit to empty group", commitReq(8, "e", "", -1, 0, 7), 0},
		{"member id on empty group", commitReq(8, "e", "gone", 1, 0, 7), errUnknownMemberID},
	} {
		if code := commitCode(t, h.do(tc.req)); code != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, errName(code), errName(tc.want))
		}
	}
	if got := h.storedOffset("g", 0); got != 10 {
		t.Fatalf("stored offset %d, want 10", got)
	}
	if got := h.storedOffset("missing", 0); got != -1 {
		t.Fatalf("rejected commit stored: %d", got)
	}
	// Metadata over 4096 bytes fails only its own partition.
	r := commitReq(8, "g", ids[0], gen, 0, 11)
	big, small := strings.Repeat("x", 4097), "ok"
	r.Topics[0].Partitions[0].Metadata = &big
	p := kmsg.NewOffsetCommitRequestTopicPartition()
	p.Partition, p.Offset, p.Metadata = 1, 12, &small
	r.Topics[0].Partitions = append(r.Topics[0].Partitions, p)
	resp := h.do(r).(*kmsg.OffsetCommitResponse)
	if c0, c1 := resp.Topics[0].Partitions[0].ErrorCode, resp.Topics[0].Partitions[1].ErrorCode; c0 != errOffsetMetadataTooLarge || c1 != 0 {
		t.Fatalf("metadata size: %s / %s", errName(c0), errName(c1))
	}
	if h.storedOffset("g", 0) != 10 || h.storedOffset("g", 1) != 12 {
		t.Fatal("metadata-size check stored the wrong partitions")
	}
	evs := h.takeEvents("g")
	n := 0
	for _, ev := range evs {
		if ev.Kind == EventOffsetsCommitted {
			n += ev.Offsets
		}
	}
	if n != 2 {
		t.Fatalf("offsets_committed events cover %d partitions, want 2", n)
	}
}

func TestCommitRearmsSession(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 1)
	for i := 0; i < 4; i++ {
		h.advance(9 * time.Second)
		if code := commitCode(t, h.do(commitReq(8, "g", ids[0], gen, 0, int64(i)))); code != 0 {
			t.Fatalf("commit %d: %s", i, errName(code))
		}
	}
	if snap, _ := h.e.Group("g"); len(snap.Members) != 1 {
		t.Fatal("member expired although it committed within its session")
	}
}

func TestCommitOwnership(t *testing.T) {
	for _, check := range []bool{false, true} {
		h := newHarness(t, func(c *Config) { c.CheckCommitOwnership = check })
		ids, gen := h.joinedGroup("g", 2)
		h.syncAll("g", gen, ids, map[string][]byte{ids[0]: assignment("t", 0, 1), ids[1]: assignment("t", 2)})
		req := commitReq(8, "g", ids[0], gen, 0, 5)
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Partition, p.Offset = 2, 5
		req.Topics[0].Partitions = append(req.Topics[0].Partitions, p)
		resp := h.do(req).(*kmsg.OffsetCommitResponse)
		owned, foreign := resp.Topics[0].Partitions[0].ErrorCode, resp.Topics[0].Partitions[1].ErrorCode
		if owned != 0 {
			t.Fatalf("check=%v owned partition: %s", check, errName(owned))
		}
		want := int16(0)
		if check {
			want = errIllegalGeneration
		}
		if foreign != want {
			t.Fatalf("check=%v foreign partition: %s, want %s", check, errName(foreign), errName(want))
		}
		// Simple commits on an empty group are never ownership-checked.
		if check && h.storedOffset("g", 2) != -1 {
			t.Fatal("a rejected partition was stored")
		}
	}
}

// gateStore is a MemoryStore whose commits wait for a gate.
type gateStore struct {
	*MemoryStore
	gate    chan struct{}
	started chan struct{}
	mu      sync.Mutex
	txn     []*kmsg.TxnOffsetCommitRequest
}

func (s *gateStore) CommitOffsets(ctx context.Context, group string, topics []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error) {
	s.started <- struct{}{}
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.MemoryStore.CommitOffsets(ctx, group, topics)
}

func (s *gateStore) TxnCommitOffsets(ctx context.Context, req *kmsg.TxnOffsetCommitRequest) (*kmsg.TxnOffsetCommitResponse, error) {
	s.mu.Lock()
	s.txn = append(s.txn, req)
	s.mu.Unlock()
	return s.MemoryStore.TxnCommitOffsets(ctx, req)
}

func TestCommitAcknowledgedOnlyAfterStore(t *testing.T) {
	gs := &gateStore{MemoryStore: NewMemoryStore(), gate: make(chan struct{}), started: make(chan struct{}, 10)}
	h := newHarness(t, func(c *Config) { c.Store = gs })
	h.store = gs.MemoryStore
	c1 := h.send(commitReq(8, "s", "", -1, 0, 1))
	c2 := h.send(commitReq(8, "s", "", -1, 0, 2))
	<-gs.started
	c1.parked(h)
	c2.parked(h)
	select {
	case <-gs.started:
		t.Fatal("a second commit of the same group reached the store before the first returned")
	case <-time.After(20 * time.Millisecond):
	}
	gs.gate <- struct{}{}
	if code := commitCode(t, c1.wait()); code != 0 {
		t.Fatalf("commit 1: %s", errName(code))
	}
	<-gs.started
	gs.gate <- struct{}{}
	if code := commitCode(t, c2.wait()); code != 0 {
		t.Fatalf("commit 2: %s", errName(code))
	}
	if got := h.storedOffset("s", 0); got != 2 {
		t.Fatalf("commits applied out of order: %d", got)
	}
	// A commit stuck in the store when the engine closes is still
	// answered exactly once.
	c3 := h.send(commitReq(8, "s", "", -1, 0, 3))
	c4 := h.send(commitReq(8, "s", "", -1, 0, 4))
	<-gs.started
	h.e.Close()
	for _, c := range []*call{c3, c4} {
		if code := commitCode(t, c.wait()); code != errCoordinatorNotAvailable {
			t.Fatalf("commit at close: %s", errName(code))
		}
	}
}

// failStore fails every call.
type failStore struct{ *MemoryStore }

func (failStore) CommitOffsets(context.Context, string, []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error) {
	return nil, kerr.NotLeaderForPartition
}

func (failStore) FetchOffsets(context.Context, string, []kmsg.OffsetFetchRequestTopic, bool) ([]kmsg.OffsetFetchResponseTopic, error) {
	return nil, context.DeadlineExceeded
}

func TestStoreErrorsRemapped(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Store = failStore{NewMemoryStore()} })
	if code := commitCode(t, h.do(commitReq(8, "s", "", -1, 0, 1))); code != errNotCoordinator {
		t.Fatalf("commit with failing store: %s", errName(code))
	}
	f := kmsg.NewPtrOffsetFetchRequest()
	f.Version = 7
	f.Group = "s"
	if code := h.do(f).(*kmsg.OffsetFetchResponse).ErrorCode; code != errCoordinatorNotAvailable {
		t.Fatalf("fetch with failing store: %s", errName(code))
	}
}

func TestTxnOffsetCommit(t *testing.T) {
	gs := &gateStore{MemoryStore: NewMemoryStore()}
	h := newHarness(t, func(c *Config) { c.Store = gs })
	h.store = gs.MemoryStore
	ids, gen := h.joinedGroup("g", 1) // CompletingRebalance: no REBALANCE_IN_PROGRESS for txn commits
	txn := func(group, member string, gen int32, version int16) *kmsg.TxnOffsetCommitRequest {
		r := kmsg.NewPtrTxnOffsetCommitRequest()
		r.Version = version
		r.TransactionalID, r.Group, r.ProducerID, r.ProducerEpoch = "tx", group, 7, 1
		r.MemberID, r.Generation = member, gen
		p := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		p.Partition, p.Offset = 0, 42
		r.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{p}}}
		return r
	}
	code := func(r kmsg.Response) int16 {
		return r.(*kmsg.TxnOffsetCommitResponse).Topics[0].Partitions[0].ErrorCode
	}
	for _, tc := range []struct {
		name string
		req  *kmsg.TxnOffsetCommitRequest
		want int16
	}{
		{"member in completing rebalance", txn("g", ids[0], gen, 3), 0},
		{"no identity", txn("g", "", -1, 3), 0},
		{"v2 ignores identity fields", txn("g", "junk", 99, 2), 0},
		{"wrong generation", txn("g", ids[0], gen+1, 3), errIllegalGeneration},
		{"unknown member", txn("g", "who", gen, 3), errUnknownMemberID},
		{"missing group with generation", txn("nope", "m", 3, 3), errIllegalGeneration},
		{"missing group simple", txn("nope", "", -1, 3), 0},
	} {
		if got := code(h.do(tc.req)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, errName(got), errName(tc.want))
		}
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if len(gs.txn) != 4 {
		t.Fatalf("store saw %d txn commits, want 4", len(gs.txn))
	}
	for _, r := range gs.txn {
		if r.Generation != -1 || r.MemberID != "" || r.InstanceID != nil || r.ProducerID != 7 || r.TransactionalID != "tx" {
			t.Fatalf("identity not cleared or producer lost: %+v", r)
		}
	}
}

func TestOffsetFetchVersions(t *testing.T) {
	h := newHarness(t)
	id := [16]byte{1, 2, 3}
	h.store.SetTopicID("t", id)
	for p := int32(0); p < 2; p++ {
		if code := commitCode(t, h.do(commitReq(8, "s", "", -1, p, int64(100+p)))); code != 0 {
			t.Fatal(errName(code))
		}
	}
	// v1: explicit topics, no top-level error field.
	f := kmsg.NewPtrOffsetFetchRequest()
	f.Version = 1
	f.Group = "s"
	f.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "t", Partitions: []int32{0, 1, 5}}}
	r := h.do(f).(*kmsg.OffsetFetchResponse)
	if len(r.Topics) != 1 || r.Topics[0].Partitions[0].Offset != 100 || r.Topics[0].Partitions[1].Offset != 101 || r.Topics[0].Partitions[2].Offset != -1 {
		t.Fatalf("v1 fetch: %+v", r.Topics)
	}
	// v7: all topics (null).
	f.Version, f.Topics = 7, nil
	r = h.do(f).(*kmsg.OffsetFetchResponse)
	if r.ErrorCode != 0 || len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 2 {
		t.Fatalf("v7 fetch-all: %+v", r)
	}
	// v8: many groups, one of them unknown (offsets -1, no error).
	f8 := kmsg.NewPtrOffsetFetchRequest()
	f8.Version = 8
	f8.Groups = []kmsg.OffsetFetchRequestGroup{
		{Group: "s", Topics: []kmsg.OffsetFetchRequestGroupTopic{{Topic: "t", Partitions: []int32{1}}}},
		{Group: "unknown", Topics: []kmsg.OffsetFetchRequestGroupTopic{{Topic: "t", Partitions: []int32{0}}}},
		{Group: "s"},
	}
	r = h.do(f8).(*kmsg.OffsetFetchResponse)
	if len(r.Groups) != 3 || r.Groups[0].Topics[0].Partitions[0].Offset != 101 || r.Groups[1].Topics[0].Partitions[0].Offset != -1 || r.Groups[1].ErrorCode != 0 || len(r.Groups[2].Topics[0].Partitions) != 2 {
		t.Fatalf("v8 fetch: %+v", r.Groups)
	}
	// v10: topics by id, in and out; an unknown id fails its partitions.
	f10 := kmsg.NewPtrOffsetFetchRequest()
	f10.Version = 10
	f10.Groups = []kmsg.OffsetFetchRequestGroup{
		{Group: "s", Topics: []kmsg.OffsetFetchRequestGroupTopic{{TopicID: id, Partitions: []int32{0}}, {TopicID: [16]byte{9}, Partitions: []int32{0}}}},
		{Group: "s"},
	}
	r = h.do(f10).(*kmsg.OffsetFetchResponse)
	g0 := r.Groups[0]
	if len(g0.Topics) != 2 || g0.Topics[0].TopicID != id || g0.Topics[0].Partitions[0].Offset != 100 || g0.Topics[1].Partitions[0].ErrorCode != errUnknownTopicID {
		t.Fatalf("v10 fetch: %+v", g0)
	}
	if r.Groups[1].Topics[0].TopicID != id {
		t.Fatalf("v10 fetch-all lacks the topic id: %+v", r.Groups[1])
	}
	// v10 commit by id lands under the name.
	c := commitReq(10, "s", "", -1, 0, 555)
	c.Topics[0].Topic, c.Topics[0].TopicID = "", id
	cr := h.do(c).(*kmsg.OffsetCommitResponse)
	if cr.Topics[0].TopicID != id || cr.Topics[0].Partitions[0].ErrorCode != 0 || h.storedOffset("s", 0) != 555 {
		t.Fatalf("v10 commit: %+v", cr)
	}
	c.Topics[0].TopicID = [16]byte{9}
	if code := commitCode(t, h.do(c)); code != errUnknownTopicID {
		t.Fatalf("v10 commit of unknown id: %s", errName(code))
	}
	// v9: a member id and epoch are checked against a classic group.
	ids, gen := h.stableGroup("g", 1)
	f9 := kmsg.NewPtrOffsetFetchRequest()
	f9.Version = 9
	who := "who"
	f9.Groups = []kmsg.OffsetFetchRequestGroup{{Group: "g", MemberID: &ids[0], MemberEpoch: gen}, {Group: "g", MemberID: &ids[0], MemberEpoch: gen + 1}, {Group: "g", MemberID: &who, MemberEpoch: gen}}
	r = h.do(f9).(*kmsg.OffsetFetchResponse)
	if r.Groups[0].ErrorCode != 0 || r.Groups[1].ErrorCode != errIllegalGeneration || r.Groups[2].ErrorCode != errUnknownMemberID {
		t.Fatalf("v9 member checks: %s %s %s", errName(r.Groups[0].ErrorCode), errName(r.Groups[1].ErrorCode), errName(r.Groups[2].ErrorCode))
	}
}

// partGateStore is a MemoryStore whose commits each wait for the gate of
// their first partition, and whose fetches are recorded as they start.
type partGateStore struct {
	*MemoryStore
	gates   [3]chan struct{}
	started chan int32 // partition of each commit reaching the store
	fetched chan struct{}
}

func (s *partGateStore) CommitOffsets(ctx context.Context, group string, topics []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error) {
	p := topics[0].Partitions[0].Partition
	s.started <- p
	select {
	case <-s.gates[p]:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.MemoryStore.CommitOffsets(ctx, group, topics)
}

func (s *partGateStore) FetchOffsets(ctx context.Context, group string, topics []kmsg.OffsetFetchRequestTopic, requireStable bool) ([]kmsg.OffsetFetchResponseTopic, error) {
	s.fetched <- struct{}{}
	return s.MemoryStore.FetchOffsets(ctx, group, topics, requireStable)
}

// TestCommitsOfDistinctPartitionsRunSideBySide: the commits of a group's
// members, each of its own partitions, reach the store together (one
// round trip each on a slow link, not one queued behind the other),
// while a commit of a partition being written waits for that write and a
// fetch waits for every commit before it.
func TestCommitsOfDistinctPartitionsRunSideBySide(t *testing.T) {
	gs := &partGateStore{MemoryStore: NewMemoryStore(), started: make(chan int32, 10), fetched: make(chan struct{}, 10)}
	for i := range gs.gates {
		gs.gates[i] = make(chan struct{})
	}
	h := newHarness(t, func(c *Config) { c.Store = gs })
	h.store = gs.MemoryStore
	ids, gen := h.stableGroup("g", 2)

	c0 := h.send(commitReq(8, "g", ids[0], gen, 0, 10))
	c1 := h.send(commitReq(8, "g", ids[1], gen, 1, 20))
	next := func() int32 {
		t.Helper()
		select {
		case p := <-gs.started:
			return p
		case <-time.After(5 * time.Second):
			t.Fatal("a commit expected at the store did not reach it")
			return -1
		}
	}
	got := map[int32]bool{next(): true, next(): true}
	if !got[0] || !got[1] {
		t.Fatalf("commits of partitions 0 and 1 reached the store as %v, want both", got)
	}
	again := h.send(commitReq(8, "g", ids[0], gen, 0, 11)) // partition 0 again: waits for c0
	other := h.send(commitReq(8, "g", ids[1], gen, 2, 30)) // behind it in the FIFO: waits too
	fetch := kmsg.NewPtrOffsetFetchRequest()
	fetch.Version = 7
	fetch.Group = "g"
	fetch.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "t", Partitions: []int32{0, 1, 2}}}
	fc := h.send(fetch)
	select {
	case p := <-gs.started:
		t.Fatalf("a commit of partition %d started while partition 0 was being written ahead of it", p)
	case <-gs.fetched:
		t.Fatal("a fetch started while commits before it were running")
	case <-time.After(30 * time.Millisecond):
	}

	gs.gates[1] <- struct{}{}
	if code := commitCode(t, c1.wait()); code != 0 {
		t.Fatalf("commit of partition 1: %s", errName(code))
	}
	select {
	case p := <-gs.started:
		t.Fatalf("a commit of partition %d started while partition 0's first commit was running", p)
	case <-time.After(30 * time.Millisecond):
	}
	gs.gates[0] <- struct{}{}
	if code := commitCode(t, c0.wait()); code != 0 {
		t.Fatalf("first commit of partition 0: %s", errName(code))
	}
	got = map[int32]bool{next(): true, next(): true}
	if !got[0] || !got[2] {
		t.Fatalf("after partition 0's first commit, started %v, want partitions 0 and 2", got)
	}
	gs.gates[0] <- struct{}{}
	gs.gates[2] <- struct{}{}
	for _, c := range []*call{again, other} {
		if code := commitCode(t, c.wait()); code != 0 {
			t.Fatalf("commit: %s", errName(code))
		}
	}
	<-gs.fetched
	resp := fc.wait().(*kmsg.OffsetFetchResponse)
	want := map[int32]int64{0: 11, 1: 20, 2: 30}
	for _, p := range resp.Topics[0].Partitions {
		if p.Offset != want[p.Partition] {
			t.Fatalf("fetch after the commits: partition %d at %d, want %d", p.Partition, p.Offset, want[p.Partition])
		}
	}
}
