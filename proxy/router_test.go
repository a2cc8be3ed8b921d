package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kproxy/kproxy/codec"
)

// Codes the fake engines answer with, so a test can tell who answered.
const (
	markerA         int16 = 1001
	markerB         int16 = 1002
	notCoordinator  int16 = 16
	codeUnavailable       = errCoordinatorNotAvailable
)

// fakeEngine is a Coordinator that owns the groups starting with prefix:
// it answers their slots with marker and every other group's with
// NOT_COORDINATOR, records what it was given, and parks requests as hold
// says (0: answer at once, negative: never).
type fakeEngine struct {
	name   string
	prefix string
	marker int16
	lists  []string // the groups ListGroups reports
	hold   func(kmsg.Request) time.Duration

	mu  sync.Mutex
	got []fakeCall // guarded by mu
}

type fakeCall struct {
	c   Client
	req kmsg.Request
}

func (f *fakeEngine) Handle(c Client, req kmsg.Request, reply func(kmsg.Response)) {
	f.mu.Lock()
	f.got = append(f.got, fakeCall{c, req})
	f.mu.Unlock()
	resp := f.answer(req)
	resp.SetVersion(req.GetVersion())
	d := time.Duration(0)
	if f.hold != nil {
		d = f.hold(req)
	}
	switch {
	case d < 0:
	case d > 0:
		time.AfterFunc(d, func() { reply(resp) })
	default:
		reply(resp)
	}
}

func (f *fakeEngine) calls() []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func (f *fakeEngine) code(group string) int16 {
	if strings.HasPrefix(group, f.prefix) {
		return f.marker
	}
	return notCoordinator
}

// answer builds the fake's response by hand for the multi-group APIs (so
// that the router's merge is checked against something it did not
// build) and with errorFor for the single-group ones.
func (f *fakeEngine) answer(req kmsg.Request) kmsg.Response {
	switch r := req.(type) {
	case *kmsg.DescribeGroupsRequest:
		resp := kmsg.NewPtrDescribeGroupsResponse()
		for _, g := range r.Groups {
			rg := kmsg.NewDescribeGroupsResponseGroup()
			rg.Group, rg.ErrorCode, rg.State = g, f.code(g), f.name
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.DeleteGroupsRequest:
		resp := kmsg.NewPtrDeleteGroupsResponse()
		for _, g := range r.Groups {
			rg := kmsg.NewDeleteGroupsResponseGroup()
			rg.Group, rg.ErrorCode = g, f.code(g)
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.ConsumerGroupDescribeRequest:
		resp := kmsg.NewPtrConsumerGroupDescribeResponse()
		for _, g := range r.Groups {
			rg := kmsg.NewConsumerGroupDescribeResponseGroup()
			rg.Group, rg.ErrorCode, rg.State = g, f.code(g), f.name
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.OffsetFetchRequest:
		if r.Version < 8 {
			break
		}
		resp := kmsg.NewPtrOffsetFetchResponse()
		for _, g := range r.Groups {
			rg := kmsg.NewOffsetFetchResponseGroup()
			rg.Group, rg.ErrorCode = g.Group, f.code(g.Group)
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.ListGroupsRequest:
		resp := kmsg.NewPtrListGroupsResponse()
		for _, g := range f.lists {
			rg := kmsg.NewListGroupsResponseGroup()
			rg.Group, rg.ProtocolType = g, f.name
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	}
	return codec.GroupErrorResponse(req, f.code(groupAPIs[req.Key()].groups(req)[0]))
}

// testLocator is a Locator over prefixes: groups starting with local are
// owned here, those starting with a key of remote by that address.
type testLocator struct {
	mu      sync.Mutex
	local   string
	remote  map[string]string
	peers   []string
	changed chan struct{}
}

func newTestLocator(local string, remote map[string]string) *testLocator {
	l := &testLocator{local: local, remote: remote, changed: make(chan struct{})}
	for _, a := range remote {
		l.peers = append(l.peers, a)
	}
	return l
}

func (l *testLocator) Locate(group string) (bool, string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.local != "" && strings.HasPrefix(group, l.local) {
		return true, "", true
	}
	for p, a := range l.remote {
		if strings.HasPrefix(group, p) {
			return false, a, true
		}
	}
	return false, "", false
}

func (l *testLocator) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *testLocator) Peers() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.peers)
}

// set gives the groups starting with prefix to addr.
func (l *testLocator) set(prefix, addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.remote[prefix] = addr
	close(l.changed)
	l.changed = make(chan struct{})
}

// fleet is two kproxies: engine A owns groups "a…", engine B groups
// "b…", each behind a PeerServer, each with a router relaying to the
// other.
type fleet struct {
	a, b       *fakeEngine
	psA, psB   *PeerServer
	rA, rB     *Router
	locA, locB *testLocator
	reader     *sdkmetric.ManualReader // rA's metrics
	logs       *logBuffer              // both peer servers' logs
}

func newFleet(t *testing.T, mutate func(*RouterConfig)) *fleet {
	t.Helper()
	f := &fleet{
		a:      &fakeEngine{name: "A", prefix: "a", marker: markerA, lists: []string{"a1", "a2", "shared"}},
		b:      &fakeEngine{name: "B", prefix: "b", marker: markerB, lists: []string{"b1", "shared"}},
		reader: sdkmetric.NewManualReader(),
		logs:   &logBuffer{},
	}
	f.psA = startPeerServer(t, "127.0.0.1:0", f.a, f.logs)
	f.psB = startPeerServer(t, "127.0.0.1:0", f.b, f.logs)
	f.locA = newTestLocator("a", map[string]string{"b": f.psB.Addr()})
	f.locB = newTestLocator("b", map[string]string{"a": f.psA.Addr()})
	cfgA := RouterConfig{Local: f.a, Locator: f.locA, Logger: testLogger(t), WaitForOwner: 100 * time.Millisecond,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))}
	cfgB := RouterConfig{Local: f.b, Locator: f.locB, Logger: testLogger(t), WaitForOwner: 100 * time.Millisecond}
	if mutate != nil {
		mutate(&cfgA)
		mutate(&cfgB)
	}
	f.rA, f.rB = NewRouter(cfgA), NewRouter(cfgB)
	t.Cleanup(f.rA.Close)
	t.Cleanup(f.rB.Close)
	return f
}

