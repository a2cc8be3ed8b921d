package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

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
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := f.resolve()
		if err != nil {
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
	raiseFileLimit(log)
	tlsSrc, err := listenerTLS(cfg, log)
	if err != nil {
		return err
	}
	w, err := wire(ctx, cfg, log)
	if err != nil {
		return err
	}
	p, err := proxy.New(proxy.Config{
		TLS:                   tlsSrc,
		UpstreamTLS:           w.upstreamSec.dataTLS,
		UpstreamClientOpts:    w.upstreamSec.clientOpts,
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
		Coordinator:           w.coordinator,
		Logger:                log,
		MeterProvider:         w.meterProvider,
	})
	if err != nil {
		w.close(context.Background())
		return err
	}
	if err := p.Start(ctx); err != nil {
		w.close(context.Background())
		return err
	}
	if err := w.startAdmin(ctx, p, cfg.AdminListen, log); err != nil {
		shutdown(p, w, cfg.ShutdownTimeout, log)
		return err
	}
	log.Info("kproxy started", "listen", p.Addr(), "upstream", cfg.Upstream, "groups", cfg.Groups.Mode,
		"tls", cfg.TLS.Cert != "", "upstream_tls", cfg.UpstreamTLS.Enabled, "upstream_sasl", cfg.UpstreamSASL.Mechanism)
	if ready != nil {
		ready(p.Addr())
	}
	<-ctx.Done()
	log.Info("shutting down: draining in-flight requests", "timeout", cfg.ShutdownTimeout)
	return shutdown(p, w, cfg.ShutdownTimeout, log)
}

func shutdown(p *proxy.Proxy, w *wiring, timeout time.Duration, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- p.Shutdown(ctx) }()
	var errP error
	select {
	case errP = <-drained:
	case <-time.After(min(2*time.Second, timeout/2)):
		// Requests parked in the engine (a JoinGroup waiting for a
		// rebalance) would hold the drain until the deadline: closing
		// the engine answers them, and the drain finishes.
		log.Info("closing the coordinator to answer parked group requests")
		if w.engine != nil {
			w.engine.Close()
		}
		errP = <-drained
	}
	errW := w.close(ctx)
	err := errors.Join(errP, errW)
	if err != nil {
		log.Warn("shutdown incomplete", "err", err)
	} else {
		log.Info("shutdown complete")
	}
	return err
}
