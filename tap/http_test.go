package tap

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kproxy/kproxy/fleet"
	"github.com/kproxy/kproxy/groupstate"
)

// get fetches path from srv and returns the status and body.
func get(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// completedRebalance feeds tp one full rebalance of group.
func completedRebalance(tp *Tap, s *eventSeq, cause string, gen int32, members ...groupstate.Member) {
	ev := s.at(0, groupstate.EventRebalanceStarted)
	ev.Cause, ev.Generation = cause, gen-1
	tp.OnEvent(ev)
	ev = s.at(1500*time.Millisecond, groupstate.EventJoinCompleted)
	ev.Generation, ev.Leader, ev.Members = gen, members[0].MemberID, members
	tp.OnEvent(ev)
	ev = s.at(500*time.Millisecond, groupstate.EventSyncCompleted)
	ev.Generation, ev.Members = gen, members
	tp.OnEvent(ev)
}

func TestMetricsScrape(t *testing.T) {
	groups := &fakeGroups{groups: []groupstate.GroupSnapshot{
		{Group: "a", State: "Stable", Generation: 3, Members: []groupstate.Member{member("m1"), member("m2")}},
		{Group: "b", State: "Stable", Generation: 1, Members: []groupstate.Member{member("m3")}},
		{Group: "c", State: "PreparingRebalance", Generation: 7},
	}}
	tp, _ := newTestTap(t, Config{Groups: groups})
	// The proxy records its own metrics through MeterProvider.
	reqs, err := tp.MeterProvider().Meter("proxy").Int64Counter("kproxy.requests")
	if err != nil {
		t.Fatal(err)
	}
	reqs.Add(context.Background(), 5)

	s := newSeq("a")
	completedRebalance(tp, s, groupstate.CauseMemberJoined, 1, member("m1"))
	completedRebalance(tp, s, groupstate.CauseMemberJoined, 2, member("m1"), member("m2"))
	ev := s.at(time.Second, groupstate.EventMemberExpired)
	ev.Member, ev.Cause = &groupstate.Member{MemberID: "m2"}, "session_timeout"
	tp.OnEvent(ev)
	completedRebalance(tp, s, groupstate.CauseMemberExpired, 3, member("m1"))
	flush(t, tp)

	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{Tap: tp, Groups: groups}))
	defer srv.Close()
	code, body := get(t, srv, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	for _, want := range []string{
		`kproxy_rebalances_total{kproxy_rebalance_cause="member_joined",messaging_consumer_group_name="a"} 2`,
		`kproxy_rebalances_total{kproxy_rebalance_cause="member_expired",messaging_consumer_group_name="a"} 1`,
		`kproxy_rebalance_duration_seconds_count{kproxy_rebalance_cause="member_joined",kproxy_rebalance_outcome="completed"} 2`,
		`kproxy_rebalances_ended_total{kproxy_rebalance_cause="member_joined",kproxy_rebalance_outcome="completed"} 2`,
		`kproxy_rebalance_phase_duration_seconds_count{kproxy_rebalance_phase="join"} 3`,
		`kproxy_rebalance_phase_duration_seconds_count{kproxy_rebalance_phase="sync"} 3`,
		`kproxy_rebalance_duration_seconds_sum{kproxy_rebalance_cause="member_joined",kproxy_rebalance_outcome="completed"} 4`,
		`kproxy_rebalance_duration_seconds_bucket{kproxy_rebalance_cause="member_joined",kproxy_rebalance_outcome="completed",le="2.5"} 2`,
		`kproxy_rebalance_duration_seconds_bucket{kproxy_rebalance_cause="member_joined",kproxy_rebalance_outcome="completed",le="1"} 0`,
		`kproxy_member_expirations_total{kproxy_member_expire_reason="session_timeout"} 1`,
		`kproxy_groups{kproxy_group_state="Stable"} 2`,
		`kproxy_groups{kproxy_group_state="PreparingRebalance"} 1`,
		`kproxy_group_members{messaging_consumer_group_name="a"} 2`,
		`kproxy_group_members{messaging_consumer_group_name="b"} 1`,
		`kproxy_group_generation{messaging_consumer_group_name="c"} 7`,
		`kproxy_group_events_total{kproxy_event_kind="sync_completed"} 3`,
		`kproxy_tap_events_dropped_total 0`,
		`kproxy_requests_total 5`,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", grepLines(body, "kproxy_"))
	}
}

