package fleet

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// mem is a member with kproxy id id (member id id+"~"), holding owned
// since generation 1.
func mem(id string, owner bool, owned ...int32) assignInput {
	m := assignInput{MemberID: id + "~", Meta: memberMeta{V: 1, ID: id, Peer: id + ":9093", Owner: owner}}
	for _, p := range owned {
		m.Meta.Owned = append(m.Meta.Owned, ownedPart{P: p, Gen: 1})
	}
	return m
}

// checkPlan asserts the invariants every plan must hold.
func checkPlan(t *testing.T, P int32, in []assignInput, pl plan) {
	t.Helper()
	if len(pl.Table) != int(P) || len(pl.Target) != int(P) {
		t.Fatalf("table %d target %d entries, want %d", len(pl.Table), len(pl.Target), P)
	}
	seen := map[int32]string{}
	for id, ps := range pl.Yours {
		for _, p := range ps {
			if o, dup := seen[p]; dup {
				t.Fatalf("partition %d given to %s and %s", p, o, id)
			}
			seen[p] = id
			if pl.Table[p].MemberID != id {
				t.Fatalf("partition %d in %s's own list but table says %q", p, id, pl.Table[p].MemberID)
			}
		}
	}
	for p, o := range pl.Table {
		if !o.IsZero() && seen[int32(p)] != o.MemberID {
			t.Fatalf("table gives %d to %s, own lists do not", p, o.MemberID)
		}
		if !o.IsZero() && pl.Target[p] != o.MemberID {
			t.Fatalf("partition %d assigned to %s but targeted at %s", p, o.MemberID, pl.Target[p])
		}
	}
	// Never hand a partition to one member while another claims it.
	claims := map[int32][]string{}
	eligible := map[string]bool{}
	for _, m := range in {
		if m.Meta.Owner {
			eligible[m.MemberID] = true
		}
		for _, o := range m.Meta.Owned {
			if !slices.Contains(claims[o.P], m.MemberID) {
				claims[o.P] = append(claims[o.P], m.MemberID)
			}
		}
	}
	for p, o := range pl.Table {
		for _, c := range claims[int32(p)] {
			if !o.IsZero() && c != o.MemberID {
				t.Fatalf("partition %d assigned to %s while %s still claims it", p, o.MemberID, c)
			}
		}
	}
	// Target balanced over the eligible members, complete if any.
	counts := map[string]int{}
	for id := range eligible {
		counts[id] = 0
	}
	for p, id := range pl.Target {
		if id == "" {
			if len(eligible) > 0 {
				t.Fatalf("partition %d has no target with %d eligible members", p, len(eligible))
			}
			continue
		}
		if !eligible[id] {
			t.Fatalf("partition %d targeted at non-owner %s", p, id)
		}
		counts[id]++
	}
	lo, hi := int(P), 0
	for _, c := range counts {
		lo, hi = min(lo, c), max(hi, c)
	}
	if len(counts) > 0 && hi-lo > 1 {
		t.Fatalf("target unbalanced: %v", counts)
	}
}

func owners(pl plan) []string {
	out := make([]string, len(pl.Table))
	for p, o := range pl.Table {
		out[p] = o.ID
	}
	return out
}

