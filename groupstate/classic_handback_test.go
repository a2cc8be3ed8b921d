package groupstate

import (
	"reflect"
	"slices"
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
	wait, freed, ok := h.e.HandBack("g", nil)
	if !ok || wait != 30*time.Second || freed != nil {
		t.Fatalf("HandBack: %v %v %v, want 30s nil true", wait, freed, ok)
	}
	if _, _, ok := h.e.HandBack("nobody", nil); ok {
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

// TestHandBackReplacesMovedStatic: a static member the cluster's group
// holds already (restarted against the brokers) is replaced when the
// hand-back starts: it leaves the engine's group, its old member id is
// unknown from then on (the process kproxy knew it by is fenced), and
// HandBack returns what it was assigned, by instance id, for the anchor
// to give it at once. Another static member and the dynamic one stay
// until they follow; an instance id the group does not list is ignored.
// The Anchor the engine hands the store before HandBack returns no
// longer holds the replaced member's partitions: the anchor, which
// assigns them to the member at the cluster, keeps only the rest.
func TestHandBackReplacesMovedStatic(t *testing.T) {
	rec := &anchorRecorder{MemoryStore: NewMemoryStore(), last: make(map[string]Anchor)}
	h := newHarness(t, func(c *Config) { c.Store = rec })
	ra := joinResp(t, h.send(jr{group: "g", instance: "a", version: 9}.req()), 0)
	cb := h.send(jr{group: "g", instance: "b", version: 9}.req())
	cb.parked(h)
	cc := h.do(jr{group: "g", version: 9}.req()).(*kmsg.JoinGroupResponse)
	if cc.ErrorCode != errMemberIDRequired {
		t.Fatalf("dynamic member's handshake: %v", errName(cc.ErrorCode))
	}
	c := h.send(jr{group: "g", member: cc.MemberID, version: 9}.req())
	ca := h.send(jr{group: "g", member: ra.MemberID, instance: "a", version: 9}.req())
	ra, rb, rc := joinResp(t, ca, 0), joinResp(t, cb, 0), joinResp(t, c, 0)
	ids := []string{ra.LeaderID}
	for _, id := range []string{ra.MemberID, rb.MemberID, rc.MemberID} {
		if id != ra.LeaderID {
			ids = append(ids, id)
		}
	}
	assign := map[string][]byte{
		ra.MemberID: assignment("t", 0, 3),
		rb.MemberID: assignment("t", 1),
		rc.MemberID: assignment("t", 2),
	}
	h.syncAll("g", ra.Generation, ids, assign)

	_, freed, ok := h.e.HandBack("g", []string{"a", "gone"})
	if !ok {
		t.Fatal("HandBack: false")
	}
	if want := map[string]map[string][]int32{"a": {"t": {0, 3}}}; !reflect.DeepEqual(freed, want) {
		t.Fatalf("freed %v, want %v", freed, want)
	}
	if got := rec.owned("g", "t"); !slices.Equal(got, []int32{1, 2}) {
		t.Fatalf("the anchor's partitions once HandBack returned: %v, want [1 2]", got)
	}
	h.flush()
	g, _ := h.e.Group("g")
	var left []string
	for _, m := range g.Members {
		left = append(left, m.MemberID)
	}
	slices.Sort(left)
	want := []string{rb.MemberID, rc.MemberID}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("members after the hand-back began: %v, want %v", left, want)
	}
	if code := h.heartbeat("g", ra.MemberID, ra.Generation); code != errUnknownMemberID {
		t.Fatalf("heartbeat of the replaced member: %v, want UNKNOWN_MEMBER_ID", kerr.ErrorForCode(code))
	}
	if code := h.heartbeat("g", rb.MemberID, ra.Generation); code != errRebalanceInProgress {
		t.Fatalf("heartbeat of the other static member: %v, want REBALANCE_IN_PROGRESS", kerr.ErrorForCode(code))
	}
}
