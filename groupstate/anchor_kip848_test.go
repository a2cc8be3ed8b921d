package groupstate

import (
	"context"
	"slices"
	"sync"
	"testing"
)

// anchorRecorder is a MemoryStore that keeps the anchors the engine hands
// it (AnchorStore), the last one per group.
type anchorRecorder struct {
	*MemoryStore
	mu   sync.Mutex // guards last
	last map[string]Anchor
}

func (r *anchorRecorder) Anchor(group string, a Anchor) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[group] = a
}

func (r *anchorRecorder) Unanchor(group string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.last, group)
}

func (r *anchorRecorder) owned(group, topic string) []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.last[group].Owned[topic])
}

// TestKIP848AnchorHoldsEveryPartition: the anchor of a KIP-848 group
// holds every partition of the subscribed topics, also right after a
// member's leave freed some, before another member was given them. The
// engine gives them at that member's next heartbeat without asking the
// cluster; had the anchor let them go, a member moved back whose join
// converted the cluster's group meanwhile would be given them there
// too (docs/anchors.md, "Out (rollback)").
func TestKIP848AnchorHoldsEveryPartition(t *testing.T) {
	rec := &anchorRecorder{MemoryStore: NewMemoryStore(), last: make(map[string]Anchor)}
	h := &consumerHarness{newHarness(t, func(c *Config) { c.Store = rec })}
	rec.SetTopic("t", 6)
	h.refresh()
	ids, _ := rec.TopicIDs(context.Background(), []string{"t"})
	tid := topicID(ids["t"])
	all := []int32{0, 1, 2, 3, 4, 5}

	a := h.join("g", "a", "t")
	b := h.join("g", "b", "t")
	h.settle("g", a, b)
	if len(a.owned.sortedPartitions(tid)) != 3 || len(b.owned.sortedPartitions(tid)) != 3 {
		t.Fatalf("settled with a %v and b %v, want three partitions each", a.owned, b.owned)
	}
	h.flush()
	if got := rec.owned("g", "t"); !slices.Equal(got, all) {
		t.Fatalf("anchor holds %v of t while settled, want %v", got, all)
	}

	leave := consumerBeat("g", "a", -1, nil)
	h.consumerResp(leave, errNone)
	h.flush()
	if got := rec.owned("g", "t"); !slices.Equal(got, all) {
		t.Fatalf("anchor holds %v of t after a's leave, before b's next heartbeat, want %v (b holds %v)",
			got, all, b.owned.sortedPartitions(tid))
	}
}
