package coexist

import (
	"context"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

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
	// issued holds, per group being handed back, the member ids the
	// cluster's coordinator handed out in JoinGroup answers forwarded
	// here (a member that got MEMBER_ID_REQUIRED rejoins with one before
	// any describe shows it); guarded by mu, dropped with the hand-back.
	issued map[string]map[string]bool
	// forwarded counts the entries of groups that forward or are being
	// handed back, so that Forwarded and ForwardRequest, asked for every
	// group request of every connection, answer without a lock while no
	// group is; written under mu.
	forwarded atomic.Int64
}

// clusterView is what the forwardSet asks the cluster; *Anchors
// implements it.
type clusterView interface {
	DescribeOnCluster(ctx context.Context, group string) (ClusterGroup, error)
	// GroupCoordinator returns the node id of group's coordinator:
	// asked afresh, or as last learnt.
	GroupCoordinator(ctx context.Context, group string, fresh bool) (int32, error)
	// JoinForMemberID sends the cluster's coordinator join, a JoinGroup
	// without a member id, and returns its answer.
	JoinForMemberID(ctx context.Context, join *kmsg.JoinGroupRequest) (*kmsg.JoinGroupResponse, error)
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
	// takenIDs are the member ids the anchor replaces in that takeover
	// (nil if unknown); immutable. The hold ends early once the cluster's
	// group lists none of them beside the anchor.
	takenIDs []string
	// handback is set while the group is being handed back to the
	// cluster's coordinator (the anchor and members of the cluster's
	// own in its group, docs/anchors.md): FindCoordinator names the
	// cluster's coordinator, JoinGroups go there (with a member id the
	// cluster does not know cleared), and the other requests go where
	// their member id belongs (ForwardRequest).
	handback bool
	// clusterIDs are the member ids the cluster's group held when
	// decided (handback only); immutable.
	clusterIDs []string
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
	return &forwardSet{cluster: cluster, groups: make(map[string]forwardEntry), issued: make(map[string]map[string]bool)}
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
	forward := e.forward || e.handback
	// A group kproxy serves is named at the coordinator last learnt:
	// its members' requests reach the broker only once it is handed
	// back, when the lookups are fresh again.
	node, err := f.cluster.GroupCoordinator(ctx, group, forward)
	if err != nil {
		return -1, false, err
	}
	return node, forward, nil
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
	e := forwardEntry{at: now, claimKind: prev.claimKind, claimed: prev.claimed, takenOver: prev.takenOver, takenIDs: prev.takenIDs}
	switch {
	case now.Sub(e.takenOver) < takeoverHold && (e.takenIDs == nil || hasAny(c.MemberIDs, e.takenIDs)):
		// Taken over: served here while the anchor replaces the
		// members in the cluster's group. Once the cluster's group
		// lists none of them, what it shows decides again: the anchor
		// alone (served here), the anchor and a member that joined
		// directly (a hand-back), members and no anchor (handed back:
		// forwarded).
	case c.Live():
		e.forward, e.kind = true, c.Kind
	case c.Anchored && len(c.MemberIDs) > 0:
		// Members of the cluster's own beside the anchor: the group is
		// being handed back (or the engine could not, and the anchor
		// holds kproxy's partitions: the members here are the engine's
		// then, and go on there).
		e.handback, e.clusterIDs = true, c.MemberIDs
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
		e.takenOver, e.takenIDs, e.forward, e.handback, e.kind = cur.takenOver, cur.takenIDs, false, false, ""
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
	if !ok || !(e.forward || e.handback) || time.Since(e.at) <= forwardRecheck {
		return ok && (e.forward || e.handback), nil
	}
	e, err := f.decide(ctx, group, e)
	return e.forward, err
}

// takeOver records that group is served here from now on: it was taken
// over from the cluster's coordinator (takeover.go), the anchor
// replacing members (their ids; nil if unknown).
func (f *forwardSet) takeOver(group string, members []string) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.groups[group]
	e.forward, e.handback, e.kind, e.at, e.takenOver, e.takenIDs = false, false, "", now, now, members
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
				delete(f.issued, g)
			}
		}
	}
	f.count(f.groups[group], e)
	f.groups[group] = e
	if !e.handback {
		delete(f.issued, group)
	}
}