// grepLines keeps the lines of s containing sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// fakeOffsets is an OffsetSource with fixed answers: a group it has no
// entry for has no commits. It records the queries it was asked.
type fakeOffsets struct {
	lags map[string]GroupLag
	err  error

	mu    sync.Mutex // guards asked
	asked map[string]LagQuery
}

func (f *fakeOffsets) Lag(_ context.Context, qs []LagQuery) (map[string]GroupLag, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.asked == nil {
		f.asked = map[string]LagQuery{}
	}
	out := map[string]GroupLag{}
	for _, q := range qs {
		f.asked[q.Group] = q
		out[q.Group] = f.lags[q.Group]
	}
	return out, f.err
}

func TestHTTPGroupsAndHealth(t *testing.T) {
	m1 := member("m1")
	m1.Assignment = assignment("payments", 1, 0)
	m2 := member("m2")
	m2.Assignment = []byte{0, 0, 0} // truncated: reported, not fatal
	since := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	groups := &fakeGroups{groups: []groupstate.GroupSnapshot{
		{Group: "zeta", State: "Empty", ProtocolType: "consumer"},
		{Group: "team/a", State: "Empty", ProtocolType: "connect"},
		{Group: "alpha", State: "Stable", ProtocolType: "consumer", Protocol: "range", Generation: 2,
			Leader: "m1", Members: []groupstate.Member{m2, m1}, StateSince: since},
	}}
	offsets := &fakeOffsets{lags: map[string]GroupLag{
		"alpha":  {Offsets: []PartitionLag{{Topic: "payments", Partition: 0, Committed: 10, End: 15, Lag: 5}, {Topic: "payments", Partition: 1, Committed: -1, End: 3, Lag: 3}}},
		"simple": {Offsets: []PartitionLag{{Topic: "t", Partition: 0, Committed: 1, End: 1, Lag: 0}}},
		"zeta":   {Err: errors.New("NOT_COORDINATOR")},
	}}
	var ready error
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{
		Groups: groups, Offsets: offsets,
		Ready: func(context.Context) error { return ready },
	}))
	defer srv.Close()

	if code, body := get(t, srv, "/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, _ := get(t, srv, "/readyz"); code != 200 {
		t.Errorf("/readyz while ready: %d", code)
	}
	ready = errors.New("upstream unreachable")
	if code, body := get(t, srv, "/readyz"); code != 503 || !strings.Contains(body, "upstream unreachable") {
		t.Errorf("/readyz while not ready: %d %q", code, body)
	}
	if code, _ := get(t, srv, "/metrics"); code != 503 {
		t.Errorf("/metrics without a tap: %d, want 503", code)
	}

	code, body := get(t, srv, "/api/groups")
	if code != 200 {
		t.Fatalf("/api/groups: %d %s", code, body)
	}
	var list []GroupSummary
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[0].Group != "alpha" || list[0].Members != 2 || list[1].Group != "team/a" || list[2].Group != "zeta" {
		t.Fatalf("/api/groups = %+v", list)
	}
	// Each group's total lag: alpha's known lags, 0 for a group with no
	// commits, none (with the reason) where its offsets failed.
	if l := list[0].TotalLag; l == nil || *l != 8 || list[0].LagError != "" {
		t.Errorf("alpha total lag = %v (%q), want 8", l, list[0].LagError)
	}
	if l := list[1].TotalLag; l == nil || *l != 0 {
		t.Errorf("team/a total lag = %v, want 0", l)
	}
	if list[2].TotalLag != nil || !strings.Contains(list[2].LagError, "NOT_COORDINATOR") {
		t.Errorf("zeta: total lag %v, error %q; want none and the failure", list[2].TotalLag, list[2].LagError)
	}
	// The query names the partitions alpha's members are assigned (m2's
	// assignment does not decode).
	offsets.mu.Lock()
	q := offsets.asked["alpha"]
	offsets.mu.Unlock()
	if len(q.Assigned) != 1 || q.Assigned[0].Topic != "payments" || !slices.Equal(q.Assigned[0].Partitions, []int32{0, 1}) {
		t.Errorf("alpha's lag query assigned %+v, want payments [0 1]", q.Assigned)
	}

	code, body = get(t, srv, "/api/groups/alpha")
	if code != 200 {
		t.Fatalf("/api/groups/alpha: %d %s", code, body)
	}
	var d GroupDetail
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if d.State != "Stable" || d.Generation != 2 || d.Protocol != "range" || !d.StateSince.Equal(since) || len(d.Members) != 2 {
		t.Fatalf("detail = %+v", d)
	}
	a := d.Members[0]
	if a.MemberID != "m1" || a.ClientID != "client-m1" || a.ClientHost != "10.0.0.1" {
		t.Errorf("member m1 = %+v", a)
	}
	if len(a.Assignment) != 1 || a.Assignment[0].Topic != "payments" || len(a.Assignment[0].Partitions) != 2 ||
		a.Assignment[0].Partitions[0] != 0 || a.Assignment[0].Partitions[1] != 1 {
		t.Errorf("m1 assignment = %+v, want payments [0 1]", a.Assignment)
	}
	if d.Members[1].AssignmentError == "" {
		t.Errorf("truncated assignment of m2 not reported: %+v", d.Members[1])
	}
	if d.TotalLag != 8 || len(d.Offsets) != 2 {
		t.Errorf("offsets %+v total lag %d, want 2 partitions and lag 8", d.Offsets, d.TotalLag)
	}

	if code, _ := get(t, srv, "/api/groups/simple"); code != 200 {
		t.Errorf("group with offsets only: %d, want 200", code)
	}
	code, body = get(t, srv, "/api/groups/zeta")
	var dz GroupDetail
	if err := json.Unmarshal([]byte(body), &dz); err != nil || code != 200 {
		t.Fatalf("/api/groups/zeta: %d %v %s", code, err, body)
	}
	if !strings.Contains(dz.OffsetsError, "NOT_COORDINATOR") || len(dz.Offsets) != 0 {
		t.Errorf("zeta offsets %+v error %q, want the failure", dz.Offsets, dz.OffsetsError)
	}
	if code, body := get(t, srv, "/api/groups/team%2Fa"); code != 200 || !strings.Contains(body, `"group": "team/a"`) {
		t.Errorf("group id with a slash: %d %s", code, body)
	}
	if code, _ := get(t, srv, "/api/groups/nope"); code != 404 {
		t.Errorf("unknown group: %d, want 404", code)
	}
	if code, body := get(t, srv, "/"); code != 200 || !strings.Contains(body, "<html") {
		t.Errorf("web view: %d %.80q", code, body)
	}
}

