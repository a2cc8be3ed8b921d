package kproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/tap"
)

// wireTelemetry sets up traces and metrics (tap) and registers its event
// sink with the engine's publisher.
func wireTelemetry(ctx context.Context, w *Server, tcfg tap.Config, log *slog.Logger) error {
	tcfg.InstanceID = w.id
	if tcfg.Logger == nil {
		tcfg.Logger = log.With("component", "tap")
	}
	t, err := tap.New(ctx, tcfg)
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	w.tap = t
	w.meterProvider = t.MeterProvider()
	w.events = append(w.events, t.OnEvent)
	w.closers = append(w.closers, t.Shutdown)
	if exp := t.TraceExporter(); exp != "" && exp != "none" {
		attrs := []any{"exporter", exp}
		if endpoint, protocol := t.TraceTarget(); endpoint != "" {
			attrs = append(attrs, "endpoint", endpoint, "protocol", protocol)
		}
		log.Info("rebalance traces enabled", attrs...)
	}
	return nil
}

// startAdmin starts the admin HTTP server when configured: health,
// readiness, metrics, the group API, the live event stream and the web
// view.
func (w *Server) startAdmin(ctx context.Context) error {
	log := w.log
	if w.engine != nil {
		w.tap.SetGroupSource(w.engine)
	}
	if w.coexist != nil {
		w.tap.SetForwardedSource(w.coexist.Forwarded)
	}
	addr := w.cfg.AdminListen
	if addr == "" {
		return nil
	}
	acfg := tap.HTTPConfig{
		Tap:     w.tap,
		Offsets: tap.NewKadmOffsetSource(kadm.NewClient(w.upstream)),
		Logger:  log.With("component", "admin"),
		Ready: func(ctx context.Context) error {
			req := kmsg.NewPtrMetadataRequest()
			req.Topics = []kmsg.MetadataRequestTopic{}
			if _, err := req.RequestWith(ctx, w.upstream); err != nil {
				return fmt.Errorf("upstream not reachable: %w", err)
			}
			return nil
		},
	}
	if w.engine != nil {
		acfg.Groups = w.engine
	}
	if w.fleet != nil {
		acfg.Fleet = w.fleet.Status
	}
	if w.groupSettings != nil {
		acfg.GroupSettings = w.groupSettings.View
	}
	if w.cfg.FleetView != nil {
		acfg.Fleet = w.cfg.FleetView
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	scheme := "http"
	if w.cfg.AdminTLS != nil {
		// http.Server runs each connection's handshake within
		// ReadHeaderTimeout.
		ln = tls.NewListener(ln, w.cfg.AdminTLS.ServerConfig())
		scheme = "https"
	}
	h := tap.NewHTTPHandler(acfg)
	if w.cfg.AdminWrap != nil {
		h = w.cfg.AdminWrap(h)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		// net/http's own complaints (TLS handshake errors) go to the log.
		ErrorLog: slog.NewLogLogger(log.With("component", "admin").Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server stopped", "err", err)
		}
	}()
	w.adminAddr = ln.Addr().String()
	log.Info("admin server listening", "addr", w.adminAddr, "scheme", scheme)
	w.closers = append(w.closers, func(ctx context.Context) error {
		// Event streams never end on their own: give them a moment,
		// then cut them.
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return srv.Close()
		}
		return nil
	})
	return nil
}
