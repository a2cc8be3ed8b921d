package groupstate

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// gatedTopicStore is a MemoryStore whose TopicMetadata waits for a token
// on gate, so a test decides when a refresh completes.
type gatedTopicStore struct {
	*MemoryStore
	gate    chan struct{}
	started chan struct{} // receives a token when a refresh starts
}

func (s *gatedTopicStore) TopicMetadata(ctx context.Context) (map[string]TopicInfo, error) {
	select {
	case s.started <- struct{}{}:
	default:
	}
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.MemoryStore.TopicMetadata(ctx)
}

// newGatedHarness builds a consumer harness over a gatedTopicStore whose
// first refresh (the one New starts) has completed.
func newGatedHarness(t *testing.T, topics map[string]int32) (*consumerHarness, *gatedTopicStore) {
	t.Helper()
	var gs *gatedTopicStore
	h := &consumerHarness{newHarness(t, func(c *Config) {
		gs = &gatedTopicStore{MemoryStore: c.Store.(*MemoryStore), gate: make(chan struct{}), started: make(chan struct{}, 16)}
		c.Store = gs
	})}
	for n, p := range topics {
		h.store.SetTopic(n, p)
	}
	<-gs.started
	gs.gate <- struct{}{} // New's refresh
	deadline := time.Now().Add(5 * time.Second)
	for !h.e.topicsKnown() || len(h.e.topicsNow().byName) != len(topics) {
		if time.Now().After(deadline) {
			t.Fatalf("the first topic refresh did not complete")
		}
		time.Sleep(time.Millisecond)
	}
	return h, gs
}

// TestConsumerJoinWaitsForUnknownTopic guards the first assignment of a
// member subscribing to a topic created after the last refresh: the
// join's answer carries the topic's partitions (it used to carry none
// until the next heartbeat).
func TestConsumerJoinWaitsForUnknownTopic(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 2})
	h.store.SetTopic("fresh", 3) // created since the last refresh
	m := h.join("g", "m1", "fresh", "t")
	want := ps(h.topicID("t"), 0, 1)
	for p := int32(0); p < 3; p++ {
		want.add(h.topicID("fresh"), p)
	}
	if !m.owned.equal(want) || m.epoch != 1 {
		t.Fatalf("first answer: epoch %d owns %v, want epoch 1 with t 0-1 and fresh 0-2", m.epoch, m.owned)
	}
	if d := h.describe("g"); d.State != "Stable" {
		t.Fatalf("group after one join: %s", d.State)
	}
}

// TestConsumerTopicWaitIsBounded guards that a heartbeat never waits
// longer than maxTopicWait for a refresh, that only a new subscription
// waits, and that Close answers a waiting heartbeat.
func TestConsumerTopicWaitIsBounded(t *testing.T) {
	h, gs := newGatedHarness(t, map[string]int32{"t": 2})
	tid := h.topicID("t")

	// A join naming a topic nobody created waits for a refresh, which
	// here never completes: it is answered after maxTopicWait with what
	// is known.
	c := h.send(consumerJoin("g", "m1", "t", "missing"))
	<-gs.started
	c.parked(h.harness)
	h.advance(maxTopicWait)
	resp := c.wait().(*kmsg.ConsumerGroupHeartbeatResponse)
	m := &client{id: "m1"}
	m.applyResp(resp)
	if resp.ErrorCode != errNone || !m.owned.equal(ps(tid, 0, 1)) {
		t.Fatalf("bounded wait: error %s, owns %v, want t 0-1", errName(resp.ErrorCode), m.owned)
	}

	// The member's later heartbeats, same subscription, do not wait,
	// though the refresh still hangs.
	r := consumerBeat("g", "m1", m.epoch, m.owned)
	r.SubscribedTopicNames = []string{"missing", "t"}
	c = h.send(r)
	if resp := c.wait().(*kmsg.ConsumerGroupHeartbeatResponse); resp.ErrorCode != errNone {
		t.Fatalf("steady heartbeat: %s", errName(resp.ErrorCode))
	}

	// The refresh completes: the topic appeared meanwhile, and the next
	// heartbeat gets it (the group epoch is bumped by the new metadata).
	h.store.SetTopic("missing", 1)
	gs.gate <- struct{}{}
	deadline := time.Now().Add(5 * time.Second)
	for _, ok := h.e.topicsNow().byName["missing"]; !ok; _, ok = h.e.topicsNow().byName["missing"] {
		if time.Now().After(deadline) {
			t.Fatalf("the refresh did not complete")
		}
		time.Sleep(time.Millisecond)
	}
	h.settle("g", m)
	if !m.owned.has(h.topicID("missing"), 0) {
		t.Fatalf("after the refresh owns %v, want missing-0 too", m.owned)
	}

	// Close answers a heartbeat that is still waiting.
	c = h.send(consumerJoin("g", "m2", "other"))
	<-gs.started
	c.parked(h.harness)
	h.e.Close()
	if resp := c.wait().(*kmsg.ConsumerGroupHeartbeatResponse); resp.ErrorCode != errCoordinatorNotAvailable {
		t.Fatalf("waiting heartbeat at Close: %s, want COORDINATOR_NOT_AVAILABLE", errName(resp.ErrorCode))
	}
}