// sseReader reads Server-Sent Events from a response body.
type sseReader struct {
	sc *bufio.Scanner
}

// next returns the next event's type ("" for message), id and data.
func (r *sseReader) next() (typ, id, data string, err error) {
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case line == "":
			if data != "" {
				return typ, id, data, nil
			}
		case strings.HasPrefix(line, "event: "):
			typ = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		}
	}
	if err := r.sc.Err(); err != nil {
		return "", "", "", err
	}
	return "", "", "", io.EOF
}

// openSSE connects to /api/events with an optional query.
func openSSE(t *testing.T, srv *httptest.Server, query string, lastID string) (*sseReader, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/events"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	return &sseReader{sc: bufio.NewScanner(resp.Body)}, func() { cancel(); resp.Body.Close() }
}

func TestEventStream(t *testing.T) {
	tp, _ := newTestTap(t, Config{RecentEvents: 4})
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{Tap: tp}))
	defer srv.Close()

	// Six events before anyone connects: the ring keeps the last four.
	s := newSeq("a")
	completedRebalance(tp, s, groupstate.CauseMemberJoined, 1, member("m1"))
	completedRebalance(tp, s, groupstate.CauseMemberJoined, 2, member("m1"), member("m2"))
	flush(t, tp)

	r, closeAll := openSSE(t, srv, "", "")
	defer closeAll()
	rb, closeB := openSSE(t, srv, "?group=b", "")
	defer closeB()
	for _, rd := range []*sseReader{r, rb} {
		typ, _, data, err := rd.next()
		if err != nil || typ != "hello" || data != `{"boot":"`+tp.hub.boot+`","seq":6}` {
			t.Fatalf("first event %q %q %v, want hello with boot and seq 6", typ, data, err)
		}
	}
	var seqs []uint64
	for i := 0; i < 4; i++ {
		_, id, data, err := r.next()
		if err != nil {
			t.Fatal(err)
		}
		var se StreamEvent
		if err := json.Unmarshal([]byte(data), &se); err != nil {
			t.Fatal(err)
		}
		if id != tp.hub.eventID(se.Seq) || se.Group != "a" {
			t.Errorf("replayed event id %q %+v", id, se)
		}
		seqs = append(seqs, se.Seq)
	}
	if seqs[0] != 3 || seqs[3] != 6 {
		t.Errorf("replayed seqs %v, want 3..6", seqs)
	}

	// A live event of group b reaches both subscribers.
	ev := newSeq("b").at(0, groupstate.EventMemberJoined)
	m := member("m9")
	m.Assignment = assignment("t", 4)
	ev.Member = &m
	tp.OnEvent(ev)
	for _, rd := range []*sseReader{r, rb} {
		_, _, data, err := rd.next()
		if err != nil {
			t.Fatal(err)
		}
		var se StreamEvent
		if err := json.Unmarshal([]byte(data), &se); err != nil {
			t.Fatal(err)
		}
		if se.Seq != 7 || se.Group != "b" || se.Kind != "member_joined" || se.Member == nil ||
			se.Member.ClientID != "client-m9" || len(se.Member.Assignment) != 1 || se.Member.Assignment[0].Topic != "t" {
			t.Errorf("live event %s", data)
		}
	}

	// Resuming after seq 5 replays 6 and 7 only.
	rr, closeR := openSSE(t, srv, "", tp.hub.eventID(5))
	defer closeR()
	if typ, _, _, _ := rr.next(); typ != "hello" {
		t.Fatalf("resume: first event %q, want hello", typ)
	}
	for _, want := range []uint64{6, 7} {
		_, id, _, err := rr.next()
		if err != nil || id != tp.hub.eventID(want) {
			t.Fatalf("resume: id %q err %v, want %s", id, err, tp.hub.eventID(want))
		}
	}
	// An id from another boot (kproxy restarted) replays the whole ring.
	ro, closeO := openSSE(t, srv, "", "0000-5")
	defer closeO()
	ro.next() // hello
	if _, id, _, err := ro.next(); err != nil || id != tp.hub.eventID(4) {
		t.Fatalf("resume from another boot: first id %q err %v, want the ring's oldest %s", id, err, tp.hub.eventID(4))
	}
}

