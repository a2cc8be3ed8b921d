package groupstate

import (
	"context"
	"strings"
	"testing"
)

// TestConsumerTakeoverKeepsEpochsAndAssignment: a KIP-848 group handed to
// the engine as the cluster held it (ConsumerTakeoverRecord, returned by
// its load) answers its members' heartbeats at the cluster's epoch with
// the cluster's assignment, even one the engine's own assignor would not
// have computed: nothing is revoked, no epoch moves, no rebalance starts.
func TestConsumerTakeoverKeepsEpochsAndAssignment(t *testing.T) {
	h, store := newMetaHarness(t, nil)
	store.SetTopic("t", 6)
	store.SetTopic("u", 2)
	c := &consumerHarness{h}
	c.refresh()
	tid, uid := c.topicID("t"), c.topicID("u")
	// Uneven on purpose: uniform would give 3 members 2-3 partitions each.
	tk := ConsumerTakeover{Epoch: 7, Assignor: AssignorUniform, Members: []ConsumerTakeoverMember{
		{ID: "m1", ClientID: "c1", Subscribed: []string{"t", "u"}, ServerAssignor: AssignorUniform, Assigned: map[[16]byte][]int32{tid: {0, 1, 2, 3}, uid: {0, 1}}},
		{ID: "m2", InstanceID: "i2", Subscribed: []string{"t"}, Assigned: map[[16]byte][]int32{tid: {4}}},
		{ID: "m3", Regex: "t", Assigned: map[[16]byte][]int32{tid: {5}}},
	}}
	rec, err := h.e.ConsumerTakeoverRecord(tk)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SaveGroupMetadata(context.Background(), "g", rec); err != nil {
		t.Fatal(err)
	}
	members := map[string]*client{}
	for _, m := range tk.Members {
		cl := &client{id: m.ID, epoch: 7, owned: partSet{}}
		for id, ps := range m.Assigned {
			for _, p := range ps {
				cl.owned.add(id, p)
			}
		}
		members[m.ID] = cl
	}
	for round := 0; round < 3; round++ {
		for _, id := range []string{"m1", "m2", "m3"} {
			cl := members[id]
			before := cl.owned.clone()
			c.beat("g", cl)
			if cl.epoch != 7 || !cl.owned.equal(before) {
				t.Fatalf("round %d: %s at epoch %d owns %v, had %v at 7", round, id, cl.epoch, cl.owned, before)
			}
		}
	}
	d := c.describe("g")
	if d.Epoch != 7 || d.AssignmentEpoch != 7 || d.State != "Stable" || len(d.Members) != 3 {
		t.Fatalf("taken-over group: %+v", d)
	}
	for _, k := range kinds(c.takeEvents("g")) {
		if strings.HasPrefix(k, "rebalance_started") {
			t.Fatalf("the taken-over group rebalanced: %s", k)
		}
	}
}

// TestConsumerTakeoverRecordRefusals: what the engine could not serve
// unchanged is refused, not approximated.
func TestConsumerTakeoverRecordRefusals(t *testing.T) {
	h, store := newMetaHarness(t, nil)
	store.SetTopic("t", 2)
	c := &consumerHarness{h}
	c.refresh()
	tid := c.topicID("t")
	var missing [16]byte
	missing[0] = 9
	for _, tc := range []struct {
		name string
		tk   ConsumerTakeover
		want string
	}{
		{"assignor", ConsumerTakeover{Epoch: 3, Assignor: "sticky", Members: []ConsumerTakeoverMember{{ID: "a"}}}, "assignor"},
		{"epoch", ConsumerTakeover{Epoch: 0, Assignor: AssignorRange, Members: []ConsumerTakeoverMember{{ID: "a"}}}, "epoch"},
		{"twice", ConsumerTakeover{Epoch: 3, Assignor: AssignorRange, Members: []ConsumerTakeoverMember{
			{ID: "a", Assigned: map[[16]byte][]int32{tid: {0}}}, {ID: "b", Assigned: map[[16]byte][]int32{tid: {0}}}}}, "assigned to"},
		{"partition", ConsumerTakeover{Epoch: 3, Assignor: AssignorRange, Members: []ConsumerTakeoverMember{
			{ID: "a", Assigned: map[[16]byte][]int32{tid: {2}}}}}, "not in the topic cache"},
		{"topic", ConsumerTakeover{Epoch: 3, Assignor: AssignorRange, Members: []ConsumerTakeoverMember{
			{ID: "a", Assigned: map[[16]byte][]int32{missing: {0}}}}}, "not in the topic cache"},
		{"repeated", ConsumerTakeover{Epoch: 3, Assignor: AssignorRange, Members: []ConsumerTakeoverMember{{ID: "a"}, {ID: "a"}}}, "repeated"},
	} {
		_, err := h.e.ConsumerTakeoverRecord(tc.tk)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one saying %q", tc.name, err, tc.want)
		}
	}
}
