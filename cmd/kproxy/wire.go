package main

import (
	"log/slog"
	"os"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/tap"
)

// assemblyConfig turns the command's configuration into the assembly's
// (internal/kproxy builds and runs kproxy from it): TLS and SASL towards
// the cluster and on the listeners (security.go), the admin token.
func assemblyConfig(cfg fileConfig, log *slog.Logger) (kproxy.Config, error) {
	tlsSrc, err := listenerTLS(cfg, log)
	if err != nil {
		return kproxy.Config{}, err
	}
	sec, err := buildUpstreamSecurity(cfg, os.Getenv)
	if err != nil {
		return kproxy.Config{}, err
	}
	adminWrap, err := adminHandlerWrap(cfg, log)
	if err != nil {
		return kproxy.Config{}, err
	}
	peerTLS, adminTLS, err := listenerSecuritySources(cfg, log)
	if err != nil {
		return kproxy.Config{}, err
	}
	pcfg := proxyConfig(cfg, log)
	pcfg.TLS = tlsSrc
	pcfg.UpstreamTLS = sec.dataTLS
	pcfg.UpstreamClientOpts = sec.clientOpts
	// A cluster that requires SASL of kproxy requires it of clients:
	// their group requests need a completed exchange (issue 9).
	pcfg.RequireSASL = cfg.UpstreamSASL.Mechanism != ""
	upOpts := sec.clientOpts
	if cfg.dialVia != nil {
		pcfg.Dial = cfg.dialVia.dial
		upOpts = append(slices.Clone(upOpts), kgo.Dialer(cfg.dialVia.dial))
	}
	fc := cfg.Groups.Fleet
	return kproxy.Config{
		Upstream:     cfg.Upstream,
		DialTimeout:  cfg.DialTimeout,
		UpstreamOpts: upOpts,
		Proxy:        pcfg,
		Groups: kproxy.GroupsConfig{
			Mode:           kproxy.GroupsMode(cfg.Groups.Mode),
			ServeShares:    cfg.Groups.Shares == "serve",
			SharesAuto:     cfg.Groups.Shares == "auto",
			Engine:         engineConfig(cfg),
			SettingSources: cfg.sources,
			// Not reading the cluster at all would hide its values from
			// /api/group-settings: it is read, and its values unused.
			IgnoreClusterSettings: !cfg.Groups.SettingsFromCluster,
			Anchors: kproxy.AnchorsConfig{
				Disabled:          !cfg.Groups.Anchors.Enabled,
				SessionTimeout:    cfg.Groups.Anchors.SessionTimeout,
				HeartbeatInterval: cfg.Groups.Anchors.HeartbeatInterval,
				JoinClients:       cfg.Groups.Anchors.JoinClients,
			},
			Fleet: kproxy.FleetConfig{
				Name:              fc.Name,
				Relay:             fc.Role == "relay",
				SessionTimeout:    fc.SessionTimeout,
				HeartbeatInterval: fc.HeartbeatInterval,
				PeerListen:        fc.PeerListen,
				PeerAdvertise:     fc.PeerAdvertise,
				PeerTLS:           peerTLS,
				PeerTLSServerName: cfg.PeerTLS.ServerName,
			},
		},
		Telemetry: tap.Config{
			ServiceName: cfg.Telemetry.ServiceName,
			Traces:      cfg.Telemetry.Traces,
		},
		Authorization: authorizationFor(cfg),
		AdminListen:   cfg.AdminListen,
		AdminWrap:     adminWrap,
		AdminTLS:      adminTLS,
		Logger:        log,
	}, nil
}

// engineConfig is the engine's part of cfg. The group settings Kafka's
// brokers also have (group.initial.rebalance.delay.ms, the session
// bounds, group.max.size, KIP-848's group.consumer.* and KIP-932's
// group.share.*) are set only
// when a flag or the file gives them: the others stay zero, and the
// assembly takes them from the cluster, or else the engine's defaults
// (internal/groupconfig/settings.go).
func engineConfig(cfg fileConfig) groupstate.Config {
	g, cg := cfg.Groups, cfg.Groups.Consumer
	e := groupstate.Config{
		CheckCommitOwnership: g.CheckCommitOwnership,
		TopicRefreshInterval: cg.TopicRefreshInterval,
	}
	delay := g.InitialRebalanceDelay
	if delay == 0 {
		delay = -1 // the engine's zero value means Kafka's 3s default
	}
	take(cfg, "group.min.session.timeout.ms", &e.MinSessionTimeout, g.MinSessionTimeout)
	take(cfg, "group.max.session.timeout.ms", &e.MaxSessionTimeout, g.MaxSessionTimeout)
	take(cfg, "group.initial.rebalance.delay.ms", &e.InitialRebalanceDelay, delay)
	take(cfg, "group.max.size", &e.MaxGroupSize, g.MaxSize)
	take(cfg, "group.consumer.session.timeout.ms", &e.ConsumerSessionTimeout, cg.SessionTimeout)
	take(cfg, "group.consumer.heartbeat.interval.ms", &e.ConsumerHeartbeatInterval, cg.HeartbeatInterval)
	take(cfg, "group.consumer.max.size", &e.ConsumerMaxGroupSize, cg.MaxSize)
	take(cfg, "group.consumer.assignors", &e.ConsumerAssignors, cg.Assignors)
	take(cfg, "group.consumer.migration.policy", &e.ConsumerMigrationPolicy, groupstate.MigrationPolicy(cg.MigrationPolicy))
	sg, sd := g.Share, &e.ShareDefaults
	take(cfg, "group.share.session.timeout.ms", &sd.SessionTimeout, sg.SessionTimeout)
	take(cfg, "group.share.heartbeat.interval.ms", &sd.HeartbeatInterval, sg.HeartbeatInterval)
	take(cfg, "group.share.record.lock.duration.ms", &sd.LockDuration, sg.RecordLockDuration)
	take(cfg, "group.share.delivery.count.limit", &sd.DeliveryLimit, sg.DeliveryCountLimit)
	take(cfg, "group.share.partition.max.record.locks", &sd.MaxRecordLocks, sg.PartitionMaxRecordLocks)
	take(cfg, "group.share.max.size", &sd.MaxSize, sg.MaxSize)
	return e
}

// take sets *dst to v when a flag or the file gives the group setting
// name (Kafka's name), and leaves it zero for the cluster's value
// otherwise.
func take[T any](cfg fileConfig, name string, dst *T, v T) {
	if cfg.explicit(name) {
		*dst = v
	}
}
