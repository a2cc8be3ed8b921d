// Package share holds the state machines of a share group (KIP-932) as
// pure values: one share-partition's record states (partition.go, as
// Kafka's kafka.server.share.SharePartition), the validation of
// acknowledgement batches (acks.go, as KafkaApis.validateAcknowledgementBatches),
// the "simple" assignor (assign.go, as Kafka's SimpleAssignor with its
// homogeneous and heterogeneous assignment builders), a share group's
// membership and epochs (group.go, as the share-group paths of Kafka's
// GroupMetadataManager) and share sessions (session.go, as Kafka's
// ShareSessionCache and SharePartitionManager.newContext).
//
// Nothing here starts a goroutine, does I/O or reads the clock: time is
// passed in, and every value is owned by its caller, which must serialise
// calls on it (the engine's owning loop). Errors that a client sees are
// returned as Kafka error codes; a Go error means malformed input.
package share
