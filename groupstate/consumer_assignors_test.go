package groupstate

import (
	"fmt"
	"math/rand"
	"testing"
)

// tid makes a readable topic id for tests.
func tid(n byte) topicID { return topicID{0: n} }

// ps builds a partition set from (topic, partitions...) pairs.
func ps(t topicID, parts ...int32) partSet {
	out := partSet{}
	for _, p := range parts {
		out.add(t, p)
	}
	return out
}

// checkExactlyOnce asserts every partition of a topic some member
// subscribes to is assigned exactly once, and only to a subscriber.
func checkExactlyOnce(t *testing.T, members []assignMember, partitions map[topicID]int32, got map[string]partSet) {
	t.Helper()
	subs := make(map[string]map[topicID]bool)
	wanted := make(map[topicID]bool)
	for _, m := range members {
		subs[m.ID] = make(map[topicID]bool)
		for _, tp := range m.Topics {
			subs[m.ID][tp] = true
			if _, ok := partitions[tp]; ok {
				wanted[tp] = true
			}
		}
	}
	seen := make(map[tp]string)
	for id, set := range got {
		for topic, parts := range set {
			if !subs[id][topic] {
				t.Fatalf("member %s got topic %x it does not subscribe to", id, topic[:1])
			}
			for p := range parts {
				if p < 0 || p >= partitions[topic] {
					t.Fatalf("member %s got partition %d of a %d-partition topic", id, p, partitions[topic])
				}
				if o, dup := seen[tp{topic, p}]; dup {
					t.Fatalf("partition %x/%d assigned to both %s and %s", topic[:1], p, o, id)
				}
				seen[tp{topic, p}] = id
			}
		}
	}
	for topic := range wanted {
		for p := int32(0); p < partitions[topic]; p++ {
			if _, ok := seen[tp{topic, p}]; !ok {
				t.Fatalf("partition %x/%d not assigned", topic[:1], p)
			}
		}
	}
}

func TestAssignUniformTable(t *testing.T) {
	a, b := tid(1), tid(2)
	cases := []struct {
		name       string
		members    []assignMember
		partitions map[topicID]int32
		want       map[string]partSet
	}{
		{
			name:       "one member takes everything",
			members:    []assignMember{{ID: "m1", Topics: []topicID{a}}},
			partitions: map[topicID]int32{a: 3},
			want:       map[string]partSet{"m1": ps(a, 0, 1, 2)},
		},
		{
			name: "sticky: a new member takes only the surplus",
			members: []assignMember{
				{ID: "m1", Topics: []topicID{a}, Current: ps(a, 0, 1, 2, 3)},
				{ID: "m2", Topics: []topicID{a}},
			},
			partitions: map[topicID]int32{a: 4},
			want:       map[string]partSet{"m1": ps(a, 0, 1), "m2": ps(a, 2, 3)},
		},
		{
			name: "balance before stickiness",
			members: []assignMember{
				{ID: "m1", Topics: []topicID{a}, Current: ps(a, 0, 1, 2)},
				{ID: "m2", Topics: []topicID{a}, Current: ps(a)},
				{ID: "m3", Topics: []topicID{a}, Current: ps(a)},
			},
			partitions: map[topicID]int32{a: 3},
			want:       map[string]partSet{"m1": ps(a, 0), "m2": ps(a, 1), "m3": ps(a, 2)},
		},
		{
			name: "a leaving member's partitions go to those with room",
			members: []assignMember{
				{ID: "m1", Topics: []topicID{a}, Current: ps(a, 0, 1)},
				{ID: "m3", Topics: []topicID{a}, Current: ps(a, 4, 5)},
			},
			partitions: map[topicID]int32{a: 6},
			want:       map[string]partSet{"m1": ps(a, 0, 1, 2), "m3": ps(a, 4, 5, 3)},
		},
		{
			name: "mixed subscriptions balance per topic",
			members: []assignMember{
				{ID: "m1", Topics: []topicID{a}},
				{ID: "m2", Topics: []topicID{a, b}},
			},
			partitions: map[topicID]int32{a: 2, b: 2},
			want:       map[string]partSet{"m1": ps(a, 0), "m2": {a: {1: {}}, b: {0: {}, 1: {}}}},
		},
		{
			name:       "a missing topic is skipped",
			members:    []assignMember{{ID: "m1", Topics: []topicID{a, b}}},
			partitions: map[topicID]int32{a: 1},
			want:       map[string]partSet{"m1": ps(a, 0)},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := assignUniform(c.members, c.partitions)
			checkExactlyOnce(t, c.members, c.partitions, got)
			for id, w := range c.want {
				if !got[id].equal(w) {
					t.Fatalf("member %s: got %v, want %v", id, got[id], w)
				}
			}
		})
	}
}

