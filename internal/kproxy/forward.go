package kproxy

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
)

// forwardSet is the proxy.GroupForwarder of a kproxy that serves groups
// with anchors (docs/anchors.md): a group is forwarded to the cluster's
// own coordinator while the cluster serves it (it has members there and
// none of them is a kproxy anchor). Each kproxy decides from the
// cluster's state itself, when a client looks the coordinator up
// (Lookup), and when the store finds a group it was about to serve live
// on the cluster (mark); the owner's load-time check is the safety net
// behind both (groupstate.ErrGroupLiveOnCluster).
type forwardSet struct {
	store *kafkastore.Store // immutable

	mu sync.RWMutex // guards groups
	// groups holds what was last decided for each group looked up, and
	// when; entries older than forwardRecheck are decided again.
	groups map[string]forwardEntry
	// forwarded counts the entries of groups that forward, so that
	// Forwarded, asked for every group request of every connection,
	// answers without a lock while no group is forwarded; written under
	// mu.
	forwarded atomic.Int64
}

// forwardEntry is one decision.
type forwardEntry struct {
	forward bool
	at      time.Time
}

// forwardRecheck is how long a decision stands before a lookup asks the
// cluster again. Forwarded stays true in between, so a group's requests
// never flap within one FindCoordinator.
const forwardRecheck = 2 * time.Second

// maxForwardEntries bounds the decisions kept; past it the oldest half
// is dropped.
const maxForwardEntries = 100_000

func newForwardSet(store *kafkastore.Store) *forwardSet {
	return &forwardSet{store: store, groups: make(map[string]forwardEntry)}
}

// Forwarded implements proxy.GroupForwarder.
func (f *forwardSet) Forwarded(group string) bool {
	if f.forwarded.Load() == 0 {
		return false
	}
	f.mu.RLock()
	e := f.groups[group]
	f.mu.RUnlock()
	return e.forward
}

// Lookup implements proxy.GroupForwarder.
func (f *forwardSet) Lookup(ctx context.Context, group string) (int32, bool, error) {
	f.mu.RLock()
	e, ok := f.groups[group]
	f.mu.RUnlock()
	if !ok || time.Since(e.at) > forwardRecheck {
		live, err := f.store.LiveOnCluster(ctx, group)
		if err != nil {
			return -1, false, err
		}
		e = forwardEntry{forward: live, at: time.Now()}
		f.set(group, e)
	}
	if !e.forward {
		return -1, false, nil
	}
	node, err := f.store.GroupCoordinator(ctx, group)
	if err != nil {
		return -1, false, err
	}
	return node, true, nil
}

// mark records that the cluster serves group (the store found it live,
// or another kproxy's anchor took it over).
func (f *forwardSet) mark(group string) {
	f.set(group, forwardEntry{forward: true, at: time.Now()})
}

// set records e for group.
func (f *forwardSet) set(group string, e forwardEntry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.groups) >= maxForwardEntries {
		cut := time.Now().Add(-forwardRecheck)
		for g, old := range f.groups {
			if old.at.Before(cut) {
				f.count(old, forwardEntry{})
				delete(f.groups, g)
			}
		}
	}
	f.count(f.groups[group], e)
	f.groups[group] = e
}

// count keeps the forwarded count as an entry goes from old to new;
// f.mu is held.
func (f *forwardSet) count(old, new forwardEntry) {
	switch {
	case old.forward && !new.forward:
		f.forwarded.Add(-1)
	case !old.forward && new.forward:
		f.forwarded.Add(1)
	}
}
