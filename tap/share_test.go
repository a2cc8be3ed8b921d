package tap

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/share"
	"github.com/kproxy/kproxy/tap/internal/groupdriver"
)

// shareHeartbeat sends a ShareGroupHeartbeat of member (epoch 0 with
// topics joins, -1 leaves) and returns the response.
func shareHeartbeat(t *testing.T, e *groupstate.Engine, group, member, client string, epoch int32, topics ...string) *kmsg.ShareGroupHeartbeatResponse {
	t.Helper()
	r := kmsg.NewPtrShareGroupHeartbeatRequest()
	r.Version = 1
	r.GroupID, r.MemberID, r.MemberEpoch = group, member, epoch
	if len(topics) > 0 {
		r.SubscribedTopicNames = topics
	}
	ch := make(chan kmsg.Response, 1)
	e.Handle(groupstate.RequestContext{ClientID: client, ClientHost: "127.0.0.1"}, r, func(resp kmsg.Response) { ch <- resp })
	select {
	case resp := <-ch:
		hr := resp.(*kmsg.ShareGroupHeartbeatResponse)
		if hr.ErrorCode != 0 {
			t.Fatalf("share heartbeat of %s: error %d", member, hr.ErrorCode)
		}
		return hr
	case <-time.After(10 * time.Second):
		t.Fatalf("share heartbeat of %s: no answer", member)
		return nil
	}
}

// shareTopicID returns the id the store gave topic.
func shareTopicID(t *testing.T, store *groupstate.MemoryStore, topic string) [16]byte {
	t.Helper()
	ids, err := store.TopicIDs(context.Background(), []string{topic})
	if err != nil || ids[topic] == ([16]byte{}) {
		t.Fatalf("no id for %s: %v", topic, err)
	}
	return ids[topic]
}

// shareDeliver runs the engine's side of one ShareFetch for member on tp
// of a log of records 0..end-1 in one batch, with acks applied first,
// and returns what it acquired.
func shareDeliver(t *testing.T, e *groupstate.Engine, group, member string, tp groupstate.ShareTP, end int64, acks []share.AckBatch) []share.Acquired {
	t.Helper()
	ackMap := map[groupstate.ShareTP][]share.AckBatch{}
	if acks != nil {
		ackMap[tp] = acks
	}
	plans := make(chan groupstate.SharePlan, 1)
	e.SharePrepare(group, member, ackMap, []groupstate.ShareTP{tp}, func(p groupstate.SharePlan) { plans <- p })
	plan := <-plans
	if plan.Code != 0 {
		t.Fatalf("SharePrepare: %d", plan.Code)
	}
	for tp, c := range plan.AckCodes {
		if c != 0 {
			t.Fatalf("acknowledging %v: %d", tp, c)
		}
	}
	if len(plan.Uninitialized) > 0 {
		done := make(chan int16, 1)
		e.ShareInitialize(group, map[groupstate.ShareTP]int64{tp: 0}, func(c int16) { done <- c })
		if c := <-done; c != 0 {
			t.Fatalf("ShareInitialize: %d", c)
		}
		e.SharePrepare(group, member, nil, []groupstate.ShareTP{tp}, func(p groupstate.SharePlan) { plans <- p })
		plan = <-plans
	}
	from := plan.Offsets[tp]
	if from >= end {
		return nil
	}
	got := make(chan map[groupstate.ShareTP][]share.Acquired, 1)
	e.ShareAcquire(group, member, map[groupstate.ShareTP]groupstate.ShareFetched{tp: {FetchOffset: from, Batches: []share.Batch{{Base: from, Last: end - 1}}}},
		500, share.BatchOptimized, 500, func(m map[groupstate.ShareTP][]share.Acquired, code int16) {
			if code != 0 {
				t.Errorf("ShareAcquire: %d", code)
			}
			got <- m
		})
	return (<-got)[tp]
}

// shareEngineTap starts an engine on a manual clock, with topic "jobs"
// of 2 partitions, a lock of 5 s and a delivery limit of 2, feeding a
// test Tap.
func shareEngineTap(t *testing.T) (*groupstate.Engine, *Tap, *groupstate.MemoryStore, *manualClock, *tracetest.InMemoryExporter) {
	t.Helper()
	tp, exp := newTestTap(t, Config{})
	clk := newManualClock()
	store := groupstate.NewMemoryStore()
	store.SetTopic("jobs", 2)
	e, err := groupstate.New(groupstate.Config{
		Store:                 store,
		Events:                tp.OnEvent,
		Shards:                1,
		Clock:                 clk,
		InitialRebalanceDelay: -1,
		ShareSettings: func(string) groupstate.ShareSettings {
			return groupstate.ShareSettings{LockDuration: 5 * time.Second, DeliveryLimit: 2}
		},
	})
	if err != nil {
		t.Fatalf("groupstate.New: %v", err)
	}
	t.Cleanup(e.Close)
	clk.drainLoopsOf(e)
	tp.SetGroupSource(e)
	return e, tp, store, clk, exp
}