func startPeerServer(t *testing.T, listen string, co Coordinator, logs *logBuffer) *PeerServer {
	t.Helper()
	log := testLogger(t)
	if logs != nil {
		log = slog.New(slog.NewTextHandler(logs, nil))
	}
	ps, err := NewPeerServer(PeerServerConfig{Listen: listen, Coordinator: co, Logger: log})
	if err != nil {
		t.Fatalf("peer server: %v", err)
	}
	t.Cleanup(ps.Close)
	return ps
}

// handleAsync hands req to co and returns where the reply arrives.
func handleAsync(co Coordinator, c Client, req kmsg.Request) <-chan kmsg.Response {
	ch := make(chan kmsg.Response, 2)
	co.Handle(c, req, func(resp kmsg.Response) { ch <- resp })
	return ch
}

// waitReply waits for the one reply on ch.
func waitReply(t *testing.T, ch <-chan kmsg.Response, d time.Duration) kmsg.Response {
	t.Helper()
	select {
	case resp := <-ch:
		return resp
	case <-time.After(d):
		t.Fatalf("no reply within %v", d)
		return nil
	}
}

func handle(t *testing.T, co Coordinator, c Client, req kmsg.Request) kmsg.Response {
	t.Helper()
	return waitReply(t, handleAsync(co, c, req), 10*time.Second)
}

// singleGroupRequests returns one request of every single-group API for
// group, at the versions that matter (OffsetFetch before and after v8).
func singleGroupRequests(group string) []kmsg.Request {
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.ProtocolType, join.RebalanceTimeoutMillis, join.SessionTimeoutMillis = group, "consumer", 10000, 10000
	join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: []byte{0, 1, 2}}}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.MemberID, sync.Generation = group, "m", 1
	sync.GroupAssignment = []kmsg.SyncGroupRequestGroupAssignment{{MemberID: "m", MemberAssignment: []byte{9, 9}}}
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group, hb.MemberID, hb.Generation = group, "m", 1
	leave := kmsg.NewPtrLeaveGroupRequest()
	leave.Group, leave.Members = group, []kmsg.LeaveGroupRequestMember{{MemberID: "m"}}
	commit := kmsg.NewPtrOffsetCommitRequest()
	commit.Version = 9
	commit.Group, commit.Generation, commit.MemberID = group, 1, "m"
	commit.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 5}, {Partition: 1, Offset: 6}}}}
	fetch7 := kmsg.NewPtrOffsetFetchRequest()
	fetch7.Version = 7
	fetch7.Group, fetch7.Topics = group, []kmsg.OffsetFetchRequestTopic{{Topic: "t", Partitions: []int32{0, 1}}}
	fetch1 := kmsg.NewPtrOffsetFetchRequest()
	fetch1.Version = 1
	fetch1.Group, fetch1.Topics = group, []kmsg.OffsetFetchRequestTopic{{Topic: "t", Partitions: []int32{0}}}
	fetch9 := kmsg.NewPtrOffsetFetchRequest()
	fetch9.Version = 9
	fetch9.Groups = []kmsg.OffsetFetchRequestGroup{{Group: group, Topics: []kmsg.OffsetFetchRequestGroupTopic{{Topic: "t", Partitions: []int32{0}}}}}
	txn := kmsg.NewPtrTxnOffsetCommitRequest()
	txn.Version = 4
	txn.Group, txn.TransactionalID, txn.ProducerID = group, "tx", 7
	txn.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{{Partition: 2, Offset: 1}}}}
	del := kmsg.NewPtrOffsetDeleteRequest()
	del.Group = group
	cgh := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	cgh.Group, cgh.MemberID, cgh.RebalanceTimeoutMillis = group, "m", 5000
	reqs := []kmsg.Request{join, sync, hb, leave, commit, fetch7, fetch1, fetch9, txn, del, cgh}
	for _, r := range []kmsg.Request{join, sync, hb, leave, del, cgh} {
		r.SetVersion(r.MaxVersion())
	}
	return reqs
}

