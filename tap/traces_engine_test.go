package tap

import (
	"context"
	"errors"
	"maps"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/tap/internal/groupdriver"
)

// manualClock is a groupstate.Clock that moves only when a test says so.
// Timers fire from Advance, in due order; their functions only post to
// the engine's loops. Advance waits for the loops (drain) before it moves
// the clock and after each timer it fires, so whatever a loop does reads
// the instant it was started at: the work a request set off (a loop
// answers a request before it emits that request's events) and a
// timer's handling alike.
type manualClock struct {
	mu     sync.Mutex // guards now, seq and timers
	now    time.Time
	seq    int
	timers []*manualTimer
	drain  func() // set by drainLoopsOf before the first Advance; then read-only
}

type manualTimer struct {
	c       *manualClock
	at      time.Time
	seq     int
	f       func()
	stopped bool // guarded by c.mu
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
}

// drainLoopsOf makes Advance wait until e's loops have run what was
// posted to them (a snapshot of every group runs on each loop after it).
func (c *manualClock) drainLoopsOf(e *groupstate.Engine) {
	c.drain = func() { e.Groups() }
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) groupstate.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &manualTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves the clock by d, firing the timers due on the way.
func (c *manualClock) Advance(d time.Duration) {
	if c.drain != nil {
		c.drain()
	}
	c.mu.Lock()
	limit := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.Slice(c.timers, func(i, j int) bool {
			if !c.timers[i].at.Equal(c.timers[j].at) {
				return c.timers[i].at.Before(c.timers[j].at)
			}
			return c.timers[i].seq < c.timers[j].seq
		})
		var due *manualTimer
		for len(c.timers) > 0 {
			t := c.timers[0]
			if t.stopped {
				c.timers = c.timers[1:]
				continue
			}
			if !t.at.After(limit) {
				due = t
				c.timers = c.timers[1:]
				t.stopped = true
				if t.at.After(c.now) {
					c.now = t.at
				}
			}
			break
		}
		if due == nil {
			c.now = limit
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		due.f()
		if c.drain != nil {
			c.drain()
		}
	}
}

// newClockedEngineTap starts a real engine on a manual clock whose events
// feed a test Tap.
func newClockedEngineTap(t *testing.T, initialDelay time.Duration, store *groupstate.MemoryStore) (*groupstate.Engine, *Tap, *tracetest.InMemoryExporter, *manualClock) {
	t.Helper()
	tp, exp := newTestTap(t, Config{})
	clk := newManualClock()
	if store == nil {
		store = groupstate.NewMemoryStore()
	}
	e, err := groupstate.New(groupstate.Config{
		Store:                 store,
		Events:                tp.OnEvent,
		Shards:                1,
		Clock:                 clk,
		InitialRebalanceDelay: initialDelay,
	})
	if err != nil {
		t.Fatalf("groupstate.New: %v", err)
	}
	t.Cleanup(e.Close)
	clk.drainLoopsOf(e)
	tp.SetGroupSource(e)
	return e, tp, exp, clk
}

// settle waits until the engine's loop has run what the clock posted (a
// snapshot runs on the loop after them) and tap has seen every event.
func settle(t *testing.T, e *groupstate.Engine, tp *Tap, group string) {
	t.Helper()
	e.Group(group)
	flush(t, tp)
}

// joinNow sends a member's JoinGroup and waits until the engine holds it.
func joinNow(t *testing.T, ctx context.Context, e *groupstate.Engine, m *groupdriver.Member) <-chan groupdriver.JoinResult {
	t.Helper()
	known := m.ID != ""
	ch := m.JoinAsync(ctx)
	waitFor(t, "the JoinGroup of "+m.ClientID+" to reach the engine", func() bool {
		g, _ := e.Group(m.Group)
		for _, gm := range g.Members {
			if gm.ClientID == m.ClientID && (!known || g.State != "Stable") {
				return true
			}
		}
		return false
	})
	return ch
}

