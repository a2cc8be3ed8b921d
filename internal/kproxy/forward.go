package kproxy

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/tap"
)

// forwardSet is the proxy.GroupForwarder of a kproxy that serves groups
// with anchors (docs/anchors.md): a group is forwarded to the cluster's
// own coordinator while the cluster serves it (it has members there and
// none of them is a kproxy anchor, or it is a share or streams group,
// which only the cluster serves). Each kproxy decides from the cluster's
// state itself, when a client looks the coordinator up (Lookup), when a
// client asks for a share or streams group (Claim), and when the store
// finds a group it was about to serve live on the cluster (mark); the
// owner's load-time check is the safety net behind them all
// (groupstate.ErrGroupLiveOnCluster).
type forwardSet struct {
	cluster clusterView // immutable

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

// clusterView is what the forwardSet asks the cluster; *kafkastore.Store
// implements it.
type clusterView interface {
	DescribeOnCluster(ctx context.Context, group string) (kafkastore.ClusterGroup, error)
	GroupCoordinator(ctx context.Context, group string) (int32, error)
}

// forwardEntry is one decision.
type forwardEntry struct {
	forward bool
	// kind is the group's kind on the cluster when it forwards ("" when
	// the cluster's state was not read: marked by the store), or the
	// kind a client claimed for a group the cluster does not have yet.
	kind string
	at   time.Time // when decided
	// claimKind and claimed are the kind a client last asked for the
	// group as (a share or streams request, Claim) and when; zero if
	// none did.
	claimKind string
	claimed   time.Time
	// takenOver is when this kproxy took the group over from the
	// cluster's coordinator (takeover.go); for takeoverHold after it the
	// group is not forwarded whatever the cluster shows (its members
	// are still there until the anchor replaced them).
	takenOver time.Time
}

// forwardRecheck is how long a decision stands before a lookup asks the
// cluster again. Forwarded stays true in between, so a group's requests
// never flap within one FindCoordinator.
const forwardRecheck = 2 * time.Second

// claimTTL is how long a client's share or streams request for a group
// the cluster does not have yet keeps FindCoordinator for it pointing at
// the cluster's coordinator, which creates the group on the client's
// first heartbeat; every such request renews it.
const claimTTL = time.Minute

// takeoverHold is how long a group taken over stays served here
// whatever the cluster shows: the anchor's join and the members' leave
// complete within it.
const takeoverHold = 30 * time.Second

// maxForwardEntries bounds the decisions kept; past it the oldest half
// is dropped.
const maxForwardEntries = 100_000

func newForwardSet(cluster clusterView) *forwardSet {
	return &forwardSet{cluster: cluster, groups: make(map[string]forwardEntry)}
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
		var err error
		if e, err = f.decide(ctx, group, e); err != nil {
			return -1, false, err
		}
	}
	if !e.forward {
		return -1, false, nil
	}
	node, err := f.cluster.GroupCoordinator(ctx, group)
	if err != nil {
		return -1, false, err
	}
	return node, true, nil
}

// Claim implements proxy.GroupForwarder: a share or streams request for
// group. A group already forwarded stays so without asking the cluster.
// Otherwise a group the cluster serves, or does not have at all, is
// forwarded from now on (the client's next FindCoordinator names the
// cluster's coordinator); one kproxy serves as a consumer group
// (anchored, or known to the cluster as a classic or consumer group
// without members of its own) is not, and served reports it. A cluster
// that cannot say leaves the request to the broker.
func (f *forwardSet) Claim(ctx context.Context, group, kind string) (served bool) {
	now := time.Now()
	f.mu.Lock()
	e, ok := f.groups[group]
	e.claimKind, e.claimed = kind, now
	if ok {
		f.groups[group] = e // renew the claim; counts unchanged
	}
	f.mu.Unlock()
	if ok && e.forward {
		// Already the cluster's: the request goes on at once, however
		// old the decision (a share member heartbeats every few
		// seconds, and asking the cluster each time would cost three
		// describes on the request's way). FindCoordinator decides
		// again (Lookup), which is where a group changing hands shows.
		return false
	}
	e, err := f.decide(ctx, group, e)
	if err != nil {
		return false
	}
	return !e.forward
}

// decide asks the cluster about group and records the decision; prev
// carries the client's claim, if any.
func (f *forwardSet) decide(ctx context.Context, group string, prev forwardEntry) (forwardEntry, error) {
	c, err := f.cluster.DescribeOnCluster(ctx, group)
	if err != nil {
		return forwardEntry{}, err
	}
	now := time.Now()
	e := forwardEntry{at: now, claimKind: prev.claimKind, claimed: prev.claimed, takenOver: prev.takenOver}
	switch {
	case now.Sub(e.takenOver) < takeoverHold:
		// Taken over: served here while the anchor replaces the
		// members in the cluster's group.
	case c.Live():
		e.forward, e.kind = true, c.Kind
	case c.Kind == "" && e.claimKind != "" && now.Sub(e.claimed) <= claimTTL:
		// Nobody has the group yet and a client wants it as a share
		// or streams group: the cluster's coordinator creates it.
		e.forward, e.kind = true, e.claimKind
	}
	f.mu.Lock()
	if cur, ok := f.groups[group]; ok && cur.claimed.After(e.claimed) {
		e.claimKind, e.claimed = cur.claimKind, cur.claimed
	}
	if cur, ok := f.groups[group]; ok && cur.takenOver.After(e.takenOver) {
		// Taken over while the cluster was asked.
		e.takenOver, e.forward, e.kind = cur.takenOver, false, ""
	}
	f.setLocked(group, e)
	f.mu.Unlock()
	return e, nil
}

// recheck decides again for a forwarded group whose decision is older
// than forwardRecheck and reports whether it is still forwarded: a group
// whose members are all requests on their way through kproxies
// (FindCoordinator is asked once, then never again while the member
// keeps its coordinator) learns so that the fleet took it over
// meanwhile.
func (f *forwardSet) recheck(ctx context.Context, group string) (bool, error) {
	f.mu.RLock()
	e, ok := f.groups[group]
	f.mu.RUnlock()
	if !ok || !e.forward || time.Since(e.at) <= forwardRecheck {
		return ok && e.forward, nil
	}
	e, err := f.decide(ctx, group, e)
	return e.forward, err
}

// takeOver records that group is served here from now on: it was taken
// over from the cluster's coordinator (takeover.go).
func (f *forwardSet) takeOver(group string) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.groups[group]
	e.forward, e.kind, e.at, e.takenOver = false, "", now, now
	f.setLocked(group, e)
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
	f.setLocked(group, e)
}

// setLocked records e for group; f.mu is held.
func (f *forwardSet) setLocked(group string, e forwardEntry) {
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

// list returns the groups forwarded now, by name.
func (f *forwardSet) list() []tap.ForwardedGroup {
	f.mu.RLock()
	out := make([]tap.ForwardedGroup, 0, f.forwarded.Load())
	for g, e := range f.groups {
		if e.forward {
			out = append(out, tap.ForwardedGroup{Group: g, Kind: e.kind, Since: e.at})
		}
	}
	f.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}