// codesOf lists every error code in a single-group response, read by the
// test's own switch.
func codesOf(t *testing.T, resp kmsg.Response) []int16 {
	t.Helper()
	switch r := resp.(type) {
	case *kmsg.JoinGroupResponse:
		return []int16{r.ErrorCode}
	case *kmsg.SyncGroupResponse:
		return []int16{r.ErrorCode}
	case *kmsg.HeartbeatResponse:
		return []int16{r.ErrorCode}
	case *kmsg.LeaveGroupResponse:
		return []int16{r.ErrorCode}
	case *kmsg.OffsetDeleteResponse:
		return []int16{r.ErrorCode}
	case *kmsg.ConsumerGroupHeartbeatResponse:
		return []int16{r.ErrorCode}
	case *kmsg.OffsetCommitResponse:
		var cs []int16
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				cs = append(cs, p.ErrorCode)
			}
		}
		return cs
	case *kmsg.TxnOffsetCommitResponse:
		var cs []int16
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				cs = append(cs, p.ErrorCode)
			}
		}
		return cs
	case *kmsg.OffsetFetchResponse:
		var cs []int16
		if r.Version >= 8 {
			for _, g := range r.Groups {
				cs = append(cs, g.ErrorCode)
			}
			return cs
		}
		if r.Version >= 2 {
			cs = append(cs, r.ErrorCode)
		}
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				cs = append(cs, p.ErrorCode)
			}
		}
		return cs
	}
	t.Fatalf("unexpected response %T", resp)
	return nil
}

func checkCodes(t *testing.T, what string, resp kmsg.Response, want int16) {
	t.Helper()
	cs := codesOf(t, resp)
	if len(cs) == 0 {
		t.Fatalf("%s: no error slot in the answer", what)
	}
	for _, c := range cs {
		if c != want {
			t.Fatalf("%s: codes %v, want all %d", what, cs, want)
		}
	}
}

// TestRouterSingleGroupAPIsReachTheOwner sends every single-group API for
// a group of A and one of B through both routers: each reaches its
// owner, local or over the peer wire, with the client's id and host, and
// the owner's answer comes back untouched at the request's version.
func TestRouterSingleGroupAPIsReachTheOwner(t *testing.T) {
	f := newFleet(t, nil)
	engines := map[string]*fakeEngine{"a": f.a, "b": f.b}
	for _, rt := range []struct {
		name string
		r    *Router
	}{{"router A", f.rA}, {"router B", f.rB}} {
		for i, group := range []string{"a-group", "b-group"} {
			owner, other := engines[group[:1]], engines[map[string]string{"a": "b", "b": "a"}[group[:1]]]
			host := []string{"10.1.2.3", "2001:db8::7"}[i]
			cl := Client{ID: "client-" + rt.name + "-" + group, Host: host}
			for _, req := range singleGroupRequests(group) {
				what := fmt.Sprintf("%s: %s v%d for %s", rt.name, kmsg.NameForKey(req.Key()), req.GetVersion(), group)
				beforeOwner, beforeOther := len(owner.calls()), len(other.calls())
				resp := handle(t, rt.r, cl, req)
				if resp.Key() != req.Key() || resp.GetVersion() != req.GetVersion() {
					t.Fatalf("%s: answered with %s v%d", what, kmsg.NameForKey(resp.Key()), resp.GetVersion())
				}
				checkCodes(t, what, resp, owner.marker)
				calls := owner.calls()
				if len(calls) != beforeOwner+1 || len(other.calls()) != beforeOther {
					t.Fatalf("%s: owner got %d requests, the other %d", what, len(calls)-beforeOwner, len(other.calls())-beforeOther)
				}
				got := calls[len(calls)-1]
				if got.c != cl {
					t.Fatalf("%s: owner saw client %+v, want %+v", what, got.c, cl)
				}
				if got.req.Key() != req.Key() || got.req.GetVersion() != req.GetVersion() {
					t.Fatalf("%s: owner got %s v%d", what, kmsg.NameForKey(got.req.Key()), got.req.GetVersion())
				}
				if j, ok := got.req.(*kmsg.JoinGroupRequest); ok && string(j.Protocols[0].Metadata) != "\x00\x01\x02" {
					t.Fatalf("%s: protocol metadata %x", what, j.Protocols[0].Metadata)
				}
			}
		}
	}
}

