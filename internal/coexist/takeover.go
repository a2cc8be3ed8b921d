package coexist

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/classic"
	"github.com/kproxy/kproxy/proxy"
)

// Takeover of a forwarded group (docs/anchors.md, "Rolling kproxy in").
// While a classic group is forwarded, kproxy watches the group requests
// it forwards (proxy.ForwardWatcher) and so knows which of the group's
// members are behind it, at which generation, with which subscriptions
// and timeouts. Once the cluster's group is Stable and every one of its
// members is one of those, the group's owner hands it to the engine as
// the cluster holds it (Anchors.PrepareTakeover, anchor_takeover.go), stops
// forwarding it, waits for the requests still on their way to the
// cluster, and lets the anchor take the members' place in the cluster's
// group (Anchors.TakeoverReady). The members' next heartbeat is
// answered by the engine at the same generation: no rebalance.
//
// In a fleet each kproxy sees only its own members' requests: the others
// report theirs to the group's owner (takeover_fleet.go), which takes the
// group over once every member is accounted for, and tells the others to
// stop forwarding it before the anchor replaces the members.
//
// KIP-848 groups are taken over through the same watching, reports,
// settle time and drain, with checks and an order of their own
// (takeover_kip848.go).

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
	// kip848 is set for a KIP-848 member (takeover_kip848.go), whose
	// epoch generation holds.
	kip848 *kip848Member
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
	// fenced holds, by member id, when the cluster last answered a
	// KIP-848 member's heartbeat forwarded here (at an epoch above 0)
	// with UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH, or its leave: that
	// member was told it lost its partitions, or gave them up (a
	// hand-back waits for it, anchor_takeover_kip848.go). Entries older
	// than fencedKeep are dropped (candidates).
	fenced map[string]time.Time
	// lastFenced is the latest fencing (not leave) recorded in fenced
	// (kept when fenced is full); the members holding no partition are
	// paced for fencedKeep after it (watchedGroup.pace).
	lastFenced time.Time
}

type flight struct {
	sent time.Time
	max  time.Duration
	// membership: a JoinGroup, SyncGroup or LeaveGroup, which changes
	// the group's membership; a takeover waits for none to be on its
	// way. Heartbeats and commits, which members send all the time,
	// only have to arrive before the anchor joins (the drain).
	membership bool
}

// joining counts g's membership requests in flight.
func (g *watchedGroup) joining() int {
	n := 0
	for _, fl := range g.inFlight {
		if fl.membership {
			n++
		}
	}
	return n
}

// forwardWatcher is the proxy.ForwardWatcher half of a takeover; it
// also runs the takeover loop (run). Safe for concurrent use.
type forwardWatcher struct {
	fw    *forwardSet       // immutable
	store takeoverStore     // immutable
	owns  func(string) bool // immutable; nil = every group is ours (local mode)
	log   *slog.Logger      // immutable

	// id names this kproxy in its reports to other kproxies; send
	// sends a kproxy message to the group's owner (the fleet's
	// Router.SendPeer); nil in local mode. Both set before run starts,
	// immutable after.
	id   string
	send func(ctx context.Context, group, typ string, version int16, payload []byte) ([]byte, error)

	mu     sync.Mutex
	groups map[string]*watchedGroup // guarded by mu
	seq    uint64                   // guarded by mu
	// remote holds, by group and reporting kproxy, the members other
	// kproxies forward (takeover_fleet.go); guarded by mu.
	remote map[string]map[string]remoteReport
	// releasing holds the takeovers waiting for their members'
	// requests to arrive; guarded by mu.
	releasing map[string]*release
	// settle is takeoverSettle (tests shorten it); immutable.
	settle time.Duration
	// readySince holds when each group was first seen ready for a
	// takeover, this time; guarded by mu.
	readySince map[string]time.Time
	// draining holds the groups no longer forwarded whose requests
	// still on their way are waited for (a takeover here, or another
	// kproxy's): kept in groups meanwhile; guarded by mu.
	draining map[string]bool
	// reporting holds the groups whose report to their owner is on its
	// way (reportAsync): one at a time per group; guarded by mu.
	reporting map[string]bool
	// released is poked when a kproxy said it stopped forwarding a
	// group being taken over, so the takeover completes without
	// waiting for the next tick.
	released chan struct{}
	// fencedNow is poked when a member's forwarded heartbeat was fenced
	// in a group another kproxy owns, so that the report goes without
	// waiting for the next tick.
	fencedNow chan struct{}
	// consumerRecord builds a KIP-848 group's record for the engine
	// (groupstate.Engine.ConsumerTakeoverRecord); nil without an
	// engine. Set before run starts, immutable after.
	consumerRecord func(groupstate.ConsumerTakeover) ([]byte, error)
}

