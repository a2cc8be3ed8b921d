package tap

import (
	"context"
	"encoding/hex"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/tap/internal/groupdriver"
)

// This file drives real engines through the rebalances an operator asked
// about (a superseded rebalance, a group emptied by an expiry, a KIP-848
// reconciliation) with the exported traces checked as a backend received
// them: by an in-process OTLP receiver here, by Jaeger in jaeger_test.go.

// gotSpan is a span as a trace backend holds it, whatever its wire format.
type gotSpan struct {
	Name                    string
	TraceID, SpanID, Parent string // lower-case hex; Parent "" for a root
	Start, End              time.Time
	Attrs                   map[string]string
	Events                  []gotEvent
	Links                   []string // span ids (hex) the span links to
	Error                   bool
	Resource                map[string]string
}

type gotEvent struct {
	Name  string
	Time  time.Time
	Attrs map[string]string
}

// newScenarioEngine starts an engine on a manual clock feeding tp.
func newScenarioEngine(t *testing.T, tp *Tap, store *groupstate.MemoryStore) (*groupstate.Engine, *manualClock) {
	t.Helper()
	clk := newManualClock()
	if store == nil {
		store = groupstate.NewMemoryStore()
	}
	e, err := groupstate.New(groupstate.Config{
		Store: store, Events: tp.OnEvent, Shards: 1, Clock: clk, InitialRebalanceDelay: -1,
	})
	if err != nil {
		t.Fatalf("groupstate.New: %v", err)
	}
	t.Cleanup(e.Close)
	clk.drainLoopsOf(e)
	return e, clk
}

// runTraceScenarios plays the three scenarios against tp, one engine each,
// and leaves the spans to tp's exporter.
func runTraceScenarios(t *testing.T, tp *Tap) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// 1. Superseded: m1 alone (generation 1); m2 joins and m1 rejoins
	// (generation 2); m1 never syncs and m3 joins; everyone rejoins
	// (generation 3).
	{
		e, clk := newScenarioEngine(t, tp, nil)
		const g = "scn-superseded"
		m1, m2, m3 := newMember(e, g, "m1"), newMember(e, g, "m2"), newMember(e, g, "m3")
		if err := groupdriver.Rebalance(ctx, m1); err != nil {
			t.Fatal(err)
		}
		j2 := joinNow(t, ctx, e, m2)
		clk.Advance(700 * time.Millisecond)
		j1 := m1.JoinAsync(ctx)
		if r1, r2 := <-j1, <-j2; r1.Err != nil || r2.Err != nil {
			t.Fatalf("joins: %v %v", r1.Err, r2.Err)
		}
		clk.Advance(time.Second)
		j3 := joinNow(t, ctx, e, m3)
		j1, j2 = m1.JoinAsync(ctx), m2.JoinAsync(ctx)
		rs := []groupdriver.JoinResult{<-j1, <-j2, <-j3}
		errs := make(chan error, 3)
		for i, m := range []*groupdriver.Member{m1, m2, m3} {
			if rs[i].Err != nil {
				t.Fatal(rs[i].Err)
			}
			go func() { errs <- m.Sync(ctx, rs[i].Resp) }()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		settle(t, e, tp, g)
	}
	// 2. Emptied: the only member dies between JoinGroup and SyncGroup.
	{
		e, clk := newScenarioEngine(t, tp, nil)
		const g = "scn-emptied"
		m1 := newMember(e, g, "m1")
		m1.RebalanceMillis = 60000
		if _, err := m1.Join(ctx); err != nil {
			t.Fatal(err)
		}
		e.Group(g) // the session timer is armed after the answer
		clk.Advance(11 * time.Second)
		settle(t, e, tp, g)
	}
	// 3. KIP-848: b joins a; a revokes half, then b gets it.
	{
		store := groupstate.NewMemoryStore()
		store.SetTopic("payments", 4)
		e, clk := newScenarioEngine(t, tp, store)
		const g = "scn-848"
		a := &kip848Member{client: "client-a", id: "aaaaaaaaaaaaaaaaaaaaaa"}
		b := &kip848Member{client: "client-b", id: "bbbbbbbbbbbbbbbbbbbbbb"}
		a.beat(t, ctx, e, g, true)
		if a.epoch == 0 || len(a.owned) == 0 {
			a.beat(t, ctx, e, g, false)
		}
		b.beat(t, ctx, e, g, true)
		clk.Advance(400 * time.Millisecond)
		a.beat(t, ctx, e, g, false)
		clk.Advance(300 * time.Millisecond)
		a.beat(t, ctx, e, g, false)
		clk.Advance(100 * time.Millisecond)
		b.beat(t, ctx, e, g, false)
		settle(t, e, tp, g)
	}
}

