package groupstate

import "fmt"

// This file holds KIP-848 reconciliation (after Kafka's
// CurrentAssignmentBuilder) as a pure function.

// memberState is a KIP-848 member's reconciliation state.
type memberState uint8

const (
	// memberStable: the member holds its whole target at its epoch.
	memberStable memberState = iota
	// memberUnrevoked: the member must first give up the partitions
	// pending revocation; its epoch is not advanced until it has.
	memberUnrevoked
	// memberUnreleased: the member is at the target epoch but some of
	// its target partitions are still owned by others.
	memberUnreleased
)

// String returns the state's name as Kafka spells it.
func (s memberState) String() string {
	switch s {
	case memberStable:
		return "STABLE"
	case memberUnrevoked:
		return "UNREVOKED_PARTITIONS"
	case memberUnreleased:
		return "UNRELEASED_PARTITIONS"
	}
	return fmt.Sprintf("memberState(%d)", uint8(s))
}

// memberAssignment is a member's current assignment as reconciliation
// sees it.
type memberAssignment struct {
	State         memberState
	Epoch         int32
	PreviousEpoch int32
	Assigned      partSet // owned and acknowledged partitions
	Pending       partSet // partitions the member must revoke
}

// reconcile computes a member's next assignment toward target (of
// targetEpoch). owned is what the member reported owning (nil: unchanged
// since its last heartbeat, which counts as still owning everything);
// ownedByOther reports whether another member of the group still holds a
// partition (assigned or pending revocation). The result never gives the
// member a partition another member holds, and never advances the epoch
// while partitions remain to revoke.
func reconcile(cur memberAssignment, target partSet, targetEpoch int32, owned partSet, ownedByOther func(topicID, int32) bool) memberAssignment {
	if cur.State == memberUnrevoked {
		if ownsAny(owned, cur.Pending) {
			return cur
		}
		// The revocation is done: continue from the kept partitions.
		cur.Pending = partSet{}
	} else if cur.State == memberStable && cur.Epoch == targetEpoch {
		return cur
	}
	kept, toRevoke, toAssign := partSet{}, partSet{}, partSet{}
	withheld := false
	for t, ps := range cur.Assigned {
		for p := range ps {
			if target.has(t, p) {
				kept.add(t, p)
			} else {
				toRevoke.add(t, p)
			}
		}
	}
	for t, ps := range target {
		for p := range ps {
			if kept.has(t, p) {
				continue
			}
			if ownedByOther(t, p) {
				withheld = true
				continue
			}
			toAssign.add(t, p)
		}
	}
	next := memberAssignment{PreviousEpoch: cur.Epoch, Pending: partSet{}}
	switch {
	case toRevoke.size() > 0 && ownsAny(owned, toRevoke):
		next.State, next.Epoch, next.PreviousEpoch = memberUnrevoked, cur.Epoch, cur.PreviousEpoch
		next.Assigned, next.Pending = kept, toRevoke
	case toAssign.size() > 0:
		for t, ps := range toAssign {
			for p := range ps {
				kept.add(t, p)
			}
		}
		next.State, next.Epoch, next.Assigned = memberStable, targetEpoch, kept
		if withheld {
			next.State = memberUnreleased
		}
	case withheld:
		next.State, next.Epoch, next.Assigned = memberUnreleased, targetEpoch, kept
	default:
		next.State, next.Epoch, next.Assigned = memberStable, targetEpoch, kept
	}
	if next.Epoch == cur.Epoch {
		next.PreviousEpoch = cur.PreviousEpoch
	}
	return next
}

// ownsAny reports whether owned holds any partition of ps; a nil owned
// (not reported) counts as owning everything.
func ownsAny(owned, ps partSet) bool {
	if ps.size() == 0 {
		return false
	}
	if owned == nil {
		return true
	}
	for t, m := range ps {
		for p := range m {
			if owned.has(t, p) {
				return true
			}
		}
	}
	return false
}
