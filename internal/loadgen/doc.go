// Package loadgen drives Kafka requests for kproxy's benchmarks: the e2e
// coordinator benchmark and kbench's groups and latency modes share it.
//
// A Doer sends one request and calls back with its answer. Three kinds
// exist: Conn, one raw TCP (or TLS) connection on which any number of
// goroutines pipeline requests, each under a correlation id of its own,
// so that many group members share a few connections as a multiplexing
// client would; KgoDoer, a franz-go client (one member per client, with
// the connections a real member holds); and, in kbench, the engine
// itself, with no wire at all.
//
// Settle brings groups of classic members (JoinGroup, SyncGroup,
// Heartbeat, KIP-394 member ids) to one synced generation each;
// StartHeartbeats keeps one heartbeat in flight per member, sending the
// next from the callback of the last, so no goroutine per member runs
// while it does.
package loadgen
