// Package share holds the state machines of a share group (KIP-932) as
// pure values: one share-partition's record states (partition.go, as
// Kafka's kafka.server.share.SharePartition), the validation of
// acknowledgement batches (acks.go, as KafkaApis.validateAcknowledgementBatches),
// the "simple" assignor (assign.go, as Kafka's SimpleAssignor with its
// homogeneous and heterogeneous assignment builders), a share group's
// membership and epochs (group.go, as the share-group paths of Kafka's
// GroupMetadataManager and ShareGroupAssignmentBuilder) and share
// sessions (session.go, as Kafka's ShareSessionCache and
// SharePartitionManager.newContext). Kafka 4.4 is the reference.
//
// Nothing here starts a goroutine, does I/O or reads the clock: time is
// passed in, and every value is owned by its caller, which must serialise
// calls on it (the engine's owning loop). Errors that a client sees are
// returned as Kafka error codes; a Go error means malformed input.
//
// Where kproxy differs from Kafka, on purpose:
//   - A share-partition keeps its in-flight records as runs of offsets
//     with equal state, count, owner and lock deadline, split on demand
//     and merged back, instead of fetched batches with optional
//     per-offset maps; memory follows the number of distinct runs.
//   - Acquire is told the offset the fetch started at, because the
//     record bytes are fetched apart from the state (by the member's own
//     kproxy). Offsets of the fetched span that hold no deliverable
//     record (compaction holes, control batches, aborted batches under
//     read_committed) are archived at once instead of being acquired and
//     acknowledged as GAP by the client; the client sees the same records.
//   - Kafka 4.4 shrinks redeliveries of records near the delivery limit
//     by the size of the cached batch; kproxy uses the fetched batch.
package share