func spanWithName(spans tracetest.SpanStubs, parent tracetest.SpanStub, name string) (tracetest.SpanStub, bool) {
	for _, s := range spans {
		if s.Name == name && s.Parent.SpanID() == parent.SpanContext.SpanID() {
			return s, true
		}
	}
	return tracetest.SpanStub{}, false
}

// metricsText returns tp's /metrics page.
func metricsText(t *testing.T, tp *Tap) string {
	t.Helper()
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{Tap: tp}))
	defer srv.Close()
	_, body := get(t, srv, "/metrics")
	return body
}

func outcomeOf(s tracetest.SpanStub) string {
	return attrMap(s.Attributes)["kproxy.rebalance.outcome"].String()
}

func eventsOf(s tracetest.SpanStub, name string) []sdktrace.Event { return eventsNamed(s, name) }

// TestEngineSupersededRebalance: the leader stops after its JoinGroup of
// generation 2 and a third member joins during the sync phase. The
// rebalance waiting for SyncGroup ends as superseded, the next one links
// to it and carries the new member's member_joined event, and each
// member's "member" event is stamped with its own JoinGroup.
func TestEngineSupersededRebalance(t *testing.T) {
	e, tp, exp, clk := newClockedEngineTap(t, -1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const g = "superseded"
	m1, m2, m3 := newMember(e, g, "m1"), newMember(e, g, "m2"), newMember(e, g, "m3")
	if err := groupdriver.Rebalance(ctx, m1); err != nil {
		t.Fatal(err)
	}
	settle(t, e, tp, g)
	exp.Reset()

	// Generation 2: m2 joins, m1 rejoins 700ms later.
	j2 := joinNow(t, ctx, e, m2)
	t2 := clk.Now()
	clk.Advance(700 * time.Millisecond)
	t1 := clk.Now()
	j1 := m1.JoinAsync(ctx)
	r1, r2 := <-j1, <-j2
	if r1.Err != nil || r2.Err != nil {
		t.Fatalf("joins: %v %v", r1.Err, r2.Err)
	}
	// m1 leads and never sends SyncGroup; m3 joins a second later.
	clk.Advance(time.Second)
	j3 := joinNow(t, ctx, e, m3)
	settle(t, e, tp, g)

	roots := rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 {
		t.Fatalf("after m3 joined: %d ended rebalances, want 1 (the superseded one): %v", len(roots), names(exp.GetSpans()))
	}
	old := roots[0]
	if got := outcomeOf(old); got != "superseded" {
		t.Errorf("old rebalance outcome %q, want superseded", got)
	}
	if old.Status.Code == codes.Error {
		t.Errorf("superseded rebalance has status %v", old.Status)
	}
	if n := len(eventsOf(old, "member_joined")); n != 1 {
		t.Errorf("old rebalance has %d member_joined events, want 1 (m2's only): %v", n, old.Events)
	}
	join, ok := spanWithName(exp.GetSpans(), old, "join")
	if !ok {
		t.Fatalf("old rebalance has no join span")
	}
	stamps := map[string]sdktrace.Event{}
	for _, ev := range eventsOf(join, "member") {
		stamps[attrMap(ev.Attributes)["messaging.client.id"].String()] = ev
	}
	if ev := stamps["client-m2"]; !ev.Time.Equal(t2) {
		t.Errorf("m2's member event at %v, want its JoinGroup at %v", ev.Time, t2)
	}
	if ev := stamps["client-m1"]; !ev.Time.Equal(t1) || !attrMap(ev.Attributes)["kproxy.member.last_to_join"].AsBool() {
		t.Errorf("m1's member event at %v (%v), want its JoinGroup at %v marked last_to_join", ev.Time, ev.Attributes, t1)
	}
	wantAttr(t, "join", join.Attributes, "kproxy.rebalance.last_member.client.id", "client-m1")
	if got := attrMap(stamps["client-m1"].Attributes)["kproxy.member.join_wait_ms"].AsInt64(); got != 700 {
		t.Errorf("m1 join_wait_ms %d, want 700", got)
	}

	// Everyone rejoins and syncs: the new rebalance completes.
	exp.Reset()
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
	roots = rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 {
		t.Fatalf("after the rejoin: %d rebalances, want 1", len(roots))
	}
	nw := roots[0]
	if outcomeOf(nw) != "completed" {
		t.Errorf("new rebalance outcome %q", outcomeOf(nw))
	}
	if len(nw.Links) != 1 || nw.Links[0].SpanContext.SpanID() != old.SpanContext.SpanID() {
		t.Errorf("new rebalance links %v, want one link to the superseded root", nw.Links)
	}
	joined := eventsOf(nw, "member_joined")
	if len(joined) != 1 || attrMap(joined[0].Attributes)["messaging.client.id"].String() != "client-m3" {
		t.Errorf("new rebalance member_joined events %v, want m3's", joined)
	}
	wantAttr(t, "new", nw.Attributes, "kproxy.rebalance.cause", groupstate.CauseMemberJoined)
	wantAttr(t, "new", nw.Attributes, "kproxy.group.previous_generation", "2")
	wantAttr(t, "new", nw.Attributes, "kproxy.group.generation", "3")
	wantAttr(t, "new", nw.Attributes, "kproxy.group.kind", "classic")
}

// TestEngineEmptiedGroupHasNoPhantomTrace: the only member gets its
// JoinGroup answer and dies before SyncGroup. Its session expiry ends
// the rebalance with outcome group_empty; no second, empty trace and no
// zero-length histogram sample follow.
func TestEngineEmptiedGroupHasNoPhantomTrace(t *testing.T) {
	e, tp, exp, clk := newClockedEngineTap(t, -1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const g = "emptied"
	m1 := newMember(e, g, "m1")
	m1.RebalanceMillis = 60000
	if _, err := m1.Join(ctx); err != nil {
		t.Fatal(err)
	}
	// The loop arms the session timer after it answered the JoinGroup:
	// a snapshot, taken on the loop, waits for that.
	e.Group(g)
	clk.Advance(11 * time.Second) // past the 10s session
	settle(t, e, tp, g)
	if st := groupState(e, g); st != "Empty" {
		t.Fatalf("group state %s, want Empty", st)
	}
	roots := rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 {
		t.Fatalf("%d rebalance traces, want 1: %v", len(roots), names(exp.GetSpans()))
	}
	root := roots[0]
	if got := outcomeOf(root); got != "group_empty" {
		t.Errorf("outcome %q, want group_empty", got)
	}
	wantAttr(t, "root", root.Attributes, "kproxy.group.member_count", "0")
	if d := root.EndTime.Sub(root.StartTime); d != 10*time.Second {
		t.Errorf("rebalance lasted %v, want 10s (the session)", d)
	}
	expired := eventsOf(root, "member_expired")
	if len(expired) != 1 {
		t.Fatalf("member_expired events %v, want 1", root.Events)
	}
	wantAttr(t, "member_expired", expired[0].Attributes, "kproxy.member.reason", "session_timeout")

	body := metricsText(t, tp)
	if strings.Contains(body, `kproxy_rebalance_outcome="aborted"`) {
		t.Errorf("/metrics counts an aborted rebalance:\n%s", grepLines(body, "rebalance_duration"))
	}
	want := `kproxy_rebalance_duration_seconds_count{kproxy_rebalance_cause="member_joined",kproxy_rebalance_outcome="group_empty"} 1`
	if !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %s:\n%s", want, grepLines(body, "rebalance_duration_seconds_count"))
	}
	if n := strings.Count(grepLines(body, "rebalance_duration_seconds_count"), "\n"); n > 1 {
		t.Errorf("%d duration series, want 1:\n%s", n, grepLines(body, "rebalance_duration_seconds_count"))
	}
}

// TestEngineInitialDelayIsMarked: a group leaving Empty waits
// group.initial.rebalance.delay.ms; the trace says so.
func TestEngineInitialDelayIsMarked(t *testing.T) {
	e, tp, exp, clk := newClockedEngineTap(t, 3*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const g = "delayed"
	m1, m2 := newMember(e, g, "m1"), newMember(e, g, "m2")
	j1 := joinNow(t, ctx, e, m1)
	// m2 joins a second into the delay: Kafka's delayed initial join
	// waits the delay again from there (up to the rebalance timeout).
	clk.Advance(time.Second)
	j2 := joinNow(t, ctx, e, m2)
	start := clk.Now()
	var r1, r2 groupdriver.JoinResult
	for r1.Resp == nil || r2.Resp == nil {
		select {
		case r1 = <-j1:
		case r2 = <-j2:
		case <-time.After(10 * time.Millisecond):
			clk.Advance(100 * time.Millisecond)
		}
		if r1.Err != nil || r2.Err != nil {
			t.Fatal(r1.Err, r2.Err)
		}
	}
	waited := clk.Now().Sub(start) + time.Second
	if waited <= 3*time.Second {
		t.Fatalf("the join completed %v after the first member, want the delay extended past 3s", waited)
	}
	s1, s2 := m1.SyncAsync(ctx, r1.Resp), m2.SyncAsync(ctx, r2.Resp)
	if err := <-s1; err != nil {
		t.Fatal(err)
	}
	if err := <-s2; err != nil {
		t.Fatal(err)
	}
	settle(t, e, tp, g)
	roots := rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 {
		t.Fatalf("%d traces, want 1", len(roots))
	}
	wantAttr(t, "root", roots[0].Attributes, "kproxy.rebalance.initial_delay_ms", "3000")
	join, ok := spanWithName(exp.GetSpans(), roots[0], "join")
	if !ok {
		t.Fatal("no join span")
	}
	delay, ok := spanWithName(exp.GetSpans(), join, "initial_delay")
	if !ok {
		t.Fatalf("no initial_delay span under join: %v", names(exp.GetSpans()))
	}
	if d := delay.EndTime.Sub(delay.StartTime); d != join.EndTime.Sub(join.StartTime) || d < waited-100*time.Millisecond || d > waited {
		t.Errorf("initial_delay span lasted %v, join %v, want the whole wait (about %v, the delay extended by m2's join)", d, join.EndTime.Sub(join.StartTime), waited)
	}
	wantAttr(t, "initial_delay", delay.Attributes, "kproxy.rebalance.initial_delay_waited_ms", strconv.FormatInt(delay.EndTime.Sub(delay.StartTime).Milliseconds(), 10))
}

// consumerHeartbeat sends a KIP-848 heartbeat and returns the response.
func consumerHeartbeat(t *testing.T, ctx context.Context, e *groupstate.Engine, client string, r *kmsg.ConsumerGroupHeartbeatRequest) *kmsg.ConsumerGroupHeartbeatResponse {
	t.Helper()
	ch := make(chan kmsg.Response, 1)
	e.Handle(groupstate.RequestContext{ClientID: client, ClientHost: "127.0.0.1"}, r, func(resp kmsg.Response) { ch <- resp })
	select {
	case resp := <-ch:
		hr := resp.(*kmsg.ConsumerGroupHeartbeatResponse)
		if hr.ErrorCode != 0 {
			t.Fatalf("heartbeat of %s: error %d", client, hr.ErrorCode)
		}
		return hr
	case <-ctx.Done():
		t.Fatalf("heartbeat of %s: %v", client, ctx.Err())
		return nil
	}
}

// kip848Member is a KIP-848 consumer that revokes at once what it lost.
type kip848Member struct {
	client string
	id     string
	epoch  int32
	owned  []kmsg.ConsumerGroupHeartbeatRequestTopic
}

func (m *kip848Member) beat(t *testing.T, ctx context.Context, e *groupstate.Engine, group string, first bool) {
	t.Helper()
	r := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	r.Version = 1
	r.Group, r.MemberID, r.MemberEpoch = group, m.id, m.epoch
	r.RebalanceTimeoutMillis = -1
	if first {
		r.RebalanceTimeoutMillis = 30000
		r.SubscribedTopicNames = []string{"payments"}
	}
	r.Topics = append([]kmsg.ConsumerGroupHeartbeatRequestTopic{}, m.owned...)
	resp := consumerHeartbeat(t, ctx, e, m.client, r)
	if resp.MemberID != nil {
		m.id = *resp.MemberID
	}
	m.epoch = resp.MemberEpoch
	if resp.Assignment != nil {
		m.owned = m.owned[:0]
		for _, at := range resp.Assignment.Topics {
			m.owned = append(m.owned, kmsg.ConsumerGroupHeartbeatRequestTopic{TopicID: at.TopicID, Partitions: at.Partitions})
		}
	}
}

// TestEngineKIP848ReconciliationTrace: a second KIP-848 member joins; the
// first must give up half its partitions before the second gets them.
// The trace says it is a consumer group, counts epochs, and shows each
// member's part.
func TestEngineKIP848ReconciliationTrace(t *testing.T) {
	store := groupstate.NewMemoryStore()
	store.SetTopic("payments", 4)
	e, tp, exp, clk := newClockedEngineTap(t, -1, store)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const g = "g848"
	a := &kip848Member{client: "client-a", id: "aaaaaaaaaaaaaaaaaaaaaa"}
	b := &kip848Member{client: "client-b", id: "bbbbbbbbbbbbbbbbbbbbbb"}
	a.beat(t, ctx, e, g, true)
	if a.epoch == 0 || len(a.owned) == 0 {
		a.beat(t, ctx, e, g, false)
	}
	settle(t, e, tp, g)
	exp.Reset()

	b.beat(t, ctx, e, g, true) // epoch bump: a must revoke
	clk.Advance(400 * time.Millisecond)
	a.beat(t, ctx, e, g, false) // asked to revoke
	clk.Advance(300 * time.Millisecond)
	a.beat(t, ctx, e, g, false) // revoked
	clk.Advance(100 * time.Millisecond)
	b.beat(t, ctx, e, g, false) // gets the released partitions
	settle(t, e, tp, g)

	spans := exp.GetSpans()
	roots := rootsOf(spans, g)
	if len(roots) != 1 {
		t.Fatalf("%d rebalance traces, want 1: %v", len(roots), names(spans))
	}
	root := roots[0]
	wantAttr(t, "root", root.Attributes, "kproxy.group.kind", "consumer")
	wantAttr(t, "root", root.Attributes, "kproxy.group.previous_epoch", "1")
	wantAttr(t, "root", root.Attributes, "kproxy.group.epoch", "2")
	wantAttr(t, "root", root.Attributes, "kproxy.group.assignor", "uniform")
	wantAttr(t, "root", root.Attributes, "kproxy.rebalance.outcome", "completed")
	wantAttr(t, "root", root.Attributes, "kproxy.group.member_count", "2")
	if _, ok := attrMap(root.Attributes)["kproxy.group.generation"]; ok {
		t.Errorf("KIP-848 root carries a generation: %v", root.Attributes)
	}
	if _, ok := spanWithName(spans, root, "join"); ok {
		t.Errorf("KIP-848 rebalance has a join span")
	}
	rec, ok := spanWithName(spans, root, "reconcile")
	if !ok {
		t.Fatalf("no reconcile span: %v", names(spans))
	}
	wantAttr(t, "reconcile", rec.Attributes, "kproxy.group.epoch", "2")
	wantAttr(t, "reconcile", rec.Attributes, "kproxy.group.member_count", "2")
	// The engine's default group.consumer.heartbeat.interval.ms: members
	// learn of their targets at their heartbeats.
	wantAttr(t, "reconcile", rec.Attributes, "kproxy.group.heartbeat_interval_ms", "5000")
	if d := root.EndTime.Sub(root.StartTime); d != 800*time.Millisecond {
		t.Errorf("rebalance lasted %v, want 800ms", d)
	}
	per := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Name == "reconcile_member" && s.Parent.SpanID() == rec.SpanContext.SpanID() {
			per[attrMap(s.Attributes)["messaging.client.id"].String()] = s
		}
	}
	sa, sb := per["client-a"], per["client-b"]
	if sa.Name == "" || sb.Name == "" {
		t.Fatalf("reconcile_member spans %v, want one per member", per)
	}
	var got []string
	for _, ev := range sa.Events {
		got = append(got, ev.Name)
	}
	if strings.Join(got, ",") != "revoke_requested,revoked,assigned" {
		t.Errorf("a's steps %v, want revoke_requested,revoked,assigned", got)
	}
	if rq := eventsOf(sa, "revoke_requested"); len(rq) == 1 {
		wantAttr(t, "revoke_requested", rq[0].Attributes, "kproxy.member.revoking_partitions", "2")
	}
	if d := sa.EndTime.Sub(sa.StartTime); d != 700*time.Millisecond {
		t.Errorf("a reconciled in %v, want 700ms", d)
	}
	if d := sb.EndTime.Sub(sb.StartTime); d != 800*time.Millisecond {
		t.Errorf("b reconciled in %v, want 800ms (the slowest: it waited for a)", d)
	}
	if as := eventsOf(sb, "assigned"); len(as) != 1 {
		t.Errorf("b's assigned events %v", sb.Events)
	} else {
		wantAttr(t, "b assigned", as[0].Attributes, "kproxy.member.assigned_partitions", "2")
	}
}

// TestEngineClassicMemberTimes: a third member joins a stable group of
// two; each old member learns of the rebalance at its own heartbeat and
// rejoins later, the followers send SyncGroup before the leader. The
// trace shows, per member, when it was asked to rejoin and how long it
// took to answer, and when its SyncGroup arrived.
func TestEngineClassicMemberTimes(t *testing.T) {
	e, tp, exp, clk := newClockedEngineTap(t, -1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const g = "member-times"
	m1, m2, m3 := newMember(e, g, "m1"), newMember(e, g, "m2"), newMember(e, g, "m3")
	if err := groupdriver.Rebalance(ctx, m1, m2); err != nil {
		t.Fatal(err)
	}
	settle(t, e, tp, g)
	exp.Reset()
	before := map[string]map[int32]bool{}
	for _, m := range []*groupdriver.Member{m1, m2} {
		before[m.ClientID] = map[int32]bool{}
		for _, at := range m.Assigned.Topics {
			for _, p := range at.Partitions {
				before[m.ClientID][p] = true
			}
		}
	}

	j3 := joinNow(t, ctx, e, m3) // starts the rebalance at t0
	t0 := clk.Now()
	clk.Advance(200 * time.Millisecond)
	if err := m1.Heartbeat(ctx); !errors.Is(err, kerr.RebalanceInProgress) {
		t.Fatalf("m1 heartbeat: %v, want REBALANCE_IN_PROGRESS", err)
	}
	clk.Advance(300 * time.Millisecond)
	j1 := joinNow(t, ctx, e, m1) // 300 ms after it was asked
	clk.Advance(100 * time.Millisecond)
	if err := m2.Heartbeat(ctx); !errors.Is(err, kerr.RebalanceInProgress) {
		t.Fatalf("m2 heartbeat: %v, want REBALANCE_IN_PROGRESS", err)
	}
	// A second heartbeat does not move the time m2 was asked.
	clk.Advance(100 * time.Millisecond)
	if err := m2.Heartbeat(ctx); !errors.Is(err, kerr.RebalanceInProgress) {
		t.Fatalf("m2 heartbeat: %v, want REBALANCE_IN_PROGRESS", err)
	}
	clk.Advance(300 * time.Millisecond)
	j2 := m2.JoinAsync(ctx) // 400 ms after it was asked; completes the join at t0+1s
	rs := map[*groupdriver.Member]groupdriver.JoinResult{m1: <-j1, m2: <-j2, m3: <-j3}
	var leader *groupdriver.Member
	for m, r := range rs {
		if r.Err != nil {
			t.Fatalf("%s join: %v", m.ClientID, r.Err)
		}
		if r.Resp.LeaderID == m.ID {
			leader = m
		}
	}
	if leader == nil {
		t.Fatal("no member leads")
	}
	// Followers sync 50 ms after the join completed, the leader 250 ms.
	clk.Advance(50 * time.Millisecond)
	var syncs []<-chan error
	for _, m := range []*groupdriver.Member{m1, m2, m3} {
		if m != leader {
			syncs = append(syncs, m.SyncAsync(ctx, rs[m].Resp))
		}
	}
	e.Group(g) // the followers' SyncGroups have run on the loop
	clk.Advance(200 * time.Millisecond)
	syncs = append(syncs, leader.SyncAsync(ctx, rs[leader].Resp))
	for _, ch := range syncs {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	settle(t, e, tp, g)

	roots := rootsOf(exp.GetSpans(), g)
	if len(roots) != 1 || outcomeOf(roots[0]) != "completed" {
		t.Fatalf("rebalances %v, want one completed", names(exp.GetSpans()))
	}
	join, ok := spanWithName(exp.GetSpans(), roots[0], "join")
	if !ok {
		t.Fatal("no join span")
	}
	asked := map[string]time.Time{}
	for _, ev := range eventsOf(join, "rejoin_requested") {
		asked[attrMap(ev.Attributes)["messaging.client.id"].String()] = ev.Time
	}
	want := map[string]time.Time{"client-m1": t0.Add(200 * time.Millisecond), "client-m2": t0.Add(600 * time.Millisecond)}
	if len(asked) != len(want) || !asked["client-m1"].Equal(want["client-m1"]) || !asked["client-m2"].Equal(want["client-m2"]) {
		t.Errorf("rejoin_requested at %v, want %v (m3 joined unasked)", asked, want)
	}
	took := map[string]int64{}
	for _, ev := range eventsOf(join, "member") {
		a := attrMap(ev.Attributes)
		if v, ok := a["kproxy.member.rejoin_ms"]; ok {
			took[a["messaging.client.id"].String()] = v.AsInt64()
		}
	}
	if len(took) != 2 || took["client-m1"] != 300 || took["client-m2"] != 400 {
		t.Errorf("rejoin_ms %v, want m1 300 and m2 400", took)
	}

	sync, ok := spanWithName(exp.GetSpans(), roots[0], "sync")
	if !ok {
		t.Fatal("no sync span")
	}
	waits := map[string]int64{}
	for _, ev := range eventsOf(sync, "sync_received") {
		waits[attrMap(ev.Attributes)["messaging.client.id"].String()] = attrMap(ev.Attributes)["kproxy.member.sync_wait_ms"].AsInt64()
	}
	for _, m := range []*groupdriver.Member{m1, m2, m3} {
		w := int64(50)
		if m == leader {
			w = 250
		}
		if got, ok := waits[m.ClientID]; !ok || got != w {
			t.Errorf("%s sync_wait_ms %d (reported %v), want %d", m.ClientID, got, ok, w)
		}
	}
	// What each member gave up: the partitions it held in generation 1
	// and not in generation 2.
	gaveUp := map[string]int64{}
	for _, ev := range eventsOf(sync, "assignment") {
		a := attrMap(ev.Attributes)
		if v, ok := a["kproxy.member.revoked_partitions"]; ok {
			gaveUp[a["messaging.client.id"].String()] = v.AsInt64()
			wantAttr(t, "assignment", ev.Attributes, "kproxy.member.revoked_topics", "payments")
		}
	}
	lost := map[string]int64{}
	total := int64(0)
	for _, m := range []*groupdriver.Member{m1, m2} {
		for p := range before[m.ClientID] {
			kept := false
			for _, at := range m.Assigned.Topics {
				kept = kept || slices.Contains(at.Partitions, p)
			}
			if !kept {
				lost[m.ClientID]++
				total++
			}
		}
	}
	if total == 0 || !maps.Equal(gaveUp, lost) {
		t.Errorf("revoked_partitions %v, want %v (m3 took %d partitions)", gaveUp, lost, total)
	}
	if d := sync.EndTime.Sub(sync.StartTime); d != 250*time.Millisecond {
		t.Errorf("sync span %v, want 250ms (the leader's SyncGroup)", d)
	}
}
