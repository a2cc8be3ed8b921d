// Package groupstate is kproxy's embedded consumer-group coordinator: it
// serves the classic group protocol (JoinGroup, SyncGroup, Heartbeat,
// LeaveGroup), the offset APIs (OffsetCommit, OffsetFetch,
// TxnOffsetCommit, OffsetDelete) and group administration (DescribeGroups,
// ListGroups, DeleteGroups) at every version kmsg knows, with Apache
// Kafka's behaviour and error codes.
//
// Groups are sharded by hash(group id) over a fixed set of
// single-threaded loops; a loop owns its groups exclusively, so the state
// machines take no locks. A request becomes an event on the owning loop
// carrying its reply callback. A JoinGroup or SyncGroup that must wait is
// parked in the group and answered later by the loop; no goroutine ever
// blocks for it. Timers (session, rebalance, initial delay, pending sync,
// new member) post keyed events back to the loop, and a stale key is
// ignored. Time comes only from the injected Clock. Store calls run on
// their own goroutines, one at a time per group id in arrival order, and
// post their result back; a commit is acknowledged only after the store
// returned.
//
// With a store that implements GroupMetadataStore (groupstate/kafkastore: a
// compacted topic upstream; MemoryStore), each classic group's metadata
// is persisted as one record (classic_persist.go): when a join completes into
// Empty, on the leader's SyncGroup (answered once durable) and on a static
// member's replacement in Stable; a tombstone on delete or expiry. The
// first request for a group id after a start waits for its record to
// load; a loaded group with members is Stable at its stored generation,
// so a kproxy restart in steady state forces no rebalance.
//
// The KIP-848 consumer protocol (ConsumerGroupHeartbeat,
// ConsumerGroupDescribe) is served from the same loops (consumer_*.go and
// 68_/69_ files): member epochs, server-side assignors (uniform, range)
// and revoke-before-assign reconciliation as pure functions, subscriptions
// by name or RE2 regex resolved against the cluster's topics
// (TopicMetadataStore, refreshed every Config.TopicRefreshInterval so a
// partition-count change bumps the group epoch, and on demand when a
// member subscribes to a topic the cache does not know; a new regex is
// resolved after the heartbeat that brought it, as Kafka resolves regexes
// asynchronously), and persistence of the group as one record in
// the same slot (consumer_persist.go, written by the coalescing writer
// of record_writer.go, as share groups are). A classic and a KIP-848
// group never share an id: an empty group of one kind is replaced by
// the other. A non-empty
// classic group is converted online into a consumer group when the first
// KIP-848 member joins, its classic members keep working inside it
// through JoinGroup/SyncGroup/Heartbeat translated onto member epochs,
// and it converts back when the last KIP-848 member leaves or is
// replaced by a static classic member, as Config.ConsumerMigrationPolicy
// allows (consumer_migration.go).
//
// Every answer that grants partitions or moves a generation or epoch
// rides on a durable write: the leader's SyncGroup, a static member's
// replacement, OffsetCommit and every KIP-848 heartbeat that changed the
// group are answered only after the store call returned nil; when it
// failed they get the store error's code (storeErrorCode) and the
// group's state does not run ahead of the store.
//
// In a fleet of kproxies (docs/fleet.md) each group has one owner.
// Config.Owns gates every request on the loop that dispatches it: a
// group this engine does not own is answered NOT_COORDINATOR, and
// nothing is created or loaded for it. Engine.Unload drops the groups of
// a partition given up or lost without writing anything (unload.go); a
// later owner loads them from the store at their stored generation,
// without a rebalance. A store error saying that the writer was fenced
// answers NOT_COORDINATOR.
//
// Reply callbacks and the Events sink are called on a loop goroutine:
// they must not block, and must not call back into Engine.Group or
// Engine.Groups (which wait for the loops).
package groupstate