func TestSlowSubscriberLosesEventsWithoutBlocking(t *testing.T) {
	h := newHub(8, 2)
	sub, _, _ := h.subscribe("", 0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 10; i++ {
			h.publish(StreamEvent{Group: "g", Kind: "member_joined"})
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("publish blocked on a slow subscriber")
	}
	if got := sub.dropped.Load(); got != 8 {
		t.Errorf("subscriber dropped %d, want 8", got)
	}
	if got := h.droppedTotal(); got != 8 {
		t.Errorf("hub dropped %d, want 8", got)
	}
	if e := <-sub.ch; e.seq != 1 {
		t.Errorf("first buffered seq %d, want 1", e.seq)
	}
	h.unsubscribe(sub)
	if h.subscribers() != 0 {
		t.Errorf("subscriber still registered")
	}
}

func TestStreamTellsSlowSubscriberHowManyItLost(t *testing.T) {
	tp, _ := newTestTap(t, Config{SubscriberBuffer: 1, RecentEvents: 1})
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{Tap: tp}))
	defer srv.Close()
	r, closeR := openSSE(t, srv, "", "")
	defer closeR()
	// Wait until the handler is subscribed.
	deadline := time.Now().Add(5 * time.Second)
	for tp.hub.subscribers() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("subscriber never registered")
		}
		time.Sleep(time.Millisecond)
	}
	// Publish directly from the test so that the handler cannot keep
	// up: hold the hub lock while filling beyond the buffer.
	tp.hub.mu.Lock()
	sub := func() *subscriber {
		for s := range tp.hub.subs {
			return s
		}
		return nil
	}()
	tp.hub.mu.Unlock()
	sub.dropped.Add(3) // as if three events were lost
	if typ, _, _, _ := r.next(); typ != "hello" {
		t.Fatalf("first event %q, want hello", typ)
	}
	tp.OnEvent(groupstate.Event{Kind: groupstate.EventGroupCreated, Group: "g", Time: time.Now()})
	typ, _, data, err := r.next()
	if err != nil {
		t.Fatal(err)
	}
	if typ != "dropped" || data != `{"dropped":3}` {
		t.Errorf("got %q %q, want a dropped event with 3", typ, data)
	}
	typ, _, data, err = r.next()
	if err != nil || typ != "" || !strings.Contains(data, "group_created") {
		t.Errorf("after the notice got %q %q %v", typ, data, err)
	}
}