// TestRouterFollowsGroupToNextOwner has the routers' tables disagree
// with the owners: B is asked about a group it does not own and answers
// NOT_COORDINATOR. The relay holds the request and sends it to B again
// every followRetry until the relay timeout, then passes the last answer
// on; when the table names another owner meanwhile (C), the request goes
// there at once and C's answer reaches the client.
func TestRouterFollowsGroupToNextOwner(t *testing.T) {
	const relayTimeout = 600 * time.Millisecond
	f := newFleet(t, func(c *RouterConfig) { c.RelayTimeout = relayTimeout })
	f.locA.set("c", f.psB.Addr()) // B does not own "c…"
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group = "c-group"
	start := time.Now()
	resp := handle(t, f.rA, Client{ID: "x"}, hb)
	took := time.Since(start)
	checkCodes(t, "heartbeat for c-group", resp, notCoordinator)
	if took < relayTimeout-50*time.Millisecond || took > relayTimeout+time.Second {
		t.Errorf("NOT_COORDINATOR passed on after %v, want about the relay timeout %v", took, relayTimeout)
	}
	if n := len(f.b.calls()); n < 2 || n > int(relayTimeout/followRetry)+1 {
		t.Errorf("B got %d requests, want one and one every %v", n, followRetry)
	}

	// The group moves to C while the request is held.
	c := &fakeEngine{name: "C", prefix: "c", marker: markerB}
	psC := startPeerServer(t, "127.0.0.1:0", c, nil)
	ch := handleAsync(f.rA, Client{ID: "x"}, hb)
	time.Sleep(150 * time.Millisecond)
	moved := time.Now()
	f.locA.set("c", psC.Addr())
	checkCodes(t, "heartbeat once c-group moved to C", waitReply(t, ch, 5*time.Second), markerB)
	if took := time.Since(moved); took > followRetry {
		t.Errorf("answered %v after the group moved, want within %v", took, followRetry)
	}
	if n := len(c.calls()); n != 1 {
		t.Errorf("C got %d requests, want 1", n)
	}
}

