package tap

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kproxy/kproxy/groupstate"
)

//go:embed web/static
var webFiles embed.FS

// AdminConfig configures the admin HTTP handler. Every field may be nil;
// the endpoints that need a missing piece answer 503.
type AdminConfig struct {
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
}

// admin serves the admin API. Immutable after NewAdminHandler.
type admin struct {
	cfg AdminConfig
	log *slog.Logger
}

// NewAdminHandler returns the admin HTTP handler: /healthz, /readyz,
// /metrics, /api/groups, /api/groups/{id}, /api/events, /api/fleet and
// the web view at /.
func NewAdminHandler(cfg AdminConfig) http.Handler {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	a := &admin{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	if cfg.Tap != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Tap.registry, promhttp.HandlerOpts{ErrorLog: slogErrorLog{a.log}}))
	} else {
		mux.HandleFunc("GET /metrics", unavailable("metrics are off"))
	}
	mux.HandleFunc("GET /api/groups", a.groups)
	mux.HandleFunc("GET /api/groups/{id...}", a.group)
	mux.HandleFunc("GET /api/events", a.events)
	mux.HandleFunc("GET /api/fleet", a.fleet)
	files := http.FileServerFS(webFiles)
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/web/static" + r.URL.Path
		r2.URL.RawPath = ""
		files.ServeHTTP(w, r2)
	})
	return mux
}

// unavailable answers 503 with msg.
func unavailable(msg string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, msg, http.StatusServiceUnavailable)
	}
}

// slogErrorLog adapts slog to promhttp's error logger.
type slogErrorLog struct{ log *slog.Logger }

// Println logs a promhttp error.
func (l slogErrorLog) Println(v ...any) { l.log.Warn("metrics: " + fmt.Sprint(v...)) }

