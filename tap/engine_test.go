package tap

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/tap/internal/groupdriver"
)

// newEngineTap starts a real engine whose events feed a test Tap.
func newEngineTap(t *testing.T) (*groupstate.Engine, *Tap, *tracetest.InMemoryExporter) {
	t.Helper()
	tp, exp := newTestTap(t, Config{})
	e, err := groupstate.New(groupstate.Config{
		Store:                 groupstate.NewMemoryStore(),
		Events:                tp.OnEvent,
		Shards:                2,
		InitialRebalanceDelay: -1,
		MinSessionTimeout:     50 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("groupstate.New: %v", err)
	}
	t.Cleanup(e.Close)
	tp.SetGroupSource(e)
	return e, tp, exp
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// groupState returns the engine's state of group.
func groupState(e *groupstate.Engine, group string) string {
	g, _ := e.Group(group)
	return g.State
}

// spanAttr returns the value of s's attribute key, "" if it has none.
func spanAttr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// rootsOf returns the rebalance root spans of group, in end order.
func rootsOf(spans tracetest.SpanStubs, group string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "rebalance" && spanAttr(s, "messaging.consumer.group.name") == group {
			out = append(out, s)
		}
	}
	return out
}

// childrenOf returns the spans whose parent is root.
func childrenOf(spans tracetest.SpanStubs, root tracetest.SpanStub) map[string]tracetest.SpanStub {
	out := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Parent.SpanID() == root.SpanContext.SpanID() {
			out[s.Name] = s
		}
	}
	return out
}

func newMember(e *groupstate.Engine, group, name string) *groupdriver.Member {
	return &groupdriver.Member{
		Engine: e, Group: group, ClientID: "client-" + name, Host: "127.0.0." + name[len(name)-1:],
		Topics: []string{"payments"}, Partitions: 4, SessionMillis: 10000, RebalanceMillis: 10000,
	}
}