func TestAssignTable(t *testing.T) {
	for _, tc := range []struct {
		name      string
		P         int32
		in        []assignInput
		want      []string // kproxy id per partition, "" none
		contested []int32
	}{
		{name: "no members", P: 3, in: nil, want: []string{"", "", ""}},
		{name: "only relays", P: 2, in: []assignInput{mem("r", false)}, want: []string{"", ""}},
		{
			name: "fresh three even", P: 6,
			in:   []assignInput{mem("c", true), mem("a", true), mem("b", true)},
			want: []string{"a", "b", "c", "a", "b", "c"},
		},
		{
			name: "fresh three uneven", P: 7,
			in:   []assignInput{mem("a", true), mem("b", true), mem("c", true)},
			want: []string{"a", "b", "c", "a", "b", "c", "a"},
		},
		{
			name: "sticky steady state", P: 6,
			in:   []assignInput{mem("a", true, 0, 1), mem("b", true, 2, 3), mem("c", true, 4, 5)},
			want: []string{"a", "a", "b", "b", "c", "c"},
		},
		{
			name: "sticky keeps an unusual layout that is balanced", P: 6,
			in:   []assignInput{mem("a", true, 5, 0), mem("b", true, 3, 1), mem("c", true, 4, 2)},
			want: []string{"a", "b", "c", "b", "c", "a"},
		},
		{
			name: "fourth member phase one: one partition leaves its owner, nobody gets it yet", P: 6,
			in:   []assignInput{mem("a", true, 0, 1), mem("b", true, 2, 3), mem("c", true, 4, 5), mem("d", true)},
			want: []string{"a", "a", "b", "b", "c", ""},
		},
		{
			name: "fourth member phase two: the given-up partition goes to the newcomer", P: 6,
			in:   []assignInput{mem("a", true, 0, 1), mem("b", true, 2, 3), mem("c", true, 4), mem("d", true)},
			want: []string{"a", "a", "b", "b", "c", "d"},
		},
		{
			name: "departed member's partitions go straight to the others", P: 6,
			in:   []assignInput{mem("a", true, 0, 1), mem("b", true, 2, 3)},
			want: []string{"a", "a", "b", "b", "a", "b"},
		},
		{
			name: "over quota keeps the lowest partitions", P: 4,
			in:   []assignInput{mem("a", true, 3, 2, 1, 0), mem("b", true)},
			want: []string{"a", "a", "", ""},
		},
		{
			name: "extra slot goes to the member holding most", P: 5,
			in:   []assignInput{mem("a", true, 0), mem("b", true, 1, 2, 3), mem("c", true, 4)},
			want: []string{"a", "b", "b", "", "c"},
		},
		{
			name: "more members than partitions", P: 2,
			in:   []assignInput{mem("a", true), mem("b", true), mem("c", true)},
			want: []string{"a", "b"},
		},
		{
			name: "more members than partitions, sticky", P: 2,
			in:   []assignInput{mem("a", true), mem("b", true), mem("c", true, 0)},
			want: []string{"c", "a"},
		},
		{
			name: "contested partition is assigned to nobody", P: 4,
			in:   []assignInput{mem("a", true, 0, 1), mem("b", true, 1, 2)},
			want: []string{"a", "", "b", "b"}, contested: []int32{1},
		},
		{
			name: "relay holding a partition must give it up", P: 4,
			in:   []assignInput{mem("a", true, 0), mem("r", false, 1)},
			want: []string{"a", "", "a", "a"},
		},
		{
			name: "relay gets nothing, owners share", P: 6,
			in:   []assignInput{mem("a", true), mem("r", false), mem("b", true)},
			want: []string{"a", "b", "a", "b", "a", "b"},
		},
		{
			name: "out of range and duplicate claims are ignored", P: 3,
			in: []assignInput{
				{MemberID: "a~", Meta: memberMeta{V: 1, ID: "a", Owner: true, Owned: []ownedPart{{P: 7, Gen: 1}, {P: -1}, {P: 0, Gen: 1}, {P: 0, Gen: 1}}}},
				mem("b", true),
			},
			want: []string{"a", "b", "a"},
		},
		{
			name: "undecodable member is a relay", P: 2,
			in:   []assignInput{{MemberID: "x~"}, mem("a", true)},
			want: []string{"a", "a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := assign(tc.P, 9, tc.in)
			checkPlan(t, tc.P, tc.in, pl)
			if got := owners(pl); !slices.Equal(got, tc.want) {
				t.Fatalf("owners %q, want %q", got, tc.want)
			}
			if !slices.Equal(pl.Contested, tc.contested) {
				t.Fatalf("contested %v, want %v", pl.Contested, tc.contested)
			}
		})
	}
}

