package tap

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// healthz answers that the process is up.
func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// readyz calls the Ready check.
func (a *httpAPI) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if a.cfg.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), a.cfg.Timeout)
		defer cancel()
		if err := a.cfg.Ready(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
	}
	_, _ = w.Write([]byte("ready\n"))
}

// metrics serves the Tap's metrics in Prometheus format, 503 without a
// Tap.
func (a *httpAPI) metrics() http.Handler {
	if a.cfg.Tap == nil {
		return unavailable("metrics are off")
	}
	return promhttp.HandlerFor(a.cfg.Tap.registry, promhttp.HandlerOpts{ErrorLog: slogErrorLog{a.log}})
}

// slogErrorLog adapts slog to promhttp's error logger.
type slogErrorLog struct{ log *slog.Logger }

// Println logs a promhttp error.
func (l slogErrorLog) Println(v ...any) { l.log.Warn("metrics: " + fmt.Sprint(v...)) }
