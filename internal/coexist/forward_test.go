package coexist

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/proxy"
)

// TestForwardSetCounts: Forwarded answers from the decisions recorded,
// and its lock-free "nothing forwarded" answer follows them.
func TestForwardSetCounts(t *testing.T) {
	f := newForwardSet(nil)
	if f.Forwarded("g") {
		t.Fatal("a group nobody decided on is forwarded")
	}
	f.mark("g")
	f.mark("g")
	f.set("h", forwardEntry{})
	if !f.Forwarded("g") || f.Forwarded("h") || f.forwarded.Load() != 1 {
		t.Fatalf("after marking g: g %v, h %v, count %d", f.Forwarded("g"), f.Forwarded("h"), f.forwarded.Load())
	}
	f.set("g", forwardEntry{})
	if f.Forwarded("g") || f.forwarded.Load() != 0 {
		t.Fatalf("after g went back: g %v, count %d", f.Forwarded("g"), f.forwarded.Load())
	}
}

// fakeCluster is a clusterView whose answers a test sets.
type fakeCluster struct {
	mu      sync.Mutex
	groups  map[string]ClusterGroup
	asked   int
	joins   []string // the member ids JoinForMemberID was sent
	joinErr error    // what JoinForMemberID fails with, if set
}

func (c *fakeCluster) DescribeOnCluster(_ context.Context, group string) (ClusterGroup, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked++
	return c.groups[group], nil
}

func (c *fakeCluster) GroupCoordinator(context.Context, string, bool) (int32, error) { return 2, nil }

func (c *fakeCluster) JoinForMemberID(_ context.Context, join *kmsg.JoinGroupRequest) (*kmsg.JoinGroupResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.joins = append(c.joins, join.MemberID)
	if c.joinErr != nil {
		return nil, c.joinErr
	}
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.ErrorCode, resp.MemberID = kerr.MemberIDRequired.Code, fmt.Sprintf("cluster-%d", len(c.joins))
	return resp, nil
}