// TestEngineRebalanceTraces drives a real engine through join, a second
// join, a leave and an expiry, and checks the trace of each rebalance.
func TestEngineRebalanceTraces(t *testing.T) {
	e, tp, exp := newEngineTap(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const g = "engine-group"
	m1, m2 := newMember(e, g, "m1"), newMember(e, g, "m2")

	// 1. The first member joins.
	if err := groupdriver.Rebalance(ctx, m1); err != nil {
		t.Fatal(err)
	}
	flush(t, tp)
	roots := rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 {
		t.Fatalf("after the first join: %d rebalance traces, want 1 (%v)", len(roots), names(exp.GetSpans()))
	}
	root := roots[0]
	kids := childrenOf(exp.GetSpans(), root)
	if _, ok := kids["join"]; !ok {
		t.Errorf("no join span under the first rebalance")
	}
	if _, ok := kids["sync"]; !ok {
		t.Errorf("no sync span under the first rebalance")
	}
	wantAttr(t, "first", root.Attributes, "kproxy.rebalance.cause", groupstate.CauseMemberJoined)
	wantAttr(t, "first", root.Attributes, "kproxy.rebalance.cause.client.id", "client-m1")
	wantAttr(t, "first", root.Attributes, "kproxy.group.generation", "1")
	wantAttr(t, "first", root.Attributes, "kproxy.group.member_count", "1")
	wantAttr(t, "first", root.Attributes, "kproxy.group.protocol", "range")
	if root.Status.Code != codes.Ok {
		t.Errorf("first rebalance status %v", root.Status)
	}
	if len(eventsNamed(root, "member_joined")) != 1 {
		t.Errorf("first rebalance lacks the member_joined event: %v", root.Events)
	}
	assigned := eventsNamed(kids["sync"], "assignment")
	if len(assigned) != 1 {
		t.Fatalf("sync span has %d assignment events, want 1", len(assigned))
	}
	wantAttr(t, "assignment", assigned[0].Attributes, "kproxy.member.assigned_partitions", "4")
	wantAttr(t, "assignment", assigned[0].Attributes, "client.address", "127.0.0.1")
	exp.Reset()

	// 2. A second member joins; the first rejoins once it sees the
	// rebalance.
	j2 := m2.JoinAsync(ctx)
	waitFor(t, "PreparingRebalance", func() bool { return groupState(e, g) == "PreparingRebalance" })
	if err := m1.Heartbeat(ctx); err != kerr.RebalanceInProgress {
		t.Fatalf("heartbeat during the rebalance: %v, want REBALANCE_IN_PROGRESS", err)
	}
	j1 := m1.JoinAsync(ctx)
	r1, r2 := <-j1, <-j2
	if r1.Err != nil || r2.Err != nil {
		t.Fatalf("joins: %v %v", r1.Err, r2.Err)
	}
	errs := make(chan error, 2)
	go func() { errs <- m1.Sync(ctx, r1.Resp) }()
	go func() { errs <- m2.Sync(ctx, r2.Resp) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	flush(t, tp)
	roots = rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 {
		t.Fatalf("after the second join: %d traces, want 1", len(roots))
	}
	wantAttr(t, "second", roots[0].Attributes, "kproxy.rebalance.cause", groupstate.CauseMemberJoined)
	wantAttr(t, "second", roots[0].Attributes, "kproxy.rebalance.cause.member.id", m2.ID)
	wantAttr(t, "second", roots[0].Attributes, "kproxy.group.generation", "2")
	wantAttr(t, "second", roots[0].Attributes, "kproxy.group.member_count", "2")
	if n := len(eventsNamed(childrenOf(exp.GetSpans(), roots[0])["join"], "member")); n != 2 {
		t.Errorf("second join span lists %d members, want 2", n)
	}
	exp.Reset()

	// 3. The second member leaves.
	if err := m2.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := groupdriver.Rebalance(ctx, m1); err != nil {
		t.Fatal(err)
	}
	flush(t, tp)
	roots = rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 {
		t.Fatalf("after the leave: %d traces, want 1", len(roots))
	}
	wantAttr(t, "leave", roots[0].Attributes, "kproxy.rebalance.cause", groupstate.CauseMemberLeft)
	wantAttr(t, "leave", roots[0].Attributes, "kproxy.rebalance.cause.member.id", m2.ID)
	wantAttr(t, "leave", roots[0].Attributes, "kproxy.group.member_count", "1")
	if left := eventsNamed(roots[0], "member_left"); len(left) != 1 {
		t.Errorf("leave rebalance has %d member_left events, want 1: %v", len(left), roots[0].Events)
	}
	exp.Reset()

	// 4. A third member joins with a short session and stops
	// heartbeating: it expires and its departure rebalances the group.
	m3 := newMember(e, g, "m3")
	m3.SessionMillis = 100
	j3 := m3.JoinAsync(ctx)
	waitFor(t, "PreparingRebalance", func() bool { return groupState(e, g) == "PreparingRebalance" })
	j1 = m1.JoinAsync(ctx)
	r1, r3 := <-j1, <-j3
	if r1.Err != nil || r3.Err != nil {
		t.Fatalf("joins: %v %v", r1.Err, r3.Err)
	}
	go func() { errs <- m1.Sync(ctx, r1.Resp) }()
	go func() { errs <- m3.Sync(ctx, r3.Resp) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// m3 never heartbeats again; m1 keeps heartbeating until told to
	// rejoin.
	waitFor(t, "m3 to expire", func() bool {
		err := m1.Heartbeat(ctx)
		return err == kerr.RebalanceInProgress
	})
	if err := groupdriver.Rebalance(ctx, m1); err != nil {
		t.Fatal(err)
	}
	flush(t, tp)
	roots = rootsOf(exp.GetSpans(), g)
	if len(roots) != 2 {
		t.Fatalf("after the expiry: %d traces, want 2 (m3 joining, m3 expiring)", len(roots))
	}
	exp2 := roots[1]
	wantAttr(t, "expiry", exp2.Attributes, "kproxy.rebalance.cause", groupstate.CauseMemberExpired)
	wantAttr(t, "expiry", exp2.Attributes, "kproxy.rebalance.cause.member.id", m3.ID)
	expired := eventsNamed(exp2, "member_expired")
	if len(expired) != 1 {
		t.Fatalf("expiry rebalance has %d member_expired events, want 1: %v", len(expired), exp2.Events)
	}
	wantAttr(t, "member_expired", expired[0].Attributes, "kproxy.member.reason", "session_timeout")
	wantAttr(t, "member_expired", expired[0].Attributes, "messaging.client.id", "client-m3")

	// The metrics and admin API see the same engine.
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{Tap: tp, Groups: e}))
	defer srv.Close()
	_, body := get(t, srv, "/metrics")
	for _, want := range []string{
		`kproxy_rebalances_total{kproxy_rebalance_cause="member_joined",messaging_consumer_group_name="engine-group"} 3`,
		`kproxy_rebalances_total{kproxy_rebalance_cause="member_left",messaging_consumer_group_name="engine-group"} 1`,
		`kproxy_rebalances_total{kproxy_rebalance_cause="member_expired",messaging_consumer_group_name="engine-group"} 1`,
		`kproxy_member_expirations_total{kproxy_member_expire_reason="session_timeout"} 1`,
		`kproxy_groups{kproxy_group_state="Stable"} 1`,
		`kproxy_group_members{messaging_consumer_group_name="engine-group"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q\n%s", want, grepLines(body, "kproxy_"))
		}
	}
	code, body := get(t, srv, "/api/groups/"+g)
	if code != 200 || !strings.Contains(body, `"topic": "payments"`) || !strings.Contains(body, `"client_id": "client-m1"`) {
		t.Errorf("/api/groups/%s: %d %s", g, code, body)
	}
}
