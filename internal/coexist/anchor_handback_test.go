package coexist

import (
	"testing"
)

// TestHandsOverOnlyToStaticMembersMovedBack: the anchor joins to hand
// static members moved back their partitions only when the cluster's
// group holds nobody else: a member without an instance id (the
// cluster's own, or one of kproxy's already following) or a static
// member the engine freed nothing for would be assigned nothing by
// that join.
func TestHandsOverOnlyToStaticMembersMovedBack(t *testing.T) {
	freed := map[string]map[string][]int32{"s1": {"t": {0, 3}}}
	view := func(dynamic int, static ...string) memberView {
		v := memberView{dynamic: dynamic, others: dynamic + len(static), static: map[string]bool{}, anchored: true}
		for _, id := range static {
			v.static[id] = true
		}
		return v
	}
	for _, c := range []struct {
		name  string
		v     memberView
		freed map[string]map[string][]int32
		want  bool
	}{
		{"the member moved back alone", view(0, "s1"), freed, true},
		{"nothing freed", view(0, "s1"), nil, false},
		{"a dynamic member besides", view(1, "s1"), freed, false},
		{"another static member besides", view(0, "s1", "s2"), freed, false},
	} {
		if got := handsOver(c.v, c.freed); got != c.want {
			t.Errorf("%s: handsOver %v, want %v", c.name, got, c.want)
		}
	}
}