// readyz calls the Ready check.
func (a *admin) readyz(w http.ResponseWriter, r *http.Request) {
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

// GroupSummary is one entry of /api/groups.
type GroupSummary struct {
	Group        string    `json:"group"`
	State        string    `json:"state"`
	ProtocolType string    `json:"protocol_type"`
	Protocol     string    `json:"protocol"`
	Generation   int32     `json:"generation"`
	Leader       string    `json:"leader,omitempty"`
	Members      int       `json:"members"`
	StateSince   time.Time `json:"state_since"`
	// TotalLag sums the known lags of the group's committed and assigned
	// partitions; absent when offsets are off or could not be read.
	TotalLag *int64 `json:"total_lag,omitempty"`
	// LagError says why TotalLag is absent while offsets are on.
	LagError string `json:"lag_error,omitempty"`
}

// GroupDetail is the body of /api/groups/{id}.
type GroupDetail struct {
	Group        string         `json:"group"`
	State        string         `json:"state"`
	ProtocolType string         `json:"protocol_type"`
	Protocol     string         `json:"protocol"`
	Generation   int32          `json:"generation"`
	Leader       string         `json:"leader,omitempty"`
	StateSince   time.Time      `json:"state_since"`
	Members      []MemberInfo   `json:"members"`
	Offsets      []PartitionLag `json:"offsets"`
	// TotalLag sums the known lags of Offsets.
	TotalLag int64 `json:"total_lag"`
	// OffsetsError says why offsets could not be read. A group without
	// commits is no error: Offsets then lists its assigned partitions
	// with Committed -1.
	OffsetsError string `json:"offsets_error,omitempty"`
}

// groups serves the group list, sorted by group id, with each group's
// total lag (one offsets query for all groups).
func (a *admin) groups(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Groups == nil {
		http.Error(w, "no group source", http.StatusServiceUnavailable)
		return
	}
	snaps := a.cfg.Groups.Groups()
	out := make([]GroupSummary, 0, len(snaps))
	for _, g := range snaps {
		out = append(out, GroupSummary{
			Group: g.Group, State: g.State, ProtocolType: g.ProtocolType, Protocol: g.Protocol,
			Generation: g.Generation, Leader: g.Leader, Members: len(g.Members), StateSince: g.StateSince,
		})
	}
	if a.cfg.Offsets != nil && len(snaps) > 0 {
		qs := make([]LagQuery, 0, len(snaps))
		for _, g := range snaps {
			qs = append(qs, LagQuery{Group: g.Group, Assigned: assignedOf(groupDetail(g).Members)})
		}
		lags, err := a.lag(r.Context(), qs)
		for i := range out {
			gl, ok := lags[out[i].Group]
			switch {
			case err != nil:
				out[i].LagError = err.Error()
			case !ok:
				out[i].LagError = "no answer for this group"
			case gl.Err != nil:
				out[i].LagError = gl.Err.Error()
			default:
				total := totalLag(gl.Offsets)
				out[i].TotalLag = &total
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	writeJSON(w, out)
}

// lag asks the offset source, bounded by the configured timeout.
func (a *admin) lag(ctx context.Context, qs []LagQuery) (map[string]GroupLag, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	lags, err := a.cfg.Offsets.Lag(ctx, qs)
	if err != nil {
		a.log.Warn("admin: reading offsets", "groups", len(qs), "err", err)
		return nil, fmt.Errorf("reading offsets: %w", err)
	}
	return lags, nil
}

// assignedOf gathers the members' decoded assignments.
func assignedOf(members []MemberInfo) []TopicPartitions {
	var out []TopicPartitions
	for _, m := range members {
		out = append(out, m.Assignment...)
	}
	return out
}

// group serves one group's detail with its offsets and lag.
func (a *admin) group(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var detail GroupDetail
	known := false
	if a.cfg.Groups != nil {
		if g, ok := a.cfg.Groups.Group(id); ok {
			known = true
			detail = groupDetail(g)
		}
	}
	if !known {
		detail = GroupDetail{Group: id, State: "Unknown", Members: []MemberInfo{}}
	}
	detail.Offsets = []PartitionLag{}
	if a.cfg.Offsets != nil {
		lags, err := a.lag(r.Context(), []LagQuery{{Group: id, Assigned: assignedOf(detail.Members)}})
		gl, ok := lags[id]
		switch {
		case err != nil:
			detail.OffsetsError = err.Error()
		case !ok:
			detail.OffsetsError = "no answer for this group"
		case gl.Err != nil:
			detail.OffsetsError = gl.Err.Error()
			a.log.Warn("admin: reading offsets", "group", id, "err", gl.Err)
		case gl.Offsets != nil:
			detail.Offsets = gl.Offsets
		}
	}
	detail.TotalLag = totalLag(detail.Offsets)
	if !known && len(detail.Offsets) == 0 {
		http.Error(w, fmt.Sprintf("group %q not found", id), http.StatusNotFound)
		return
	}
	writeJSON(w, detail)
}

// groupDetail converts a snapshot, decoding member assignments.
func groupDetail(g groupstate.GroupSnapshot) GroupDetail {
	d := GroupDetail{
		Group: g.Group, State: g.State, ProtocolType: g.ProtocolType, Protocol: g.Protocol,
		Generation: g.Generation, Leader: g.Leader, StateSince: g.StateSince,
		Members: make([]MemberInfo, 0, len(g.Members)),
	}
	for _, m := range g.Members {
		d.Members = append(d.Members, toMemberInfo(g.ProtocolType, m))
	}
	sort.Slice(d.Members, func(i, j int) bool { return d.Members[i].MemberID < d.Members[j].MemberID })
	return d
}

// writeJSON writes v as indented JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// events streams engine events as Server-Sent Events: first the recent
// ones (after Last-Event-ID when the client resumes), then live ones.
// ?group=G keeps only one group's events. A subscriber that falls behind
// loses events and receives a "dropped" event saying how many.
func (a *admin) events(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Tap == nil {
		http.Error(w, "event stream is off", http.StatusServiceUnavailable)
		return
	}
	rc := http.NewResponseController(w)
	hub := a.cfg.Tap.hub
	after := hub.resumeAfter(r.Header.Get("Last-Event-ID"))
	sub, recent, seq := hub.subscribe(r.URL.Query().Get("group"), after)
	defer hub.unsubscribe(sub)

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// Tell EventSource clients to reconnect quickly, and which event
	// sequence this is: a client that sees another boot id knows kproxy
	// restarted and drops what it had.
	if _, err := fmt.Fprintf(w, "retry: 1000\n\nevent: hello\ndata: {\"boot\":%q,\"seq\":%d}\n\n", hub.boot, seq); err != nil {
		return
	}
	for _, e := range recent {
		if err := writeSSE(w, hub, e); err != nil {
			return
		}
	}
	if err := rc.Flush(); err != nil {
		return
	}
	keep := time.NewTicker(a.cfg.KeepAlive)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case e, ok := <-sub.ch:
			if !ok {
				return // the tap shut down
			}
			if n := sub.dropped.Swap(0); n > 0 {
				if _, err := fmt.Fprintf(w, "event: dropped\ndata: {\"dropped\":%d}\n\n", n); err != nil {
					return
				}
			}
			if err := writeSSE(w, hub, e); err != nil {
				return
			}
			// Coalesce whatever else is already buffered before
			// flushing.
		drain:
			for {
				select {
				case e, ok := <-sub.ch:
					if !ok {
						_ = rc.Flush()
						return
					}
					if err := writeSSE(w, hub, e); err != nil {
						return
					}
				default:
					break drain
				}
			}
			if err := rc.Flush(); err != nil {
				return
			}
		case <-keep.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
		}
	}
}

// writeSSE writes one event in SSE framing. The JSON has no newlines.
func writeSSE(w http.ResponseWriter, h *hub, e *hubEntry) error {
	if _, err := fmt.Fprintf(w, "id: %s\ndata: %s\n\n", h.eventID(e.seq), e.data); err != nil {
		return fmt.Errorf("writing event: %w", err)
	}
	return nil
}

// FleetView is the body of /api/fleet: one kproxy's view of the fleet it
// belongs to (docs/fleet.md). The admin server serves it; its source
// (cmd/kproxy, from the fleet member's snapshot and the store's claims)
// fills every field except Members, which the server derives. The JSON
// keys are a stable API: fields may be added, none renamed or dropped.
// Every list is present (possibly empty), never null.
type FleetView struct {
	// ID is this kproxy's id in the fleet.
	ID string `json:"id"`
	// Peer is the peer address this kproxy advertises (what the others
	// dial to relay group requests to it).
	Peer string `json:"peer"`
	// PeerListen is the address its peer listener is bound to.
	PeerListen string `json:"peer_listen"`
	// Partitions is the groups topic's partition count.
	Partitions int `json:"partitions"`
	// Serving lists the partitions whose groups this kproxy serves now:
	// assigned to it, claimed (fenced and loaded) and inside the lease;
	// ascending.
	Serving []int32 `json:"serving"`
	// Moves counts the ownership changes seen here (claims, releases,
	// losses) since start.
	Moves int64 `json:"ownership_moves"`
	// Fenced counts the partitions this kproxy dropped because a newer
	// owner fenced its transactional writes.
	Fenced int64 `json:"fenced"`
	// LeaseValid reports whether the fleet lease holds now.
	LeaseValid bool `json:"lease_valid"`
	// Member is the state of this kproxy's membership in the fleet group.
	Member FleetMembership `json:"member"`
	// Members lists the fleet's members as this kproxy knows them: the
	// owners in Member.Table, itself and the leader, sorted by kproxy id.
	// Derived by the admin server; a value set by the source is replaced.
	Members []FleetMember `json:"members"`
}

// FleetMembership is one kproxy's membership in the fleet group (the
// fleet member's snapshot).
type FleetMembership struct {
	// ID is the kproxy id, MemberID its member id in the fleet group and
	// Peer its advertised peer address.
	ID       string `json:"id"`
	MemberID string `json:"member_id"`
	Peer     string `json:"peer"`
	// Owner is false for a relay (--fleet-role relay): it owns nothing.
	Owner bool `json:"owner"`
	// Group is the fleet group (__kproxy_fleet or __kproxy_fleet.<name>).
	Group string `json:"group"`
	// Generation is the fleet generation this member is in.
	Generation int32 `json:"generation"`
	// LeaderID is the member id of the fleet leader; Leader reports
	// whether that is this kproxy.
	LeaderID string `json:"leader_member_id"`
	Leader   bool   `json:"leader"`
	// Joining is true while the member is rejoining the fleet group.
	Joining bool `json:"joining"`
	// Table is indexed by partition: who owns each one. An entry with an
	// empty MemberID has no owner now (in transition). It may be shorter
	// than Partitions (empty before the first generation).
	Table []FleetOwner `json:"table"`
	// Owned lists the partitions assigned to this member, ascending
	// (served only once claimed: see FleetView.Serving).
	Owned []int32 `json:"owned"`
	// LeaseValid and LeaseRemaining: the lease and how long it still
	// holds (JSON in nanoseconds).
	LeaseValid     bool          `json:"lease_valid"`
	LeaseRemaining time.Duration `json:"lease_remaining_ns"`
	// Counters since start: generations completed, partitions gained,
	// revoked (given up cooperatively) and lost, times the member was
	// fenced out of the group and its lease ran out.
	Generations  uint64 `json:"generations"`
	Gained       uint64 `json:"gained"`
	Revoked      uint64 `json:"revoked"`
	Lost         uint64 `json:"lost"`
	Fenced       uint64 `json:"fenced"`
	LeaseExpired uint64 `json:"lease_expired"`
}

// FleetOwner is one entry of the fleet table: who owns a partition.
type FleetOwner struct {
	// ID is the owner's kproxy id, MemberID its member id in the fleet
	// group, Peer its advertised peer address.
	ID       string `json:"id"`
	MemberID string `json:"member_id"`
	Peer     string `json:"peer"`
	// Generation is the fleet generation since which it owns the
	// partition.
	Generation int32 `json:"generation"`
}

// FleetMember is one entry of FleetView.Members.
type FleetMember struct {
	// ID is the kproxy id (empty for a leader that owns nothing, known
	// only by its member id), MemberID its member id, Peer its advertised
	// peer address.
	ID       string `json:"id"`
	MemberID string `json:"member_id"`
	Peer     string `json:"peer"`
	// Owned lists the partitions the table gives it, ascending.
	Owned []int32 `json:"owned"`
	// Leader marks the fleet leader, Self this kproxy.
	Leader bool `json:"leader"`
	Self   bool `json:"self"`
}

// fleet serves /api/fleet.
func (a *admin) fleet(w http.ResponseWriter, _ *http.Request) {
	if a.cfg.Fleet == nil {
		http.Error(w, "groups are not distributed: no fleet", http.StatusNotFound)
		return
	}
	writeJSON(w, normalizeFleet(a.cfg.Fleet()))
}

// normalizeFleet sorts v's lists, replaces nil ones with empty ones and
// derives Members from the table.
func normalizeFleet(v FleetView) FleetView {
	v.Serving = sortedCopy(v.Serving)
	v.Member.Owned = sortedCopy(v.Member.Owned)
	if v.Member.Table == nil {
		v.Member.Table = []FleetOwner{}
	}
	byMember := map[string]*FleetMember{}
	var members []*FleetMember
	add := func(id, memberID, peer string) *FleetMember {
		key := memberID
		if key == "" {
			key = "id:" + id // not joined yet: known by its kproxy id only
		}
		m := byMember[key]
		if m == nil {
			m = &FleetMember{MemberID: memberID, Owned: []int32{}}
			byMember[key] = m
			members = append(members, m)
		}
		if m.ID == "" {
			m.ID = id
		}
		if m.Peer == "" {
			m.Peer = peer
		}
		return m
	}
	for p, o := range v.Member.Table {
		if o.MemberID == "" {
			continue
		}
		m := add(o.ID, o.MemberID, o.Peer)
		m.Owned = append(m.Owned, int32(p))
	}
	self := add(v.ID, v.Member.MemberID, v.Peer)
	self.Self = true
	if v.Member.LeaderID != "" {
		add("", v.Member.LeaderID, "").Leader = true
	}
	sort.SliceStable(members, func(i, j int) bool {
		if members[i].ID != members[j].ID {
			return members[i].ID < members[j].ID
		}
		return members[i].MemberID < members[j].MemberID
	})
	v.Members = make([]FleetMember, 0, len(members))
	for _, m := range members {
		v.Members = append(v.Members, *m)
	}
	return v
}

// sortedCopy returns s sorted, as a new non-nil slice.
func sortedCopy(s []int32) []int32 {
	out := append([]int32{}, s...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