// rootsNamed returns the root spans of group's rebalances by start time,
// then end time (backends return traces in any order, and on the manual
// clock consecutive rebalances may start at the same instant).
func rootsNamed(spans []gotSpan, group string) []gotSpan {
	var out []gotSpan
	for _, s := range spans {
		if s.Parent == "" && s.Name == "rebalance" && s.Attrs["messaging.consumer.group.name"] == group {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Start.Equal(out[j].Start) {
			return out[i].Start.Before(out[j].Start)
		}
		return out[i].End.Before(out[j].End)
	})
	return out
}

func childNamed(spans []gotSpan, parent gotSpan, name string) []gotSpan {
	var out []gotSpan
	for _, s := range spans {
		if s.Parent == parent.SpanID && s.TraceID == parent.TraceID && s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func gotEvents(s gotSpan, name string) []gotEvent {
	var out []gotEvent
	for _, e := range s.Events {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

func wantGot(t *testing.T, what string, attrs map[string]string, key, want string) {
	t.Helper()
	if got, ok := attrs[key]; !ok || got != want {
		t.Errorf("%s: %s = %q (present %v), want %q", what, key, got, ok, want)
	}
}

// checkScenarioTraces checks what a backend received from
// runTraceScenarios.
func checkScenarioTraces(t *testing.T, spans []gotSpan, service string) {
	t.Helper()
	if len(spans) == 0 {
		t.Fatal("the backend holds no span")
	}
	for _, s := range spans {
		if s.Resource["service.name"] != service || s.Resource["host.name"] == "" || s.Resource["process.pid"] == "" {
			t.Fatalf("span %s resource %v, want service.name=%s, host.name and process.pid", s.Name, s.Resource, service)
		}
	}

	// 1. Superseded.
	roots := rootsNamed(spans, "scn-superseded")
	if len(roots) != 3 {
		t.Fatalf("scn-superseded: %d rebalance traces, want 3", len(roots))
	}
	gen1, gen2, gen3 := roots[0], roots[1], roots[2]
	wantGot(t, "generation 1", gen1.Attrs, "kproxy.rebalance.outcome", "completed")
	wantGot(t, "generation 2", gen2.Attrs, "kproxy.rebalance.outcome", "superseded")
	wantGot(t, "generation 3", gen3.Attrs, "kproxy.rebalance.outcome", "completed")
	wantGot(t, "generation 3", gen3.Attrs, "kproxy.group.previous_generation", "2")
	wantGot(t, "generation 3", gen3.Attrs, "kproxy.group.generation", "3")
	wantGot(t, "generation 3", gen3.Attrs, "kproxy.group.kind", "classic")
	if gen2.Error {
		t.Errorf("the superseded rebalance is marked as an error")
	}
	if len(gen3.Links) != 1 || gen3.Links[0] != gen2.SpanID {
		t.Errorf("generation 3 links %v, want the superseded root %s", gen3.Links, gen2.SpanID)
	}
	if j := gotEvents(gen3, "member_joined"); len(j) != 1 || j[0].Attrs["messaging.client.id"] != "client-m3" {
		t.Errorf("generation 3 member_joined events %v, want m3's", j)
	}
	if j := gotEvents(gen2, "member_joined"); len(j) != 1 || j[0].Attrs["messaging.client.id"] != "client-m2" {
		t.Errorf("generation 2 member_joined events %v, want m2's only", j)
	}
	if joins := childNamed(spans, gen2, "join"); len(joins) != 1 {
		t.Errorf("generation 2 has %d join spans", len(joins))
	} else {
		wantGot(t, "generation 2 join", joins[0].Attrs, "kproxy.rebalance.last_member.client.id", "client-m1")
		var waits []string
		for _, m := range gotEvents(joins[0], "member") {
			waits = append(waits, m.Attrs["messaging.client.id"]+"="+m.Attrs["kproxy.member.join_wait_ms"])
		}
		if got := strings.Join(waits, ","); got != "client-m1=700,client-m2=0" && got != "client-m2=0,client-m1=700" {
			t.Errorf("generation 2 join waits %s, want m2 at 0ms and m1 at 700ms", got)
		}
	}

	// 2. Emptied.
	roots = rootsNamed(spans, "scn-emptied")
	if len(roots) != 1 {
		t.Fatalf("scn-emptied: %d rebalance traces, want 1 (no phantom)", len(roots))
	}
	wantGot(t, "emptied", roots[0].Attrs, "kproxy.rebalance.outcome", "group_empty")
	if ex := gotEvents(roots[0], "member_expired"); len(ex) != 1 || ex[0].Attrs["kproxy.member.reason"] != "session_timeout" {
		t.Errorf("emptied: member_expired events %v", ex)
	}

	// 3. KIP-848.
	roots = rootsNamed(spans, "scn-848")
	if len(roots) != 2 {
		t.Fatalf("scn-848: %d rebalance traces, want 2 (a joining, b joining)", len(roots))
	}
	r := roots[1]
	wantGot(t, "848", r.Attrs, "kproxy.group.kind", "consumer")
	wantGot(t, "848", r.Attrs, "kproxy.group.previous_epoch", "1")
	wantGot(t, "848", r.Attrs, "kproxy.group.epoch", "2")
	wantGot(t, "848", r.Attrs, "kproxy.group.assignor", "uniform")
	wantGot(t, "848", r.Attrs, "kproxy.rebalance.outcome", "completed")
	if _, ok := r.Attrs["kproxy.group.generation"]; ok {
		t.Errorf("848: root carries a generation")
	}
	rec := childNamed(spans, r, "reconcile")
	if len(rec) != 1 {
		t.Fatalf("848: %d reconcile spans, want 1", len(rec))
	}
	wantGot(t, "848 reconcile", rec[0].Attrs, "kproxy.group.epoch", "2")
	wantGot(t, "848 reconcile", rec[0].Attrs, "kproxy.group.member_count", "2")
	per := map[string]gotSpan{}
	for _, s := range childNamed(spans, rec[0], "reconcile_member") {
		per[s.Attrs["messaging.client.id"]] = s
	}
	a, b := per["client-a"], per["client-b"]
	var steps []string
	for _, e := range a.Events {
		steps = append(steps, e.Name)
	}
	if strings.Join(steps, ",") != "revoke_requested,revoked,assigned" {
		t.Errorf("848: a's steps %v", steps)
	}
	if d := a.End.Sub(a.Start); d != 700*time.Millisecond {
		t.Errorf("848: a reconciled in %v, want 700ms", d)
	}
	if d := b.End.Sub(b.Start); d != 800*time.Millisecond {
		t.Errorf("848: b reconciled in %v, want 800ms", d)
	}
}

// fromOTLP converts what an OTLP receiver got.
func fromOTLP(rs []*tracepb.ResourceSpans) []gotSpan {
	var out []gotSpan
	for _, r := range rs {
		res := otlpAttrs(r.GetResource().GetAttributes())
		for _, ss := range r.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				g := gotSpan{
					Name:     s.GetName(),
					TraceID:  hex.EncodeToString(s.GetTraceId()),
					SpanID:   hex.EncodeToString(s.GetSpanId()),
					Parent:   hex.EncodeToString(s.GetParentSpanId()),
					Start:    time.Unix(0, int64(s.GetStartTimeUnixNano())).UTC(),
					End:      time.Unix(0, int64(s.GetEndTimeUnixNano())).UTC(),
					Attrs:    otlpAttrs(s.GetAttributes()),
					Error:    s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
					Resource: res,
				}
				for _, e := range s.GetEvents() {
					g.Events = append(g.Events, gotEvent{Name: e.GetName(), Time: time.Unix(0, int64(e.GetTimeUnixNano())).UTC(), Attrs: otlpAttrs(e.GetAttributes())})
				}
				for _, l := range s.GetLinks() {
					g.Links = append(g.Links, hex.EncodeToString(l.GetSpanId()))
				}
				out = append(out, g)
			}
		}
	}
	return out
}

func otlpAttrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

// TestOTLPScenariosInProcess exports the scenarios over OTLP/HTTP with the
// SDK's batching exporter to an in-process receiver that decodes the
// protobuf as a collector does.
func TestOTLPScenariosInProcess(t *testing.T) {
	clearOTELEnv(t)
	rc, srv, _ := newHTTPReceiver(t)
	tp, err := New(context.Background(), Config{ServiceName: "kproxy-scenarios", Traces: TracesConfig{Endpoint: srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	runTraceScenarios(t, tp)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	rs := append([]*tracepb.ResourceSpans(nil), rc.resourceSpans...)
	rc.mu.Unlock()
	checkScenarioTraces(t, fromOTLP(rs), "kproxy-scenarios")
}
