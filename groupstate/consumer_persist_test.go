package groupstate

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestConsumerGroupRestartResumesWithoutNewEpoch(t *testing.T) {
	h1, store := newMetaHarness(t, nil)
	store.SetTopic("t", 4)
	c1 := &consumerHarness{h1}
	c1.refresh()
	m1 := c1.join("g", "m1", "t")
	m2 := c1.join("g", "m2", "t")
	c1.settle("g", m1, m2)
	before := c1.describe("g")
	c1.flush() // coalesced writes of the settling land first
	saves, _, _ := store.counts("g")
	// A heartbeat that changes nothing writes nothing.
	c1.beat("g", m1)
	c1.flush()
	if again, _, _ := store.counts("g"); again != saves {
		t.Fatalf("an idle heartbeat wrote the record (%d → %d saves)", saves, again)
	}
	h1.e.Close()

	h2, _ := newMetaHarness(t, store)
	c2 := &consumerHarness{h2}
	c2.refresh()
	// Both members go on at their epochs with their partitions.
	for _, c := range []*client{m1, m2} {
		owned := c.owned.clone()
		c2.beat("g", c)
		if !c.owned.equal(owned) || c.epoch != before.Epoch {
			t.Fatalf("%s after restart: epoch %d owns %v, before epoch %d owned %v", c.id, c.epoch, c.owned, before.Epoch, owned)
		}
	}
	after := c2.describe("g")
	if after.Epoch != before.Epoch || after.AssignmentEpoch != before.AssignmentEpoch || after.State != "Stable" || len(after.Members) != 2 {
		t.Fatalf("loaded group: %+v, before %+v", after, before)
	}
	evs := kinds(c2.takeEvents("g"))
	if !slices.Contains(evs, "group_loaded") || slices.ContainsFunc(evs, func(k string) bool {
		return k == "rebalance_started(topics_changed)" || k == "rebalance_started(member_joined)"
	}) {
		t.Fatalf("events after restart: %v", evs)
	}
	// A member that does not come back expires after its session.
	for i := 0; i < 10; i++ {
		c2.advance(5 * time.Second)
		c2.beat("g", m1)
	}
	if evs := kinds(c2.takeEvents("g")); !slices.Contains(evs, "member_expired(session_timeout)") {
		t.Fatalf("the member that did not return never expired: %v", evs)
	}
	c2.settle("g", m1)
	if m1.owned.size() != 4 {
		t.Fatalf("m1 owns %v after m2 expired", m1.owned)
	}
	// Deleting the empty group tombstones its record.
	c2.consumerResp(consumerBeat("g", "m1", -1, nil), errNone)
	c2.flush()
	if rec, found, _ := store.LoadGroupMetadata(context.Background(), "g"); !found || !isConsumerRecord(rec) {
		t.Fatalf("the empty group's record is missing before delete")
	}
	del := kmsg.NewPtrDeleteGroupsRequest()
	del.Groups = []string{"g"}
	if code := c2.do(del).(*kmsg.DeleteGroupsResponse).Groups[0].ErrorCode; code != errNone {
		t.Fatalf("delete: %s", errName(code))
	}
	c2.flush()
	if _, found, _ := store.LoadGroupMetadata(context.Background(), "g"); found {
		t.Fatalf("the deleted group's record is still stored")
	}
}

func TestConsumerGroupRecordRejectsBadInput(t *testing.T) {
	h := newHarness(t)
	s := h.e.shards[0]
	bad := [][]byte{
		{0x4b, 0x38},
		append([]byte{0x4b, 0x38}, `{"version":9,"epoch":1,"assignment_epoch":1,"members":[]}`...),
		append([]byte{0x4b, 0x38}, `{"version":1,"epoch":1,"assignment_epoch":2,"members":[]}`...),
		append([]byte{0x4b, 0x38}, `{"version":1,"epoch":1,"assignment_epoch":1,"members":[{"id":"a","state":0,"epoch":1,"previous_epoch":0,"rebalance_timeout_ms":1,"assigned":[{"topic":"00","partitions":[0]}]}]}`...),
		append([]byte{0x4b, 0x38}, `{"version":1,"epoch":1,"assignment_epoch":1,"members":[{"id":"a","state":0,"epoch":1,"previous_epoch":0,"rebalance_timeout_ms":1,"assigned":[{"topic":"00000000000000000000000000000001","partitions":[0]}]},{"id":"b","state":0,"epoch":1,"previous_epoch":0,"rebalance_timeout_ms":1,"assigned":[{"topic":"00000000000000000000000000000001","partitions":[0]}]}]}`...),
		append([]byte{0x4b, 0x38}, `{"version":1,"epoch":1,"assignment_epoch":1,"assignor":"nope","members":[]}`...),
	}
	done := make(chan struct{})
	s.post(func() {
		defer close(done)
		for i, rec := range bad {
			if _, err := s.consumerGroupFromRecord("g", rec); err == nil {
				t.Errorf("bad record %d accepted", i)
			}
		}
	})
	<-done
}

// TestConsumerHeartbeatAnsweredOnceDurable checks that a heartbeat that
// changed the group is answered only after the group's record is
// written, and that an unchanged heartbeat does not wait.
func TestConsumerHeartbeatAnsweredOnceDurable(t *testing.T) {
	h, store := newMetaHarness(t, nil)
	store.SetTopic("t", 2)
	c := &consumerHarness{h}
	c.refresh()
	m1 := c.join("g", "m1", "t")
	c.flush()
	hold := make(chan struct{})
	store.mu.Lock()
	store.holdSave = hold
	store.mu.Unlock()
	// An unchanged heartbeat is answered while writes are held.
	c.beat("g", m1)
	// A join changes the group: its answer waits for the write.
	call := c.send(consumerJoin("g", "m2", "t"))
	c.flushLoops()
	time.Sleep(20 * time.Millisecond)
	select {
	case r := <-call.ch:
		t.Fatalf("join answered before its change was durable: %+v", r)
	default:
	}
	close(hold)
	resp := call.wait().(*kmsg.ConsumerGroupHeartbeatResponse)
	if resp.ErrorCode != errNone || resp.MemberEpoch != 2 {
		t.Fatalf("join after the write: %s epoch %d", errName(resp.ErrorCode), resp.MemberEpoch)
	}
	rec, found, _ := store.LoadGroupMetadata(context.Background(), "g")
	if !found || !isConsumerRecord(rec) {
		t.Fatalf("no consumer group record after the join")
	}
}

// TestConsumerHeartbeatWaitingAtCloseIsAnswered checks that a heartbeat
// waiting for a write is answered when the engine closes.
func TestConsumerHeartbeatWaitingAtCloseIsAnswered(t *testing.T) {
	h, store := newMetaHarness(t, nil)
	store.SetTopic("t", 2)
	c := &consumerHarness{h}
	c.refresh()
	c.join("g", "m1", "t")
	c.flush()
	hold := make(chan struct{})
	store.mu.Lock()
	store.holdSave = hold
	store.mu.Unlock()
	first := c.send(consumerJoin("g", "m2", "t"))  // its write is held
	second := c.send(consumerJoin("g", "m3", "t")) // waits for the next write
	c.flushLoops()
	go func() {
		time.Sleep(50 * time.Millisecond)
		close(hold)
	}()
	h.e.Close()
	for _, call := range []*call{first, second} {
		if r := call.wait().(*kmsg.ConsumerGroupHeartbeatResponse); r.ErrorCode != errNone && r.ErrorCode != errCoordinatorNotAvailable {
			t.Fatalf("waiting heartbeat answered %s", errName(r.ErrorCode))
		}
	}
}
