package groupstate

import (
	"math/rand"
	"testing"
)

func TestReconcileTable(t *testing.T) {
	a := tid(1)
	none := func(topicID, int32) bool { return false }
	ownedBy := func(set partSet) func(topicID, int32) bool {
		return func(t topicID, p int32) bool { return set.has(t, p) }
	}
	cases := []struct {
		name   string
		cur    memberAssignment
		target partSet
		epoch  int32
		owned  partSet
		other  func(topicID, int32) bool
		want   memberAssignment
	}{
		{
			name:   "new member gets free partitions at the target epoch",
			cur:    memberAssignment{Epoch: 0, Assigned: partSet{}, Pending: partSet{}},
			target: ps(a, 0, 1), epoch: 1, owned: partSet{}, other: none,
			want: memberAssignment{State: memberStable, Epoch: 1, PreviousEpoch: 0, Assigned: ps(a, 0, 1), Pending: partSet{}},
		},
		{
			name:   "revoke before assign: epoch held while still owning",
			cur:    memberAssignment{Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0, 1), Pending: partSet{}},
			target: ps(a, 0, 2), epoch: 4, owned: ps(a, 0, 1), other: none,
			want: memberAssignment{State: memberUnrevoked, Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0), Pending: ps(a, 1)},
		},
		{
			name:   "null owned counts as still owning",
			cur:    memberAssignment{Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0, 1), Pending: partSet{}},
			target: ps(a, 0), epoch: 4, owned: nil, other: none,
			want: memberAssignment{State: memberUnrevoked, Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0), Pending: ps(a, 1)},
		},
		{
			name:   "still revoking stays put",
			cur:    memberAssignment{State: memberUnrevoked, Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0), Pending: ps(a, 1)},
			target: ps(a, 0, 2), epoch: 4, owned: ps(a, 0, 1), other: none,
			want: memberAssignment{State: memberUnrevoked, Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0), Pending: ps(a, 1)},
		},
		{
			name:   "revocation acknowledged: new partitions at the new epoch",
			cur:    memberAssignment{State: memberUnrevoked, Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0), Pending: ps(a, 1)},
			target: ps(a, 0, 2), epoch: 4, owned: ps(a, 0), other: none,
			want: memberAssignment{State: memberStable, Epoch: 4, PreviousEpoch: 3, Assigned: ps(a, 0, 2), Pending: partSet{}},
		},
		{
			name:   "partition still owned by another is withheld",
			cur:    memberAssignment{Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0), Pending: partSet{}},
			target: ps(a, 0, 1, 2), epoch: 4, owned: ps(a, 0), other: ownedBy(ps(a, 2)),
			want: memberAssignment{State: memberUnreleased, Epoch: 4, PreviousEpoch: 3, Assigned: ps(a, 0, 1), Pending: partSet{}},
		},
		{
			name:   "only withheld partitions: epoch advances, unreleased",
			cur:    memberAssignment{Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0), Pending: partSet{}},
			target: ps(a, 0, 2), epoch: 4, owned: ps(a, 0), other: ownedBy(ps(a, 2)),
			want: memberAssignment{State: memberUnreleased, Epoch: 4, PreviousEpoch: 3, Assigned: ps(a, 0), Pending: partSet{}},
		},
		{
			name:   "unreleased partitions freed later are assigned",
			cur:    memberAssignment{State: memberUnreleased, Epoch: 4, PreviousEpoch: 3, Assigned: ps(a, 0), Pending: partSet{}},
			target: ps(a, 0, 2), epoch: 4, owned: ps(a, 0), other: none,
			want: memberAssignment{State: memberStable, Epoch: 4, PreviousEpoch: 3, Assigned: ps(a, 0, 2), Pending: partSet{}},
		},
		{
			name:   "already revoked by the client: no revoking state",
			cur:    memberAssignment{Epoch: 3, PreviousEpoch: 2, Assigned: ps(a, 0, 1), Pending: partSet{}},
			target: ps(a, 0), epoch: 4, owned: ps(a, 0), other: none,
			want: memberAssignment{State: memberStable, Epoch: 4, PreviousEpoch: 3, Assigned: ps(a, 0), Pending: partSet{}},
		},
		{
			name:   "stable at the target epoch is unchanged",
			cur:    memberAssignment{State: memberStable, Epoch: 4, PreviousEpoch: 3, Assigned: ps(a, 0), Pending: partSet{}},
			target: ps(a, 0), epoch: 4, owned: ps(a, 0), other: none,
			want: memberAssignment{State: memberStable, Epoch: 4, PreviousEpoch: 3, Assigned: ps(a, 0), Pending: partSet{}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := reconcile(c.cur, c.target, c.epoch, c.owned, c.other)
			if got.State != c.want.State || got.Epoch != c.want.Epoch || got.PreviousEpoch != c.want.PreviousEpoch ||
				!got.Assigned.equal(c.want.Assigned) || !got.Pending.equal(c.want.Pending) {
				t.Fatalf("got %s epoch %d prev %d assigned %v pending %v; want %s epoch %d prev %d assigned %v pending %v",
					got.State, got.Epoch, got.PreviousEpoch, got.Assigned, got.Pending,
					c.want.State, c.want.Epoch, c.want.PreviousEpoch, c.want.Assigned, c.want.Pending)
			}
		})
	}
}

// TestReconcileNeverTwoOwners simulates a group converging on random
// targets with members heartbeating in random order, acknowledging
// revocations at random, and checks that no partition is ever held by
// two members and that every member ends at its target.
func TestReconcileNeverTwoOwners(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	a := tid(1)
	const parts = 12
	for iter := 0; iter < 200; iter++ {
		n := 2 + rng.Intn(4)
		ids := make([]string, n)
		cur := make([]memberAssignment, n)
		for i := range ids {
			ids[i] = string(rune('a' + i))
			cur[i] = memberAssignment{Assigned: partSet{}, Pending: partSet{}}
		}
		epoch := int32(0)
		for round := 0; round < 4; round++ {
			epoch++
			// A random but valid target: each partition to one member.
			target := make(map[string]partSet)
			for _, id := range ids {
				target[id] = partSet{}
			}
			for p := int32(0); p < parts; p++ {
				target[ids[rng.Intn(n)]].add(a, p)
			}
			for step := 0; step < 200; step++ {
				i := rng.Intn(n)
				owned := cur[i].Assigned.clone()
				if rng.Intn(2) == 0 { // not yet revoked
					for t, ps := range cur[i].Pending {
						for p := range ps {
							owned.add(t, p)
						}
					}
				}
				other := func(t topicID, p int32) bool {
					for j := range cur {
						if j != i && (cur[j].Assigned.has(t, p) || cur[j].Pending.has(t, p)) {
							return true
						}
					}
					return false
				}
				cur[i] = reconcile(cur[i], target[ids[i]], epoch, owned, other)
				holders := make(map[int32]int)
				for j := range cur {
					for _, set := range []partSet{cur[j].Assigned, cur[j].Pending} {
						for p := range set[a] {
							holders[p]++
							if holders[p] > 1 {
								t.Fatalf("iteration %d round %d: partition %d has two owners", iter, round, p)
							}
						}
					}
				}
			}
			for i := range cur {
				if cur[i].Epoch != epoch || !cur[i].Assigned.equal(target[ids[i]]) || cur[i].State != memberStable {
					t.Fatalf("iteration %d round %d: member %s did not converge: %s epoch %d", iter, round, ids[i], cur[i].State, cur[i].Epoch)
				}
			}
		}
	}
}
