// Package groupconfig reads the group configuration kproxy takes from the
// cluster behind it, so that a group behaves through kproxy as on the
// cluster:
//
//   - the broker-level group settings (the group.* configs of Kafka's
//     GroupCoordinatorConfig, DescribeConfigs of a BROKER), resolved into
//     the engine's Config once before it is built and re-read only to
//     report a change (ReadSettings, Settings);
//   - the GROUP configs of single groups (Kafka's GroupConfig: KIP-848's
//     consumer.* and KIP-932's share.*), cached for the engine's shard
//     loops and read again periodically and after a change that went
//     through kproxy (Configs);
//   - on a cluster without GROUP configs (before Kafka 4.0), the GROUP
//     configs kproxy keeps itself in a compacted topic (Store), which
//     Configs reads instead of the cluster, and the answers to the admin
//     calls for them (Service; ClusterHasGroupConfigs decides at start).
//
// The assembly (internal/kproxy) builds both and runs their loops.
package groupconfig