// TestRouterSplitsAndMergesMultiGroupRequests asks router A about groups
// of A, of B and of nobody, interleaved: each owner gets one request
// holding only its groups, in request order, and the answer lists every
// group in the original order with its owner's answer
// (COORDINATOR_NOT_AVAILABLE for the unowned one).
func TestRouterSplitsAndMergesMultiGroupRequests(t *testing.T) {
	groups := []string{"b1", "a1", "zz", "b2", "a2", "a3"}
	want := []int16{markerB, markerA, codeUnavailable, markerB, markerA, markerA}
	wantState := []string{"B", "A", "", "B", "A", "A"}
	type entry struct {
		group string
		code  int16
		state string
	}
	cases := []struct {
		name  string
		req   func() kmsg.Request
		names func(kmsg.Request) []string // the groups of a request as the owner got it
		read  func(kmsg.Response) []entry
		state bool
	}{
		{
			name: "DescribeGroups",
			req: func() kmsg.Request {
				r := kmsg.NewPtrDescribeGroupsRequest()
				r.Version, r.Groups = r.MaxVersion(), groups
				return r
			},
			names: func(r kmsg.Request) []string { return r.(*kmsg.DescribeGroupsRequest).Groups },
			read: func(r kmsg.Response) (es []entry) {
				for _, g := range r.(*kmsg.DescribeGroupsResponse).Groups {
					es = append(es, entry{g.Group, g.ErrorCode, g.State})
				}
				return es
			},
			state: true,
		},
		{
			name: "DeleteGroups",
			req: func() kmsg.Request {
				r := kmsg.NewPtrDeleteGroupsRequest()
				r.Version, r.Groups = r.MaxVersion(), groups
				return r
			},
			names: func(r kmsg.Request) []string { return r.(*kmsg.DeleteGroupsRequest).Groups },
			read: func(r kmsg.Response) (es []entry) {
				for _, g := range r.(*kmsg.DeleteGroupsResponse).Groups {
					es = append(es, entry{g.Group, g.ErrorCode, ""})
				}
				return es
			},
		},
		{
			name: "ConsumerGroupDescribe",
			req: func() kmsg.Request {
				r := kmsg.NewPtrConsumerGroupDescribeRequest()
				r.Version, r.Groups = r.MaxVersion(), groups
				return r
			},
			names: func(r kmsg.Request) []string { return r.(*kmsg.ConsumerGroupDescribeRequest).Groups },
			read: func(r kmsg.Response) (es []entry) {
				for _, g := range r.(*kmsg.ConsumerGroupDescribeResponse).Groups {
					es = append(es, entry{g.Group, g.ErrorCode, g.State})
				}
				return es
			},
			state: true,
		},
		{
			name: "OffsetFetch",
			req: func() kmsg.Request {
				r := kmsg.NewPtrOffsetFetchRequest()
				r.Version = r.MaxVersion()
				for _, g := range groups {
					r.Groups = append(r.Groups, kmsg.OffsetFetchRequestGroup{Group: g})
				}
				return r
			},
			names: func(r kmsg.Request) (ns []string) {
				for _, g := range r.(*kmsg.OffsetFetchRequest).Groups {
					ns = append(ns, g.Group)
				}
				return ns
			},
			read: func(r kmsg.Response) (es []entry) {
				for _, g := range r.(*kmsg.OffsetFetchResponse).Groups {
					es = append(es, entry{g.Group, g.ErrorCode, ""})
				}
				return es
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, nil)
			req := tc.req()
			start := time.Now()
			resp := handle(t, f.rA, Client{ID: "multi", Host: "10.0.0.1"}, req)
			if waited := time.Since(start); waited < 100*time.Millisecond {
				t.Fatalf("answered after %v, before WaitForOwner for the unowned group", waited)
			}
			if resp.GetVersion() != req.GetVersion() {
				t.Fatalf("answer at v%d", resp.GetVersion())
			}
			es := tc.read(resp)
			if len(es) != len(groups) {
				t.Fatalf("%d groups answered, want %d: %+v", len(es), len(groups), es)
			}
			for i, e := range es {
				if e.group != groups[i] || e.code != want[i] || (tc.state && e.state != wantState[i]) {
					t.Fatalf("group %d: %+v, want %s code %d state %q", i, e, groups[i], want[i], wantState[i])
				}
			}
			for _, o := range []struct {
				e    *fakeEngine
				want []string
			}{{f.a, []string{"a1", "a2", "a3"}}, {f.b, []string{"b1", "b2"}}} {
				calls := o.e.calls()
				if len(calls) != 1 {
					t.Fatalf("engine %s got %d requests", o.e.name, len(calls))
				}
				if got := tc.names(calls[0].req); !slices.Equal(got, o.want) {
					t.Fatalf("engine %s was asked about %v, want %v", o.e.name, got, o.want)
				}
				if calls[0].c != (Client{ID: "multi", Host: "10.0.0.1"}) {
					t.Fatalf("engine %s saw client %+v", o.e.name, calls[0].c)
				}
			}
		})
	}
}

// TestMergeMatchesByNameWhenOwnerReorders feeds merge owner answers out
// of request order and with a group missing: each group still lands at
// its place, the missing one as COORDINATOR_NOT_AVAILABLE.
func TestMergeMatchesByNameWhenOwnerReorders(t *testing.T) {
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{"x", "y", "z", "w"}
	resp := kmsg.NewPtrDescribeGroupsResponse()
	resp.ThrottleMillis = 7
	for _, g := range []string{"z", "x"} { // y missing, z before x
		rg := kmsg.NewDescribeGroupsResponseGroup()
		rg.Group, rg.State = g, "from-owner"
		resp.Groups = append(resp.Groups, rg)
	}
	other := kmsg.NewPtrDescribeGroupsResponse()
	other.Groups = []kmsg.DescribeGroupsResponseGroup{{Group: "w", State: "other"}}
	out := describeGroupsAPI.multi.merge(req, []part{{idx: []int{0, 1, 2}, resp: resp}, {idx: []int{3}, resp: other}}).(*kmsg.DescribeGroupsResponse)
	type e struct {
		g, s string
		c    int16
	}
	var got []e
	for _, g := range out.Groups {
		got = append(got, e{g.Group, g.State, g.ErrorCode})
	}
	want := []e{{"x", "from-owner", 0}, {"y", "", codeUnavailable}, {"z", "from-owner", 0}, {"w", "other", 0}}
	if !slices.Equal(got, want) || out.ThrottleMillis != 7 {
		t.Fatalf("merged %+v (throttle %d), want %+v", got, out.ThrottleMillis, want)
	}
}

