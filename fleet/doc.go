// Package fleet is the kproxy fleet member (docs/fleet.md, "Ownership"):
// every kproxy joins one upstream classic group (DefaultGroup, protocol
// type "kproxy") served by the brokers' own coordinator, and the group's
// assignment decides which kproxy owns which partition of the groups
// topic.
//
// The member loop (member.go) is written over kmsg (JoinGroup,
// SyncGroup, Heartbeat, LeaveGroup sent through a kgo.Client, which routes
// them to the group's coordinator) rather than kgo's consumer group,
// because the lease is measured from the send times of its own requests.
//
// # Assignment
//
// The leader runs a sticky cooperative assignor (assignor.go, KIP-429's
// two-phase rule): members say in their metadata what they hold; the
// target is balanced (counts differ by at most one) and sticky; a
// partition whose holder is not its target is assigned to nobody until
// the holder gave it up and rejoined, so no generation ever has two
// owners for a partition. Every member's assignment carries the whole
// table p → (kproxy id, member id, peer address, generation since which
// that owner holds p). The documents are versioned JSON (codec.go).
//
// # Lease
//
// A member owns its partitions only while
//
//	now < min(alive + SessionTimeout, stable + RebalanceTimeout) - LeaseMargin
//
// where alive is the send time of the last request whose answer shows the
// broker reset the member's session (a Heartbeat answered NONE or
// REBALANCE_IN_PROGRESS, a successful JoinGroup or SyncGroup) and stable
// the send time of the last one answered while the group was not
// preparing a rebalance (a Heartbeat answered NONE, a successful JoinGroup
// or SyncGroup). The broker expels a member a session after it received
// its last heartbeat, and completes a rebalance without a member that did
// not rejoin at the earliest a rebalance timeout after the rebalance began,
// which was after "stable"; so the lease of a paused or cut-off member
// runs out before anyone else can be given its partitions. Heartbeats go
// on from their own goroutine while the loop rejoins and while callbacks
// run. A watchdog calls for OnLost the moment the lease passes; Owns
// checks the lease itself on every call.
//
// # Callbacks and transitions
//
// After each SyncGroup: partitions held and still assigned are kept;
// newly assigned ones go to OnAssigned; held ones no longer assigned go to
// OnRevoked (Owns is false for them first) and the member rejoins at once,
// so the leader can give them to their target in the next generation. A
// heartbeat answered REBALANCE_IN_PROGRESS makes the member rejoin while
// keeping what it holds. UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION (outside a
// rejoin) or FENCED_INSTANCE_ID lose everything (OnLost) and the member
// rejoins with a fresh member id. Drop loses one partition and rejoins.
//
// Ownership of mutable state: Member's fields say who owns each (the loop
// goroutine, or Member.mu); Owns and LeaseValid read an immutable view
// swapped atomically.
package fleet
