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

// OffsetStore is where committed offsets live. The engine validates every
// offset request (member, generation, state) and then calls the store; it
// answers the client only after the store returns. Calls are made from
// goroutines outside the engine's loops and may block; implementations are
// safe for concurrent use.
//
// The production store (KafkaStore) writes offsets to the upstream
// cluster's own __consumer_offsets as simple commits (generation -1, no
// member id), so existing lag tools still see them. MemoryStore is for
// tests.
type OffsetStore interface {
	// CommitOffsets durably stores offsets for group and returns the
	// per-partition result, in the shape of an OffsetCommit response.
	CommitOffsets(ctx context.Context, group string, topics []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error)
	// TxnCommitOffsets adds transactional offsets for group on behalf of
	// a transactional producer; they become visible when the transaction
	// commits.
	TxnCommitOffsets(ctx context.Context, req *kmsg.TxnOffsetCommitRequest) (*kmsg.TxnOffsetCommitResponse, error)
	// FetchOffsets returns the committed offsets of group. topics nil
	// means every partition with a committed offset. requireStable asks
	// for UNSTABLE_OFFSET_COMMIT on partitions with pending transactional
	// offsets.
	FetchOffsets(ctx context.Context, group string, topics []kmsg.OffsetFetchRequestTopic, requireStable bool) ([]kmsg.OffsetFetchResponseTopic, error)
	// DeleteOffsets removes the committed offsets of the given
	// partitions.
	DeleteOffsets(ctx context.Context, group string, topics []kmsg.OffsetDeleteRequestTopic) ([]kmsg.OffsetDeleteResponseTopic, error)
	// DeleteGroup removes every committed offset of group.
	DeleteGroup(ctx context.Context, group string) error
	// ListGroups lists the groups that have committed offsets in the
	// store (simple groups the engine has no state for).
	ListGroups(ctx context.Context) ([]string, error)
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
)

// Member describes a group member as events and snapshots report it.
type Member struct {
	MemberID   string
	InstanceID string // "" for dynamic members
	ClientID   string
	ClientHost string
	// Assignment is the member's assignment bytes for the current
	// generation, as the leader sent it (nil before sync).
	Assignment []byte
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
}

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
}

// TopicResolver is implemented by an OffsetStore that can translate
// between topic names and topic IDs. OffsetCommit v10, OffsetFetch v10 and
// TxnOffsetCommit v6 name topics by ID; the engine resolves them to names
// (the store and the ownership check work on names) and answers with IDs.
// With a store that does not implement it, topics named only by ID get
// UNKNOWN_TOPIC_ID.
type TopicResolver interface {
	// TopicNames maps topic IDs to names; unknown IDs are left out.
	TopicNames(ctx context.Context, ids [][16]byte) (map[[16]byte]string, error)
	// TopicIDs maps topic names to IDs; unknown names are left out.
	TopicIDs(ctx context.Context, names []string) (map[string][16]byte, error)
}

// GroupMetadataStore is implemented by an OffsetStore that can also
// persist classic group metadata, so that a restarted engine resumes every
// group where it was, without a rebalance (spec F). The record is opaque
// to the store: a versioned encoding owned by the engine. The engine
// calls these methods off its loops, at most one at a time per group id,
// in the order it issued them; the first call for a group id after the
// engine's start, or after an Engine.Unload of the group returned, is
// always a load. A store that does not implement it (or is wrapped by
// WithoutGroupMetadata) keeps no group metadata: a restart then forgets
// every member and the groups rebalance.
type GroupMetadataStore interface {
	// SaveGroupMetadata durably replaces the record of group; the engine
	// answers the clients waiting on it only after it returned nil.
	SaveGroupMetadata(ctx context.Context, group string, record []byte) error
	// DeleteGroupMetadata removes the record of group (a tombstone).
	DeleteGroupMetadata(ctx context.Context, group string) error
	// LoadGroupMetadata returns the last record saved for group, and
	// false if there is none (never saved, or deleted).
	LoadGroupMetadata(ctx context.Context, group string) (record []byte, found bool, err error)
}