func TestAssignRangeTable(t *testing.T) {
	a, b := tid(1), tid(2)
	cases := []struct {
		name       string
		members    []assignMember
		partitions map[topicID]int32
		want       map[string]partSet
	}{
		{
			name: "contiguous ranges, first gets the extra",
			members: []assignMember{
				{ID: "m2", Topics: []topicID{a}},
				{ID: "m1", Topics: []topicID{a}},
			},
			partitions: map[topicID]int32{a: 5},
			want:       map[string]partSet{"m1": ps(a, 0, 1, 2), "m2": ps(a, 3, 4)},
		},
		{
			name: "static members first by instance id",
			members: []assignMember{
				{ID: "a-dyn", Topics: []topicID{a}},
				{ID: "z", InstanceID: "i2", Topics: []topicID{a}},
				{ID: "y", InstanceID: "i1", Topics: []topicID{a}},
			},
			partitions: map[topicID]int32{a: 3},
			want:       map[string]partSet{"y": ps(a, 0), "z": ps(a, 1), "a-dyn": ps(a, 2)},
		},
		{
			name: "co-partitioned topics",
			members: []assignMember{
				{ID: "m1", Topics: []topicID{a, b}},
				{ID: "m2", Topics: []topicID{a, b}},
			},
			partitions: map[topicID]int32{a: 4, b: 4},
			want: map[string]partSet{
				"m1": {a: {0: {}, 1: {}}, b: {0: {}, 1: {}}},
				"m2": {a: {2: {}, 3: {}}, b: {2: {}, 3: {}}},
			},
		},
		{
			name: "no stickiness",
			members: []assignMember{
				{ID: "m1", Topics: []topicID{a}, Current: ps(a, 3)},
				{ID: "m2", Topics: []topicID{a}, Current: ps(a, 0)},
			},
			partitions: map[topicID]int32{a: 4},
			want:       map[string]partSet{"m1": ps(a, 0, 1), "m2": ps(a, 2, 3)},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := assignRange(c.members, c.partitions)
			checkExactlyOnce(t, c.members, c.partitions, got)
			for id, w := range c.want {
				if !got[id].equal(w) {
					t.Fatalf("member %s: got %v, want %v", id, got[id], w)
				}
			}
		})
	}
}

// TestAssignorsProperties checks, over random groups, that every
// partition goes to exactly one subscriber, that uniform with equal
// subscriptions balances within one, that range gives each subscriber
// ⌊P/n⌋ or ⌈P/n⌉ of every topic, and that uniform keeps every partition it
// can when nothing changes.
func TestAssignorsProperties(t *testing.T) {
	rng := rand.New(rand.NewSource(848))
	for iter := 0; iter < 500; iter++ {
		nTopics := 1 + rng.Intn(4)
		partitions := make(map[topicID]int32)
		var all []topicID
		for i := 0; i < nTopics; i++ {
			id := tid(byte(i + 1))
			partitions[id] = int32(rng.Intn(20))
			all = append(all, id)
		}
		nMembers := 1 + rng.Intn(8)
		equal := rng.Intn(2) == 0
		var members []assignMember
		for i := 0; i < nMembers; i++ {
			m := assignMember{ID: fmt.Sprintf("m%02d", rng.Intn(100)*10+i)}
			if rng.Intn(3) == 0 {
				m.InstanceID = fmt.Sprintf("inst-%d", i)
			}
			if equal {
				m.Topics = all
			} else {
				for _, id := range all {
					if rng.Intn(2) == 0 {
						m.Topics = append(m.Topics, id)
					}
				}
			}
			members = append(members, m)
		}
		// Random current assignments for stickiness, possibly stale.
		for i := range members {
			members[i].Current = partSet{}
			for _, id := range all {
				for p := int32(0); p < partitions[id]+2; p++ {
					if rng.Intn(nMembers+1) == 0 {
						members[i].Current.add(id, p)
					}
				}
			}
		}
		for name, fn := range assignors {
			got := fn(members, partitions)
			t.Run(fmt.Sprintf("%d/%s", iter, name), func(t *testing.T) {
				checkExactlyOnce(t, members, partitions, got)
			})
			if name == AssignorUniform && equal {
				lo, hi := 1<<30, -1
				for _, m := range members {
					n := got[m.ID].size()
					lo, hi = min(lo, n), max(hi, n)
				}
				if hi-lo > 1 {
					t.Fatalf("iteration %d: uniform unbalanced: sizes range %d..%d", iter, lo, hi)
				}
				// Stable input: re-running with the result as
				// current must change nothing.
				again := make([]assignMember, len(members))
				copy(again, members)
				for i := range again {
					again[i].Current = got[again[i].ID]
				}
				re := fn(again, partitions)
				for _, m := range members {
					if !re[m.ID].equal(got[m.ID]) {
						t.Fatalf("iteration %d: uniform not sticky for %s: %v then %v", iter, m.ID, got[m.ID], re[m.ID])
					}
				}
			}
			if name == AssignorRange {
				for topic, count := range partitions {
					var subs []string
					for _, m := range members {
						for _, x := range m.Topics {
							if x == topic {
								subs = append(subs, m.ID)
							}
						}
					}
					if len(subs) == 0 {
						continue
					}
					n := int32(len(subs))
					for _, id := range subs {
						k := int32(len(got[id][topic]))
						if k != count/n && k != count/n+1 {
							t.Fatalf("iteration %d: range gave %s %d of %d partitions for %d members", iter, id, k, count, n)
						}
					}
				}
			}
		}
	}
}
