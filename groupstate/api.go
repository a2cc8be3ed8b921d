package groupstate

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// This file is the engine's contract with the rest of kproxy: the proxy
// hands it decoded requests, the store persists offsets, and tap reads the
// events and snapshots it publishes. The state machines behind it live in
// the other files of this package.

// RequestContext describes the connection a request arrived on. The engine
// records it on members (DescribeGroups reports client id and host).
type RequestContext struct {
	ClientID   string // from the request header
	ClientHost string // the peer's IP address, without port
}

// Clock is the engine's only source of time. Tests inject a fake one so
// that every timeout can be driven deterministically.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed. The
	// engine never mutates state from f: it posts an event to the loop
	// that owns the group.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether
	// it did so.
	Stop() bool
}

// EventKind says what happened in an Event.
type EventKind uint8

const (
	EventGroupCreated     EventKind = iota + 1 // a group came into existence
	EventMemberJoined                          // a member was added to the group
	EventMemberLeft                            // a member left with LeaveGroup
	EventMemberExpired                         // a member's session (or join/sync) timer fired
	EventMemberFenced                          // a static member was replaced by a newer instance
	EventRebalanceStarted                      // the group entered PreparingRebalance; Cause says why
	EventJoinCompleted                         // join phase done: new generation, leader chosen
	EventSyncCompleted                         // sync phase done: assignments delivered, group Stable
	EventRebalanceAborted                      // the rebalance ended without reaching Stable
	EventGroupEmpty                            // the last member left
	EventGroupDeleted                          // DeleteGroups removed the group
	EventOffsetsCommitted                      // an OffsetCommit was stored
	EventGroupLoaded                           // the group's persisted metadata was loaded after a start
	// EventAssignmentReconciled: every member of a KIP-848 group holds
	// its target assignment at the assignment epoch (Generation is the
	// group epoch, Members carry their assignments).
	EventAssignmentReconciled
	// EventGroupUnloaded: the engine dropped the group's state without
	// writing anything, and a later request loads it from the store
	// again. Cause is CauseUnloaded (Engine.Unload: ownership moved to
	// another kproxy) or CauseStoreError (a write a reply waited for
	// failed: the state must not run ahead of the store). State is the
	// state the group was in; Members lists its members. A rebalance in
	// progress ends here (its parked requests were answered).
	EventGroupUnloaded
	// EventGroupConverted: the group changed protocol online (KIP-848's
	// migration). Cause is CauseConvertedToConsumer (a
	// ConsumerGroupHeartbeat joined a classic group: it is now a
	// consumer group whose classic members keep working) or
	// CauseConvertedToClassic (the last KIP-848 member left or was
	// fenced: the group is a classic group again and rebalances).
	// Member is the member whose join or departure converted it (only
	// its MemberID is known for an upgrade); Members lists the members
	// of the group as converted, each with its Protocol. State,
	// Generation and ProtocolType describe the new group.
	EventGroupConverted
	// EventMemberReconciling: a KIP-848 member's assignment changed on
	// one of its heartbeats (it was asked to revoke partitions, it
	// finished revoking, or it was given partitions). Member carries
	// the member's epoch, state, assignment and the partitions it must
	// still revoke; Generation is the group epoch.
	EventMemberReconciling
)

// String returns the kind's snake_case name, used in logs, metrics and JSON.
func (k EventKind) String() string {
	switch k {
	case EventGroupCreated:
		return "group_created"
	case EventMemberJoined:
		return "member_joined"
	case EventMemberLeft:
		return "member_left"
	case EventMemberExpired:
		return "member_expired"
	case EventMemberFenced:
		return "member_fenced"
	case EventRebalanceStarted:
		return "rebalance_started"
	case EventJoinCompleted:
		return "join_completed"
	case EventSyncCompleted:
		return "sync_completed"
	case EventRebalanceAborted:
		return "rebalance_aborted"
	case EventGroupEmpty:
		return "group_empty"
	case EventGroupDeleted:
		return "group_deleted"
	case EventOffsetsCommitted:
		return "offsets_committed"
	case EventGroupLoaded:
		return "group_loaded"
	case EventAssignmentReconciled:
		return "assignment_reconciled"
	case EventGroupUnloaded:
		return "group_unloaded"
	case EventGroupConverted:
		return "group_converted"
	case EventMemberReconciling:
		return "member_reconciling"
	}
	return "unknown"
}

