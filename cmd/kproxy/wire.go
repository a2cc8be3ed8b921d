package main

import (
	"log/slog"
	"os"

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
	delay := cfg.Groups.InitialRebalanceDelay
	if delay == 0 {
		delay = -1 // the engine's zero value means Kafka's 3s default
	}
	fc := cfg.Groups.Fleet
	return kproxy.Config{
		Upstream:     cfg.Upstream,
		DialTimeout:  cfg.DialTimeout,
		UpstreamOpts: sec.clientOpts,
		Proxy:        pcfg,
		Groups: kproxy.GroupsConfig{
			Mode: kproxy.GroupsMode(cfg.Groups.Mode),
			Engine: groupstate.Config{
				MinSessionTimeout:     cfg.Groups.MinSessionTimeout,
				MaxSessionTimeout:     cfg.Groups.MaxSessionTimeout,
				InitialRebalanceDelay: delay,
				MaxGroupSize:          cfg.Groups.MaxSize,
				CheckCommitOwnership:  cfg.Groups.CheckCommitOwnership,
				// KIP-848 groups: the session timeout is the group's, so it is
				// also its own bounds.
				ConsumerSessionTimeout:    cfg.Groups.Consumer.SessionTimeout,
				ConsumerMinSessionTimeout: cfg.Groups.Consumer.SessionTimeout,
				ConsumerMaxSessionTimeout: cfg.Groups.Consumer.SessionTimeout,
				ConsumerHeartbeatInterval: cfg.Groups.Consumer.HeartbeatInterval,
				ConsumerMaxGroupSize:      cfg.Groups.Consumer.MaxSize,
				ConsumerAssignors:         cfg.Groups.Consumer.Assignors,
				ConsumerMigrationPolicy:   groupstate.MigrationPolicy(cfg.Groups.Consumer.MigrationPolicy),
				TopicRefreshInterval:      cfg.Groups.Consumer.TopicRefreshInterval,
			},
			Anchors: kproxy.AnchorsConfig{
				Disabled:          !cfg.Groups.Anchors.Enabled,
				SessionTimeout:    cfg.Groups.Anchors.SessionTimeout,
				HeartbeatInterval: cfg.Groups.Anchors.HeartbeatInterval,
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
