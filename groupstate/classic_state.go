package groupstate

import "fmt"

// classicGroupState is the state of a classic group (Kafka's ClassicGroupState).
type classicGroupState uint8

const (
	// stateEmpty: no members; offsets may still exist.
	stateEmpty classicGroupState = iota
	// statePreparingRebalance: members are (re)joining; JoinGroups park.
	statePreparingRebalance
	// stateCompletingRebalance: joins answered; waiting for the leader's
	// SyncGroup, followers' SyncGroups park.
	stateCompletingRebalance
	// stateStable: assignments delivered; heartbeats answer NONE.
	stateStable
	// stateDead: the group was deleted or the engine is closing.
	stateDead
)

// String returns the state's name as Kafka spells it in DescribeGroups and
// ListGroups.
func (s classicGroupState) String() string {
	switch s {
	case stateEmpty:
		return "Empty"
	case statePreparingRebalance:
		return "PreparingRebalance"
	case stateCompletingRebalance:
		return "CompletingRebalance"
	case stateStable:
		return "Stable"
	case stateDead:
		return "Dead"
	}
	return fmt.Sprintf("classicGroupState(%d)", uint8(s))
}

// validPrevious lists, for each state, the states it may be entered from.
var validPrevious = map[classicGroupState][]classicGroupState{
	stateEmpty:               {statePreparingRebalance},
	statePreparingRebalance:  {stateStable, stateCompletingRebalance, stateEmpty},
	stateCompletingRebalance: {statePreparingRebalance},
	stateStable:              {stateCompletingRebalance},
	stateDead:                {stateEmpty, statePreparingRebalance, stateCompletingRebalance, stateStable, stateDead},
}

// canTransition reports whether from → to is legal.
func canTransition(from, to classicGroupState) bool {
	for _, p := range validPrevious[to] {
		if p == from {
			return true
		}
	}
	return false
}

// canRebalance reports whether a rebalance may start from s.
func (s classicGroupState) canRebalance() bool {
	return s == stateStable || s == stateCompletingRebalance || s == stateEmpty
}