// TestRouterListGroupsMergesEveryOwner lists groups through each router:
// the local engine's and the peer's groups, a group both list once; a
// peer that cannot be reached makes the answer COORDINATOR_NOT_AVAILABLE
// with the groups of the others still listed.
func TestRouterListGroupsMergesEveryOwner(t *testing.T) {
	f := newFleet(t, nil)
	list := func(r *Router) (*kmsg.ListGroupsResponse, []string) {
		req := kmsg.NewPtrListGroupsRequest()
		req.Version = req.MaxVersion()
		resp := handle(t, r, Client{ID: "lister"}, req).(*kmsg.ListGroupsResponse)
		var names []string
		for _, g := range resp.Groups {
			names = append(names, g.Group+"@"+g.ProtocolType)
		}
		return resp, names
	}
	if resp, names := list(f.rA); resp.ErrorCode != 0 || !slices.Equal(names, []string{"a1@A", "a2@A", "shared@A", "b1@B"}) {
		t.Fatalf("router A listed %v, error %d", names, resp.ErrorCode)
	}
	if resp, names := list(f.rB); resp.ErrorCode != 0 || !slices.Equal(names, []string{"b1@B", "shared@B", "a1@A", "a2@A"}) {
		t.Fatalf("router B listed %v, error %d", names, resp.ErrorCode)
	}
	dead := startPeerServer(t, "127.0.0.1:0", f.a, nil)
	deadAddr := dead.Addr()
	dead.Close()
	f.locA.mu.Lock()
	f.locA.peers = append(f.locA.peers, deadAddr, f.psB.Addr()) // a duplicate is asked once
	f.locA.mu.Unlock()
	resp, names := list(f.rA)
	if resp.ErrorCode != codeUnavailable || !slices.Equal(names, []string{"a1@A", "a2@A", "shared@A", "b1@B"}) {
		t.Fatalf("with a dead peer router A listed %v, error %d", names, resp.ErrorCode)
	}
	// Once by each of router A's three listings (the duplicate address
	// asked once), once locally by router B.
	if n := countKey(f.b.calls(), 16); n != 3 {
		t.Fatalf("B was asked to list %d times, want 3", n)
	}
}

func countKey(calls []fakeCall, key int16) int {
	n := 0
	for _, c := range calls {
		if c.req.Key() == key {
			n++
		}
	}
	return n
}

// TestRouterNoOwner waits WaitForOwner for an owner, then answers
// COORDINATOR_NOT_AVAILABLE in the request's error slots; an owner that
// appears during the wait gets the request.
func TestRouterNoOwner(t *testing.T) {
	f := newFleet(t, func(c *RouterConfig) { c.WaitForOwner, c.RelayTimeout = 300*time.Millisecond, 400*time.Millisecond })
	for _, req := range singleGroupRequests("nobody") {
		// A member joining afresh waits for an owner for its
		// rebalance timeout (holdJoin), every other request for
		// WaitForOwner.
		least := 300 * time.Millisecond
		if jg, ok := req.(*kmsg.JoinGroupRequest); ok && jg.MemberID == "" {
			jg.RebalanceTimeoutMillis = 1000
			least = time.Second
		}
		start := time.Now()
		resp := handle(t, f.rA, Client{ID: "x"}, req)
		waited := time.Since(start)
		what := kmsg.NameForKey(req.Key())
		if waited < least || waited > least+3*time.Second {
			t.Fatalf("%s answered after %v", what, waited)
		}
		checkCodes(t, what, resp, codeUnavailable)
		if resp.GetVersion() != req.GetVersion() {
			t.Fatalf("%s answered at v%d", what, resp.GetVersion())
		}
	}
	if len(f.a.calls())+len(f.b.calls()) != 0 {
		t.Fatalf("an engine saw a request for an unowned group")
	}

	// An owner appears 100ms into the wait.
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group = "late-group"
	ch := handleAsync(f.rA, Client{ID: "x"}, hb)
	time.Sleep(100 * time.Millisecond)
	f.locA.set("late", f.psB.Addr())
	// B does not serve "late…": the relay follows the group
	// (TestRouterFollowsGroupToNextOwner) until the relay timeout.
	checkCodes(t, "heartbeat after the owner appeared", waitReply(t, ch, 5*time.Second), notCoordinator)
	if n := len(f.b.calls()); n < 1 {
		t.Fatalf("B got %d requests", n)
	}
}

// relayHolds parks heartbeats whose member id is "hold=<duration>" for
// that long, and JoinGroups for 2s.
func relayHolds(req kmsg.Request) time.Duration {
	switch r := req.(type) {
	case *kmsg.HeartbeatRequest:
		if d, ok := strings.CutPrefix(r.MemberID, "hold="); ok {
			if d == "forever" {
				return -1
			}
			dur, _ := time.ParseDuration(d)
			return dur
		}
	case *kmsg.JoinGroupRequest:
		return 2 * time.Second
	}
	return 0
}

// heartbeatFor is a heartbeat for group from member.
func heartbeatFor(group, member string) *kmsg.HeartbeatRequest {
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Version = hb.MaxVersion()
	hb.Group, hb.MemberID = group, member
	return hb
}

