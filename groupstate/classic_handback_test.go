package groupstate

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestHandBack: a Stable group handed back starts a rebalance: its
// members' heartbeats say REBALANCE_IN_PROGRESS, a commit at the current
// generation is still accepted, and each member's JoinGroup is answered
// NOT_COORDINATOR and takes it out of the group, as does a new member's.
// HandBack reports the members' longest rebalance timeout; a group the
// engine does not hold cannot be handed back.
func TestHandBack(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("g", 2)
	wait, ok := h.e.HandBack("g")
	if !ok || wait != 30*time.Second {
		t.Fatalf("HandBack: %v %v, want 30s true", wait, ok)
	}
	if _, ok := h.e.HandBack("nobody"); ok {
		t.Fatal("a group the engine does not hold was handed back")
	}
	for _, id := range ids {
		if code := h.heartbeat("g", id, gen); code != errRebalanceInProgress {
			t.Fatalf("heartbeat of %s: %v, want REBALANCE_IN_PROGRESS", id, kerr.ErrorForCode(code))
		}
	}
	commit := kmsg.NewPtrOffsetCommitRequest()
	commit.Version = 8
	commit.Group, commit.MemberID, commit.Generation = "g", ids[0], gen
	ct := kmsg.NewOffsetCommitRequestTopic()
	ct.Topic = "t"
	cp := kmsg.NewOffsetCommitRequestTopicPartition()
	cp.Partition, cp.Offset = 0, 42
	ct.Partitions = append(ct.Partitions, cp)
	commit.Topics = append(commit.Topics, ct)
	if code := h.do(commit).(*kmsg.OffsetCommitResponse).Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("commit during the hand-back: %v", kerr.ErrorForCode(code))
	}
	rejoin := jr{group: "g", member: ids[0], version: 9}.req()
	joinResp(t, h.send(rejoin), errNotCoordinator)
	if g, ok := h.e.Group("g"); !ok || len(g.Members) != 1 || g.Members[0].MemberID != ids[1] {
		t.Fatalf("after the first member's join: %+v", g.Members)
	}
	joinResp(t, h.send(jr{group: "g", version: 9}.req()), errNotCoordinator)
	joinResp(t, h.send(jr{group: "g", member: ids[1], version: 9}.req()), errNotCoordinator)
	h.flush()
	if g, ok := h.e.Group("g"); !ok || len(g.Members) != 0 || g.State != "Empty" {
		t.Fatalf("after every member's join: %s with %+v", g.State, g.Members)
	}
}