// count keeps the forwarded count as an entry goes from old to new,
// and drops the issued ids of a hand-back that ended; f.mu is held.
func (f *forwardSet) count(old, new forwardEntry) {
	was, is := old.forward || old.handback, new.forward || new.handback
	switch {
	case was && !is:
		f.forwarded.Add(-1)
	case !was && is:
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

// handBack records that group is being handed back to the cluster's
// coordinator from now on (this kproxy's anchor began it): the other
// kproxies learn it from the cluster's group (decide).
func (f *forwardSet) handBack(group string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.groups[group]
	e.forward, e.handback, e.kind, e.at, e.takenOver = false, true, "", time.Now(), time.Time{}
	f.setLocked(group, e)
}

// handingBackNow reports whether group is being handed back, asking the
// cluster unless this kproxy knows it already: another kproxy's anchor
// may have begun it, which this one learns only from the cluster's
// group.
func (f *forwardSet) handingBackNow(ctx context.Context, group string) bool {
	if f.handingBack(group) {
		return true
	}
	f.mu.RLock()
	prev := f.groups[group]
	f.mu.RUnlock()
	e, err := f.decide(ctx, group, prev)
	return err == nil && e.handback
}

// handingBack reports whether group is being handed back.
func (f *forwardSet) handingBack(group string) bool {
	if f.forwarded.Load() == 0 {
		return false
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.groups[group].handback
}

// issuedID records memberID, handed out by the cluster's coordinator for
// group in a JoinGroup answer forwarded here.
func (f *forwardSet) issuedID(group, memberID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.groups[group].handback {
		return
	}
	ids := f.issued[group]
	if ids == nil {
		ids = make(map[string]bool)
		f.issued[group] = ids
	}
	if len(ids) < maxIssuedIDs {
		ids[memberID] = true
	}
}

// maxIssuedIDs bounds the ids recorded for one group being handed back.
const maxIssuedIDs = 10_000

// ForwardRequest implements proxy.RequestForwarder. A group being
// handed back has two kinds of members for a while: those of kproxy's
// engine (until they rejoin) and those in the cluster's group. A
// JoinGroup goes to the cluster's coordinator, its member id cleared if
// the cluster did not hand it out (the engine's: the cluster would
// answer UNKNOWN_MEMBER_ID, on which cooperative clients drop their
// partitions uncommitted; cleared, it gets MEMBER_ID_REQUIRED and an id
// of the cluster's, and its owned partitions travel in its metadata).
// A request carrying a member id goes where that id belongs; the rest
// (offset fetches, describes) stays with kproxy, which serves them as
// the cluster does.
func (f *forwardSet) ForwardRequest(group string, req kmsg.Request) (forward, rewrite bool) {
	if f.forwarded.Load() == 0 {
		return false, false
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	e := f.groups[group]
	switch {
	case e.forward:
		return true, false
	case !e.handback:
		return false, false
	}
	known := func(id string) bool {
		return id != "" && (f.issued[group][id] || slices.Contains(e.clusterIDs, id))
	}
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		if r.MemberID != "" && !known(r.MemberID) {
			r.MemberID = ""
			return true, true
		}
		return true, false
	case *kmsg.SyncGroupRequest:
		return known(r.MemberID), false
	case *kmsg.HeartbeatRequest:
		return known(r.MemberID), false
	case *kmsg.LeaveGroupRequest:
		if len(r.Members) > 0 {
			return known(r.Members[0].MemberID), false
		}
		return known(r.MemberID), false
	case *kmsg.OffsetCommitRequest:
		return known(r.MemberID), false
	case *kmsg.TxnOffsetCommitRequest:
		return known(r.MemberID), false
	}
	return false, false
}

// hasAny reports whether any of ids is in set.
func hasAny(set, ids []string) bool {
	for _, id := range ids {
		if slices.Contains(set, id) {
			return true
		}
	}
	return false
}