// TestConsumerTopicRefreshCoalesces guards the refresh scheduler: joins
// that arrive while a refresh runs share one more refresh, started after
// it, and none starts while one runs.
func TestConsumerTopicRefreshCoalesces(t *testing.T) {
	h, gs := newGatedHarness(t, map[string]int32{"t": 1})
	c1 := h.send(consumerJoin("g1", "m1", "a"))
	<-gs.started
	h.clock.mu.Lock()
	h.clock.now = h.clock.now.Add(time.Millisecond) // later than the running refresh's start
	h.clock.mu.Unlock()
	h.store.SetTopic("a", 1)
	h.store.SetTopic("b", 2)
	c2 := h.send(consumerJoin("g2", "m2", "b"))
	c3 := h.send(consumerJoin("g3", "m3", "b"))
	c2.parked(h.harness)
	c3.parked(h.harness)
	select {
	case <-gs.started:
		t.Fatalf("a second refresh started while one runs")
	default:
	}
	gs.gate <- struct{}{} // the first refresh answers c1 (it knows a)
	if resp := c1.wait().(*kmsg.ConsumerGroupHeartbeatResponse); resp.Assignment == nil || len(resp.Assignment.Topics) != 1 {
		t.Fatalf("c1: %+v", resp.Assignment)
	}
	<-gs.started // the one more, for c2 and c3
	c2.parked(h.harness)
	gs.gate <- struct{}{}
	for _, c := range []*call{c2, c3} {
		resp := c.wait().(*kmsg.ConsumerGroupHeartbeatResponse)
		if resp.Assignment == nil || len(resp.Assignment.Topics) != 1 || len(resp.Assignment.Topics[0].Partitions) != 2 {
			t.Fatalf("joins after the refresh started: %+v", resp.Assignment)
		}
	}
	select {
	case <-gs.started:
		t.Fatalf("a third refresh started for nobody")
	case <-time.After(20 * time.Millisecond):
	}
}

// TestConsumerTopicDeletedWithinRefreshInterval guards that a deleted
// topic leaves a KIP-848 group's assignment after one periodic refresh
// (Config.TopicRefreshInterval, 2s by default) and the next heartbeat.
func TestConsumerTopicDeletedWithinRefreshInterval(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 2, "u": 2})
	m := h.join("g", "m1", "t", "u")
	h.settle("g", m)
	if m.owned.size() != 4 {
		t.Fatalf("before the deletion owns %v", m.owned)
	}
	h.store.DeleteTopic("u")
	h.advance(defaultTopicRefreshInterval)
	deadline := time.Now().Add(5 * time.Second)
	for _, ok := h.e.topicsNow().byName["u"]; ok; _, ok = h.e.topicsNow().byName["u"] {
		if time.Now().After(deadline) {
			t.Fatalf("no refresh after %v", defaultTopicRefreshInterval)
		}
		time.Sleep(time.Millisecond)
	}
	before := h.describe("g").Epoch
	h.beat("g", m)
	if !m.owned.equal(ps(h.topicID("t"), 0, 1)) {
		t.Fatalf("the heartbeat after the refresh leaves %v, want t 0-1", m.owned)
	}
	if d := h.describe("g"); d.Epoch != before+1 {
		t.Fatalf("group epoch %d -> %d, want one bump (topics changed)", before, d.Epoch)
	}
}
