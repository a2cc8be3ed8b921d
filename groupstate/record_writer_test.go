package groupstate

import (
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRecordWriterCoalescesAndDropsOnFailure: changes made while a
// group's write is in flight wait for one next write holding them all,
// each answered once it is durable; a failed write answers its waiters
// with the store error's code and drops the group, which the next
// request loads again from the store as the last good write left it.
func TestRecordWriterCoalescesAndDropsOnFailure(t *testing.T) {
	h, store := newMetaHarness(t, nil)
	store.SetTopic("t", 4)
	c := &consumerHarness{h}
	c.refresh()
	m1 := c.join("g", "m1", "t")
	c.flush()
	before, _, _ := store.counts("g")

	hold := make(chan struct{})
	store.mu.Lock()
	store.holdSave = hold
	store.mu.Unlock()
	first := c.send(consumerJoin("g", "m2", "t")) // its write starts and is held
	c.flushLoops()
	second := c.send(consumerJoin("g", "m3", "t")) // these two wait for the next write
	third := c.send(consumerJoin("g", "m4", "t"))
	c.flushLoops()
	for _, call := range []*call{first, second, third} {
		select {
		case r := <-call.ch:
			t.Fatalf("a join answered while its write was held: %+v", r)
		default:
		}
	}
	close(hold)
	for i, call := range []*call{first, second, third} {
		if r := call.wait().(*kmsg.ConsumerGroupHeartbeatResponse); r.ErrorCode != errNone {
			t.Fatalf("join %d: %s", i+2, errName(r.ErrorCode))
		}
	}
	c.flush()
	if after, _, _ := store.counts("g"); after-before != 2 {
		t.Fatalf("%d writes for three changes, want 2 (the last two coalesced)", after-before)
	}
	snap, _ := c.e.Group("g")
	epoch := snap.Generation

	c.takeEvents("g")
	store.mu.Lock()
	store.failSave = kerr.NotLeaderForPartition
	store.mu.Unlock()
	if r := c.send(consumerJoin("g", "m5", "t")).wait().(*kmsg.ConsumerGroupHeartbeatResponse); r.ErrorCode != errNotCoordinator {
		t.Fatalf("join with a failing write: %s, want NOT_COORDINATOR", errName(r.ErrorCode))
	}
	if evs := kinds(c.takeEvents("g")); !slices.Contains(evs, "group_unloaded(store_error)") {
		t.Fatalf("events after a failed write: %v", evs)
	}
	if _, held := c.e.Group("g"); held {
		t.Fatal("the group is still held after a failed write")
	}

	store.mu.Lock()
	store.failSave = nil
	store.mu.Unlock()
	_, _, loads := store.counts("g")
	c.beat("g", m1)
	if _, _, again := store.counts("g"); again != loads+1 {
		t.Fatalf("%d loads after the failure, want 1", again-loads)
	}
	snap, _ = c.e.Group("g")
	if snap.Generation != epoch || len(snap.Members) != 4 {
		t.Fatalf("reloaded group: epoch %d with %d members, want %d with 4 (m5's join was never durable)", snap.Generation, len(snap.Members), epoch)
	}
}
