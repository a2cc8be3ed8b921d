package kproxy

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/proxy"
)

// Takeover of a forwarded group (docs/anchors.md, "Rolling kproxy in").
// While a classic group is forwarded, kproxy watches the group requests
// it forwards (proxy.ForwardWatcher) and so knows which of the group's
// members are behind it, at which generation, with which subscriptions
// and timeouts. Once the cluster's group is Stable and every one of its
// members is one of those, the group's owner hands it to the engine as
// the cluster holds it (kafkastore.Store.PrepareTakeover), stops
// forwarding it, waits for the requests still on their way to the
// cluster, and lets the anchor take the members' place in the cluster's
// group (kafkastore.Store.TakeoverReady). The members' next heartbeat is
// answered by the engine at the same generation: no rebalance.
//
// What is not taken over: KIP-848 groups (their members are forwarded
// until the group empties), and, in a fleet, a group whose members are
// behind more than one kproxy (each kproxy sees only its own members'
// requests).

// watchedMember is what this kproxy saw of one member of a forwarded
// classic group. Guarded by the watcher's mu.
type watchedMember struct {
	instanceID   *string
	clientID     string
	clientHost   string
	protocolType string
	protocols    []kmsg.JoinGroupRequestProtocol // copied from its last JoinGroup
	sessionMS    int32
	rebalanceMS  int32
	generation   int32
	leader       string
	protocol     string
	// synced: its SyncGroup of generation was answered without error,
	// and no answer since said the group is rebalancing.
	synced bool
	// lastOK is when an answer at generation last came without error.
	lastOK time.Time
}

// watchedGroup is one forwarded group's members behind this kproxy, and
// its requests on their way to the cluster.
type watchedGroup struct {
	members map[string]*watchedMember
	// inFlight holds the requests forwarded and not answered, by a
	// number of their own, with when they went and how long they may
	// take; one never answered (its connection died) stops counting
	// after that.
	inFlight map[uint64]flight
}

type flight struct {
	sent time.Time
	max  time.Duration
}

// forwardWatcher is the proxy.ForwardWatcher half of a takeover; it
// also runs the takeover loop (run). Safe for concurrent use.
type forwardWatcher struct {
	fw    *forwardSet       // immutable
	store takeoverStore     // immutable
	owns  func(string) bool // immutable; nil = every group is ours (local mode)
	log   *slog.Logger      // immutable

	mu     sync.Mutex
	groups map[string]*watchedGroup // guarded by mu
	seq    uint64                   // guarded by mu
}

// takeoverStore is what a takeover asks of the store;
// *kafkastore.Store implements it.
type takeoverStore interface {
	DescribeClassicGroup(ctx context.Context, group string) (kmsg.DescribeGroupsResponseGroup, error)
	PrepareTakeover(group string, record []byte, members []kafkastore.TakeoverMember) error
	TakeoverReady(group string)
	CancelTakeover(group string)
}

// takeoverInterval is how often the watched groups are checked for a
// takeover.
const takeoverInterval = time.Second

// takeoverDrain bounds the wait for a group's forwarded requests to be
// answered once it is no longer forwarded.
const takeoverDrain = 5 * time.Second

// maxWatchedGroups bounds the groups watched; past it new ones are not.
const maxWatchedGroups = 10_000

func newForwardWatcher(fw *forwardSet, store takeoverStore, owns func(string) bool, log *slog.Logger) *forwardWatcher {
	return &forwardWatcher{fw: fw, store: store, owns: owns, log: log, groups: make(map[string]*watchedGroup)}
}

// Forwarded, Lookup and Claim are the forwardSet's: the watcher is the
// proxy's GroupForwarder.
func (w *forwardWatcher) Forwarded(group string) bool { return w.fw.Forwarded(group) }
func (w *forwardWatcher) Lookup(ctx context.Context, group string) (int32, bool, error) {
	return w.fw.Lookup(ctx, group)
}
func (w *forwardWatcher) Claim(ctx context.Context, group, kind string) bool {
	return w.fw.Claim(ctx, group, kind)
}

