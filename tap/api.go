package tap

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/kproxy/kproxy/groupstate"
)

// GroupSummary is one entry of /api/groups.
type GroupSummary struct {
	Group string `json:"group"`
	// Kind is the kind of group: classic, consumer (KIP-848) or share
	// (KIP-932); absent from a GroupSource that does not say.
	Kind         string    `json:"kind,omitempty"`
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
	Group string `json:"group"`
	// Kind is as in GroupSummary.
	Kind         string         `json:"kind,omitempty"`
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
	// SharePartitions lists a share group's share-partitions (those its
	// members fetched), sorted by topic and partition; absent for other
	// kinds.
	SharePartitions []SharePartition `json:"share_partitions,omitempty"`
}

// SharePartition is one share-partition of a share group (KIP-932): its
// start offset (every record below it is acknowledged or archived) and
// its in-flight records from there, by state.
type SharePartition struct {
	Topic string `json:"topic"`
	// TopicID is the topic's id in hex.
	TopicID     string `json:"topic_id"`
	Partition   int32  `json:"partition"`
	StartOffset int64  `json:"start_offset"`
	// InFlight counts the records from StartOffset to the end of the
	// window; Acquired those locked for a member, Available those
	// waiting to be delivered (again), Acknowledged and Archived those
	// done but above a record still in flight.
	InFlight     int64 `json:"in_flight"`
	Acquired     int64 `json:"acquired"`
	Available    int64 `json:"available"`
	Acknowledged int64 `json:"acknowledged"`
	Archived     int64 `json:"archived"`
}

// groups serves the group list, sorted by group id, with each group's
// total lag (one offsets query for all groups).
func (a *httpAPI) groups(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Groups == nil {
		http.Error(w, "no group source", http.StatusServiceUnavailable)
		return
	}
	snaps := a.cfg.Groups.Groups()
	out := make([]GroupSummary, 0, len(snaps))
	for _, g := range snaps {
		out = append(out, GroupSummary{
			Group: g.Group, Kind: string(g.Kind), State: g.State, ProtocolType: g.ProtocolType, Protocol: g.Protocol,
			Generation: g.Generation, Leader: g.Leader, Members: len(g.Members), StateSince: g.StateSince,
		})
	}
	if a.cfg.Offsets != nil && len(snaps) > 0 {
		// A share group commits no offsets: its progress is in
		// share_partitions (/api/groups/{id}), not in a lag.
		qs := make([]LagQuery, 0, len(snaps))
		for _, g := range snaps {
			if g.Kind != groupstate.KindShare {
				qs = append(qs, LagQuery{Group: g.Group, Assigned: assignedOf(groupDetail(g).Members)})
			}
		}
		var (
			lags map[string]GroupLag
			err  error
		)
		if len(qs) > 0 {
			lags, err = a.lag(r.Context(), qs)
		}
		for i := range out {
			gl, ok := lags[out[i].Group]
			switch {
			case out[i].Kind == string(groupstate.KindShare):
				// No lag (above).
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
func (a *httpAPI) lag(ctx context.Context, qs []LagQuery) (map[string]GroupLag, error) {
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
func (a *httpAPI) group(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var detail GroupDetail
	known := false
	if a.cfg.Groups != nil {
		if g, ok := a.cfg.Groups.Group(id); ok {
			known = true
			detail = groupDetail(g)
			if ss, ok := a.cfg.Groups.(ShareSource); ok && g.Kind == groupstate.KindShare {
				detail.SharePartitions = sharePartitions(ss, id)
			}
		}
	}
	if !known {
		detail = GroupDetail{Group: id, State: "Unknown", Members: []MemberInfo{}}
	}
	detail.Offsets = []PartitionLag{}
	if a.cfg.Offsets != nil && detail.Kind != string(groupstate.KindShare) {
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
		Group: g.Group, Kind: string(g.Kind), State: g.State, ProtocolType: g.ProtocolType, Protocol: g.Protocol,
		Generation: g.Generation, Leader: g.Leader, StateSince: g.StateSince,
		Members: make([]MemberInfo, 0, len(g.Members)),
	}
	for _, m := range g.Members {
		d.Members = append(d.Members, toMemberInfo(g.ProtocolType, m))
	}
	sort.Slice(d.Members, func(i, j int) bool { return d.Members[i].MemberID < d.Members[j].MemberID })
	return d
}

// sharePartitions lists group's share-partitions, sorted.
func sharePartitions(src ShareSource, group string) []SharePartition {
	states, _ := src.ShareStates(group)
	out := make([]SharePartition, 0, len(states))
	for _, st := range states {
		out = append(out, SharePartition{
			Topic: st.Topic, TopicID: hex.EncodeToString(st.TP.TopicID[:]), Partition: st.TP.Partition,
			StartOffset: st.StartOffset, InFlight: st.InFlight, Acquired: st.Acquired, Available: st.Available,
			Acknowledged: st.Acknowledged, Archived: st.Archived,
		})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		if out[i].TopicID != out[j].TopicID {
			return out[i].TopicID < out[j].TopicID
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}

// events streams engine events as Server-Sent Events: first the recent
// ones (after Last-Event-ID when the client resumes), then live ones.
// ?group=G keeps only one group's events. A subscriber that falls behind
// loses events and receives a "dropped" event saying how many.
func (a *httpAPI) events(w http.ResponseWriter, r *http.Request) {
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