// TestForwardSetKinds: share and streams groups are the cluster's, with
// or without members; a group nobody has yet is forwarded once a client
// asked for it as a share group, and not before; a consumer group
// kproxy anchors is kproxy's whatever a client asks (Claim says so, and
// FindCoordinator keeps naming kproxy); the kind shows in the list.
func TestForwardSetKinds(t *testing.T) {
	ctx := context.Background()
	c := &fakeCluster{groups: map[string]ClusterGroup{
		"sh":       {Kind: "share"},
		"st":       {Kind: "streams", Members: true},
		"mine":     {Kind: "classic", Members: true, Anchored: true},
		"empty":    {Kind: "classic"},
		"theirs":   {Kind: "consumer", Members: true},
		"nobodys":  {},
		"nobodys2": {},
	}}
	f := newForwardSet(c)
	lookup := func(g string) bool {
		t.Helper()
		node, fwd, err := f.Lookup(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		if node != 2 {
			t.Fatalf("looked %s up at node %d, want the cluster's coordinator 2 (forwarded or not)", g, node)
		}
		return fwd
	}
	for g, want := range map[string]bool{"sh": true, "st": true, "mine": false, "empty": false, "theirs": true, "nobodys": false} {
		if got := lookup(g); got != want {
			t.Errorf("Lookup(%s) forwards %v, want %v", g, got, want)
		}
	}
	// A share client asks for a group nobody has: forwarded from now on,
	// FindCoordinator included, without waiting for the recheck.
	if served := f.Claim(ctx, "nobodys2", "share"); served {
		t.Error("a group nobody has is served by kproxy after a share request")
	}
	if !f.Forwarded("nobodys2") || !lookup("nobodys2") {
		t.Error("a claimed share group is not forwarded")
	}
	// Past the recheck the claim still holds while the group does not
	// exist yet (the cluster creates it on the first heartbeat).
	f.mu.Lock()
	e := f.groups["nobodys2"]
	e.at = e.at.Add(-time.Hour)
	f.groups["nobodys2"] = e
	f.mu.Unlock()
	if !lookup("nobodys2") {
		t.Error("a claimed share group stopped being forwarded at the recheck")
	}
	// kproxy's own consumer groups stay kproxy's.
	for _, g := range []string{"mine", "empty"} {
		if served := f.Claim(ctx, g, "share"); !served {
			t.Errorf("Claim(%s) as share: not served by kproxy, which holds it as a consumer group", g)
		}
		if lookup(g) || f.Forwarded(g) {
			t.Errorf("a share request made kproxy's consumer group %s forwarded", g)
		}
	}
	// A forwarded group's claims are answered from the decision, without
	// asking the cluster again, even past the recheck.
	f.mu.Lock()
	e = f.groups["sh"]
	e.at = e.at.Add(-time.Hour)
	f.groups["sh"] = e
	f.mu.Unlock()
	before := c.asked
	for range 10 {
		if f.Claim(ctx, "sh", "share") {
			t.Error("a forwarded share group's claim says kproxy serves it")
		}
	}
	if c.asked != before {
		t.Errorf("claims of a forwarded group asked the cluster %d times", c.asked-before)
	}
	kinds := map[string]string{}
	for _, g := range f.list() {
		kinds[g.Group] = g.Kind
	}
	want := map[string]string{"sh": "share", "st": "streams", "theirs": "consumer", "nobodys2": "share"}
	if len(kinds) != len(want) {
		t.Errorf("forwarded %v, want %v", kinds, want)
	}
	for g, k := range want {
		if kinds[g] != k {
			t.Errorf("forwarded %s as %q, want %q", g, kinds[g], k)
		}
	}
}

// TestForwardSetHandBack: a group whose cluster group holds the anchor
// and a member of the cluster's own is being handed back. FindCoordinator
// names the cluster's coordinator; a JoinGroup goes there, its member id
// cleared unless the cluster handed it out (seen in the describe, or in a
// JoinGroup answer forwarded here); every other request goes where its
// member id belongs; requests without one stay with kproxy. Once the
// anchor left, everything is forwarded.
func TestForwardSetHandBack(t *testing.T) {
	ctx := context.Background()
	c := &fakeCluster{groups: map[string]ClusterGroup{
		"g": {Kind: "classic", Members: true, Anchored: true, MemberIDs: []string{"direct-1"}},
	}}
	f := newForwardSet(c)
	if _, forward, err := f.Lookup(ctx, "g"); err != nil || !forward {
		t.Fatalf("lookup of a group being handed back: forward %v, %v", forward, err)
	}
	if f.Forwarded("g") || !f.handingBack("g") {
		t.Fatalf("a group being handed back: forwarded %v, handing back %v", f.Forwarded("g"), f.handingBack("g"))
	}
	join := func(id string) *kmsg.JoinGroupRequest {
		r := kmsg.NewPtrJoinGroupRequest()
		r.Group, r.MemberID = "g", id
		return r
	}
	for _, tc := range []struct {
		id, want string
		rewrite  bool
	}{
		{"engine-7", "", true},
		{"", "", false},
		{"direct-1", "direct-1", false},
	} {
		r := join(tc.id)
		forward, rewrite := f.ForwardRequest("g", r)
		if !forward || rewrite != tc.rewrite || r.MemberID != tc.want {
			t.Fatalf("JoinGroup of %q: forward %v rewrite %v, member id %q; want forwarded, rewrite %v, %q",
				tc.id, forward, rewrite, r.MemberID, tc.rewrite, tc.want)
		}
	}
	hb := func(id string) *kmsg.HeartbeatRequest {
		r := kmsg.NewPtrHeartbeatRequest()
		r.Group, r.MemberID = "g", id
		return r
	}
	if forward, _ := f.ForwardRequest("g", hb("engine-7")); forward {
		t.Fatal("a heartbeat of the engine's member went to the cluster")
	}
	if forward, _ := f.ForwardRequest("g", hb("direct-1")); !forward {
		t.Fatal("a heartbeat of a member of the cluster's stayed with kproxy")
	}
	// A member that got MEMBER_ID_REQUIRED rejoins with the id the
	// cluster handed out: kept, and its heartbeats go there too.
	f.issuedID("g", "issued-2")
	if r := join("issued-2"); func() bool { fw, rw := f.ForwardRequest("g", r); return !fw || rw || r.MemberID != "issued-2" }() {
		t.Fatal("the rejoin with the id the cluster handed out was rewritten")
	}
	if forward, _ := f.ForwardRequest("g", hb("issued-2")); !forward {
		t.Fatal("a heartbeat with an id the cluster handed out stayed with kproxy")
	}
	fetch := kmsg.NewPtrOffsetFetchRequest()
	fetch.Group = "g"
	if forward, _ := f.ForwardRequest("g", fetch); forward {
		t.Fatal("an offset fetch of a group being handed back left kproxy")
	}
	f.mark("g")
	if forward, _ := f.ForwardRequest("g", hb("engine-7")); !forward || f.handingBack("g") || len(f.issued) != 0 {
		t.Fatalf("after the hand-back: forwarded %v, handing back %v, issued ids kept %d", forward, f.handingBack("g"), len(f.issued))
	}
	if f.forwarded.Load() != 1 {
		t.Fatalf("forwarded count %d, want 1", f.forwarded.Load())
	}
}

// TestJoinAtClusterDuringHandBack: a JoinGroup the engine refused as the
// hand-back began goes to the cluster without its member id, only while
// the group is being handed back, only for a dynamic member at v4 or
// later; the id the cluster handed out is then known (its rejoin goes
// there unchanged).
func TestJoinAtClusterDuringHandBack(t *testing.T) {
	ctx := context.Background()
	c := &fakeCluster{groups: map[string]ClusterGroup{}}
	f := newForwardSet(c)
	w := newForwardWatcher(f, nil, func(string) bool { return true }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	join := func(version int16, instance *string) *kmsg.JoinGroupRequest {
		r := kmsg.NewPtrJoinGroupRequest()
		r.SetVersion(version)
		r.Group, r.MemberID, r.InstanceID, r.ProtocolType = "g", "engine-7", instance, "consumer"
		r.SessionTimeoutMillis, r.RebalanceTimeoutMillis = 10_000, 30_000
		return r
	}
	c.groups["g"] = ClusterGroup{Kind: "classic", Members: true, Anchored: true}
	if id, ok := w.JoinAtCluster(ctx, proxy.Client{}, join(5, nil)); ok || len(c.joins) != 0 {
		t.Fatalf("a group kproxy serves: joined at the cluster (%q, %v, %d sent)", id, ok, len(c.joins))
	}
	// Another kproxy's anchor began the hand-back: this kproxy learns it
	// from the cluster's group, which holds a member of its own.
	c.mu.Lock()
	c.groups["g"] = ClusterGroup{Kind: "classic", Members: true, Anchored: true, MemberIDs: []string{"direct-1"}}
	c.mu.Unlock()
	static := "i1"
	for _, r := range []*kmsg.JoinGroupRequest{join(3, nil), join(5, &static)} {
		if id, ok := w.JoinAtCluster(ctx, proxy.Client{}, r); ok || len(c.joins) != 0 {
			t.Fatalf("join v%d static %v: joined at the cluster (%q, %v, %d sent)", r.Version, r.InstanceID != nil, id, ok, len(c.joins))
		}
	}
	r := join(5, nil)
	id, ok := w.JoinAtCluster(ctx, proxy.Client{}, r)
	if !ok || id != "cluster-1" || len(c.joins) != 1 || c.joins[0] != "" {
		t.Fatalf("refused join during the hand-back: %q, %v; sent with ids %q, want one without", id, ok, c.joins)
	}
	if r.MemberID != "engine-7" {
		t.Fatalf("the member's request was changed: member id %q", r.MemberID)
	}
	if !f.handingBack("g") {
		t.Fatal("the hand-back the cluster showed was not recorded")
	}
	rejoin := join(5, nil)
	rejoin.MemberID = id
	if forward, rewrite := f.ForwardRequest("g", rejoin); !forward || rewrite || rejoin.MemberID != id {
		t.Fatalf("the rejoin with the id handed out: forward %v rewrite %v id %q", forward, rewrite, rejoin.MemberID)
	}
	// The cluster cannot be asked: no id, and the member keeps the
	// engine's NOT_COORDINATOR.
	c.mu.Lock()
	c.joinErr = errors.New("coordinator unreachable")
	c.mu.Unlock()
	if id, ok := w.JoinAtCluster(ctx, proxy.Client{}, join(5, nil)); ok || id != "" {
		t.Fatalf("a join the cluster never answered got member id %q, %v", id, ok)
	}
}

// TestForwardSetTakeoverHold: a group taken over stays served here while
// the cluster's group still lists a member the anchor replaces; then
// what the cluster shows decides again, within the hold too: the anchor
// alone is served here, the anchor and a member that joined directly is
// a hand-back, members without the anchor (handed back) are forwarded.
func TestForwardSetTakeoverHold(t *testing.T) {
	ctx := context.Background()
	c := &fakeCluster{groups: map[string]ClusterGroup{}}
	f := newForwardSet(c)
	f.takeOver("g", []string{"m1", "m2"})
	for _, step := range []struct {
		what              string
		cluster           ClusterGroup
		forward, handback bool
	}{
		{"members still there, anchor not yet", ClusterGroup{Kind: "classic", Members: true, MemberIDs: []string{"m1", "m2"}}, false, false},
		{"anchor joining, one member left", ClusterGroup{Kind: "classic", Members: true, Anchored: true, MemberIDs: []string{"m2"}}, false, false},
		{"anchor alone", ClusterGroup{Kind: "classic", Members: true, Anchored: true}, false, false},
		{"a member joined directly", ClusterGroup{Kind: "classic", Members: true, Anchored: true, MemberIDs: []string{"d"}}, false, true},
		{"handed back", ClusterGroup{Kind: "classic", Members: true, MemberIDs: []string{"d", "m1-new"}}, true, false},
	} {
		c.mu.Lock()
		c.groups["g"] = step.cluster
		c.mu.Unlock()
		f.mu.RLock()
		prev := f.groups["g"]
		f.mu.RUnlock()
		e, err := f.decide(ctx, "g", prev)
		if err != nil || e.forward != step.forward || e.handback != step.handback {
			t.Fatalf("%s: forward %v handback %v (%v), want %v %v", step.what, e.forward, e.handback, err, step.forward, step.handback)
		}
	}
}
