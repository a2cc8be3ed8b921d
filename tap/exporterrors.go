package tap

import (
	"log/slog"
	"sync"
	"time"
)

// exportErrorEvery is the least time between two logged export errors;
// the ones in between are counted and the count goes with the next line.
const exportErrorEvery = time.Minute

// exportErrors receives the OpenTelemetry SDK's errors (failed exports
// above all) through otel.SetErrorHandler and logs them through kproxy's
// structured log, at most one line per exportErrorEvery.
type exportErrors struct {
	log    *slog.Logger     // immutable
	target exportTarget     // immutable
	now    func() time.Time // immutable

	mu         sync.Mutex // guards last and suppressed
	last       time.Time  // when the last line was logged; zero before the first
	suppressed int        // errors since that line, not logged
}

func newExportErrors(log *slog.Logger, target exportTarget) *exportErrors {
	return &exportErrors{log: log, target: target, now: time.Now}
}

// Handle logs err unless a line went out less than exportErrorEvery ago.
// It is safe for concurrent use (the SDK calls it from its exporting
// goroutines).
func (h *exportErrors) Handle(err error) {
	now := h.now()
	h.mu.Lock()
	if !h.last.IsZero() && now.Sub(h.last) < exportErrorEvery {
		h.suppressed++
		h.mu.Unlock()
		return
	}
	suppressed := h.suppressed
	h.last, h.suppressed = now, 0
	h.mu.Unlock()

	attrs := []any{"err", err}
	if h.target.Endpoint != "" {
		attrs = append(attrs, "endpoint", h.target.Endpoint, "protocol", h.target.Protocol)
	}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed, "suppressed_for", exportErrorEvery.String())
	}
	if h.target.Hint != "" {
		attrs = append(attrs, "hint", h.target.Hint)
	}
	h.log.Warn("tap: exporting traces failed", attrs...)
}
