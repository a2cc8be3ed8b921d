package tap

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kproxy/kproxy/groupstate"
)

// checkRebalanceTrace verifies the shape every completed rebalance trace
// has: a root with join and sync children in one trace, phases that tile
// the root, and the group attributes.
func checkRebalanceTrace(t *testing.T, spans tracetest.SpanStubs, group string) (root, join, sync tracetest.SpanStub) {
	t.Helper()
	by := spansByName(spans)
	if len(by["rebalance"]) != 1 || len(by["join"]) != 1 || len(by["sync"]) != 1 {
		t.Fatalf("want one root, join and sync span, got %v", names(spans))
	}
	root, join, sync = by["rebalance"][0], by["join"][0], by["sync"][0]
	if root.Parent.IsValid() {
		t.Errorf("root span has a parent %v", root.Parent)
	}
	for _, child := range []tracetest.SpanStub{join, sync} {
		if child.Parent.SpanID() != root.SpanContext.SpanID() || child.SpanContext.TraceID() != root.SpanContext.TraceID() {
			t.Errorf("%s span is not a child of the root in its trace", child.Name)
		}
	}
	if !join.EndTime.Equal(sync.StartTime) {
		t.Errorf("join ends at %v but sync starts at %v", join.EndTime, sync.StartTime)
	}
	if !sync.EndTime.Equal(root.EndTime) {
		t.Errorf("sync ends at %v but root at %v", sync.EndTime, root.EndTime)
	}
	wantAttr(t, "root", root.Attributes, "messaging.system", "kafka")
	wantAttr(t, "root", root.Attributes, "messaging.consumer.group.name", group)
	wantAttr(t, "join", join.Attributes, "messaging.consumer.group.name", group)
	return root, join, sync
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func TestTraceOfFirstJoin(t *testing.T) {
	tp, exp := newTestTap(t, Config{InstanceID: "kproxy-a"})
	s := newSeq("orders")
	m1 := member("m1")
	m1.InstanceID = "pod-1"
	ev := s.at(0, groupstate.EventGroupCreated)
	tp.OnEvent(ev)
	ev = s.at(time.Millisecond, groupstate.EventMemberJoined)
	ev.Member = &m1
	tp.OnEvent(ev)
	ev = s.at(0, groupstate.EventRebalanceStarted)
	ev.Cause, ev.Member = groupstate.CauseMemberJoined, &m1
	start := ev.Time
	tp.OnEvent(ev)
	ev = s.at(3*time.Second, groupstate.EventJoinCompleted)
	ev.Generation, ev.Protocol, ev.Leader, ev.Members = 1, "cooperative-sticky", "m1", []groupstate.Member{m1}
	joinDone := ev.Time
	tp.OnEvent(ev)
	ev = s.at(20*time.Millisecond, groupstate.EventSyncCompleted)
	m1a := m1
	m1a.Assignment = assignment("payments", 2, 0, 1)
	ev.Generation, ev.Members = 1, []groupstate.Member{m1a}
	tp.OnEvent(ev)
	flush(t, tp)

	root, join, sync := checkRebalanceTrace(t, exp.GetSpans(), "orders")
	if !root.StartTime.Equal(start.Add(-0)) || !join.StartTime.Equal(start) || !join.EndTime.Equal(joinDone) {
		t.Errorf("timing: root %v join %v..%v, want start %v join end %v", root.StartTime, join.StartTime, join.EndTime, start, joinDone)
	}
	if got := root.EndTime.Sub(root.StartTime); got != 3020*time.Millisecond {
		t.Errorf("rebalance lasted %v, want 3.02s", got)
	}
	wantAttr(t, "root", root.Attributes, "kproxy.rebalance.cause", "member_joined")
	wantAttr(t, "root", root.Attributes, "kproxy.owner", "kproxy-a")
	wantAttr(t, "root", root.Attributes, "kproxy.rebalance.cause.member.id", "m1")
	wantAttr(t, "root", root.Attributes, "kproxy.rebalance.cause.client.id", "client-m1")
	wantAttr(t, "root", root.Attributes, "kproxy.rebalance.cause.instance_id", "pod-1")
	wantAttr(t, "root", root.Attributes, "kproxy.group.generation", "1")
	wantAttr(t, "root", root.Attributes, "kproxy.group.protocol", "cooperative-sticky")
	wantAttr(t, "root", root.Attributes, "kproxy.group.protocol_type", "consumer")
	wantAttr(t, "root", root.Attributes, "kproxy.group.leader", "m1")
	wantAttr(t, "root", root.Attributes, "kproxy.group.member_count", "1")
	wantAttr(t, "root", root.Attributes, "kproxy.rebalance.outcome", "completed")
	if root.Status.Code != codes.Ok {
		t.Errorf("root status %v, want Ok", root.Status)
	}
	joined := eventsNamed(root, "member_joined")
	if len(joined) != 1 {
		t.Fatalf("root has %d member_joined events, want 1: %v", len(joined), root.Events)
	}
	wantAttr(t, "member_joined", joined[0].Attributes, "kproxy.member.id", "m1")
	wantAttr(t, "member_joined", joined[0].Attributes, "messaging.client.id", "client-m1")
	wantAttr(t, "member_joined", joined[0].Attributes, "client.address", "10.0.0.1")
	wantAttr(t, "member_joined", joined[0].Attributes, "kproxy.member.instance_id", "pod-1")
	members := eventsNamed(join, "member")
	if len(members) != 1 {
		t.Fatalf("join span has %d member events, want 1", len(members))
	}
	wantAttr(t, "join member", members[0].Attributes, "kproxy.member.leader", "true")
	assigned := eventsNamed(sync, "assignment")
	if len(assigned) != 1 {
		t.Fatalf("sync span has %d assignment events, want 1", len(assigned))
	}
	wantAttr(t, "assignment", assigned[0].Attributes, "kproxy.member.assigned_partitions", "3")
	wantAttr(t, "assignment", assigned[0].Attributes, "kproxy.member.assigned_topics", "payments")
}

func TestTraceOfLeaveIsANewTrace(t *testing.T) {
	tp, exp := newTestTap(t, Config{})
	s := newSeq("g")
	m1, m2 := member("m1"), member("m2")
	both := []groupstate.Member{m1, m2}
	// First rebalance: both members join.
	ev := s.at(0, groupstate.EventRebalanceStarted)
	ev.Cause = groupstate.CauseMemberJoined
	tp.OnEvent(ev)
	ev = s.at(time.Second, groupstate.EventJoinCompleted)
	ev.Generation, ev.Leader, ev.Members = 1, "m1", both
	tp.OnEvent(ev)
	ev = s.at(time.Millisecond, groupstate.EventSyncCompleted)
	ev.Generation, ev.Members = 1, both
	tp.OnEvent(ev)
	flush(t, tp)
	first := exp.GetSpans()
	exp.Reset()

	// Second rebalance: m2 leaves.
	ev = s.at(time.Minute, groupstate.EventMemberLeft)
	ev.Generation, ev.Member = 1, &m2
	tp.OnEvent(ev)
	ev = s.at(0, groupstate.EventRebalanceStarted)
	ev.Generation, ev.Cause, ev.Member = 1, groupstate.CauseMemberLeft, &m2
	tp.OnEvent(ev)
	ev = s.at(50*time.Millisecond, groupstate.EventJoinCompleted)
	ev.Generation, ev.Leader, ev.Members = 2, "m1", []groupstate.Member{m1}
	tp.OnEvent(ev)
	ev = s.at(time.Millisecond, groupstate.EventSyncCompleted)
	ev.Generation, ev.Members = 2, []groupstate.Member{m1}
	tp.OnEvent(ev)
	flush(t, tp)

	root1, _, _ := checkRebalanceTrace(t, first, "g")
	root2, join2, _ := checkRebalanceTrace(t, exp.GetSpans(), "g")
	if root1.SpanContext.TraceID() == root2.SpanContext.TraceID() {
		t.Errorf("two rebalances share trace %v", root1.SpanContext.TraceID())
	}
	wantAttr(t, "root2", root2.Attributes, "kproxy.rebalance.cause", "member_left")
	wantAttr(t, "root2", root2.Attributes, "kproxy.rebalance.cause.member.id", "m2")
	wantAttr(t, "root2", root2.Attributes, "kproxy.group.previous_generation", "1")
	wantAttr(t, "root2", root2.Attributes, "kproxy.group.generation", "2")
	wantAttr(t, "root2", root2.Attributes, "kproxy.group.member_count", "1")
	if left := eventsNamed(root2, "member_left"); len(left) != 1 {
		t.Errorf("root2 has %d member_left events, want 1 (the leave that caused it)", len(left))
	}
	if n := len(eventsNamed(join2, "member")); n != 1 {
		t.Errorf("join2 lists %d members, want 1", n)
	}
}

func TestTraceOfExpiryDuringJoin(t *testing.T) {
	tp, exp := newTestTap(t, Config{})
	s := newSeq("g")
	m1, m2, m3 := member("m1"), member("m2"), member("m3")
	ev := s.at(0, groupstate.EventMemberJoined)
	ev.Member = &m3
	tp.OnEvent(ev)
	ev = s.at(0, groupstate.EventRebalanceStarted)
	ev.Generation, ev.Cause, ev.Member = 4, groupstate.CauseMemberJoined, &m3
	tp.OnEvent(ev)
	ev = s.at(30*time.Second, groupstate.EventMemberExpired)
	ev.Member, ev.Cause = &m2, "join_timeout"
	tp.OnEvent(ev)
	ev = s.at(0, groupstate.EventJoinCompleted)
	ev.Generation, ev.Leader, ev.Members = 5, "m1", []groupstate.Member{m1, m3}
	tp.OnEvent(ev)
	ev = s.at(time.Millisecond, groupstate.EventSyncCompleted)
	ev.Generation, ev.Members = 5, []groupstate.Member{m1, m3}
	tp.OnEvent(ev)
	flush(t, tp)

	root, join, _ := checkRebalanceTrace(t, exp.GetSpans(), "g")
	expired := eventsNamed(root, "member_expired")
	if len(expired) != 1 {
		t.Fatalf("root has %d member_expired events, want 1: %v", len(expired), root.Events)
	}
	wantAttr(t, "member_expired", expired[0].Attributes, "kproxy.member.id", "m2")
	wantAttr(t, "member_expired", expired[0].Attributes, "kproxy.member.reason", "join_timeout")
	if join.EndTime.Sub(join.StartTime) != 30*time.Second {
		t.Errorf("join phase lasted %v, want 30s (waiting for the expired member)", join.EndTime.Sub(join.StartTime))
	}
}

func TestTraceOfAbortedAndEmptiedRebalances(t *testing.T) {
	for _, tc := range []struct {
		kind    groupstate.EventKind
		outcome string
		failed  bool // an emptied group is no failure: its member events say why
	}{
		{groupstate.EventRebalanceAborted, "aborted", true},
		{groupstate.EventGroupEmpty, "group_empty", false},
		{groupstate.EventGroupUnloaded, "unloaded", true},
		{groupstate.EventGroupConverted, "converted", true},
	} {
		t.Run(tc.outcome, func(t *testing.T) {
			tp, exp := newTestTap(t, Config{})
			s := newSeq("g")
			ev := s.at(0, groupstate.EventRebalanceStarted)
			ev.Cause = groupstate.CauseMemberExpired
			tp.OnEvent(ev)
			ev = s.at(2*time.Second, tc.kind)
			ev.Cause = "sync_timeout"
			tp.OnEvent(ev)
			flush(t, tp)
			by := spansByName(exp.GetSpans())
			if len(by["rebalance"]) != 1 || len(by["join"]) != 1 || len(by["sync"]) != 0 {
				t.Fatalf("spans %v, want root and join only", names(exp.GetSpans()))
			}
			root := by["rebalance"][0]
			if tc.failed && (root.Status.Code != codes.Error || root.Status.Description == "") {
				t.Errorf("root status %+v, want Error with a description", root.Status)
			}
			if !tc.failed && root.Status.Code != codes.Unset {
				t.Errorf("root status %+v, want Unset", root.Status)
			}
			wantAttr(t, "root", root.Attributes, "kproxy.rebalance.outcome", tc.outcome)
			if !by["join"][0].EndTime.Equal(root.EndTime) {
				t.Errorf("join span not ended with the root")
			}
		})
	}
}

func TestTraceOfRebalanceRestartedDuringSync(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp, _ := newTestTap(t, Config{SpanExporter: keepSpans{exp}})
	s := newSeq("g")
	ev := s.at(0, groupstate.EventRebalanceStarted)
	ev.Cause = groupstate.CauseMemberJoined
	tp.OnEvent(ev)
	ev = s.at(time.Second, groupstate.EventJoinCompleted)
	ev.Generation, ev.Members = 1, []groupstate.Member{member("m1")}
	tp.OnEvent(ev)
	ev = s.at(time.Second, groupstate.EventRebalanceStarted)
	ev.Generation, ev.Cause = 1, groupstate.CauseMemberJoined
	tp.OnEvent(ev)
	flush(t, tp)
	by := spansByName(exp.GetSpans())
	if len(by["rebalance"]) != 1 || len(by["sync"]) != 1 {
		t.Fatalf("spans %v, want the superseded rebalance ended", names(exp.GetSpans()))
	}
	wantAttr(t, "superseded", by["rebalance"][0].Attributes, "kproxy.rebalance.outcome", "superseded")

	// The new rebalance is still open; shutting down ends it.
	exp.Reset()
	if err := tp.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	by = spansByName(exp.GetSpans())
	if len(by["rebalance"]) != 1 {
		t.Fatalf("after shutdown spans %v, want the open rebalance ended", names(exp.GetSpans()))
	}
	root := by["rebalance"][0]
	wantAttr(t, "open", root.Attributes, "kproxy.rebalance.outcome", "shutdown")
	if len(root.Links) != 1 {
		t.Errorf("restarted rebalance has %d links, want 1 to the superseded one", len(root.Links))
	}
}

func TestOnEventNeverBlocks(t *testing.T) {
	tp, _ := newTestTap(t, Config{EventBuffer: 8})
	if err := tp.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100; i++ {
			tp.OnEvent(groupstate.Event{Kind: groupstate.EventMemberJoined, Group: "g"})
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("OnEvent blocked with a full queue")
	}
	if got := tp.DroppedEvents(); got != 92 {
		t.Errorf("dropped %d events, want 92 (100 sent, 8 buffered)", got)
	}
}

// keepSpans keeps an in-memory exporter's spans across Shutdown (which
// would otherwise reset them).
type keepSpans struct{ *tracetest.InMemoryExporter }

func (keepSpans) Shutdown(context.Context) error { return nil }

func TestPendingMemberEventsAreForgotten(t *testing.T) {
	tp, _ := newTestTap(t, Config{})
	s := newSeq("static")
	m := member("m1")
	ev := s.at(0, groupstate.EventMemberFenced)
	ev.Member = &m
	tp.OnEvent(ev) // a static replacement without a rebalance
	flush(t, tp)
	if len(tp.rebalances.pending["static"]) != 1 {
		t.Fatalf("fenced event not kept for a following rebalance")
	}
	other := newSeq("busy")
	other.now = s.now.Add(time.Minute)
	for i := 0; i < 1100; i++ {
		tp.OnEvent(other.at(time.Millisecond, groupstate.EventOffsetsCommitted))
	}
	flush(t, tp)
	if _, ok := tp.rebalances.pending["static"]; ok {
		t.Errorf("stale pending events of an idle group are still held")
	}
}

// TestTraceOfKIP848Rebalance covers a consumer-protocol group: its
// rebalance has no join or sync round and ends when every member holds
// its target assignment at the new group epoch.
func TestTraceOfKIP848Rebalance(t *testing.T) {
	tp, exp := newTestTap(t, Config{})
	s := newSeq("g848")
	m1 := member("m1")
	ev := s.at(0, groupstate.EventRebalanceStarted)
	ev.GroupType = groupstate.GroupTypeConsumer
	ev.Generation, ev.Cause, ev.Member = 4, groupstate.CauseMemberJoined, &m1
	tp.OnEvent(ev)
	ev = s.at(40*time.Millisecond, groupstate.EventAssignmentReconciled)
	ev.GroupType = groupstate.GroupTypeConsumer
	ev.Generation, ev.Protocol, ev.Members = 4, "uniform", []groupstate.Member{m1}
	tp.OnEvent(ev)
	flush(t, tp)
	var root *tracetest.SpanStub
	spans := exp.GetSpans()
	for i := range spans {
		if !spans[i].Parent.IsValid() {
			root = &spans[i]
		}
	}
	if root == nil {
		t.Fatalf("no root span among %d spans: the rebalance never ended", len(spans))
	}
	wantAttr(t, "root", root.Attributes, "kproxy.rebalance.cause", "member_joined")
	wantAttr(t, "root", root.Attributes, "kproxy.group.kind", "consumer")
	wantAttr(t, "root", root.Attributes, "kproxy.group.previous_epoch", "3")
	wantAttr(t, "root", root.Attributes, "kproxy.group.epoch", "4")
	wantAttr(t, "root", root.Attributes, "kproxy.group.assignor", "uniform")
	wantAttr(t, "root", root.Attributes, "kproxy.rebalance.outcome", "completed")
	if d := root.EndTime.Sub(root.StartTime); d != 40*time.Millisecond {
		t.Errorf("root lasted %v, want 40ms", d)
	}
}

// TestLastMemberLeavingEndsOneTrace: when the last member leaves, the
// engine starts a rebalance and empties the group at the same instant.
// That ends in one trace with outcome group_empty, whether a rebalance
// was in progress (KIP-848 here: it ends group_empty, with no second
// trace) or not (classic here: a short trace, not counted in the
// duration histogram).
func TestLastMemberLeavingEndsOneTrace(t *testing.T) {
	t.Run("during a KIP-848 rebalance", func(t *testing.T) {
		tp, exp := newTestTap(t, Config{})
		s := newSeq("k")
		m1 := member("m1")
		ev := s.at(0, groupstate.EventRebalanceStarted)
		ev.GroupType, ev.Generation, ev.Cause = groupstate.GroupTypeConsumer, 2, groupstate.CauseSubscriptionChanged
		tp.OnEvent(ev)
		ev = s.at(time.Second, groupstate.EventMemberLeft)
		ev.GroupType, ev.Generation, ev.Member = groupstate.GroupTypeConsumer, 2, &m1
		tp.OnEvent(ev)
		ev = s.at(0, groupstate.EventRebalanceStarted)
		ev.GroupType, ev.Generation, ev.Cause, ev.Member = groupstate.GroupTypeConsumer, 3, groupstate.CauseMemberLeft, &m1
		tp.OnEvent(ev)
		ev = s.at(0, groupstate.EventGroupEmpty)
		ev.GroupType, ev.Generation = groupstate.GroupTypeConsumer, 3
		tp.OnEvent(ev)
		flush(t, tp)
		roots := rootsOf(exp.GetSpans(), "k")
		if len(roots) != 1 {
			t.Fatalf("%d traces, want 1: %v", len(roots), names(exp.GetSpans()))
		}
		wantAttr(t, "root", roots[0].Attributes, "kproxy.rebalance.outcome", "group_empty")
		wantAttr(t, "root", roots[0].Attributes, "kproxy.rebalance.cause", groupstate.CauseSubscriptionChanged)
		if len(eventsNamed(roots[0], "member_left")) != 1 {
			t.Errorf("member_left not in the trace: %v", roots[0].Events)
		}
		if d := roots[0].EndTime.Sub(roots[0].StartTime); d != time.Second {
			t.Errorf("trace lasted %v, want 1s", d)
		}
		body := metricsText(t, tp)
		if want := `kproxy_rebalance_duration_seconds_count{kproxy_rebalance_cause="subscription_changed",kproxy_rebalance_outcome="group_empty"} 1`; !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(body, "rebalance_duration_seconds_count"))
		}
		if strings.Contains(grepLines(body, "rebalance_duration_seconds_count"), "member_left") {
			t.Errorf("/metrics has a sample of the rebalance that never was:\n%s", grepLines(body, "rebalance_duration_seconds_count"))
		}
	})
	t.Run("from a Stable classic group", func(t *testing.T) {
		tp, exp := newTestTap(t, Config{})
		s := newSeq("c")
		m1 := member("m1")
		ev := s.at(0, groupstate.EventMemberLeft)
		ev.Generation, ev.Member = 5, &m1
		tp.OnEvent(ev)
		ev = s.at(0, groupstate.EventRebalanceStarted)
		ev.GroupType, ev.Generation, ev.Cause, ev.Member = groupstate.GroupTypeClassic, 5, groupstate.CauseMemberLeft, &m1
		ev.State = "PreparingRebalance"
		tp.OnEvent(ev)
		ev = s.at(0, groupstate.EventRebalanceAborted)
		ev.GroupType, ev.Generation, ev.State = groupstate.GroupTypeClassic, 6, "Empty"
		tp.OnEvent(ev)
		ev = s.at(0, groupstate.EventGroupEmpty)
		ev.GroupType, ev.Generation, ev.State = groupstate.GroupTypeClassic, 6, "Empty"
		tp.OnEvent(ev)
		flush(t, tp)
		roots := rootsOf(exp.GetSpans(), "c")
		if len(roots) != 1 {
			t.Fatalf("%d traces, want 1: %v", len(roots), names(exp.GetSpans()))
		}
		wantAttr(t, "root", roots[0].Attributes, "kproxy.rebalance.outcome", "group_empty")
		if roots[0].Status.Code != codes.Unset {
			t.Errorf("status %v, want Unset: the group emptying is no failure", roots[0].Status)
		}
		if len(eventsNamed(roots[0], "member_left")) != 1 {
			t.Errorf("member_left not in the trace: %v", roots[0].Events)
		}
		if body := metricsText(t, tp); strings.Contains(body, "kproxy_rebalance_duration_seconds_count") {
			t.Errorf("/metrics counts a rebalance that waited for nothing:\n%s", grepLines(body, "rebalance_duration_seconds_count"))
		}
	})
}
