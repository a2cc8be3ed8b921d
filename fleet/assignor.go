package fleet

import (
	"cmp"
	"slices"
)

// assignInput is one member of a generation as the leader sees it in the
// JoinGroup response: its member id and its decoded metadata. A member
// whose metadata could not be decoded is passed with a zero Meta: it may
// own nothing and claims nothing.
type assignInput struct {
	MemberID string
	Meta     memberMeta
}

// plan is what the assignor decided for one generation.
type plan struct {
	// Table is indexed by partition; a zero Owner means p has no owner
	// in this generation (in transition).
	Table []Owner
	// Target is the balanced sticky target, indexed by partition: the
	// member id p should end up with ("" when no member may own).
	// Table[p] equals Target[p] unless p waits for its current owner to
	// give it up.
	Target []string
	// Yours lists each member's own partitions, ascending; every member
	// of the input has an entry, possibly empty.
	Yours map[string][]int32
	// Contested lists the partitions more than one member claimed.
	Contested []int32
}

// assign is the fleet's sticky cooperative assignor (KIP-429's two-phase
// rule applied to the fleet's partitions). It is a pure function of the
// partition count, the generation being formed and the members' metadata.
//
//  1. Claims: each member's metadata says which partitions it holds now.
//     A partition claimed by exactly one member has that member as its
//     current owner. A partition claimed by two or more (which the
//     protocol never produces) trusts none of them: it is contested.
//  2. Target: a balanced sticky assignment over the members that may own
//     (Owner true). With n such members each gets P/n partitions and
//     P mod n of them one more, so counts differ by at most one. The extra
//     ones go to the members holding the most now (ties by kproxy id, then
//     member id), each member keeps as many of its current partitions as
//     its quota allows (lowest first), and what is left (unowned,
//     contested, over quota, held by a relay) fills the members below
//     quota one partition at a time, the member with the most room first,
//     then the one with the fewest, so fresh members interleave.
//  3. Assignment: a partition nobody holds goes straight to its target. A
//     partition whose current owner is its target stays. A partition whose
//     current owner is not its target, and a contested one, is assigned
//     to nobody in this generation: its holders see it missing, give it
//     up and rejoin at once, and the next generation, where nobody
//     claims it, hands it to its target. So a partition never has two
//     owners in one generation, nor one owner in a generation while its
//     previous owner still holds it.
//
// The owner entry of a kept partition keeps the generation since which
// its owner holds it; a newly given one gets gen.
func assign(partitions int32, gen int32, members []assignInput) plan {
	if partitions < 0 {
		partitions = 0
	}
	pl := plan{
		Table:  make([]Owner, partitions),
		Target: make([]string, partitions),
		Yours:  make(map[string][]int32, len(members)),
	}

	// Deterministic member order, whatever order the broker listed them.
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b assignInput) int {
		return cmp.Or(cmp.Compare(a.Meta.ID, b.Meta.ID), cmp.Compare(a.MemberID, b.MemberID))
	})
	for _, m := range ms {
		pl.Yours[m.MemberID] = []int32{}
	}

	// 1. Claims.
	claimant := make([]int, partitions) // member index, -1 none, -2 contested
	since := make([]int32, partitions)
	for p := range claimant {
		claimant[p] = -1
	}
	for i, m := range ms {
		seen := make(map[int32]bool, len(m.Meta.Owned))
		for _, o := range m.Meta.Owned {
			if o.P < 0 || o.P >= partitions || seen[o.P] {
				continue
			}
			seen[o.P] = true
			switch claimant[o.P] {
			case -1:
				claimant[o.P] = i
				since[o.P] = o.Gen
			case -2:
			default:
				claimant[o.P] = -2
			}
		}
	}
	for p, c := range claimant {
		if c == -2 {
			pl.Contested = append(pl.Contested, int32(p))
		}
	}

	// 2. Target.
	var eligible []int // indexes into ms
	for i, m := range ms {
		if m.Meta.Owner {
			eligible = append(eligible, i)
		}
	}
	target := make([]int, partitions)
	for p := range target {
		target[p] = -1
	}
	if n := int32(len(eligible)); n > 0 {
		current := make(map[int][]int32, n)
		for p, c := range claimant {
			if c >= 0 && ms[c].Meta.Owner {
				current[c] = append(current[c], int32(p))
			}
		}
		order := slices.Clone(eligible)
		slices.SortStableFunc(order, func(a, b int) int {
			return cmp.Compare(len(current[b]), len(current[a])) // most held first; ties keep id order
		})
		base, extra := partitions/n, partitions%n
		quota := make(map[int]int32, n)
		count := make(map[int]int32, n)
		for r, i := range order {
			quota[i] = base
			if int32(r) < extra {
				quota[i]++
			}
		}
		for _, i := range order {
			for _, p := range current[i] { // ascending
				if count[i] == quota[i] {
					break
				}
				target[p] = i
				count[i]++
			}
		}
		for p := range target {
			if target[p] != -1 {
				continue
			}
			best := -1
			for _, i := range order {
				if count[i] == quota[i] {
					continue
				}
				room, bestRoom := quota[i]-count[i], int32(0)
				if best >= 0 {
					bestRoom = quota[best] - count[best]
				}
				if best == -1 || room > bestRoom || (room == bestRoom && count[i] < count[best]) {
					best = i
				}
			}
			if best == -1 { // cannot happen: quotas sum to P
				break
			}
			target[p] = best
			count[best]++
		}
	}

	// 3. Assignment.
	for p := range partitions {
		t := target[p]
		if t >= 0 {
			pl.Target[p] = ms[t].MemberID
		}
		c := claimant[p]
		switch {
		case c == -2: // contested: nobody this generation
			continue
		case c >= 0 && c != t: // its holder must give it up first
			continue
		case t < 0: // nobody may own
			continue
		}
		g := gen
		if c == t {
			g = since[p]
		}
		m := ms[t]
		pl.Table[p] = Owner{ID: m.Meta.ID, MemberID: m.MemberID, Peer: m.Meta.Peer, Generation: g}
		pl.Yours[m.MemberID] = append(pl.Yours[m.MemberID], p)
	}
	return pl
}