func TestHTTPFleetNotDistributed(t *testing.T) {
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{}))
	defer srv.Close()
	code, body := get(t, srv, "/api/fleet")
	if code != http.StatusNotFound || !strings.Contains(body, "groups are not distributed") {
		t.Fatalf("/api/fleet without a fleet: %d %q, want 404 saying groups are not distributed", code, body)
	}
}

// fleetOf builds a fleet view: self owns 0 and 2 and serves 2, "b" owns
// 1 and 4, partition 3 has no owner, and the leader "l" owns nothing.
func fleetOf() FleetView {
	a := fleet.Owner{ID: "a", MemberID: "a-m", Peer: "10.0.0.1:9093", Generation: 4}
	b := fleet.Owner{ID: "b", MemberID: "b-m", Peer: "10.0.0.2:9093", Generation: 3}
	return FleetView{
		ID: "a", Peer: "10.0.0.1:9093", PeerListen: "0.0.0.0:9093", Partitions: 6,
		Serving: []int32{2}, Moves: 5, Fenced: 1, LeaseValid: true,
		Member: fleet.Status{
			ID: "a", MemberID: "a-m", Peer: "10.0.0.1:9093", Owner: true, Group: "__kproxy_fleet",
			Generation: 9, LeaderID: "l-m", Table: []fleet.Owner{a, b, a, {}, b},
			Owned: []int32{2, 0}, LeaseValid: true, LeaseRemaining: 7500 * time.Millisecond,
			Generations: 9, Gained: 3, Lost: 1,
		},
		Members: []FleetMember{{ID: "bogus"}}, // replaced by the server
	}
}

func TestHTTPFleet(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{Fleet: func() FleetView { calls.Add(1); return fleetOf() }}))
	defer srv.Close()
	code, body := get(t, srv, "/api/fleet")
	if code != http.StatusOK {
		t.Fatalf("/api/fleet: %d %s", code, body)
	}
	var v FleetView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("decoding %s: %v", body, err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("fleet source called %d times for one request", n)
	}
	if v.ID != "a" || v.Partitions != 6 || v.Moves != 5 || v.Fenced != 1 || !v.LeaseValid ||
		v.Member.Generation != 9 || v.Member.LeaseRemaining != 7500*time.Millisecond || len(v.Member.Table) != 5 {
		t.Errorf("fleet view lost fields: %+v", v)
	}
	if !slices.Equal(v.Member.Owned, []int32{0, 2}) {
		t.Errorf("owned = %v, want sorted [0 2]", v.Member.Owned)
	}
	want := []FleetMember{
		{ID: "", MemberID: "l-m", Owned: []int32{}, Leader: true},
		{ID: "a", MemberID: "a-m", Peer: "10.0.0.1:9093", Owned: []int32{0, 2}, Self: true},
		{ID: "b", MemberID: "b-m", Peer: "10.0.0.2:9093", Owned: []int32{1, 4}},
	}
	if len(v.Members) != len(want) {
		t.Fatalf("members = %+v, want %+v", v.Members, want)
	}
	for i := range want {
		g, w := v.Members[i], want[i]
		if g.ID != w.ID || g.MemberID != w.MemberID || g.Peer != w.Peer || !slices.Equal(g.Owned, w.Owned) || g.Leader != w.Leader || g.Self != w.Self {
			t.Errorf("member %d = %+v, want %+v", i, g, w)
		}
	}
}

