package groupstate

import (
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestDescribeGroups(t *testing.T) {
	h := newHarness(t)
	ids, _ := h.stableGroup("g", 2)
	h.joinedGroup("c", 1)
	h.do(commitReq(8, "simple", "", -1, 0, 1))
	for _, version := range []int16{0, 3, 5, 6} {
		d := kmsg.NewPtrDescribeGroupsRequest()
		d.Version = version
		d.Groups = []string{"g", "c", "simple", "missing"}
		d.IncludeAuthorizedOperations = version >= 3
		r := h.do(d).(*kmsg.DescribeGroupsResponse)
		if len(r.Groups) != 4 {
			t.Fatalf("v%d: %d groups", version, len(r.Groups))
		}
		g, c, s, m := r.Groups[0], r.Groups[1], r.Groups[2], r.Groups[3]
		if g.State != "Stable" || g.Protocol != "range" || g.ProtocolType != "consumer" || len(g.Members) != 2 {
			t.Fatalf("v%d stable: %+v", version, g)
		}
		if g.Members[0].MemberID != ids[0] || len(g.Members[0].ProtocolMetadata) == 0 || len(g.Members[0].MemberAssignment) == 0 || g.Members[0].ClientID != "client" {
			t.Fatalf("v%d stable member: %+v", version, g.Members[0])
		}
		if c.State != "CompletingRebalance" || c.Protocol != "" || len(c.Members) != 1 || c.Members[0].ProtocolMetadata != nil {
			t.Fatalf("v%d completing: %+v", version, c)
		}
		if s.State != "Empty" || s.ErrorCode != 0 || s.ProtocolType != "" {
			t.Fatalf("v%d simple: %+v", version, s)
		}
		wantErr := int16(0)
		if version >= 6 {
			wantErr = errGroupIDNotFound
		}
		if m.State != "Dead" || m.ErrorCode != wantErr {
			t.Fatalf("v%d missing: %+v", version, m)
		}
		if version >= 3 && g.AuthorizedOperations != groupOperations {
			t.Fatalf("v%d authorized operations %d", version, g.AuthorizedOperations)
		}
	}
}

func TestListGroups(t *testing.T) {
	h := newHarness(t)
	h.stableGroup("stable", 1)
	h.joinedGroup("completing", 1)
	h.do(commitReq(8, "simple", "", -1, 0, 1))
	names := func(r *kmsg.ListGroupsResponse) []string {
		var out []string
		for _, g := range r.Groups {
			out = append(out, g.Group+"/"+g.GroupState+"/"+g.ProtocolType)
		}
		return out
	}
	for _, tc := range []struct {
		version int16
		states  []string
		types   []string
		want    []string
	}{
		{0, nil, nil, []string{"completing//consumer", "simple//", "stable//consumer"}},
		{4, nil, nil, []string{"completing/CompletingRebalance/consumer", "simple/Empty/", "stable/Stable/consumer"}},
		{4, []string{"stable", "EMPTY"}, nil, []string{"simple/Empty/", "stable/Stable/consumer"}},
		{5, nil, []string{"Classic"}, []string{"completing/CompletingRebalance/consumer", "simple/Empty/", "stable/Stable/consumer"}},
		{5, nil, []string{"consumer"}, nil},
	} {
		l := kmsg.NewPtrListGroupsRequest()
		l.Version, l.StatesFilter, l.TypesFilter = tc.version, tc.states, tc.types
		r := h.do(l).(*kmsg.ListGroupsResponse)
		got := names(r)
		if tc.version < 4 {
			// GroupState is not on the wire below v4, but the engine
			// fills it; compare names and types only.
			for i := range got {
				g := r.Groups[i]
				got[i] = g.Group + "//" + g.ProtocolType
			}
		}
		if r.ErrorCode != 0 || !slices.Equal(got, tc.want) {
			t.Errorf("v%d states %v types %v: %v, want %v", tc.version, tc.states, tc.types, got, tc.want)
		}
	}
}

func TestDeleteGroups(t *testing.T) {
	h := newHarness(t)
	ids, gen := h.stableGroup("busy", 1)
	h.do(commitReq(8, "busy", ids[0], gen, 0, 1))
	ids2, gen2 := h.stableGroup("idle", 1)
	h.do(commitReq(8, "idle", ids2[0], gen2, 0, 5))
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Group, lv.MemberID = "idle", ids2[0]
	h.do(lv)
	h.do(commitReq(8, "simple", "", -1, 0, 1))
	h.takeEvents("idle")

	d := kmsg.NewPtrDeleteGroupsRequest()
	d.Version = 2
	d.Groups = []string{"busy", "idle", "simple", "missing"}
	r := h.do(d).(*kmsg.DeleteGroupsResponse)
	want := []int16{errNonEmptyGroup, 0, 0, errGroupIDNotFound}
	for i, g := range r.Groups {
		if g.ErrorCode != want[i] {
			t.Errorf("%s: %s, want %s", g.Group, errName(g.ErrorCode), errName(want[i]))
		}
	}
	if _, ok := h.e.Group("idle"); ok {
		t.Fatal("deleted group still held")
	}
	if h.storedOffset("idle", 0) != -1 || h.storedOffset("simple", 0) != -1 || h.storedOffset("busy", 0) != 1 {
		t.Fatal("offsets not deleted as expected")
	}
	if evs := kinds(h.takeEvents("idle")); !slices.Equal(evs, []string{"group_deleted"}) {
		t.Fatalf("events %v", evs)
	}
}

func TestOffsetDelete(t *testing.T) {
	h := newHarness(t)
	// Members subscribe to "t"; offsets exist for "t" and "u".
	ids, gen := h.stableGroup("g", 1)
	for _, topic := range []string{"t", "u"} {
		r := commitReq(8, "g", ids[0], gen, 0, 3)
		r.Topics[0].Topic = topic
		if code := commitCode(t, h.do(r)); code != 0 {
			t.Fatal(errName(code))
		}
	}
	od := kmsg.NewPtrOffsetDeleteRequest()
	od.Group = "g"
	od.Topics = []kmsg.OffsetDeleteRequestTopic{
		{Topic: "t", Partitions: []kmsg.OffsetDeleteRequestTopicPartition{{Partition: 0}}},
		{Topic: "u", Partitions: []kmsg.OffsetDeleteRequestTopicPartition{{Partition: 0}}},
	}
	r := h.do(od).(*kmsg.OffsetDeleteResponse)
	if r.ErrorCode != 0 || r.Topics[0].Partitions[0].ErrorCode != errGroupSubscribedToTopic || r.Topics[1].Partitions[0].ErrorCode != 0 {
		t.Fatalf("offset delete: %+v", r)
	}
	if h.storedOffset("g", 0) != 3 {
		t.Fatal("subscribed offset deleted")
	}
	od.Group = "missing"
	if code := h.do(od).(*kmsg.OffsetDeleteResponse).ErrorCode; code != errGroupIDNotFound {
		t.Fatalf("missing group: %s", errName(code))
	}
	// A non-empty group of another protocol type cannot tell what it
	// reads.
	c, _ := h.joinNew(jr{group: "connect", ptype: "connect"})
	joinResp(t, c, 0)
	od.Group = "connect"
	if code := h.do(od).(*kmsg.OffsetDeleteResponse).ErrorCode; code != errNonEmptyGroup {
		t.Fatalf("connect group: %s", errName(code))
	}
}