// takeoverStore is what a takeover asks of the store;
// *Anchors implements it.
type takeoverStore interface {
	DescribeClassicGroup(ctx context.Context, group string) (kmsg.DescribeGroupsResponseGroup, error)
	PrepareTakeover(group string, record []byte, members []TakeoverMember) error
	TakeoverReady(group string)
}

// takeoverInterval is how often the watched groups are checked for a
// takeover.
const takeoverInterval = time.Second

// takeoverSettle is how long a group must stay ready before it is
// taken over: a member restarted onto its sidecar is gone from the
// cluster's group for the moment of its restart, when the others may all
// be behind kproxy already.
const takeoverSettle = 3 * time.Second

// takeoverDrain bounds the wait for a group's forwarded requests to be
// answered once it is no longer forwarded.
const takeoverDrain = 5 * time.Second

// maxWatchedGroups bounds the groups watched; past it new ones are not.
const maxWatchedGroups = 10_000

func newForwardWatcher(fw *forwardSet, store takeoverStore, owns func(string) bool, log *slog.Logger) *forwardWatcher {
	return &forwardWatcher{fw: fw, store: store, owns: owns, log: log, groups: make(map[string]*watchedGroup),
		remote: make(map[string]map[string]remoteReport), releasing: make(map[string]*release), released: make(chan struct{}, 1), fencedNow: make(chan struct{}, 1),
		draining: make(map[string]bool), readySince: make(map[string]time.Time), reporting: make(map[string]bool), settle: takeoverSettle}
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

// ForwardRequest implements proxy.RequestForwarder.
func (w *forwardWatcher) ForwardRequest(group string, req kmsg.Request) (bool, bool) {
	return w.fw.ForwardRequest(group, req)
}

// Watch implements proxy.ForwardWatcher. The JoinGroup answers of a
// group being handed back also tell the forwardSet the member ids the
// cluster handed out (forwardSet.issuedID).
func (w *forwardWatcher) Watch(c proxy.Client, group string, req kmsg.Request) func(kmsg.Response) {
	inner := w.watch(c, group, req)
	if _, ok := req.(*kmsg.JoinGroupRequest); !ok || !w.fw.handingBack(group) {
		return inner
	}
	return func(resp kmsg.Response) {
		if jr, ok := resp.(*kmsg.JoinGroupResponse); ok && jr.MemberID != "" {
			w.fw.issuedID(group, jr.MemberID)
		}
		if inner != nil {
			inner(resp)
		}
	}
}

// JoinAtCluster implements proxy.ClusterJoiner: the join of a member
// of kproxy's whose JoinGroup the engine refused as the hand-back began
// goes to the cluster's coordinator without its member id, as the
// member's own join would (ForwardRequest clears it), and is watched as
// forwarded, so the id handed out routes its next join there unchanged
// (issuedID). Not for a join below v4, which the cluster would admit
// into its rebalance at once, nor for a static member's, which it would
// hold there: both wait there only from the member's connection. The
// group's owner may be another kproxy, whose anchor began the hand-back:
// this one then asks the cluster.
func (w *forwardWatcher) JoinAtCluster(ctx context.Context, c proxy.Client, req *kmsg.JoinGroupRequest) (string, bool) {
	if req.Version < 4 || req.InstanceID != nil || !w.fw.handingBackNow(ctx, req.Group) {
		return "", false
	}
	join := *req
	join.MemberID = ""
	watch := w.Watch(c, req.Group, &join)
	resp, err := w.fw.cluster.JoinForMemberID(ctx, &join)
	if err != nil {
		w.log.Debug("hand-back: no member id from the cluster for a refused join", "group", req.Group, "err", err)
		if watch != nil {
			watch(nil) // the answer never came: a nil interface, not a nil *JoinGroupResponse
		}
		return "", false
	}
	if watch != nil {
		watch(resp)
	}
	if resp.ErrorCode != kerr.MemberIDRequired.Code || resp.MemberID == "" {
		return "", false
	}
	return resp.MemberID, true
}

// watch is Watch for the takeover: what it learns of the members.
func (w *forwardWatcher) watch(c proxy.Client, group string, req kmsg.Request) func(kmsg.Response) {
	var answered func(g *watchedGroup, resp kmsg.Response)
	// priorGen is, for a JoinGroup, the generation the member's entry
	// had when it was sent (-2 if none); set under w.mu below.
	priorGen := int32(-2)
	max := 30 * time.Second
	membership := true
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
				// The join's answer is the first of the generation:
				// lastOK from now, or the next tick, before the
				// member's SyncGroup is answered, would take it for
				// one silent past its session.
				m.generation, m.leader, m.lastOK = jr.Generation, jr.LeaderID, time.Now()
				if jr.Protocol != nil {
					m.protocol = *jr.Protocol
				}
				if prior != "" && prior != jr.MemberID {
					delete(g.members, prior)
				}
				g.members[jr.MemberID] = &m
			case gone(jr.ErrorCode):
				// Unless a later join of the member was answered
				// first (its entry is not the one this join left).
				if m := g.members[prior]; m != nil && m.generation == priorGen {
					w.forget(g, group, prior, "JoinGroup", jr.ErrorCode)
				}
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
			if gen != m.generation {
				w.ignored(group, member, "SyncGroup", gen, m.generation, sr.ErrorCode)
				return // of a generation the member left already
			}
			switch {
			case sr.ErrorCode == 0:
				m.synced, m.lastOK = true, time.Now()
			case gone(sr.ErrorCode):
				w.forget(g, group, member, "SyncGroup", sr.ErrorCode)
			default:
				m.synced = false
			}
		}
	case *kmsg.HeartbeatRequest:
		member, gen := r.MemberID, r.Generation
		membership = false
		answered = func(g *watchedGroup, resp kmsg.Response) {
			hr, ok := resp.(*kmsg.HeartbeatResponse)
			m := g.members[member]
			if !ok || m == nil {
				return
			}
			if gen != m.generation {
				// A heartbeat of a generation the member left already:
				// sent before its rejoin was answered, it comes back
				// ILLEGAL_GENERATION or REBALANCE_IN_PROGRESS about a
				// rebalance that is over.
				w.ignored(group, member, "Heartbeat", gen, m.generation, hr.ErrorCode)
				return
			}
			switch {
			case hr.ErrorCode == 0:
				m.lastOK = time.Now()
			case gone(hr.ErrorCode):
				w.forget(g, group, member, "Heartbeat", hr.ErrorCode)
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
	case *kmsg.ConsumerGroupHeartbeatRequest:
		answered, membership = watchConsumerHeartbeat(clientInfo{c.ID, c.Host}, r)
	case *kmsg.OffsetCommitRequest, *kmsg.TxnOffsetCommitRequest:
		membership = false
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
	if jq, ok := req.(*kmsg.JoinGroupRequest); ok {
		if m := g.members[jq.MemberID]; m != nil {
			priorGen = m.generation
		}
	}
	w.seq++
	id := w.seq
	g.inFlight[id] = flight{sent: time.Now(), max: max, membership: membership}
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
			n := len(g.fenced)
			answered(g, resp)
			if len(g.fenced) > n && w.owns != nil && !w.owns(group) {
				// The owner may be handing the group back and waiting
				// for this member to be told: report now.
				select {
				case w.fencedNow <- struct{}{}:
				default:
				}
			}
		}
	}
}