// TestRelayMatchesRepliesOutOfOrder relays heartbeats that the owner
// answers in the reverse order: each client gets its own answer, over one
// peer connection.
func TestRelayMatchesRepliesOutOfOrder(t *testing.T) {
	f := newFleet(t, nil)
	order := make(chan string, 10)
	f.b.hold = relayHolds
	var chans []<-chan kmsg.Response
	for i := range 5 {
		member := fmt.Sprintf("hold=%dms", 100*(5-i))
		cl := Client{ID: member}
		inner := handleAsync(f.rA, cl, heartbeatFor("b-group", member))
		ch := make(chan kmsg.Response, 1)
		go func() {
			resp := <-inner
			order <- member
			ch <- resp
		}()
		chans = append(chans, ch)
	}
	for _, ch := range chans {
		checkCodes(t, "held heartbeat", waitReply(t, ch, 5*time.Second), markerB)
	}
	var got []string
	for range 5 {
		got = append(got, <-order)
	}
	if want := []string{"hold=100ms", "hold=200ms", "hold=300ms", "hold=400ms", "hold=500ms"}; !slices.Equal(got, want) {
		t.Fatalf("answers completed in order %v, want %v", got, want)
	}
	// Each client's request reached B with its own id: matching by
	// correlation id did not mix them up.
	for _, c := range f.b.calls() {
		if c.c.ID != c.req.(*kmsg.HeartbeatRequest).MemberID {
			t.Fatalf("B got member %s from client %s", c.req.(*kmsg.HeartbeatRequest).MemberID, c.c.ID)
		}
	}
	f.rA.pool.mu.Lock()
	n := len(f.rA.pool.conns)
	f.rA.pool.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d peer connections, want 1", n)
	}
}

// TestRelayParkedJoinDoesNotBlockHeartbeat parks a JoinGroup at the owner
// for 2s; a heartbeat relayed after it on the same peer connection is
// answered long before.
func TestRelayParkedJoinDoesNotBlockHeartbeat(t *testing.T) {
	f := newFleet(t, func(c *RouterConfig) { c.RelayTimeout = time.Second })
	f.b.hold = relayHolds
	join := kmsg.NewPtrJoinGroupRequest()
	join.Version = join.MaxVersion()
	join.Group, join.ProtocolType, join.RebalanceTimeoutMillis, join.SessionTimeoutMillis = "b-group", "consumer", 10000, 10000
	start := time.Now()
	joined := handleAsync(f.rA, Client{ID: "j"}, join)
	waitFor(t, 5*time.Second, "B to get the JoinGroup", func() bool { return len(f.b.calls()) == 1 })
	resp := handle(t, f.rA, Client{ID: "h"}, heartbeatFor("b-group", "m"))
	if d := time.Since(start); d > time.Second {
		t.Fatalf("heartbeat answered after %v, behind the parked join", d)
	}
	checkCodes(t, "heartbeat", resp, markerB)
	select {
	case <-joined:
		t.Fatalf("join answered before the owner replied")
	default:
	}
	// The join waits past RelayTimeout: its own bound is the rebalance
	// timeout.
	checkCodes(t, "join", waitReply(t, joined, 10*time.Second), markerB)
	if d := time.Since(start); d < 2*time.Second {
		t.Fatalf("join answered after %v", d)
	}
}

// TestRelayPeerKilledMidRequest closes the owner's peer server with a
// request in flight: the client gets COORDINATOR_NOT_AVAILABLE at once
// (not after RelayTimeout); the relay reconnects with backoff, and once
// the owner is back a request reaches it, nothing resent.
func TestRelayPeerKilledMidRequest(t *testing.T) {
	f := newFleet(t, func(c *RouterConfig) { c.RelayTimeout = 10 * time.Second })
	f.b.hold = relayHolds
	start := time.Now()
	parked := handleAsync(f.rA, Client{ID: "p"}, heartbeatFor("b-group", "hold=forever"))
	waitFor(t, 5*time.Second, "B to get the heartbeat", func() bool { return len(f.b.calls()) == 1 })
	addr := f.psB.Addr()
	f.psB.Close()
	checkCodes(t, "cut heartbeat", waitReply(t, parked, 5*time.Second), codeUnavailable)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cut request answered after %v", d)
	}
	// B is back at the same address: a reconnection finds it, and
	// until then requests fail at once.
	startPeerServer(t, addr, f.b, nil)
	waitFor(t, 5*time.Second, "a heartbeat answered by B after the restart", func() bool {
		start := time.Now()
		c := codesOf(t, handle(t, f.rA, Client{ID: "q"}, heartbeatFor("b-group", "m")))[0]
		if c == codeUnavailable && time.Since(start) > time.Second {
			t.Fatalf("a request while B was unreachable waited %v", time.Since(start))
		}
		return c == markerB
	})
	if n := len(f.b.calls()); n != 2 {
		t.Fatalf("B got %d requests, want 2 (nothing resent)", n)
	}
	// An owner that is not there at all: unreachable.
	f.locA.set("c", "127.0.0.1:1")
	checkCodes(t, "heartbeat to a dead address", handle(t, f.rA, Client{ID: "q"}, heartbeatFor("c-group", "m")), codeUnavailable)
}

