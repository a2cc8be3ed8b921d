package kproxy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
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
	mu     sync.Mutex
	groups map[string]kafkastore.ClusterGroup
	asked  int
}

func (c *fakeCluster) DescribeOnCluster(_ context.Context, group string) (kafkastore.ClusterGroup, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked++
	return c.groups[group], nil
}

func (c *fakeCluster) GroupCoordinator(context.Context, string) (int32, error) { return 2, nil }

// TestForwardSetKinds: share and streams groups are the cluster's, with
// or without members; a group nobody has yet is forwarded once a client
// asked for it as a share group, and not before; a consumer group
// kproxy anchors is kproxy's whatever a client asks (Claim says so, and
// FindCoordinator keeps naming kproxy); the kind shows in the list.
func TestForwardSetKinds(t *testing.T) {
	ctx := context.Background()
	c := &fakeCluster{groups: map[string]kafkastore.ClusterGroup{
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
		if fwd && node != 2 {
			t.Fatalf("forwarded %s to node %d, want the cluster's coordinator 2", g, node)
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