// forget drops member from g, the watched group, on an answer of kind
// with code that ended its membership; w.mu is held.
func (w *forwardWatcher) forget(g *watchedGroup, group, member, kind string, code int16) {
	delete(g.members, member)
	w.log.Debug("takeover: a member's membership ended", "group", group, "member", member, "answer", kind, "error_code", code)
}

// ignored logs an answer of kind about generation gen ignored, the
// member being at generation now.
func (w *forwardWatcher) ignored(group, member, kind string, gen, now int32, code int16) {
	if code != 0 {
		w.log.Debug("takeover: an error about an earlier generation ignored", "group", group, "member", member,
			"answer", kind, "generation", gen, "member_generation", now, "error_code", code)
	}
}

// gone reports whether a group error code ends a membership: the
// member id or generation is no longer the group's, or a newer instance
// of its group.instance.id replaced it.
func gone(code int16) bool {
	o := classic.OutcomeOf(code)
	return o == classic.Stale || o == classic.Fenced
}

func cloneString(s *string) *string {
	if s == nil {
		return nil
	}
	c := *s
	return &c
}

// run checks the watched groups every takeoverInterval until ctx ends:
// a group this kproxy owns is taken over when it can be; the members
// of a group another kproxy owns are reported to that owner.
func (w *forwardWatcher) run(ctx context.Context) {
	t := time.NewTicker(takeoverInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.released:
			w.finishReleases()
			continue
		case <-w.fencedNow:
			for _, rep := range w.fencedReports() {
				w.reportAsync(ctx, rep)
			}
			continue
		case <-t.C:
		}
		began := time.Now()
		w.recheck(ctx)
		if took := time.Since(began); took > takeoverInterval {
			w.log.Debug("takeover: asking the cluster about the forwarded groups took long", "took", took)
		}
		owned, others := w.candidates()
		for _, group := range owned {
			if err := w.tryTakeover(ctx, group); err != nil && ctx.Err() == nil {
				w.log.Debug("takeover not done", "group", group, "err", err)
			}
		}
		for _, rep := range others {
			w.reportAsync(ctx, rep)
		}
		w.finishReleases()
	}
}

