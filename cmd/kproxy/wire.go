package main

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/metric"

	"github.com/kproxy/kproxy/proxy"
)

// wiring holds what run builds around the proxy: the coordinator engine,
// its offset store's upstream client, telemetry and the admin server.
type wiring struct {
	coordinator   proxy.Coordinator
	meterProvider metric.MeterProvider
	closers       []func(context.Context) error
}

func wire(ctx context.Context, cfg fileConfig, log *slog.Logger) (*wiring, error) {
	w := &wiring{}
	return w, nil
}

func (w *wiring) startAdmin(ctx context.Context, p *proxy.Proxy) error { return nil }

func (w *wiring) close(ctx context.Context) error {
	var err error
	for i := len(w.closers) - 1; i >= 0; i-- {
		if e := w.closers[i](ctx); e != nil && err == nil {
			err = e
		}
	}
	return err
}
