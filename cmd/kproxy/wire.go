package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/metric"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// wiring holds what run builds around the proxy: the coordinator engine,
// its offset store's upstream client, telemetry and the admin server.
// Owned by run; closers run in reverse order.
type wiring struct {
	engine        *groupstate.Engine // nil with groups forwarded
	fleet         *fleetRuntime      // nil unless groups are distributed
	id            string             // this process's id: fleet member, traces
	upstream      *kgo.Client        // kproxy's own client of the cluster
	upstreamSec   upstreamSecurity   // TLS and SASL towards the cluster (security.go)
	adminWrap     func(http.Handler) http.Handler
	tap           *tap.Tap
	coordinator   proxy.Coordinator
	meterProvider metric.MeterProvider
	events        []func(groupstate.Event)
	closers       []func(context.Context) error
}

func wire(ctx context.Context, cfg fileConfig, log *slog.Logger) (*wiring, error) {
	w := &wiring{id: kproxyID()}
	sec, err := buildUpstreamSecurity(cfg, os.Getenv)
	if err != nil {
		return nil, err
	}
	if w.adminWrap, err = adminWrapper(cfg, log); err != nil {
		return nil, err
	}
	w.upstreamSec = sec
	opts := []kgo.Opt{kgo.SeedBrokers(cfg.Upstream...), kgo.DialTimeout(cfg.DialTimeout), kgo.ClientID("kproxy")}
	cl, err := kgo.NewClient(append(opts, sec.clientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("upstream client: %w", err)
	}
	w.upstream = cl
	w.closers = append(w.closers, func(context.Context) error { cl.Close(); return nil })
	if err := wireTelemetry(ctx, w, cfg, log); err != nil {
		w.close(context.Background())
		return nil, err
	}
	if cfg.Groups.Mode == "forward" {
		return w, nil
	}
	delay := cfg.Groups.InitialRebalanceDelay
	if delay == 0 {
		delay = -1 // the engine's zero value means Kafka's 3s default
	}
	engCfg := groupstate.Config{
		Logger:                log.With("component", "engine"),
		Events:                w.publish,
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
	}
	if cfg.Groups.Mode == "distributed" {
		if err := startFleet(ctx, w, cfg, engCfg, log); err != nil {
			w.close(context.Background())
			return nil, err
		}
		return w, nil
	}
	engCfg.Store = kafkastore.New(cl)
	eng, err := groupstate.New(engCfg)
	if err != nil {
		w.close(context.Background())
		return nil, fmt.Errorf("coordinator engine: %w", err)
	}
	w.engine = eng
	w.coordinator = engineCoordinator{eng}
	// The engine closes before the upstream client it stores through.
	w.closers = append(w.closers, func(context.Context) error { eng.Close(); return nil })
	return w, nil
}

// publish fans an engine event out to the sinks registered at wiring
// time (tap). It runs on the engine's loop goroutines and never blocks.
func (w *wiring) publish(ev groupstate.Event) {
	for _, f := range w.events {
		f(ev)
	}
}

// engineCoordinator adapts groupstate.Engine to proxy.Coordinator.
type engineCoordinator struct{ e *groupstate.Engine }

func (c engineCoordinator) Handle(cl proxy.Client, req kmsg.Request, reply func(kmsg.Response)) {
	c.e.Handle(groupstate.RequestContext{ClientID: cl.ID, ClientHost: cl.Host}, req, reply)
}

func (w *wiring) close(ctx context.Context) error {
	var err error
	for i := len(w.closers) - 1; i >= 0; i-- {
		if e := w.closers[i](ctx); e != nil && err == nil {
			err = e
		}
	}
	return err
}
