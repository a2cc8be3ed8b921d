package kproxy

import "testing"

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