// TestShareMetrics: a share group's deliveries, acknowledgements, lock
// timeouts, redeliveries and archiving at the limit show in /metrics,
// with its share-partitions and locked records per group.
func TestShareMetrics(t *testing.T) {
	e, tp, store, clk, _ := shareEngineTap(t)
	const g = "queue"
	shareHeartbeat(t, e, g, "member-a", "client-a", 0, "jobs")
	part := groupstate.ShareTP{TopicID: shareTopicID(t, store, "jobs"), Partition: 0}

	// 0-9 delivered; 0-3 accepted, 4 rejected, 5-9 time out.
	if got := shareDeliver(t, e, g, "member-a", part, 10, nil); len(got) != 1 || got[0].Last != 9 {
		t.Fatalf("first delivery %+v", got)
	}
	acks := []share.AckBatch{{First: 0, Last: 3, Types: []share.AckType{share.AckAccept}}, {First: 4, Last: 4, Types: []share.AckType{share.AckReject}}}
	shareDeliver(t, e, g, "member-a", part, 10, acks) // 5-9 still locked: nothing new
	clk.Advance(6 * time.Second)
	e.Group(g) // the lock timer ran on the loop
	// 5-9 delivered again (count 2 = the limit) and released: archived.
	if got := shareDeliver(t, e, g, "member-a", part, 12, nil); len(got) == 0 || got[0].First != 5 || got[0].DeliveryCount != 2 {
		t.Fatalf("redelivery %+v", got)
	}
	flush(t, tp)

	body := metricsText(t, tp)
	for _, want := range []string{
		`kproxy_share_records_acknowledged_total{kproxy_share_ack_type="accept"} 4`,
		`kproxy_share_records_acknowledged_total{kproxy_share_ack_type="reject"} 1`,
		`kproxy_share_records_acknowledged_total{kproxy_share_ack_type="release"} 0`,
		`kproxy_share_records_lock_timeouts_total 5`,
		`kproxy_share_records_redelivered_total 5`,
		`kproxy_share_partitions{messaging_consumer_group_name="queue"} 1`,
		`kproxy_share_records_archived_at_limit_total 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q\n%s", want, grepLines(body, "kproxy_share"))
		}
	}
	locked := attrLine(body, `kproxy_share_records_locked{messaging_consumer_group_name="queue"}`)
	if locked != "7" { // 5-9 again and 10-11
		t.Errorf("records locked in /metrics: %q, want 7\n%s", locked, grepLines(body, "kproxy_share"))
	}

	// Releasing what it holds at the limit archives it.
	rel := []share.AckBatch{{First: 5, Last: 9, Types: []share.AckType{share.AckRelease}}}
	plans := make(chan groupstate.SharePlan, 1)
	e.SharePrepare(g, "member-a", map[groupstate.ShareTP][]share.AckBatch{part: rel}, nil, func(p groupstate.SharePlan) { plans <- p })
	if p := <-plans; p.AckCodes[part] != 0 {
		t.Fatalf("release: %d", p.AckCodes[part])
	}
	body = metricsText(t, tp)
	for _, want := range []string{
		`kproxy_share_records_archived_at_limit_total 5`,
		`kproxy_share_records_acknowledged_total{kproxy_share_ack_type="release"} 5`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q\n%s", want, grepLines(body, "kproxy_share"))
		}
	}
	if !strings.Contains(body, "kproxy_share_records_acquired_total ") || !strings.Contains(body, "kproxy_share_state_writes_total ") ||
		!strings.Contains(body, "kproxy_share_state_write_time_seconds_total ") {
		t.Errorf("/metrics lacks the acquired or write counters\n%s", grepLines(body, "kproxy_share"))
	}
}

// attrLine returns the value of the metric line starting with prefix.
func attrLine(body, prefix string) string {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix+" ") {
			return strings.TrimPrefix(l, prefix+" ")
		}
	}
	return ""
}

// TestShareAdminAPI: /api/groups lists a share group with its kind and
// epoch; /api/groups/{id} shows its members with their assignments and
// its share-partitions' start offsets and records by state. A classic
// group keeps its shape, with its kind.
func TestShareAdminAPI(t *testing.T) {
	e, tp, store, _, _ := shareEngineTap(t)
	const g = "queue"
	shareHeartbeat(t, e, g, "member-a", "client-a", 0, "jobs")
	shareHeartbeat(t, e, g, "member-b", "client-b", 0, "jobs")
	shareHeartbeat(t, e, g, "member-a", "client-a", 1) // moves to epoch 2's target
	part := groupstate.ShareTP{TopicID: shareTopicID(t, store, "jobs"), Partition: 0}
	shareDeliver(t, e, g, "member-a", part, 10, nil)
	shareDeliver(t, e, g, "member-a", part, 15, []share.AckBatch{{First: 0, Last: 3, Types: []share.AckType{share.AckAccept}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := groupdriver.Rebalance(ctx, newMember(e, "classic-group", "m1")); err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{Tap: tp, Groups: e}))
	defer srv.Close()
	code, body := get(t, srv, "/api/groups")
	var list []GroupSummary
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil {
		t.Fatalf("/api/groups: %d %v %s", code, err, body)
	}
	byID := map[string]GroupSummary{}
	for _, s := range list {
		byID[s.Group] = s
	}
	if s := byID[g]; s.Kind != "share" || s.ProtocolType != "share" || s.Members != 2 || s.Generation != 2 || s.State != "Stable" {
		t.Errorf("share group in /api/groups: %+v", s)
	}
	if s := byID["classic-group"]; s.Kind != "classic" || s.Members != 1 {
		t.Errorf("classic group in /api/groups: %+v", s)
	}

	code, body = get(t, srv, "/api/groups/"+g)
	var d GroupDetail
	if err := json.Unmarshal([]byte(body), &d); code != 200 || err != nil {
		t.Fatalf("/api/groups/%s: %d %v %s", g, code, err, body)
	}
	if d.Kind != "share" || len(d.Members) != 2 {
		t.Fatalf("detail %+v", d)
	}
	parts := 0
	for _, m := range d.Members {
		if m.ClientID == "" || m.Epoch != 2 {
			t.Errorf("member %+v lacks its client id or epoch", m)
		}
		for _, a := range m.Assignment {
			if a.Topic != "jobs" {
				t.Errorf("member %s assigned %+v", m.MemberID, a)
			}
			parts += len(a.Partitions)
		}
	}
	if parts != 2 {
		t.Errorf("members hold %d partitions of jobs, want 2: %+v", parts, d.Members)
	}
	// 0-3 accepted: the start moved to 4; 4-14 locked by member-a.
	want := SharePartition{Topic: "jobs", Partition: 0, StartOffset: 4, InFlight: 11, Acquired: 11}
	if len(d.SharePartitions) != 1 {
		t.Fatalf("share_partitions %+v", d.SharePartitions)
	}
	got := d.SharePartitions[0]
	want.TopicID = got.TopicID
	if got != want || len(got.TopicID) != 32 {
		t.Errorf("share partition %+v, want %+v", got, want)
	}
	if !strings.Contains(body, `"share_partitions"`) || !strings.Contains(body, `"start_offset": 4`) {
		t.Errorf("JSON lacks share_partitions: %s", body)
	}
	_, body = get(t, srv, "/api/groups/classic-group")
	if strings.Contains(body, "share_partitions") || !strings.Contains(body, `"kind": "classic"`) {
		t.Errorf("classic group detail: %s", body)
	}
}

// TestShareAssignmentTraces: each assignment change of a share group is
// one short trace: its cause, epochs, member count and an "assignment"
// event per member with its target. After a leave the trace lasts until
// the next heartbeat computes the new target; the last member leaving
// ends one as group_empty.
func TestShareAssignmentTraces(t *testing.T) {
	e, tp, _, clk, exp := shareEngineTap(t)
	const g = "queue"
	shareHeartbeat(t, e, g, "member-a", "client-a", 0, "jobs")
	settle(t, e, tp, g)
	roots := rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 {
		t.Fatalf("after a joined: %d traces, want 1: %v", len(roots), names(exp.GetSpans()))
	}
	r := roots[0]
	wantAttr(t, "join", r.Attributes, "kproxy.group.kind", "share")
	wantAttr(t, "join", r.Attributes, "kproxy.rebalance.cause", groupstate.CauseMemberJoined)
	wantAttr(t, "join", r.Attributes, "kproxy.rebalance.cause.client.id", "client-a")
	wantAttr(t, "join", r.Attributes, "kproxy.group.epoch", "1")
	wantAttr(t, "join", r.Attributes, "kproxy.group.assignor", "simple")
	wantAttr(t, "join", r.Attributes, "kproxy.group.member_count", "1")
	wantAttr(t, "join", r.Attributes, "kproxy.rebalance.outcome", "completed")
	if r.Status.Code != codes.Ok {
		t.Errorf("join trace status %v", r.Status)
	}
	assign, ok := spanWithName(exp.GetSpans(), r, "assign")
	if !ok {
		t.Fatalf("no assign span: %v", names(exp.GetSpans()))
	}
	if ev := eventsOf(assign, "assignment"); len(ev) != 1 {
		t.Errorf("assign span events %v", assign.Events)
	} else {
		wantAttr(t, "assignment", ev[0].Attributes, "kproxy.member.assigned_partitions", "2")
		wantAttr(t, "assignment", ev[0].Attributes, "kproxy.member.assigned_topics", "jobs")
	}
	if len(eventsOf(r, "member_joined")) != 1 {
		t.Errorf("join trace lacks member_joined: %v", r.Events)
	}
	shareHeartbeat(t, e, g, "member-b", "client-b", 0, "jobs")
	shareHeartbeat(t, e, g, "member-a", "client-a", 1)
	settle(t, e, tp, g)
	exp.Reset()

	// b leaves; a's next heartbeat, 700 ms later, computes the target.
	shareHeartbeat(t, e, g, "member-b", "client-b", -1)
	clk.Advance(700 * time.Millisecond)
	shareHeartbeat(t, e, g, "member-a", "client-a", 2)
	settle(t, e, tp, g)
	roots = rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 {
		t.Fatalf("after b left: %d traces, want 1: %v", len(roots), names(exp.GetSpans()))
	}
	r = roots[0]
	wantAttr(t, "leave", r.Attributes, "kproxy.rebalance.cause", groupstate.CauseMemberLeft)
	wantAttr(t, "leave", r.Attributes, "kproxy.group.previous_epoch", "2")
	wantAttr(t, "leave", r.Attributes, "kproxy.group.epoch", "3")
	wantAttr(t, "leave", r.Attributes, "kproxy.group.member_count", "1")
	if d := r.EndTime.Sub(r.StartTime); d != 700*time.Millisecond {
		t.Errorf("leave trace lasted %v, want 700ms", d)
	}
	if len(eventsOf(r, "member_left")) != 1 {
		t.Errorf("leave trace lacks member_left: %v", r.Events)
	}
	if assign, ok := spanWithName(exp.GetSpans(), r, "assign"); !ok {
		t.Errorf("no assign span after the leave")
	} else if ev := eventsOf(assign, "assignment"); len(ev) != 1 {
		t.Errorf("assign events %v", assign.Events)
	} else {
		wantAttr(t, "assignment", ev[0].Attributes, "kproxy.member.id", "member-a")
		wantAttr(t, "assignment", ev[0].Attributes, "kproxy.member.assigned_partitions", "2")
	}
	exp.Reset()

	shareHeartbeat(t, e, g, "member-a", "client-a", -1)
	settle(t, e, tp, g)
	roots = rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 || outcomeOf(roots[0]) != "group_empty" {
		t.Fatalf("after the last member left: %v", names(exp.GetSpans()))
	}
	body := metricsText(t, tp)
	if !strings.Contains(body, `kproxy_rebalances_total{kproxy_rebalance_cause="member_left",messaging_consumer_group_name="queue"} 2`) {
		t.Errorf("/metrics lacks the share group's rebalances\n%s", grepLines(body, "kproxy_rebalances"))
	}
}

// TestWebViewShowsShareGroups: the page served has the kind column and
// the share-partitions table, and its script fills them from the API's
// fields. (The browser test, tap/webview/e2e, drives the page itself.)
func TestWebViewShowsShareGroups(t *testing.T) {
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{}))
	defer srv.Close()
	_, page := get(t, srv, "/")
	_, script := get(t, srv, "/app.js")
	for _, want := range []string{`<th title="classic, consumer (KIP-848) or share (KIP-932)">kind</th>`, `id="share-partitions"`} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	for _, want := range []string{"g.kind", "d.share_partitions", "p.start_offset", "p.acquired", "p.available", "p.in_flight"} {
		if !strings.Contains(script, want) {
			t.Errorf("app.js does not read %s", want)
		}
	}
}
