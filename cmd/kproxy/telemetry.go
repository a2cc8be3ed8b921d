package main

import (
	"context"
	"log/slog"

	"github.com/kproxy/kproxy/proxy"
)

// wireTelemetry sets up traces and metrics (tap) and registers its event
// sink.
func wireTelemetry(ctx context.Context, w *wiring, cfg fileConfig, log *slog.Logger) error {
	return nil
}

// startAdmin starts the admin HTTP server when configured.
func (w *wiring) startAdmin(ctx context.Context, p *proxy.Proxy) error { return nil }