// TestRelayTimeout answers COORDINATOR_NOT_AVAILABLE when the owner takes
// longer than RelayTimeout; its late answer is dropped and the
// connection keeps serving.
func TestRelayTimeout(t *testing.T) {
	f := newFleet(t, func(c *RouterConfig) { c.RelayTimeout = 300 * time.Millisecond })
	f.b.hold = relayHolds
	start := time.Now()
	checkCodes(t, "slow heartbeat", handle(t, f.rA, Client{ID: "s"}, heartbeatFor("b-group", "hold=800ms")), codeUnavailable)
	if d := time.Since(start); d < 300*time.Millisecond || d > 800*time.Millisecond {
		t.Fatalf("timed out after %v", d)
	}
	f.rA.pool.mu.Lock()
	pc := f.rA.pool.conns[f.psB.Addr()]
	f.rA.pool.mu.Unlock()
	time.Sleep(700 * time.Millisecond) // the late answer arrives meanwhile
	checkCodes(t, "next heartbeat", handle(t, f.rA, Client{ID: "s"}, heartbeatFor("b-group", "m")), markerB)
	f.rA.pool.mu.Lock()
	same := f.rA.pool.conns[f.psB.Addr()] == pc
	f.rA.pool.mu.Unlock()
	if pc == nil || !same {
		t.Fatalf("the late answer cost the connection")
	}
}

// TestRouterCloseAnswersInFlight closes the router with a relayed request
// parked at the owner: it is answered COORDINATOR_NOT_AVAILABLE, and
// remote requests after Close are too.
func TestRouterCloseAnswersInFlight(t *testing.T) {
	f := newFleet(t, nil)
	f.b.hold = relayHolds
	parked := handleAsync(f.rA, Client{ID: "p"}, heartbeatFor("b-group", "hold=forever"))
	waiting := handleAsync(f.rA, Client{ID: "w"}, heartbeatFor("nobody", "m"))
	waitFor(t, 5*time.Second, "B to get the heartbeat", func() bool { return len(f.b.calls()) == 1 })
	f.rA.Close()
	checkCodes(t, "parked heartbeat", waitReply(t, parked, 5*time.Second), codeUnavailable)
	checkCodes(t, "heartbeat waiting for an owner", waitReply(t, waiting, 5*time.Second), codeUnavailable)
	checkCodes(t, "heartbeat after Close", handle(t, f.rA, Client{ID: "q"}, heartbeatFor("b-group", "m")), codeUnavailable)
	checkCodes(t, "local heartbeat after Close", handle(t, f.rA, Client{ID: "q"}, heartbeatFor("a-group", "m")), markerA)
}

// TestRelayMetrics records relayed requests by API and outcome.
func TestRelayMetrics(t *testing.T) {
	f := newFleet(t, nil)
	handle(t, f.rA, Client{ID: "m"}, heartbeatFor("b-group", "m"))
	handle(t, f.rA, Client{ID: "m"}, heartbeatFor("a-group", "m")) // local: not a relay
	handle(t, f.rA, Client{ID: "m"}, heartbeatFor("nobody", "m"))
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	var requests int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case "kproxy.relay.duration":
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					api, _ := dp.Attributes.Value("api")
					o, _ := dp.Attributes.Value("outcome")
					counts[api.AsString()+"/"+o.AsString()] += dp.Count
				}
			case "kproxy.relay.requests":
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					requests += dp.Value
				}
			}
		}
	}
	want := map[string]uint64{"Heartbeat/ok": 1, "Heartbeat/no_owner": 1}
	if len(counts) != len(want) || counts["Heartbeat/ok"] != 1 || counts["Heartbeat/no_owner"] != 1 || requests != 2 {
		t.Fatalf("relay durations %v (requests %d), want %v", counts, requests, want)
	}
}

// TestRouterRoutesTheGroupKeys checks the router's table against codec's
// routing table: every key kproxy serves itself, and no other, has a
// groupAPI (FindCoordinator is the session's), and so has every
// share-group key the coordinator serves when kproxy serves share
// groups.
func TestRouterRoutesTheGroupKeys(t *testing.T) {
	var got []int16
	for key := range groupAPIs {
		got = append(got, key)
	}
	slices.Sort(got)
	want := codec.GroupKeys()
	for key := range int16(200) {
		if codec.IsShareCoordinatorKey(key) {
			want = append(want, key)
		}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("router serves keys %v, codec routes %v to kproxy", got, want)
	}
}