// Causes, carried by EventRebalanceStarted and EventGroupUnloaded.
const (
	CauseMemberJoined         = "member_joined"          // a new member joined
	CauseMemberLeft           = "member_left"            // a member sent LeaveGroup
	CauseMemberExpired        = "member_expired"         // a member's session timed out
	CauseMetadataChanged      = "metadata_changed"       // a member rejoined with different protocols or metadata
	CauseLeaderRejoined       = "leader_rejoined"        // the leader rejoined while Stable
	CauseSyncTimeout          = "sync_timeout"           // members never sent SyncGroup
	CauseStaticMemberReplaced = "static_member_replaced" // a static member's new instance forced a rebalance
	CauseStoreError           = "store_error"            // the group's metadata could not be persisted (a rebalance on the leader's SyncGroup, or EventGroupUnloaded)
	CauseSubscriptionChanged  = "subscription_changed"   // a KIP-848 member changed its subscription or assignor
	CauseTopicsChanged        = "topics_changed"         // a subscribed topic was created, deleted or resized (KIP-848)
	CauseUnloaded             = "unloaded"               // Engine.Unload dropped the group (EventGroupUnloaded)
	CauseHandedBack           = "handed_back"            // the group is being handed back to the cluster's coordinator (Engine.HandBack)
	// CauseConvertedToConsumer and CauseConvertedToClassic are carried
	// by EventGroupConverted; CauseConvertedToClassic also by the
	// classic rebalance that follows a downgrade (EventRebalanceStarted).
	CauseConvertedToConsumer = "converted_to_consumer" // a classic group became a consumer group (online upgrade)
	CauseConvertedToClassic  = "converted_to_classic"  // a consumer group became a classic group (online downgrade)
)

// Member describes a group member as events and snapshots report it.
type Member struct {
	MemberID   string
	InstanceID string // "" for dynamic members
	ClientID   string
	ClientHost string
	// Protocol is the protocol the member speaks: MemberProtocolClassic
	// (JoinGroup/SyncGroup/Heartbeat) or MemberProtocolConsumer
	// (KIP-848's ConsumerGroupHeartbeat). A consumer group that was
	// upgraded online holds both kinds.
	Protocol string
	// Assignment is the member's assignment bytes for the current
	// generation, as the leader sent it (nil before sync).
	Assignment []byte
	// JoinedAt is, in EventJoinCompleted, when the member's JoinGroup
	// of this rebalance arrived (zero for a static member that did not
	// rejoin).
	JoinedAt time.Time
	// AskedAt is, in EventJoinCompleted, when the member was first told
	// to rejoin in this rebalance (its Heartbeat or SyncGroup answered
	// REBALANCE_IN_PROGRESS); zero if it rejoined unasked (the member
	// that caused the rebalance, or one whose heartbeat had not come).
	AskedAt time.Time
	// SyncedAt is, in EventSyncCompleted, when the member's SyncGroup of
	// the new generation arrived (zero if it had not yet).
	SyncedAt time.Time
	// Epoch, State and Revoking are set in EventMemberReconciling: the
	// member epoch, the member's reconciliation state as Kafka names it
	// (STABLE, UNREVOKED_PARTITIONS, UNRELEASED_PARTITIONS) and the
	// partitions it must still revoke, encoded as Assignment is.
	Epoch    int32
	State    string
	Revoking []byte
}

