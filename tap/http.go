package tap

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"
)

// HTTPConfig configures tap's HTTP handler, which kproxy's admin server
// (--admin-listen) serves. Every field may be nil; the endpoints that
// need a missing piece answer 503.
type HTTPConfig struct {
	// Tap provides /metrics and /api/events.
	Tap *Tap
	// Groups provides /api/groups (usually the engine).
	Groups GroupSource
	// Ready reports whether kproxy can serve (upstream reachable, state
	// loaded); /readyz answers 503 with its error. Nil means ready.
	Ready func(context.Context) error
	// Offsets provides committed offsets and lag: per partition in
	// /api/groups/{id}, each group's total in /api/groups.
	Offsets OffsetSource
	// Logger receives request failures; discarded when nil.
	Logger *slog.Logger
	// Timeout bounds Ready and Offsets calls, 3s when zero.
	Timeout time.Duration
	// KeepAlive is the interval of SSE keep-alive comments, 15s when
	// zero.
	KeepAlive time.Duration
	// Fleet provides /api/fleet (distributed groups: this kproxy's view
	// of the fleet, who owns which partition); nil answers 404, which
	// the web view shows as "groups are not distributed". It is called
	// on every request and must be safe to call from any goroutine.
	Fleet func() FleetView
	// GroupSettings provides /api/group-settings: each group setting of
	// kproxy's coordinator, its value and where it came from; nil
	// answers 404 (groups forwarded). Called on every request from any
	// goroutine.
	GroupSettings func() GroupSettingsView
}

// httpAPI serves the handler's endpoints. Immutable after
// NewHTTPHandler.
type httpAPI struct {
	cfg HTTPConfig
	log *slog.Logger
}

// NewHTTPHandler returns tap's HTTP handler: health and metrics
// (/healthz, /readyz, /metrics; health.go), the group API and event
// stream (/api/groups, /api/groups/{id}, /api/events; api.go), the fleet
// (/api/fleet; api_fleet.go), the groups kproxy forwards to the
// cluster's coordinator (/api/forwarded), the group settings and their
// sources (/api/group-settings) and the web view at /
// (webview.go).
func NewHTTPHandler(cfg HTTPConfig) http.Handler {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	a := &httpAPI{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", a.metrics())
	mux.HandleFunc("GET /api/groups", a.groups)
	mux.HandleFunc("GET /api/groups/{id...}", a.group)
	mux.HandleFunc("GET /api/events", a.events)
	mux.HandleFunc("GET /api/fleet", a.fleet)
	mux.HandleFunc("GET /api/forwarded", a.forwardedGroups)
	mux.HandleFunc("GET /api/group-settings", a.groupSettings)
	mux.Handle("GET /", webView())
	return mux
}

// unavailable answers 503 with msg.
func unavailable(msg string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, msg, http.StatusServiceUnavailable)
	}
}

// writeJSON writes v as indented JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// forwardedGroups serves /api/forwarded: the groups kproxy does not
// serve because the cluster's own coordinator does, with their kind
// there (Tap.SetForwardedSource); an empty list when there are none.
func (a *httpAPI) forwardedGroups(w http.ResponseWriter, _ *http.Request) {
	var out []ForwardedGroup
	if a.cfg.Tap != nil {
		out = a.cfg.Tap.forwardedGroups()
	}
	if out == nil {
		out = []ForwardedGroup{}
	}
	writeJSON(w, struct {
		Groups []ForwardedGroup `json:"groups"`
	}{out})
}

// GroupSettingsView is /api/group-settings: the group settings kproxy's
// coordinator runs with (Kafka's broker config names) and where each
// came from.
type GroupSettingsView struct {
	// Cluster is the latest read of the cluster's settings.
	Cluster GroupSettingsRead `json:"cluster"`
	// Settings are in a fixed order.
	Settings []GroupSetting `json:"settings"`
}

// GroupSettingsRead is one DescribeConfigs read of the cluster's group
// settings.
type GroupSettingsRead struct {
	// Broker is the broker asked, -1 if none could be.
	Broker int32 `json:"broker"`
	// At is when it was read.
	At time.Time `json:"at"`
	// Error says why the cluster could not be read; then kproxy's
	// defaults stand for the settings no flag or file sets.
	Error string `json:"error,omitempty"`
}

// GroupSetting is one group setting.
type GroupSetting struct {
	// Name is Kafka's broker config name (group.initial.rebalance.delay.ms).
	Name string `json:"name"`
	// Value is what the coordinator uses, as Kafka writes it
	// (milliseconds, a comma-separated list, "unlimited" for no limit);
	// empty for a setting kproxy only reports.
	Value string `json:"value"`
	// Source is flag, file, config (set by the program embedding
	// kproxy), cluster or default.
	Source string `json:"source"`
	// Cluster is the cluster's value at the latest read, when it names
	// the setting: it differs from Value when overridden, or when the
	// cluster changed since kproxy started (applied at its next start).
	Cluster *string `json:"cluster,omitempty"`
	// Note says why the cluster's value is not used, when it is not.
	Note string `json:"note,omitempty"`
}

// groupSettings serves /api/group-settings.
func (a *httpAPI) groupSettings(w http.ResponseWriter, _ *http.Request) {
	if a.cfg.GroupSettings == nil {
		http.Error(w, "groups are forwarded to the cluster: kproxy has no group settings", http.StatusNotFound)
		return
	}
	writeJSON(w, a.cfg.GroupSettings())
}