// Watch implements proxy.ForwardWatcher.
func (w *forwardWatcher) Watch(c proxy.Client, group string, req kmsg.Request) func(kmsg.Response) {
	var answered func(g *watchedGroup, resp kmsg.Response)
	max := 30 * time.Second
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		if r.ProtocolType == "" {
			return nil
		}
		seen := watchedMember{
			instanceID: cloneString(r.InstanceID), clientID: c.ID, clientHost: c.Host,
			protocolType: r.ProtocolType, sessionMS: r.SessionTimeoutMillis, rebalanceMS: r.RebalanceTimeoutMillis,
		}
		if seen.rebalanceMS <= 0 {
			seen.rebalanceMS = seen.sessionMS // JoinGroup v0
		}
		for _, p := range r.Protocols {
			seen.protocols = append(seen.protocols, kmsg.JoinGroupRequestProtocol{Name: p.Name, Metadata: slices.Clone(p.Metadata)})
		}
		prior := r.MemberID
		max = time.Duration(seen.rebalanceMS)*time.Millisecond + 30*time.Second
		answered = func(g *watchedGroup, resp kmsg.Response) {
			jr, ok := resp.(*kmsg.JoinGroupResponse)
			if !ok {
				return
			}
			switch {
			case jr.ErrorCode == 0:
				m := seen
				m.generation, m.leader = jr.Generation, jr.LeaderID
				if jr.Protocol != nil {
					m.protocol = *jr.Protocol
				}
				if prior != "" && prior != jr.MemberID {
					delete(g.members, prior)
				}
				g.members[jr.MemberID] = &m
			case gone(jr.ErrorCode):
				delete(g.members, prior)
			}
		}
	case *kmsg.SyncGroupRequest:
		member, gen := r.MemberID, r.Generation
		max = time.Minute
		answered = func(g *watchedGroup, resp kmsg.Response) {
			sr, ok := resp.(*kmsg.SyncGroupResponse)
			m := g.members[member]
			if !ok || m == nil {
				return
			}
			switch {
			case sr.ErrorCode == 0 && gen == m.generation:
				m.synced, m.lastOK = true, time.Now()
			case gone(sr.ErrorCode):
				delete(g.members, member)
			default:
				m.synced = false
			}
		}
	case *kmsg.HeartbeatRequest:
		member, gen := r.MemberID, r.Generation
		answered = func(g *watchedGroup, resp kmsg.Response) {
			hr, ok := resp.(*kmsg.HeartbeatResponse)
			m := g.members[member]
			if !ok || m == nil {
				return
			}
			switch {
			case hr.ErrorCode == 0 && gen == m.generation:
				m.lastOK = time.Now()
			case gone(hr.ErrorCode):
				delete(g.members, member)
			default:
				m.synced = false // REBALANCE_IN_PROGRESS: it rejoins
			}
		}
	case *kmsg.LeaveGroupRequest:
		ids := []string{r.MemberID}
		for _, m := range r.Members {
			ids = append(ids, m.MemberID)
		}
		answered = func(g *watchedGroup, _ kmsg.Response) {
			for _, id := range ids {
				delete(g.members, id)
			}
		}
	case *kmsg.OffsetCommitRequest, *kmsg.TxnOffsetCommitRequest:
		answered = func(*watchedGroup, kmsg.Response) {}
	default:
		return nil
	}

	w.mu.Lock()
	g := w.groups[group]
	if g == nil {
		if len(w.groups) >= maxWatchedGroups {
			w.mu.Unlock()
			return nil
		}
		g = &watchedGroup{members: make(map[string]*watchedMember), inFlight: make(map[uint64]flight)}
		w.groups[group] = g
	}
	w.seq++
	id := w.seq
	g.inFlight[id] = flight{sent: time.Now(), max: max}
	w.mu.Unlock()
	return func(resp kmsg.Response) {
		w.mu.Lock()
		defer w.mu.Unlock()
		g := w.groups[group]
		if g == nil {
			return
		}
		delete(g.inFlight, id)
		if resp != nil {
			answered(g, resp)
		}
	}
}

// gone reports whether a group error code ends a membership.
func gone(code int16) bool {
	switch code {
	case kerr.UnknownMemberID.Code, kerr.IllegalGeneration.Code, kerr.FencedInstanceID.Code:
		return true
	}
	return false
}

func cloneString(s *string) *string {
	if s == nil {
		return nil
	}
	c := *s
	return &c
}

// run checks the watched groups for a takeover every takeoverInterval
// until ctx ends.
func (w *forwardWatcher) run(ctx context.Context) {
	t := time.NewTicker(takeoverInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, group := range w.candidates() {
			if err := w.tryTakeover(ctx, group); err != nil && ctx.Err() == nil {
				w.log.Debug("takeover not done", "group", group, "err", err)
			}
		}
	}
}

