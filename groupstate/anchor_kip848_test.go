package groupstate

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
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

func (r *anchorRecorder) version(group string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[group].Version
}

// anchoredPair starts an engine whose store records its anchors, with
// topic t of six partitions and group g of two KIP-848 members, a and b,
// settled.
func anchoredPair(t *testing.T) (h *consumerHarness, rec *anchorRecorder, tid topicID, a, b *client) {
	t.Helper()
	rec = &anchorRecorder{MemoryStore: NewMemoryStore(), last: make(map[string]Anchor)}
	h = &consumerHarness{newHarness(t, func(c *Config) { c.Store = rec })}
	rec.SetTopic("t", 6)
	h.refresh()
	ids, _ := rec.TopicIDs(context.Background(), []string{"t"})
	tid = topicID(ids["t"])
	a = h.join("g", "a", "t")
	b = h.join("g", "b", "t")
	h.settle("g", a, b)
	return h, rec, tid, a, b
}

// TestKIP848AnchorHoldsEveryPartition: the anchor of a KIP-848 group
// holds every partition of the subscribed topics but those a leave freed
// (withheld, consumer_withhold.go): the engine gives a partition nobody
// holds to a member at that member's next heartbeat without asking the
// cluster; had the anchor let it go, a member moved back whose join
// converted the cluster's group meanwhile would be given it there too
// (docs/anchors.md, "Out (rollback)").
func TestKIP848AnchorHoldsEveryPartition(t *testing.T) {
	h, rec, tid, a, b := anchoredPair(t)
	all := []int32{0, 1, 2, 3, 4, 5}
	if len(a.owned.sortedPartitions(tid)) != 3 || len(b.owned.sortedPartitions(tid)) != 3 {
		t.Fatalf("settled with a %v and b %v, want three partitions each", a.owned, b.owned)
	}
	h.flush()
	if got := rec.owned("g", "t"); !slices.Equal(got, all) {
		t.Fatalf("anchor holds %v of t while settled, want %v", got, all)
	}
	// b's partitions grow: a partition nobody holds is the anchor's.
	c := h.join("g", "c", "t")
	h.flush()
	if got := rec.owned("g", "t"); !slices.Equal(got, all) {
		t.Fatalf("anchor holds %v of t with c joining, want %v", got, all)
	}
	h.settle("g", a, b, c)
	if got := rec.owned("g", "t"); !slices.Equal(got, all) {
		t.Fatalf("anchor holds %v of t after c joined, want %v", got, all)
	}
}

// TestKIP848LeaveWithheldForAMemberMovedBack: the partitions a member's
// leave frees are given to no member of the engine and let go by the
// anchor for withholdFor, so that a member moved back to the cluster
// within it is given them at once there (consumer_withhold.go). Then
// the anchor takes them back, and the engine gives them out only once
// the anchor reports a sync of that Anchor: a report of an older one
// (the sync that let them go) gives nothing.
func TestKIP848LeaveWithheldForAMemberMovedBack(t *testing.T) {
	h, rec, tid, a, b := anchoredPair(t)
	all := []int32{0, 1, 2, 3, 4, 5}
	freed := a.owned.sortedPartitions(tid)
	kept := b.owned.sortedPartitions(tid)
	h.consumerResp(consumerBeat("g", "a", -1, nil), errNone)
	h.flush()
	if got := rec.owned("g", "t"); !slices.Equal(got, kept) {
		t.Fatalf("anchor holds %v of t after a's leave, want only b's %v (a's %v let go)", got, kept, freed)
	}
	released := rec.version("g")
	resp := h.consumerResp(consumerBeat("g", "b", b.epoch, b.owned), errNone)
	b.applyResp(resp)
	if got := b.owned.sortedPartitions(tid); !slices.Equal(got, kept) {
		t.Fatalf("b holds %v right after a's leave, want its own %v: a's are withheld", got, kept)
	}
	if resp.HeartbeatIntervalMillis != int32(withheldHeartbeat/time.Millisecond) {
		t.Fatalf("b told to heartbeat every %d ms while partitions are withheld, want %v", resp.HeartbeatIntervalMillis, withheldHeartbeat)
	}

	h.advance(withholdFor)
	h.flush()
	if got := rec.owned("g", "t"); !slices.Equal(got, all) {
		t.Fatalf("anchor holds %v of t after the window, want %v again", got, all)
	}
	reclaimed := rec.version("g")
	h.e.AnchorHeld("g", released) // the sync that let them go
	h.beat("g", b)
	if got := b.owned.sortedPartitions(tid); !slices.Equal(got, kept) {
		t.Fatalf("b holds %v before the anchor synced them back, want %v", got, kept)
	}
	h.e.AnchorHeld("g", reclaimed)
	h.settle("g", b)
	if got := b.owned.sortedPartitions(tid); !slices.Equal(got, all) {
		t.Fatalf("b holds %v once the anchor holds a's partitions again, want %v", got, all)
	}
	if resp := h.consumerResp(consumerBeat("g", "b", b.epoch, b.owned), errNone); resp.HeartbeatIntervalMillis != 5000 {
		t.Fatalf("b told to heartbeat every %d ms after, want the group's 5 s", resp.HeartbeatIntervalMillis)
	}
}

// TestKIP848WithheldUntilAnchorConfirmsOrGivesUp: a member joining the
// engine's group ends the window at once (the partitions may be meant
// for it), and an anchor that never reports its sync holds nothing up
// for longer than withholdConfirmWait.
func TestKIP848WithheldUntilAnchorConfirmsOrGivesUp(t *testing.T) {
	h, rec, tid, _, b := anchoredPair(t)
	all := []int32{0, 1, 2, 3, 4, 5}
	h.consumerResp(consumerBeat("g", "a", -1, nil), errNone)
	h.flush()
	if got := rec.owned("g", "t"); len(got) != 3 {
		t.Fatalf("anchor holds %v of t after a's leave, want b's three", got)
	}
	a2 := h.join("g", "a2", "t")
	h.flush()
	if got := rec.owned("g", "t"); !slices.Equal(got, all) {
		t.Fatalf("anchor holds %v of t once a2 joined, want %v", got, all)
	}
	h.beat("g", b)
	h.beat("g", a2)
	h.beat("g", b)
	h.beat("g", a2)
	if got := a2.owned.sortedPartitions(tid); len(got) != 0 {
		t.Fatalf("a2 holds %v before the anchor synced them back", got)
	}
	h.advance(withholdConfirmWait)
	h.settle("g", b, a2)
	if n := len(a2.owned.sortedPartitions(tid)) + len(b.owned.sortedPartitions(tid)); n != len(all) {
		t.Fatalf("b %v and a2 %v after the anchor never confirmed, want every partition held", b.owned, a2.owned)
	}
}
