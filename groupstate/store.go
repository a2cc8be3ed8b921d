package groupstate

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// This file is the engine's contract with its stores: where offsets and
// group metadata live and how topics are resolved. MemoryStore
// (memstore.go) implements all of it in memory; package
// groupstate/kafkastore implements it over the upstream cluster.

// OffsetStore is where committed offsets live. The engine validates every
// offset request (member, generation, state) and then calls the store; it
// answers the client only after the store returns. Calls are made from
// goroutines outside the engine's loops and may block; implementations are
// safe for concurrent use.
//
// The production store (package groupstate/kafkastore) writes offsets
// to the upstream cluster's own __consumer_offsets as simple commits (generation -1, no
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
// group where it was, without a rebalance (as Kafka's coordinator does
// after failover, from __consumer_offsets). The record is opaque
// to the store: a versioned encoding owned by the engine. The engine
// calls these methods off its loops, at most one at a time per group id,
// in the order it issued them; the first call for a group id after the
// engine's start, or after an Engine.Unload of the group returned, is
// always a load. A store that does not implement it
// (or is wrapped by WithoutGroupMetadata) keeps no group metadata: a
// restart then forgets every member and the groups rebalance.
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

// TopicInfo describes one topic of the cluster, as KIP-848 assignment
// needs it.
type TopicInfo struct {
	ID         [16]byte
	Partitions int32
}

// EndOffsetStore is implemented by an OffsetStore that can read the
// end (high watermark) of the cluster's partitions: a share group's lag
// (DescribeShareGroupOffsets v1, KIP-1226) is measured to it. With a
// store that does not implement it, lags are answered -1 (unknown).
type EndOffsetStore interface {
	// EndOffsets returns the end offset of each of the partitions of
	// each topic asked for; a partition it could not read is absent.
	EndOffsets(ctx context.Context, topics map[string][]int32) (map[string]map[int32]int64, error)
}

// TopicMetadataStore is implemented by an OffsetStore that can list the
// cluster's topics. KIP-848 groups (ConsumerGroupHeartbeat) resolve their
// subscriptions (names and regular expressions) and partition counts
// through it; the engine caches the answer and refreshes it every
// Config.TopicRefreshInterval, so a partition-count change bumps the
// epoch of the groups subscribed to the topic, and when a heartbeat
// subscribes to a topic the cache does not know (consumer_topics.go). It
// must be safe for concurrent use with the store's other methods; the
// engine runs one TopicMetadata at a time. With a store that does not
// implement it, every subscribed topic counts as missing and KIP-848
// members get empty assignments.
type TopicMetadataStore interface {
	// TopicMetadata returns every (non-internal) topic by name.
	TopicMetadata(ctx context.Context) (map[string]TopicInfo, error)
}