func TestAssignGenerations(t *testing.T) {
	// Kept partitions keep the generation since which they are held; new
	// ones get the generation being formed.
	in := []assignInput{mem("a", true, 0), mem("b", true)}
	in[0].Meta.Owned[0].Gen = 4
	pl := assign(2, 9, in)
	if pl.Table[0].Generation != 4 || pl.Table[1].Generation != 9 {
		t.Fatalf("generations %d %d, want 4 9", pl.Table[0].Generation, pl.Table[1].Generation)
	}
	if pl.Table[0].Peer != "a:9093" || pl.Table[1].ID != "b" || pl.Table[1].MemberID != "b~" {
		t.Fatalf("owner entries %+v", pl.Table)
	}
}

// TestAssignConvergesWithoutOverlap simulates the fleet protocol over
// random joins and leaves: after each generation a member keeps what it
// was given, gains new partitions and gives up the rest, and rejoins if a
// claim was not granted. It checks that no partition is ever held by two
// members, that a moved partition spends a generation with nobody, and
// that each change settles into a complete, balanced table within two
// generations, moving no more partitions than balance needs.
func TestAssignConvergesWithoutOverlap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const P = 16
	type member struct {
		id    string
		owner bool
		held  map[int32]int32
	}
	var ms []*member
	next := 0
	gen := int32(0)
	round := func() (rejoin bool, pl plan) {
		gen++
		in := make([]assignInput, 0, len(ms))
		for _, m := range ms {
			a := assignInput{MemberID: m.id + "~", Meta: memberMeta{V: 1, ID: m.id, Owner: m.owner}}
			for _, p := range slices.Sorted(maps.Keys(m.held)) {
				a.Meta.Owned = append(a.Meta.Owned, ownedPart{P: p, Gen: m.held[p]})
			}
			in = append(in, a)
		}
		pl = assign(P, gen, in)
		checkPlan(t, P, in, pl)
		for _, m := range ms {
			yours := pl.Yours[m.id+"~"]
			for p := range m.held {
				if !slices.Contains(yours, p) {
					delete(m.held, p)
					rejoin = true
				}
			}
			for _, p := range yours {
				if _, ok := m.held[p]; !ok {
					m.held[p] = gen
				}
			}
		}
		// No partition held twice.
		seen := map[int32]string{}
		for _, m := range ms {
			for p := range m.held {
				if o, ok := seen[p]; ok {
					t.Fatalf("gen %d: partition %d held by %s and %s", gen, p, o, m.id)
				}
				seen[p] = m.id
			}
		}
		return rejoin, pl
	}
	for step := 0; step < 200; step++ {
		switch {
		case len(ms) == 0 || (len(ms) < 8 && rng.IntN(2) == 0):
			ms = append(ms, &member{id: fmt.Sprintf("k%03d", next), owner: rng.IntN(5) != 0, held: map[int32]int32{}})
			next++
		default:
			i := rng.IntN(len(ms))
			ms = append(ms[:i], ms[i+1:]...)
		}
		before := map[int32]string{}
		for _, m := range ms {
			for p := range m.held {
				before[p] = m.id
			}
		}
		var pl plan
		rounds := 0
		for {
			var rejoin bool
			rejoin, pl = round()
			rounds++
			if !rejoin {
				break
			}
			if rounds > 2 {
				t.Fatalf("step %d: not settled after %d generations", step, rounds)
			}
		}
		// Settled: complete if anyone may own, and only targets hold.
		nOwners := 0
		for _, m := range ms {
			if m.owner {
				nOwners++
			}
		}
		moved := 0
		for p, o := range pl.Table {
			if nOwners > 0 && o.IsZero() {
				t.Fatalf("step %d: partition %d unowned after settling", step, p)
			}
			if b, ok := before[int32(p)]; ok && b != o.ID {
				moved++
			}
		}
		// Minimal moves: a member over its quota gives up only the excess.
		if nOwners > 0 {
			hi := (P + nOwners - 1) / nOwners
			excess := 0
			counts := map[string]int{}
			for _, id := range before {
				counts[id]++
			}
			for _, m := range ms {
				if c := counts[m.id]; m.owner && c > hi {
					excess += c - hi
				} else if !m.owner {
					excess += c
				}
			}
			if moved > excess+nOwners { // +nOwners: which members get the extra slot may shift
				t.Fatalf("step %d: %d partitions moved, at most %d needed", step, moved, excess+nOwners)
			}
		}
	}
}
