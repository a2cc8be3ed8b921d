// Package e2e holds kproxy's end-to-end tests: an in-memory cluster
// (kfake) behind kproxy, assembled in process by internal/kproxy as the
// command assembles it (or run as kproxy processes for the fleet), whose
// consumer groups are served by the coordinator engine, driven by real
// clients (franz-go, sarama, confluent-kafka-go). Every test checks the
// invariants: no record lost, no partition owned by two members at once,
// committed offsets survive rebalances and restarts, and the brokers
// never see a group request.
//
// Tests that measure or bound a duration run one at a time. Those that
// assert no timing call t.Parallel: Go runs them once every sequential
// test of the package is done, -parallel (GOMAXPROCS) at a time, so
// they never slow a timed test.
package e2e
