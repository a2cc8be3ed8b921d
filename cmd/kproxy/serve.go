package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/proxy"
)

func newServeCmd() *cobra.Command {
	cmd, _ := serveCmd()
	return cmd
}

// serveCmd returns the serve command and its flags.
func serveCmd() (*cobra.Command, *flagSet) {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Proxy an upstream Kafka cluster",
		Long: `serve listens on --listen (the bootstrap address) and on one port per
upstream broker (listen port + 1 + node id), forwards data traffic to the
brokers and serves consumer groups from kproxy's own coordinator.`,
		Args: cobra.NoArgs,
	}
	f := bindFlags(cmd.Flags(), true)
	via := bindDialVia(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := f.resolve()
		if err != nil {
			return err
		}
		if cfg.dialVia, err = parseDialVia(*via); err != nil {
			return err
		}
		if err := cfg.validate(); err != nil {
			return err
		}
		return run(cmd.Context(), cfg, cfg.logger(), func(addr string) {
			fmt.Fprintf(cmd.OutOrStdout(), "kproxy listening on %s\n", addr)
		})
	}
	return cmd, f
}

// run serves until ctx ends, then shuts down gracefully. ready is called
// with the bootstrap address once clients can connect.
func run(ctx context.Context, cfg fileConfig, log *slog.Logger, ready func(addr string)) error {
	raiseFileLimit(log, cfg.MaxConns)
	kcfg, err := assemblyConfig(cfg, log)
	if err != nil {
		return err
	}
	srv, err := kproxy.Start(ctx, kcfg)
	if err != nil {
		return err
	}
	log.Info("kproxy started", "listen", srv.Addr(), "upstream", cfg.Upstream, "groups", cfg.Groups.Mode,
		"tls", cfg.TLS.Cert != "", "upstream_tls", cfg.UpstreamTLS.Enabled, "upstream_sasl", cfg.UpstreamSASL.Mechanism,
		"group_authorization", cfg.Authorization.Mode)
	if ready != nil {
		ready(srv.Addr())
	}
	<-ctx.Done()
	log.Info("shutting down: draining in-flight requests", "timeout", cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	return srv.Shutdown(sctx)
}

// proxyConfig is the proxy's part of cfg; the assembly sets its
// coordinator and meter provider.
func proxyConfig(cfg fileConfig, log *slog.Logger) proxy.Config {
	return proxy.Config{
		Upstreams:             cfg.Upstream,
		Listen:                cfg.Listen,
		AdvertiseHost:         cfg.AdvertiseHost,
		AdvertisePort:         cfg.AdvertisePort,
		BrokerPorts:           cfg.BrokerPorts,
		MaxFrame:              cfg.MaxFrameBytes,
		MaxGroupRequest:       cfg.MaxGroupRequest,
		MaxRewriteResponse:    cfg.MaxRewriteResp,
		FrameMemory:           cfg.FrameMemory,
		MaxInFlight:           cfg.MaxInFlight,
		RequestTimeout:        cfg.RequestTimeout,
		IdleTimeout:           cfg.IdleTimeout,
		MaxConnections:        cfg.MaxConns,
		MaxConnectionsPerHost: cfg.MaxConnsPerHost,
		DialTimeout:           cfg.DialTimeout,
		MetadataInterval:      cfg.MetadataRefresh,
		Logger:                log,
	}
}
