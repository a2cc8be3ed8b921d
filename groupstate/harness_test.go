package groupstate

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fakeClock is a Clock whose time moves only when a test advances it.
type fakeClock struct {
	mu     sync.Mutex // guards every field below
	now    time.Time
	seq    int
	timers []*fakeTimer
}

// fakeTimer is one AfterFunc of a fakeClock.
type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	seq     int
	f       func()
	stopped bool
	fired   bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	if len(c.timers) >= 1024 && len(c.timers)&(len(c.timers)-1) == 0 {
		// Drop stopped timers now and then so that long runs (and the
		// memory benchmark) do not accumulate them.
		live := c.timers[:0]
		for _, o := range c.timers {
			if !o.stopped && !o.fired {
				live = append(live, o)
			}
		}
		clear(c.timers[len(live):])
		c.timers = live
	}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.fired || t.stopped {
		return false
	}
	t.stopped = true
	return true
}

// next pops the earliest due timer at or before limit, moving time to it.
func (c *fakeClock) next(limit time.Time) *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := c.timers[:0]
	for _, t := range c.timers {
		if !t.stopped && !t.fired {
			live = append(live, t)
		}
	}
	c.timers = live
	sort.Slice(c.timers, func(i, j int) bool {
		if !c.timers[i].at.Equal(c.timers[j].at) {
			return c.timers[i].at.Before(c.timers[j].at)
		}
		return c.timers[i].seq < c.timers[j].seq
	})
	if len(c.timers) == 0 || c.timers[0].at.After(limit) {
		c.now = limit
		return nil
	}
	t := c.timers[0]
	t.fired = true
	if t.at.After(c.now) {
		c.now = t.at
	}
	return t
}

// pendingTimers counts armed timers (for leak checks).
func (c *fakeClock) pendingTimers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped && !t.fired {
			n++
		}
	}
	return n
}

// harness drives one Engine with a fake clock and a memory store.
type harness struct {
	t     testing.TB
	e     *Engine
	clock *fakeClock
	store *MemoryStore

	mu     sync.Mutex // guards events
	events []Event
}

// harnessConfig tweaks the Config a harness builds.
type harnessConfig func(*Config)