// recheck asks the cluster again about the forwarded groups watched
// here (forwardSet.recheck): a member that joined through this kproxy
// while the fleet took its group over joined the cluster's group beside
// the anchor and gets nothing there; once this kproxy sees the anchor it
// stops forwarding, so the member's next heartbeat reaches the group's
// owner, which does not know it: it rejoins there.
func (w *forwardWatcher) recheck(ctx context.Context) {
	w.mu.Lock()
	groups := make([]string, 0, len(w.groups))
	for group := range w.groups {
		if !w.draining[group] {
			groups = append(groups, group)
		}
	}
	w.mu.Unlock()
	for _, group := range groups {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		forward, err := w.fw.recheck(cctx, group)
		cancel()
		if err == nil && !forward {
			w.log.Info("the group is served by kproxy now (taken over, or empty on the cluster): its requests go to its owner", "group", group)
			w.mu.Lock()
			delete(w.groups, group)
			w.mu.Unlock()
		}
	}
}

// candidates returns the groups this kproxy owns that may be taken over
// now (their members all watched here or reported by other kproxies,
// ready), and the reports of the groups watched here that another kproxy
// owns. It forgets the groups no longer forwarded or without members.
func (w *forwardWatcher) candidates() (owned []string, others []memberReport) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for group, g := range w.groups {
		for id, fl := range g.inFlight {
			if now.Sub(fl.sent) > fl.max {
				delete(g.inFlight, id)
			}
		}
		for id, m := range g.members {
			if now.Sub(m.lastOK) > time.Duration(m.sessionMS)*time.Millisecond+10*time.Second {
				delete(g.members, id) // the cluster expired it
				w.log.Debug("takeover: a member silent past its session is forgotten", "group", group, "member", id)
			}
		}
		for id, at := range g.fenced {
			if now.Sub(at) > fencedKeep {
				delete(g.fenced, id)
			}
		}
		if w.draining[group] {
			continue
		}
		if len(g.members) == 0 && len(g.inFlight) == 0 && len(g.fenced) == 0 || !w.fw.Forwarded(group) {
			if len(g.members) > 0 {
				w.log.Debug("takeover: the group is not forwarded here any more; forgetting its members", "group", group,
					"members", describeMembers(g.members))
			}
			delete(w.groups, group)
			continue
		}
		if w.owns != nil && !w.owns(group) {
			others = append(others, w.reportLocked(group, g, now))
		}
	}
	for group, byFrom := range w.remote {
		for from, r := range byFrom {
			if now.Sub(r.at) > reportFresh {
				delete(byFrom, from)
			}
		}
		if len(byFrom) == 0 {
			delete(w.remote, group)
		}
	}
	seen := make(map[string]bool)
	for group := range w.groups {
		seen[group] = true
	}
	for group := range w.remote {
		seen[group] = true
	}
	for group := range seen {
		// A group without members behind this kproxy may have no
		// forwarding decision here: the cluster's view decides
		// (tryTakeover).
		if _, busy := w.releasing[group]; busy || (w.owns != nil && !w.owns(group)) {
			continue
		}
		if all, ok := w.mergedLocked(group, now); !ok {
			w.log.Debug("takeover: the group's members are not ready (rebalancing, unsynced, silent, or a join on its way)",
				"group", group, "members", describeMembers(all))
			delete(w.readySince, group)
			continue
		}
		since, seen := w.readySince[group]
		if !seen {
			since = now
			w.readySince[group] = now
		}
		// Readiness is sampled at the ticks: a group ready at the
		// ticks that span the settle time is taken over. Compared
		// exactly, the tick one settle time after the first ready
		// one fell short by the ticker's jitter and the takeover
		// waited one more interval (6.0 s after the last move settled
		// on three brokers, 1 s of it this).
		if now.Sub(since) >= w.settle-takeoverInterval/2 {
			owned = append(owned, group)
		}
	}
	sort.Strings(owned)
	return owned, others
}