// TestHTTPFleetJSONKeys pins /api/fleet's JSON keys (the web view, the
// fleet e2e tests and scripts read them) and checks that no list is null,
// even for a kproxy that has not joined its fleet yet.
func TestHTTPFleetJSONKeys(t *testing.T) {
	for name, v := range map[string]FleetView{"joined": fleetOf(), "not joined yet": {ID: "a", Partitions: 16}} {
		srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{Fleet: func() FleetView { return v }}))
		code, body := get(t, srv, "/api/fleet")
		srv.Close()
		if code != http.StatusOK {
			t.Fatalf("%s: /api/fleet: %d %s", name, code, body)
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &top); err != nil {
			t.Fatalf("%s: decoding %s: %v", name, body, err)
		}
		var member map[string]json.RawMessage
		if err := json.Unmarshal(top["member"], &member); err != nil {
			t.Fatalf("%s: decoding member: %v", name, err)
		}
		var members []map[string]json.RawMessage
		if err := json.Unmarshal(top["members"], &members); err != nil || len(members) == 0 {
			t.Fatalf("%s: members = %s (%v), want at least this kproxy", name, top["members"], err)
		}
		for _, c := range []struct {
			what string
			obj  map[string]json.RawMessage
			keys []string
			list []string
		}{
			{"top level", top,
				[]string{"id", "peer", "peer_listen", "partitions", "serving", "ownership_moves", "fenced", "lease_valid", "member", "members"},
				[]string{"serving", "members"}},
			{"member", member,
				[]string{"id", "member_id", "peer", "owner", "group", "generation", "leader_member_id", "leader", "joining", "table", "owned",
					"lease_valid", "lease_remaining_ns", "generations", "gained", "revoked", "lost", "fenced", "lease_expired"},
				[]string{"table", "owned"}},
			{"members[0]", members[0], []string{"id", "member_id", "peer", "owned", "leader", "self"}, []string{"owned"}},
		} {
			got := slices.Sorted(maps.Keys(c.obj))
			if want := slices.Sorted(slices.Values(c.keys)); !slices.Equal(got, want) {
				t.Errorf("%s: %s keys = %v, want %v", name, c.what, got, want)
			}
			for _, k := range c.list {
				if s := string(c.obj[k]); !strings.HasPrefix(s, "[") {
					t.Errorf("%s: %s.%s = %s, want a list", name, c.what, k, s)
				}
			}
		}
		if name == "joined" {
			var entry map[string]json.RawMessage
			var table []map[string]json.RawMessage
			if err := json.Unmarshal(member["table"], &table); err != nil || len(table) == 0 {
				t.Fatalf("table = %s (%v)", member["table"], err)
			}
			entry = table[0]
			if got, want := slices.Sorted(maps.Keys(entry)), []string{"generation", "id", "member_id", "peer"}; !slices.Equal(got, want) {
				t.Errorf("table entry keys = %v, want %v", got, want)
			}
		}
	}
}

func TestHTTPGroupSettings(t *testing.T) {
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{}))
	code, body := get(t, srv, "/api/group-settings")
	srv.Close()
	if code != http.StatusNotFound || !strings.Contains(body, "forwarded") {
		t.Fatalf("/api/group-settings without groups: %d %q, want 404", code, body)
	}
	zero := "0"
	view := GroupSettingsView{
		Cluster:  GroupSettingsRead{Broker: 2, At: time.Unix(1700000000, 0).UTC()},
		Settings: []GroupSetting{{Name: "group.initial.rebalance.delay.ms", Value: "1500", Source: "flag", Cluster: &zero}},
	}
	srv = httptest.NewServer(NewHTTPHandler(HTTPConfig{GroupSettings: func() GroupSettingsView { return view }}))
	defer srv.Close()
	code, body = get(t, srv, "/api/group-settings")
	if code != http.StatusOK {
		t.Fatalf("/api/group-settings: %d %q", code, body)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"cluster":  map[string]any{"broker": 2.0, "at": "2023-11-14T22:13:20Z"},
		"settings": []any{map[string]any{"name": "group.initial.rebalance.delay.ms", "value": "1500", "source": "flag", "cluster": "0"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("/api/group-settings = %v, want %v", got, want)
	}
}