func newHarness(t testing.TB, opts ...harnessConfig) *harness {
	t.Helper()
	h := &harness{t: t, clock: newFakeClock(), store: NewMemoryStore()}
	cfg := Config{
		Clock:                 h.clock,
		Store:                 h.store,
		Shards:                2,
		InitialRebalanceDelay: -1,
		Events: func(ev Event) {
			h.mu.Lock()
			h.events = append(h.events, ev)
			h.mu.Unlock()
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.e = e
	t.Cleanup(func() {
		e.Close()
		if n := e.illegalTransitions.Load(); n != 0 {
			t.Errorf("engine refused %d illegal state transitions", n)
		}
	})
	return h
}

// flush waits until every loop has processed everything posted so far,
// including the completions of group metadata loads and saves (offset
// operations may still be running: tests gate those themselves).
func (h *harness) flush() {
	h.t.Helper()
	h.flushLoops()
	deadline := time.Now().Add(5 * time.Second)
	for h.e.metaInflight.Load() != 0 {
		if time.Now().After(deadline) {
			h.t.Fatalf("group metadata operations still in flight after 5s")
		}
		time.Sleep(50 * time.Microsecond)
		h.flushLoops()
	}
	h.flushLoops()
}

// flushLoops waits until every loop has processed everything posted so
// far.
func (h *harness) flushLoops() {
	var wg sync.WaitGroup
	for _, s := range h.e.shards {
		wg.Add(1)
		if !s.post(wg.Done) {
			wg.Done()
		}
	}
	wg.Wait()
}

// advance moves the fake time forward by d, firing due timers in order
// and letting the loops process each before the next.
func (h *harness) advance(d time.Duration) {
	h.t.Helper()
	h.flush()
	limit := h.clock.Now().Add(d)
	for {
		t := h.clock.next(limit)
		if t == nil {
			break
		}
		t.f()
		h.flush()
	}
	h.flush()
}

// call is an in-flight request.
type call struct {
	t  testing.TB
	ch chan kmsg.Response
}

// send hands req to the engine and returns the pending call; it fails
// the test if the reply is ever called twice.
func (h *harness) send(req kmsg.Request) *call {
	return h.sendAs(RequestContext{ClientID: "client", ClientHost: "10.0.0.1"}, req)
}

func (h *harness) sendAs(rc RequestContext, req kmsg.Request) *call {
	c := &call{t: h.t, ch: make(chan kmsg.Response, 2)}
	var once sync.Once
	h.e.Handle(rc, req, func(resp kmsg.Response) {
		called := false
		once.Do(func() { called = true })
		if !called {
			h.t.Errorf("reply called twice for key %d", req.Key())
		}
		if resp.GetVersion() != req.GetVersion() {
			h.t.Errorf("key %d: response version %d, request version %d", req.Key(), resp.GetVersion(), req.GetVersion())
		}
		c.ch <- resp
	})
	return c
}

// do sends req and waits for its answer (which may need the store).
func (h *harness) do(req kmsg.Request) kmsg.Response {
	h.t.Helper()
	return h.send(req).wait()
}

// wait returns the call's response, failing after 5s of real time.
func (c *call) wait() kmsg.Response {
	c.t.Helper()
	select {
	case r := <-c.ch:
		return r
	case <-time.After(5 * time.Second):
		c.t.Fatalf("no response within 5s")
		return nil
	}
}

// parked asserts the call has not been answered (after a flush).
func (c *call) parked(h *harness) {
	h.t.Helper()
	h.flush()
	select {
	case r := <-c.ch:
		h.t.Fatalf("expected the request to be parked, got %#v", r)
	default:
	}
}

// answered returns the response if the call was answered by now.
func (c *call) answered(h *harness) (kmsg.Response, bool) {
	h.flush()
	select {
	case r := <-c.ch:
		return r, true
	default:
		return nil, false
	}
}

// eventKinds returns the kinds of events seen for group, and clears them.
func (h *harness) takeEvents(group string) []Event {
	h.flush()
	h.mu.Lock()
	defer h.mu.Unlock()
	var out, rest []Event
	for _, ev := range h.events {
		if ev.Group == group {
			out = append(out, ev)
		} else {
			rest = append(rest, ev)
		}
	}
	h.events = rest
	return out
}

func kinds(evs []Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Kind.String()
		if ev.Cause != "" {
			out[i] += "(" + ev.Cause + ")"
		}
	}
	return out
}

// protocol builds a consumer-protocol JoinGroup protocol subscribing to
// topics.
func protocol(name string, topics ...string) kmsg.JoinGroupRequestProtocol {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = topics
	return kmsg.JoinGroupRequestProtocol{Name: name, Metadata: meta.AppendTo(nil)}
}

// joinReq builds a JoinGroup.
type jr struct {
	group     string
	member    string
	instance  string
	version   int16
	session   time.Duration
	rebalance time.Duration
	ptype     string
	protocols []kmsg.JoinGroupRequestProtocol
}

func (j jr) req() *kmsg.JoinGroupRequest {
	r := kmsg.NewPtrJoinGroupRequest()
	r.Version = j.version
	r.Group = j.group
	r.MemberID = j.member
	if j.instance != "" {
		iid := j.instance
		r.InstanceID = &iid
	}
	r.SessionTimeoutMillis = int32(orDur(j.session, 10*time.Second) / time.Millisecond)
	r.RebalanceTimeoutMillis = int32(orDur(j.rebalance, 30*time.Second) / time.Millisecond)
	r.ProtocolType = j.ptype
	if r.ProtocolType == "" {
		r.ProtocolType = "consumer"
	}
	r.Protocols = j.protocols
	if r.Protocols == nil {
		r.Protocols = []kmsg.JoinGroupRequestProtocol{protocol("range", "t")}
	}
	return r
}

func orDur(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// joinNew performs the KIP-394 handshake of a new dynamic member (v9
// unless j says otherwise, v4 at least) and sends its real JoinGroup; it
// returns that call, parked or answered, and the member id.
func (h *harness) joinNew(j jr) (*call, string) {
	h.t.Helper()
	if j.version == 0 {
		j.version = 9
	}
	if j.version < 4 || j.instance != "" {
		h.t.Fatalf("joinNew is for dynamic members at v4+")
	}
	resp := h.do(j.req()).(*kmsg.JoinGroupResponse)
	if resp.ErrorCode != errMemberIDRequired {
		h.t.Fatalf("first join: error %v, want MEMBER_ID_REQUIRED", kerr.ErrorForCode(resp.ErrorCode))
	}
	j.member = resp.MemberID
	return h.send(j.req()), j.member
}

// joinResp waits for a JoinGroup answer and checks its error.
func joinResp(t testing.TB, c *call, want int16) *kmsg.JoinGroupResponse {
	t.Helper()
	r := c.wait().(*kmsg.JoinGroupResponse)
	if r.ErrorCode != want {
		t.Fatalf("join error %v, want %v", kerr.ErrorForCode(r.ErrorCode), kerr.ErrorForCode(want))
	}
	return r
}

// syncReq builds a SyncGroup.
func syncReq(group, member string, gen int32, assign map[string][]byte) *kmsg.SyncGroupRequest {
	r := kmsg.NewPtrSyncGroupRequest()
	r.Version = 5
	r.Group, r.MemberID, r.Generation = group, member, gen
	ids := make([]string, 0, len(assign))
	for id := range assign {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r.GroupAssignment = append(r.GroupAssignment, kmsg.SyncGroupRequestGroupAssignment{MemberID: id, MemberAssignment: assign[id]})
	}
	return r
}

// hb builds a Heartbeat.
func hb(group, member string, gen int32) *kmsg.HeartbeatRequest {
	r := kmsg.NewPtrHeartbeatRequest()
	r.Version = 4
	r.Group, r.MemberID, r.Generation = group, member, gen
	return r
}

// heartbeatCode sends a heartbeat and returns its error code.
func (h *harness) heartbeat(group, member string, gen int32) int16 {
	h.t.Helper()
	return h.do(hb(group, member, gen)).(*kmsg.HeartbeatResponse).ErrorCode
}

// assignment encodes a consumer assignment of topic partitions.
func assignment(topic string, partitions ...int32) []byte {
	a := kmsg.NewConsumerMemberAssignment()
	if topic != "" {
		a.Topics = []kmsg.ConsumerMemberAssignmentTopic{{Topic: topic, Partitions: partitions}}
	}
	return a.AppendTo(nil)
}

// stableGroup builds a Stable group of n dynamic members (v9) and returns
// their ids (leader first) and the generation. Every member does its
// KIP-394 handshake first, so the pending ids hold the join open until
// the last one joins and everyone lands in one generation.
func (h *harness) stableGroup(group string, n int) ([]string, int32) {
	h.t.Helper()
	ids, gen := h.joinedGroup(group, n)
	h.syncAll(group, gen, ids, nil)
	return ids, gen
}

// joinedGroup is stableGroup without the sync: the group is left in
// CompletingRebalance.
func (h *harness) joinedGroup(group string, n int) ([]string, int32) {
	h.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		resp := h.do(jr{group: group, version: 9}.req()).(*kmsg.JoinGroupResponse)
		if resp.ErrorCode != errMemberIDRequired {
			h.t.Fatalf("handshake: %v", errName(resp.ErrorCode))
		}
		ids[i] = resp.MemberID
	}
	calls := make([]*call, n)
	for i, id := range ids {
		calls[i] = h.send(jr{group: group, member: id, version: 9}.req())
	}
	var leader string
	var gen int32
	for i, c := range calls {
		r := joinResp(h.t, c, 0)
		if i == 0 {
			leader, gen = r.LeaderID, r.Generation
		}
		if r.LeaderID != leader || r.Generation != gen {
			h.t.Fatalf("members disagree: leader %s/%s generation %d/%d", r.LeaderID, leader, r.Generation, gen)
		}
	}
	ordered := []string{leader}
	for _, id := range ids {
		if id != leader {
			ordered = append(ordered, id)
		}
	}
	return ordered, gen
}

// syncAll syncs every member (leader first, with assign) and checks that
// each gets NONE.
func (h *harness) syncAll(group string, gen int32, ids []string, assign map[string][]byte) map[string][]byte {
	h.t.Helper()
	var calls []*call
	for _, id := range ids[1:] {
		calls = append(calls, h.send(syncReq(group, id, gen, nil)))
	}
	if assign == nil {
		assign = map[string][]byte{}
		for i, id := range ids {
			assign[id] = assignment("t", int32(i))
		}
	}
	lc := h.send(syncReq(group, ids[0], gen, assign))
	got := map[string][]byte{}
	all := append([]*call{lc}, calls...)
	for i, c := range all {
		r := c.wait().(*kmsg.SyncGroupResponse)
		if r.ErrorCode != 0 {
			h.t.Fatalf("sync: %v", kerr.ErrorForCode(r.ErrorCode))
		}
		id := ids[0]
		if i > 0 {
			id = ids[i]
		}
		got[id] = r.MemberAssignment
	}
	return got
}

// commitReq builds an OffsetCommit of one partition of topic "t".
func commitReq(version int16, group, member string, gen int32, partition int32, offset int64) *kmsg.OffsetCommitRequest {
	r := kmsg.NewPtrOffsetCommitRequest()
	r.Version = version
	r.Group, r.MemberID, r.Generation = group, member, gen
	p := kmsg.NewOffsetCommitRequestTopicPartition()
	p.Partition, p.Offset = partition, offset
	r.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetCommitRequestTopicPartition{p}}}
	return r
}

// commitCode returns the single partition error of a commit.
func commitCode(t testing.TB, r kmsg.Response) int16 {
	t.Helper()
	resp := r.(*kmsg.OffsetCommitResponse)
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("commit response shape: %#v", resp)
	}
	return resp.Topics[0].Partitions[0].ErrorCode
}

// fetchOffset reads one offset of topic "t" straight from the store.
func (h *harness) storedOffset(group string, partition int32) int64 {
	h.t.Helper()
	res, err := h.store.FetchOffsets(context.Background(), group, []kmsg.OffsetFetchRequestTopic{{Topic: "t", Partitions: []int32{partition}}}, false)
	if err != nil {
		h.t.Fatal(err)
	}
	return res[0].Partitions[0].Offset
}

func errName(code int16) string {
	if code == 0 {
		return "NONE"
	}
	return kerr.ErrorForCode(code).Error()
}
