package share

import (
	"fmt"
	"math/rand"
	"reflect"
	"testing"
)

func tid(b byte) [16]byte { return [16]byte{b} }

func tps(id byte, parts ...int32) []TopicPartition {
	var out []TopicPartition
	for _, p := range parts {
		out = append(out, TopicPartition{TopicID: tid(id), Partition: p})
	}
	return out
}

func TestAssignSimple(t *testing.T) {
	topics := map[string]Topic{"a": {ID: tid(1), Partitions: 4}}
	ms := []Member{{"m1", []string{"a"}}, {"m2", []string{"a"}}}
	got := Assign(ms, topics, nil)
	want := map[string][]TopicPartition{"m1": tps(1, 0, 2), "m2": tps(1, 1, 3)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v", got)
	}
	// A third member takes one partition from one of them; the rest stay.
	ms = append(ms, Member{"m3", []string{"a"}})
	got = Assign(ms, topics, want)
	if len(got["m3"]) != 1 || len(got["m1"])+len(got["m2"]) != 3 {
		t.Fatalf("got %v", got)
	}
	for _, m := range []string{"m1", "m2"} {
		for _, tp := range got[m] {
			if !contains(want[m], tp) {
				t.Fatalf("%s moved to %v: %v", m, tp, got)
			}
		}
	}
}

func TestAssignSharedWhenMoreMembers(t *testing.T) {
	topics := map[string]Topic{"a": {ID: tid(1), Partitions: 2}}
	var ms []Member
	for i := 0; i < 5; i++ {
		ms = append(ms, Member{fmt.Sprint("m", i), []string{"a"}})
	}
	got := Assign(ms, topics, nil)
	count := map[TopicPartition]int{}
	for _, a := range got {
		if len(a) < 1 || len(a) > 2 {
			t.Fatalf("unbalanced %v", got)
		}
		for _, tp := range a {
			count[tp]++
		}
	}
	// ⌈5/2⌉ = 3 members per partition.
	if count[tps(1, 0)[0]] != 3 || count[tps(1, 1)[0]] != 3 {
		t.Fatalf("sharing %v", count)
	}
}

func TestAssignHeterogeneous(t *testing.T) {
	topics := map[string]Topic{"a": {ID: tid(1), Partitions: 2}, "b": {ID: tid(2), Partitions: 3}}
	ms := []Member{{"x", []string{"a", "b"}}, {"y", []string{"b"}}, {"z", []string{"missing"}}}
	got := Assign(ms, topics, nil)
	if len(got["z"]) != 0 {
		t.Fatalf("z got %v", got["z"])
	}
	a, b := 0, 0
	for m, as := range got {
		for _, tp := range as {
			if tp.TopicID == tid(1) {
				a++
				if m != "x" {
					t.Fatalf("%s got topic a", m)
				}
			} else {
				b++
			}
		}
	}
	if a != 2 || b != 3 {
		t.Fatalf("got %v", got)
	}
}

func contains(s []TopicPartition, tp TopicPartition) bool {
	for _, x := range s {
		if x == tp {
			return true
		}
	}
	return false
}

// checkAssign verifies the homogeneous properties: each partition held
// by exactly ⌈M/P⌉ distinct members, sizes within one.
func checkAssign(t *testing.T, got map[string][]TopicPartition, m, p int) {
	t.Helper()
	if p == 0 {
		for id, a := range got {
			if len(a) != 0 {
				t.Fatalf("%s got %v with no partitions", id, a)
			}
		}
		return
	}
	sharing := (m + p - 1) / p
	count := map[TopicPartition]int{}
	lo, hi := 1<<30, -1
	for _, a := range got {
		seen := map[TopicPartition]bool{}
		for _, tp := range a {
			if seen[tp] {
				t.Fatalf("duplicate %v", tp)
			}
			seen[tp] = true
			count[tp]++
		}
		lo, hi = min(lo, len(a)), max(hi, len(a))
	}
	if hi-lo > 1 {
		t.Fatalf("sizes %d..%d: %v", lo, hi, got)
	}
	if len(count) != p {
		t.Fatalf("%d of %d partitions assigned", len(count), p)
	}
	for tp, c := range count {
		if c != sharing {
			t.Fatalf("%v held by %d, want %d", tp, c, sharing)
		}
	}
}

func FuzzAssign(f *testing.F) {
	f.Add(int64(1), uint8(3), uint8(7))
	f.Add(int64(2), uint8(9), uint8(2))
	f.Add(int64(3), uint8(4), uint8(4))
	f.Fuzz(func(t *testing.T, seed int64, nm, np uint8) {
		r := rand.New(rand.NewSource(seed))
		m := int(nm%24) + 1
		p := int(np % 40)
		// Split p partitions over up to three topics.
		topics := map[string]Topic{}
		names := []string{"a", "b", "c"}
		left := p
		for i, n := range names {
			k := left
			if i < 2 {
				k = r.Intn(left + 1)
			}
			topics[n] = Topic{ID: tid(byte(i + 1)), Partitions: int32(k)}
			left -= k
		}
		var ms []Member
		for i := 0; i < m; i++ {
			ms = append(ms, Member{fmt.Sprintf("m%02d", i), names})
		}
		// A random, possibly stale and unbalanced, current assignment.
		cur := map[string][]TopicPartition{}
		for _, mem := range ms {
			for k := r.Intn(5); k > 0; k-- {
				cur[mem.ID] = append(cur[mem.ID], TopicPartition{TopicID: tid(byte(r.Intn(4) + 1)), Partition: int32(r.Intn(20))})
			}
		}
		got := Assign(ms, topics, cur)
		checkAssign(t, got, m, p)
		// Deterministic, whatever the member order.
		rev := make([]Member, len(ms))
		for i := range ms {
			rev[i] = ms[len(ms)-1-i]
		}
		if again := Assign(rev, topics, cur); !reflect.DeepEqual(again, got) {
			t.Fatalf("not deterministic")
		}
		// A balanced assignment is kept as is.
		if again := Assign(ms, topics, got); !reflect.DeepEqual(again, got) {
			t.Fatalf("not sticky: %v -> %v", got, again)
		}
		// A member leaving: when members do not exceed partitions, every
		// remaining member keeps all it had (it may gain).
		if m > 1 && m <= p {
			rest := ms[1:]
			after := Assign(rest, topics, got)
			checkAssign(t, after, m-1, p)
			for _, mem := range rest {
				for _, tp := range got[mem.ID] {
					if !contains(after[mem.ID], tp) {
						t.Fatalf("%s lost %v when %s left", mem.ID, tp, ms[0].ID)
					}
				}
			}
		}
		// A member joining: when members do not exceed partitions, each
		// old member keeps at least the floor of the new fair share.
		if m+1 <= p {
			more := append(ms, Member{"zz", names})
			after := Assign(more, topics, got)
			checkAssign(t, after, m+1, p)
			for _, mem := range ms {
				kept := 0
				for _, tp := range after[mem.ID] {
					if contains(got[mem.ID], tp) {
						kept++
					}
				}
				if kept < min(len(got[mem.ID]), p/(m+1)) {
					t.Fatalf("%s kept %d of %v", mem.ID, kept, got[mem.ID])
				}
			}
		}
	})
}