// candidates returns the watched groups that may be taken over now,
// and forgets the groups no longer forwarded or without members.
func (w *forwardWatcher) candidates() []string {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for group, g := range w.groups {
		for id, fl := range g.inFlight {
			if now.Sub(fl.sent) > fl.max {
				delete(g.inFlight, id)
			}
		}
		for id, m := range g.members {
			if now.Sub(m.lastOK) > time.Duration(m.sessionMS)*time.Millisecond+10*time.Second {
				delete(g.members, id) // the cluster expired it
			}
		}
		if len(g.members) == 0 && len(g.inFlight) == 0 || !w.fw.Forwarded(group) {
			delete(w.groups, group)
			continue
		}
		if w.readyLocked(g, now) && (w.owns == nil || w.owns(group)) {
			out = append(out, group)
		}
	}
	sort.Strings(out)
	return out
}

// readyLocked reports whether g's members all stand synced at one
// generation, heard from recently, with no join or sync on its way.
func (w *forwardWatcher) readyLocked(g *watchedGroup, now time.Time) bool {
	if len(g.members) == 0 || len(g.inFlight) > 0 {
		return false
	}
	gen := int32(-1)
	for _, m := range g.members {
		if !m.synced || (gen >= 0 && m.generation != gen) ||
			now.Sub(m.lastOK) > time.Duration(m.sessionMS)*time.Millisecond/2 {
			return false
		}
		gen = m.generation
	}
	return true
}

// tryTakeover takes group over if the cluster's group is Stable and its
// members are exactly the ones watched here.
func (w *forwardWatcher) tryTakeover(ctx context.Context, group string) error {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	d, err := w.store.DescribeClassicGroup(dctx, group)
	cancel()
	if err != nil {
		return err
	}
	if d.ErrorCode != 0 || d.State != "Stable" || len(d.Members) == 0 {
		return nil
	}
	w.mu.Lock()
	g := w.groups[group]
	if g == nil || !w.readyLocked(g, time.Now()) || len(g.members) != len(d.Members) {
		w.mu.Unlock()
		return nil
	}
	rec, members, gen, ok := takeoverRecord(d, g.members)
	w.mu.Unlock()
	if !ok {
		return nil
	}
	if err := w.store.PrepareTakeover(group, rec, members); err != nil {
		return err
	}
	w.fw.takeOver(group)
	// Wait for the requests already forwarded: the anchor's join must
	// not meet a member's heartbeat at the cluster.
	deadline := time.Now().Add(takeoverDrain)
	for {
		w.mu.Lock()
		g := w.groups[group]
		n := 0
		if g != nil {
			n = len(g.inFlight)
		}
		w.mu.Unlock()
		if n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.store.TakeoverReady(group)
	w.mu.Lock()
	delete(w.groups, group)
	w.mu.Unlock()
	w.log.Info("group taken over from the cluster's coordinator", "group", group, "members", len(members), "generation", gen)
	return nil
}

// takeoverRecord builds the group record of the cluster's group d, whose
// members watched describes; ok is false when they do not match.
func takeoverRecord(d kmsg.DescribeGroupsResponseGroup, watched map[string]*watchedMember) (rec []byte, members []kafkastore.TakeoverMember, gen int32, ok bool) {
	v := kmsg.NewGroupMetadataValue()
	v.Version = 3
	v.ProtocolType = d.ProtocolType
	protocol := d.Protocol
	v.Protocol = &protocol
	v.CurrentStateTimestamp = time.Now().UnixMilli()
	var leader string
	gen = -1
	for _, dm := range d.Members {
		m := watched[dm.MemberID]
		if m == nil || m.protocolType != d.ProtocolType || m.protocol != d.Protocol || (gen >= 0 && m.generation != gen) {
			return nil, nil, 0, false
		}
		gen, leader = m.generation, m.leader
		vm := kmsg.NewGroupMetadataValueMember()
		vm.MemberID = dm.MemberID
		vm.InstanceID = cloneString(m.instanceID)
		vm.ClientID, vm.ClientHost = m.clientID, m.clientHost
		vm.SessionTimeoutMillis, vm.RebalanceTimeoutMillis = m.sessionMS, m.rebalanceMS
		vm.Subscription = slices.Clone(dm.ProtocolMetadata)
		for _, p := range m.protocols {
			if p.Name == d.Protocol {
				vm.Subscription = slices.Clone(p.Metadata)
			}
		}
		if vm.Subscription == nil {
			vm.Subscription = []byte{}
		}
		vm.Assignment = slices.Clone(dm.MemberAssignment)
		if vm.Assignment == nil {
			vm.Assignment = []byte{}
		}
		v.Members = append(v.Members, vm)
		members = append(members, kafkastore.TakeoverMember{MemberID: dm.MemberID, InstanceID: cloneString(m.instanceID)})
	}
	if _, ok := watched[leader]; !ok {
		return nil, nil, 0, false
	}
	v.Generation, v.Leader = gen, &leader
	return v.AppendTo(nil), members, gen, true
}