// Event is one state change in the engine. Events are delivered in order
// per group, from the goroutine of the loop that owns the group; the sink
// must not block (buffer or drop).
type Event struct {
	Time         time.Time
	Kind         EventKind
	Group        string
	Generation   int32  // the group's generation after the change
	State        string // the group's state after the change
	ProtocolType string
	Protocol     string // the selected protocol, once chosen
	Leader       string // leader member id, once chosen
	// Cause is set for EventRebalanceStarted (one of the Cause
	// constants) and for EventMemberExpired ("session_timeout",
	// "join_timeout", "sync_timeout", "new_member_timeout"). For
	// EventMemberLeft it is the client's reason (LeaveGroup v5+) or
	// "group_max_size" when a rejoin was refused by the size limit.
	Cause string
	// Member is the member the event is about (joined, left, expired,
	// fenced) or, for EventRebalanceStarted, the member that caused it
	// when there is one.
	Member *Member
	// Members lists the members for EventJoinCompleted and
	// EventSyncCompleted (with assignments on sync).
	Members []Member
	// Offsets is the number of partitions committed, for
	// EventOffsetsCommitted.
	Offsets int
	// InitialDelay is, for EventRebalanceStarted of a group leaving
	// Empty, the initial rebalance delay its join phase waits at least
	// (group.initial.rebalance.delay.ms; each new member extends it, up
	// to the rebalance timeout); zero otherwise.
	InitialDelay time.Duration
	// HeartbeatInterval is, for a consumer (KIP-848) group, the
	// interval its members heartbeat at: a member learns of a new
	// target, and reports revoking, only at a heartbeat.
	HeartbeatInterval time.Duration
	// GroupType is the kind of group: GroupTypeClassic (JoinGroup and
	// SyncGroup), GroupTypeConsumer (KIP-848) or GroupTypeShare
	// (KIP-932); empty for an offset
	// commit of a group kproxy holds no state for.
	GroupType string
}

// Group types, in Event.GroupType.
const (
	GroupTypeClassic  = "classic"
	GroupTypeConsumer = "consumer"
	// GroupTypeShare is a share group (KIP-932): its EventRebalanceStarted
	// marks a group epoch bump, its EventAssignmentReconciled the target
	// assignment computed for that epoch (members move to it at their
	// next heartbeat, with no revocation phase).
	GroupTypeShare = "share"
)

// GroupSnapshot is a consistent copy of one group's state, taken on the
// loop that owns it.
type GroupSnapshot struct {
	Group        string
	State        string
	ProtocolType string
	Protocol     string
	Generation   int32
	Leader       string
	Members      []Member
	// StateSince is when the group entered its current state.
	StateSince time.Time
	// Kind is the kind of group (KindClassic, KindConsumer, KindShare),
	// set by Engine.Groups and Engine.Group.
	Kind GroupKind
}

// ClusterGroups is the view of a cluster that has groups of its own
// (Config.ClusterGroups; internal/coexist implements it over the
// cluster): groups its own coordinator serves (an application still
// direct, or only partly behind kproxy, docs/anchors.md), share or
// streams groups, groups of other tools. Through it, ListGroups,
// DescribeGroups and ConsumerGroupDescribe answer for a group the engine
// does not hold as the brokers do directly, instead of as an empty
// simple group: kafka-consumer-groups --list and --describe --all-groups
// through kproxy see what they see against the brokers. The engine's own
// answer stands for every group it holds: a group kproxy serves is
// anchored under the same id (the anchor is a member of the cluster's
// group, never a group of its own), so the cluster's view of it, which
// shows the anchor as its one member, is never used. Without it, a
// group only the store knows is a simple group, protocol type "", state
// Empty.
//
// The methods are called off the engine's loops and may block; they are
// safe for concurrent use.
type ClusterGroups interface {
	// ListClusterGroups lists every group of the cluster (every broker
	// asked) with its protocol type, state and type (GroupType
	// "classic" from a cluster that predates group types), except
	// kproxy's own fleet group. On an error the groups of the brokers
	// that answered are still returned.
	ListClusterGroups(ctx context.Context) ([]kmsg.ListGroupsResponseGroup, error)
	// DescribeClusterGroups describes groups as the cluster does
	// (DescribeGroups, at the newest version both sides speak, each
	// group asked of its coordinator), one entry per distinct id in
	// order; a group that could not be asked carries the error code in
	// its entry, and the error returned (for logs) says why.
	// includeOps is the request's IncludeAuthorizedOperations.
	DescribeClusterGroups(ctx context.Context, groups []string, includeOps bool) ([]kmsg.DescribeGroupsResponseGroup, error)
	// DescribeClusterConsumerGroups is DescribeClusterGroups for
	// ConsumerGroupDescribe (KIP-848 groups). A cluster without the API
	// has no such groups: every entry is GROUP_ID_NOT_FOUND.
	DescribeClusterConsumerGroups(ctx context.Context, groups []string, includeOps bool) ([]kmsg.ConsumerGroupDescribeResponseGroup, error)
}