// mergedLocked returns every member of group known here: watched here
// and reported by other kproxies; ok says they all stand synced at one
// generation, each answered without error within its session timeout
// (a member heartbeating every session/3, as clients do by default, is
// often older than half of it once a report carried it here), with no
// JoinGroup, SyncGroup or LeaveGroup of the group on its way to the
// cluster anywhere.
func (w *forwardWatcher) mergedLocked(group string, now time.Time) (map[string]*watchedMember, bool) {
	all := make(map[string]*watchedMember)
	joining := 0
	if g := w.groups[group]; g != nil {
		joining += g.joining()
		for id, m := range g.members {
			all[id] = m
		}
	}
	for _, r := range w.remote[group] {
		joining += r.Joining
		for _, rm := range r.Members {
			all[rm.ID] = rm.member(r.at)
		}
	}
	if len(all) == 0 || joining > 0 {
		return all, false
	}
	gen := int32(-1)
	for _, m := range all {
		if !m.synced || (gen >= 0 && m.generation != gen) ||
			now.Sub(m.lastOK) > time.Duration(m.sessionMS)*time.Millisecond {
			return all, false
		}
		gen = m.generation
	}
	return all, true
}

// tryTakeover takes group over if the cluster's group is Stable and its
// members are exactly the ones known here. The takeover completes
// (finishReleases) once the other kproxies that forward its members
// stopped forwarding them.
func (w *forwardWatcher) tryTakeover(ctx context.Context, group string) error {
	w.mu.Lock()
	consumer := w.isConsumerGroupLocked(group)
	w.mu.Unlock()
	if consumer {
		return w.tryConsumerTakeover(ctx, group)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	d, err := w.store.DescribeClassicGroup(dctx, group)
	cancel()
	if err != nil {
		return err
	}
	if d.ErrorCode != 0 || d.State != "Stable" || len(d.Members) == 0 {
		w.log.Debug("takeover: the cluster's group is not Stable with members", "group", group, "state", d.State, "members", len(d.Members))
		return nil
	}
	var rec []byte
	var gen int32
	rel, err := w.takeOver(group, len(d.Members), func(all map[string]*watchedMember) ([]TakeoverMember, string) {
		r, members, g, ok := takeoverRecord(d, all)
		if !ok {
			return nil, "the cluster's members differ from those known here (ids, protocol or generation): " + describeMembers(all)
		}
		rec, gen = r, g
		return members, ""
	}, func(members []TakeoverMember) error {
		return w.store.PrepareTakeover(group, rec, members)
	})
	if rel == nil || err != nil {
		return err
	}
	w.log.Info("taking the group over from the cluster's coordinator", "group", group, "members", len(rel.members),
		"generation", gen, "other_kproxies", len(rel.waiting))
	return nil
}

// takeOver is the part of a takeover every kind of group shares, once
// the cluster described the group Stable with n members: the members
// known here (mergedLocked) must be ready and n, and match must accept
// them (why says what does not match) and return the members the anchor
// replaces; prepare then hands the group to the engine (the store's
// Prepare*Takeover), and forwarding stops while the members' requests on
// their way drain (startRelease). rel is nil when nothing was taken over.
func (w *forwardWatcher) takeOver(group string, n int, match func(all map[string]*watchedMember) (members []TakeoverMember, why string), prepare func([]TakeoverMember) error) (rel *release, err error) {
	now := time.Now()
	w.mu.Lock()
	all, ok := w.mergedLocked(group, now)
	if !ok || len(all) != n {
		w.mu.Unlock()
		w.log.Debug("takeover: the cluster's members are not those known here", "group", group, "cluster", n, "known", len(all))
		return nil, nil
	}
	members, why := match(all)
	if why != "" {
		w.mu.Unlock()
		w.log.Debug("takeover: the cluster's group is not the one known here", "group", group, "why", why)
		return nil, nil
	}
	ids := make([]string, 0, len(members))
	for _, m := range members {
		ids = append(ids, m.MemberID)
	}
	rel = w.newReleaseLocked(group, now, ids)
	w.mu.Unlock()
	if err := prepare(members); err != nil {
		return nil, err
	}
	w.startRelease(group, rel)
	return rel, nil
}

// newReleaseLocked returns the release of group's takeover of members,
// waiting for the kproxies that reported them; w.mu is held.
func (w *forwardWatcher) newReleaseLocked(group string, now time.Time, members []string) *release {
	rel := &release{since: now, waiting: make(map[string]bool), members: members}
	for from := range w.remote[group] {
		rel.waiting[from] = true
	}
	return rel
}

// startRelease stops forwarding group, taken over, and waits for its
// requests on their way (finishReleases).
func (w *forwardWatcher) startRelease(group string, rel *release) {
	w.mu.Lock()
	w.releasing[group] = rel
	w.draining[group] = true
	w.mu.Unlock()
	w.fw.takeOver(group, rel.members)
}

// release is a takeover waiting for the requests of its members still
// on their way to the cluster: those forwarded here, and the other
// kproxies' (waiting names the kproxies that have not said they stopped
// forwarding the group).
type release struct {
	since   time.Time
	waiting map[string]bool
	// members are the member ids the anchor replaces; immutable.
	members []string
}

// finishReleases completes the takeovers whose members' requests all
// arrived, or that waited takeoverDrain.
func (w *forwardWatcher) finishReleases() {
	now := time.Now()
	var ready []string
	w.mu.Lock()
	for group, rel := range w.releasing {
		local := 0
		if g := w.groups[group]; g != nil {
			local = len(g.inFlight)
		}
		if (local == 0 && len(rel.waiting) == 0) || now.Sub(rel.since) > takeoverDrain {
			if len(rel.waiting) > 0 || local > 0 {
				w.log.Warn("takeover: requests of the group's members may still be on their way to the cluster; completing anyway",
					"group", group, "kproxies_silent", len(rel.waiting), "in_flight_here", local)
			}
			ready = append(ready, group)
			delete(w.readySince, group)
			delete(w.releasing, group)
			delete(w.draining, group)
			delete(w.groups, group)
			delete(w.remote, group)
		}
	}
	w.mu.Unlock()
	for _, group := range ready {
		w.store.TakeoverReady(group)
		w.log.Info("group taken over from the cluster's coordinator", "group", group)
	}
}

// takeoverRecord builds the group record of the cluster's group d, whose
// members watched describes; ok is false when they do not match.
func takeoverRecord(d kmsg.DescribeGroupsResponseGroup, watched map[string]*watchedMember) (rec []byte, members []TakeoverMember, gen int32, ok bool) {
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
		gen = m.generation
		if _, ok := watched[m.leader]; ok && leader == "" {
			// The leader one of them heard of that is still a member:
			// a static member replaced without a rebalance (KIP-345)
			// heard of the leader of its time, which may have been
			// replaced since, and whose new id another one heard of.
			leader = m.leader
		}
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
		members = append(members, TakeoverMember{MemberID: dm.MemberID, InstanceID: cloneString(m.instanceID)})
	}
	if len(v.Members) == 0 {
		return nil, nil, 0, false
	}
	if leader == "" {
		// Every leader heard of was replaced since: any member leads
		// kproxy's next rebalance (Kafka picks one the same way when its
		// leader is gone).
		leader = v.Members[0].MemberID
	}
	v.Generation, v.Leader = gen, &leader
	return v.AppendTo(nil), members, gen, true
}

// describeMembers renders members for a log line: id, generation,
// synced, and how long ago each was last answered without error.
func describeMembers(all map[string]*watchedMember) string {
	ids := make([]string, 0, len(all))
	for id := range all {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var b strings.Builder
	for _, id := range ids {
		m := all[id]
		fmt.Fprintf(&b, "%s gen=%d synced=%v ok_ago=%s; ", id, m.generation, m.synced, time.Since(m.lastOK).Round(time.Millisecond))
	}
	return b.String()
}
