package coexist

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/internal/classic"
	"github.com/kproxy/kproxy/internal/clientpool"
	"github.com/kproxy/kproxy/internal/upstream"
)

// Anchors (docs/anchors.md). With EnableAnchors, every group the engine
// serves with members holds one static member (KIP-345) in the cluster's
// own coordinator for the same group id: instance id AnchorOptions.
// InstanceID, the group's protocol type and protocol names, a consumer
// protocol subscription to the union of the members' topics. The cluster
// then sees the group live: DescribeGroups shows it Stable with the
// anchor, DeleteGroups answers NON_EMPTY_GROUP and OffsetDelete of a
// subscribed topic GROUP_SUBSCRIBED_TO_TOPIC, as for any live group.
//
// Fencing. Every kproxy in front of a cluster (of one fleet) uses the same
// instance id, so a new owner's JoinGroup replaces the previous owner's
// member id durably and without a rebalance (Kafka's
// GroupMetadataManager, static member replacement), and from then on
// the previous owner's commits get FENCED_INSTANCE_ID. Client commits are
// one plain OffsetCommit under the anchor's member id, instance id and
// generation, sent to the group's coordinator: the cluster's own member
// and generation checks fence them, so they need no transaction. A
// commit never overlaps a JoinGroup of its own anchor (the replacement
// would fence it): each anchor runs its requests one at a time, commits
// aside, and a join waits for the commits in flight.
//
// The anchor leads its group in the cluster. When a member reaches the
// cluster directly (an application member moved back off kproxy), the
// cluster rebalances; the anchor rejoins and, as leader, assigns itself
// the partitions kproxy's members own and the direct member nothing, so
// no partition is ever consumed twice; once kproxy's group is empty the
// anchor leaves and the cluster hands the direct members everything from
// the committed offsets.

// DefaultAnchorInstanceID is the group.instance.id of every anchor (a
// fleet name is appended as ".<name>").
const DefaultAnchorInstanceID = "kproxy-anchor"

// AnchorLoss says why a group's anchor was lost.
type AnchorLoss int8

const (
	// AnchorFenced: another kproxy's anchor replaced this one (it joined
	// with the same instance id later).
	AnchorFenced AnchorLoss = iota
	// AnchorLiveOnCluster: the cluster's group has members of its own
	// and no anchor; the group belongs to the cluster's coordinator.
	AnchorLiveOnCluster
	// AnchorHandedBack: a member reached the cluster's group directly,
	// kproxy's members followed it there, and the anchor left
	// (anchor_handback.go); the group belongs to the cluster's coordinator.
	AnchorHandedBack
)

// String names the loss, for logs and metrics.
func (l AnchorLoss) String() string {
	switch l {
	case AnchorLiveOnCluster:
		return "live_on_cluster"
	case AnchorHandedBack:
		return "handed_back"
	}
	return "fenced"
}

// AnchorOptions configures EnableAnchors; zero values are defaults.
type AnchorOptions struct {
	// InstanceID is the anchors' group.instance.id; "" means
	// DefaultAnchorInstanceID.
	InstanceID string
	// SessionTimeout is the longest session timeout of the anchors,
	// within the cluster's group.min/max.session.timeout.ms. An anchor
	// joins with the longest session timeout of its group's members
	// (groupstate.Anchor.SessionTimeout), at least MinSessionTimeout and
	// at most this: that is how long the cluster keeps an anchor whose
	// kproxy is gone, and until then a direct member waits for the
	// partitions the anchor holds. A cluster that refuses the members'
	// session for the anchor gets this one. 0 means 2m.
	SessionTimeout time.Duration
	// MinSessionTimeout is the shortest session timeout of the anchors:
	// in a fleet, long enough that a failover's next owner replaces the
	// anchor before its session ends. 0 means 6s, Kafka's default
	// group.min.session.timeout.ms.
	MinSessionTimeout time.Duration
	// RebalanceTimeout is the anchors' rebalance timeout; 0 means 5m
	// (the consumers' default max.poll.interval.ms).
	RebalanceTimeout time.Duration
	// HeartbeatInterval is how often an anchor heartbeats at most (a
	// quarter of its session when that is shorter); 0 means a quarter
	// of SessionTimeout.
	HeartbeatInterval time.Duration
	// PollInterval is how often the anchors' groups are described, many
	// in one DescribeGroups per coordinator, to find those the cluster
	// rebalances (a member reached it directly) sooner than the next
	// heartbeat would: such a group waits for its anchor to rejoin. 0
	// means 3s.
	PollInterval time.Duration
	// RebalanceWatchInterval is how often each coordinator of an
	// anchored group is asked which groups it rebalances
	// (watchRebalances): how soon a member moved back to the brokers is
	// seen. 0 means 250ms.
	RebalanceWatchInterval time.Duration
	// OnLost is called when the anchor of group was lost: the engine
	// must stop serving the group (unload it). It runs on a goroutine of
	// its own.
	OnLost func(group string, why AnchorLoss)
	// OnLive, when set, is told of a group whose load found it live on
	// the cluster (groupstate.ErrGroupLiveOnCluster): the engine does not
	// hold it. It must not block.
	OnLive func(group string)
	// NewClient, when set, makes a client of the cluster like the
	// store's own: the anchors' JoinGroup and SyncGroup go each on a
	// client lent to it alone, from a pool of at most JoinClients made
	// with it (internal/clientpool), so that a join the cluster holds holds up
	// no other; and so does every other request the store sends a
	// group's coordinator (commits, heartbeats, describes), from a pool
	// of at most RequestClients, so that none waits out another's answer
	// on one connection. Unset, they go on the store's client.
	NewClient func() (*kgo.Client, error)
	// JoinClients bounds the pool of NewClient's clients for joins: how
	// many anchor joins and syncs may be in flight at once. 0 means 256.
	JoinClients int
	// RequestClients bounds the pool of NewClient's clients for the
	// other requests to coordinators: how many may be in flight at
	// once. 0 means 64.
	RequestClients int
	// MemberHeartbeatInterval, when set, says how often the engine's
	// KIP-848 members heartbeat (the interval it gives them); unset
	// means 5s, Kafka's group.consumer.heartbeat.interval.ms. A KIP-848
	// hand-back (anchor_takeover_kip848.go) counts on every member having
	// heartbeated within it.
	MemberHeartbeatInterval func() time.Duration
	// MembersFenced, when set, returns which of ids (members of the
	// engine's KIP-848 group) the cluster fenced at or after since on a
	// heartbeat forwarded by a kproxy of the fleet: told to give their
	// partitions up. A KIP-848 hand-back leaves once every one of
	// kproxy's members was (anchor_takeover_kip848.go).
	MembersFenced func(group string, since time.Time, ids []string) map[string]bool
	// OnHeld, when set, is told after each sync of an anchor the
	// version of the Anchor whose partitions it assigned itself: the
	// engine gives partitions it withheld for a member moved back only
	// once the anchor holds them (groupstate/consumer_withhold.go). It
	// must not block.
	OnHeld func(group string, version uint64)
	// OnHandBack, when set, is asked to hand group back to the cluster's
	// coordinator (anchor_handback.go): a member reached the cluster's group
	// directly. ok false means the engine cannot, and the anchor rejoins
	// as leader holding kproxy's partitions instead; otherwise wait is
	// how long the engine's members may take to follow. moved are the
	// instance ids of kproxy's static members the cluster's group holds
	// already (restarted against the brokers); freed is what the engine
	// took from each (groupstate.Engine.HandBack), which the anchor
	// hands them at once. It runs on the anchor's worker and must
	// return promptly.
	OnHandBack func(group string, moved []string) (wait time.Duration, freed map[string]map[string][]int32, ok bool)
}

// Anchors are the anchors of a kafkastore.Store: EnableAnchors hands
// them to it (kafkastore.Anchors) and Close stops them.
type Anchors struct {
	s    *kafkastore.Store // immutable
	up   *upstream.Cluster // immutable: the store's, shared
	opts AnchorOptions     // immutable, defaults filled
	log  *slog.Logger      // immutable
	// reqs lends the requests to group coordinators (the anchors' and
	// the store's, through up) a client each (nil without
	// AnchorOptions.NewClient); closed by Close.
	reqs *clientpool.Pool

	mu     sync.Mutex         // guards groups and released
	groups map[string]*anchor // by group id
	// released maps the groups whose anchor the engine dropped while it
	// was a member (Unanchor: the partition moved, or kproxy stops) to
	// that member id, so that Close(leave) can still take it out
	// when nobody is left to replace it.
	released map[string]string

	// takeovers are the takeovers prepared and not loaded yet
	// (anchor_takeover.go), by group; guarded by mu.
	takeovers map[string]*takeoverPlan

	// sem bounds the anchor requests in flight at once (heartbeats of
	// thousands of groups come due together after a failover) while the
	// store has no pool of clients for them (reqs, which bounds
	// them otherwise); joins lends the joins and syncs a client each
	// (nil without AnchorOptions.NewClient).
	sem   chan struct{}
	joins *clientpool.Pool
	// stop ends the heartbeat scheduler; closed by Close.
	stop     chan struct{}
	stopOnce sync.Once
}

// anchorState is where an anchor stands in the cluster's group.
type anchorState int8

const (
	anchorOut     anchorState = iota // no membership held (never joined, left, or forgotten)
	anchorJoining                    // JoinGroup or SyncGroup in flight
	anchorIn                         // a member of the cluster's group, synced
	anchorFenced                     // replaced by another kproxy; dead
)

// anchor is one group's anchor. Its requests run on at most one worker
// goroutine at a time (running); commits run on their callers'
// goroutines between the worker's joins.
type anchor struct {
	group string // immutable

	mu sync.Mutex // guards every field below
	// want is the latest Anchor the engine handed over; wanted is false
	// until the first.
	want   groupstate.Anchor
	wanted bool
	// have is the Anchor the current membership was joined with.
	have groupstate.Anchor
	// session is the session timeout the current membership joined
	// with (sessionFor); longSession is set once the cluster refused a
	// session shorter than AnchorOptions.SessionTimeout.
	session     time.Duration
	longSession bool
	state       anchorState
	memberID    string
	gen         int32
	// rejoin is set when the cluster asked for a rejoin (a rebalance,
	// an unknown member id, a generation moved on).
	rejoin bool
	// rejoinKnown says the rejoin asked for goes with the anchor's
	// member id: the cluster is rebalancing (a member reached it
	// directly) and waits for this member, whose leadership a known
	// member's rejoin keeps. A rejoin after an unknown member id goes
	// with an empty one (a static replacement); a change of what the
	// anchor stands for (Anchor.SameMembership) with the known one.
	rejoinKnown bool
	// checked is set once the cluster was asked whether the group is
	// live without an anchor (before the first join).
	checked bool
	// takeover, when set, is the takeover the first join completes
	// (anchor_takeover.go); cleared by that join.
	takeover *takeoverPlan
	// handbackCheck is set when the cluster rebalances the group with
	// OnHandBack set: the worker asks whether a member reached it
	// directly before it rejoins. handback is the hand-back in progress
	// (anchor_handback.go).
	handbackCheck bool
	handback      *handback
	// handOver, when set, is what a hand-back's first join assigns the
	// static members moved back, by instance id (anchor_handback.go);
	// cleared by that join.
	handOver map[string]map[string][]int32
	// watchUntil, while in the future, has watchRebalances describe the
	// group every leaveWatchEvery: a member left kproxy's group then.
	watchUntil time.Time
	// commits counts commits in flight under memberID; a join waits for
	// it to drop to zero and holds new ones off meanwhile.
	commits int
	// running is set while a worker goroutine runs this anchor's
	// requests.
	running bool
	// forgotten is set by Unanchor: the engine dropped the group; the
	// worker stops without leaving the cluster's group.
	forgotten bool
	// nextHeartbeat is when the next heartbeat is due; retryAt, when not
	// zero, holds the worker off after a failed request.
	nextHeartbeat time.Time
	retryAt       time.Time
	failures      int
	// changed is closed and replaced whenever state, commits or running
	// change: commits and DeleteGroup wait on it.
	changed chan struct{}
}

// EnableAnchors turns anchoring on for s (docs/anchors.md) and returns
// the anchors. It must be called once, before the store is shared;
// Close stops them.
func EnableAnchors(s *kafkastore.Store, o AnchorOptions) *Anchors {
	as := newAnchors(s, o)
	as.start()
	return as
}

// newAnchors builds the anchors of s, not started yet.
func newAnchors(s *kafkastore.Store, o AnchorOptions) *Anchors {
	if o.InstanceID == "" {
		o.InstanceID = DefaultAnchorInstanceID
	}
	if o.SessionTimeout <= 0 {
		o.SessionTimeout = 2 * time.Minute
	}
	if o.RebalanceTimeout <= 0 {
		o.RebalanceTimeout = 5 * time.Minute
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = o.SessionTimeout / 4
	}
	if o.MinSessionTimeout <= 0 {
		o.MinSessionTimeout = 6 * time.Second
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 3 * time.Second
	}
	if o.RebalanceWatchInterval <= 0 {
		o.RebalanceWatchInterval = 250 * time.Millisecond
	}
	if o.JoinClients <= 0 {
		o.JoinClients = 256
	}
	if o.RequestClients <= 0 {
		o.RequestClients = 64
	}
	as := &Anchors{
		s: s, up: s.Cluster(), opts: o, log: s.Logger(),
		groups:   make(map[string]*anchor),
		released: make(map[string]string),
		sem:      make(chan struct{}, 64),
		stop:     make(chan struct{}),
	}
	if o.NewClient != nil {
		as.joins = clientpool.New("an anchor's join", o.JoinClients, o.NewClient)
		as.reqs = clientpool.New("a request to a group coordinator", o.RequestClients, o.NewClient)
	}
	return as
}

// start hands the anchors to their store and starts their scheduler.
func (as *Anchors) start() {
	if as.reqs != nil {
		as.up.LendFrom(as.reqs)
	}
	as.s.SetAnchors(as)
	go as.scheduler()
	go as.watchRebalances()
}

// Close stops the anchors' heartbeats. With leave, every anchor
// held, or dropped by Unanchor while held, leaves its group first (one
// LeaveGroup each, bounded by ctx): a kproxy that serves groups alone
// (--groups local), or the last owner of a fleet, hands them back to the
// cluster at once. Otherwise a fleet member stops without leaving, so
// that the next owner replaces its anchors without a rebalance.
func (as *Anchors) Close(ctx context.Context, leave bool) {
	as.stopOnce.Do(func() { close(as.stop) })
	if as.joins != nil {
		// After the leaves, which go on the store's clients; later
		// requests go on the store's own client (kafkastore's lend).
		defer as.joins.Close()
		defer as.reqs.Close()
	}
	as.mu.Lock()
	all := make([]*anchor, 0, len(as.groups))
	for _, a := range as.groups {
		all = append(all, a)
	}
	held := as.released
	as.released = make(map[string]string)
	as.mu.Unlock()
	for _, a := range all {
		a.mu.Lock()
		a.forgotten = true
		// An anchor in the group, or one whose JoinGroup the cluster
		// answered before its sync failed (it is a member there until
		// it leaves or its session ends).
		if a.state == anchorIn || (a.state == anchorOut && a.memberID != "") {
			held[a.group] = a.memberID
		}
		a.mu.Unlock()
	}
	if !leave {
		return
	}
	// An anchor another kproxy replaced meanwhile answers
	// FENCED_INSTANCE_ID and stays the other's: leave treats it as gone.
	var wg sync.WaitGroup
	for group, memberID := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := as.leave(ctx, group, memberID); err != nil {
				as.log.Warn("anchor did not leave", "group", group, "err", err)
			}
		}()
	}
	wg.Wait()
}

// Anchor implements groupstate.AnchorStore (the store passes the
// engine's calls on).
func (as *Anchors) Anchor(group string, want groupstate.Anchor) {
	a := as.get(group, true)
	as.mu.Lock()
	delete(as.released, group)
	as.mu.Unlock()
	a.mu.Lock()
	if a.wanted && want.Members > 0 && want.Members < a.want.Members {
		// A member left kproxy's group: it may be on its way to the
		// brokers (watchRebalances).
		a.watchUntil = time.Now().Add(leaveWatch)
	}
	a.want, a.wanted, a.forgotten = want, true, false
	a.mu.Unlock()
	as.kick(a)
}

// Unanchor implements groupstate.AnchorStore.
func (as *Anchors) Unanchor(group string) {
	as.mu.Lock()
	defer as.mu.Unlock()
	a := as.groups[group]
	delete(as.groups, group)
	if a == nil {
		return
	}
	a.mu.Lock()
	a.forgotten = true
	if a.state == anchorIn {
		if len(as.released) >= maxReleased {
			clear(as.released)
		}
		as.released[group] = a.memberID
	}
	a.broadcastLocked()
	a.mu.Unlock()
}

// maxReleased bounds Anchors.released; past it the map is emptied
// (the anchors it named then expire by their session).
const maxReleased = 100_000

// AnchorIdentity returns the member id and generation of group's anchor,
// ok false when it holds no membership. For tests and the admin API.
func (as *Anchors) AnchorIdentity(group string) (memberID string, generation int32, ok bool) {
	a := as.get(group, false)
	if a == nil {
		return "", 0, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.memberID, a.gen, a.state == anchorIn
}

// get returns group's anchor, creating it if create.
func (as *Anchors) get(group string, create bool) *anchor {
	as.mu.Lock()
	defer as.mu.Unlock()
	a := as.groups[group]
	if a == nil && create {
		a = &anchor{group: group, changed: make(chan struct{})}
		as.groups[group] = a
	}
	return a
}

// broadcastLocked wakes whoever waits on a's changes.
func (a *anchor) broadcastLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// kick starts a's worker unless it runs.
func (as *Anchors) kick(a *anchor) {
	a.mu.Lock()
	if a.running {
		a.mu.Unlock()
		return
	}
	a.running = true
	a.mu.Unlock()
	go as.work(a)
}

// scheduler kicks the anchors whose heartbeat or retry is due, once a
// second, until the set is closed.
func (as *Anchors) scheduler() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastPoll := time.Now()
	for {
		select {
		case <-as.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		if now.Sub(lastPoll) >= as.opts.PollInterval {
			lastPoll = now
			as.pollRebalances()
		}
		as.mu.Lock()
		var due []*anchor
		for _, a := range as.groups {
			a.mu.Lock()
			if !a.running && a.dueLocked(now) {
				due = append(due, a)
			}
			a.mu.Unlock()
		}
		as.mu.Unlock()
		for _, a := range due {
			as.kick(a)
		}
	}
}

// dueLocked reports whether a has work now.
func (a *anchor) dueLocked(now time.Time) bool {
	if !a.retryAt.IsZero() && now.Before(a.retryAt) {
		return false
	}
	_, ok := a.nextOpLocked(now)
	return ok
}

// anchorOp is one step of an anchor's worker.
type anchorOp int8

const (
	opJoin anchorOp = iota
	opHeartbeat
	opLeave
	opHandback
)

// nextOpLocked says what a must do now, if anything.
func (a *anchor) nextOpLocked(now time.Time) (anchorOp, bool) {
	switch {
	case a.forgotten || a.state == anchorFenced || !a.wanted:
		return 0, false
	case a.handback != nil:
		// Handing the group back: no rejoin but the one handing
		// static members moved back their partitions, no leave but
		// the hand-back's, heartbeats to keep the session.
		switch {
		case a.handOver != nil && a.state == anchorIn:
			return opJoin, true
		case !now.Before(a.handback.nextCheck) || a.state != anchorIn:
			return opHandback, true
		case !now.Before(a.nextHeartbeat):
			return opHeartbeat, true
		}
		return 0, false
	case a.handbackCheck && a.state == anchorIn && a.want.Members > 0:
		return opHandback, true
	case a.want.Members == 0:
		return opLeave, a.state == anchorIn
	case a.state != anchorIn || a.rejoin || !a.have.SameMembership(a.want):
		// A membership that no longer stands for what kproxy's members
		// subscribe to and own rejoins with the anchor's member id: the
		// cluster's group (the anchor leads it) starts a new generation,
		// recomputes the topics it is subscribed to (OffsetDelete's
		// check), and the anchor assigns itself what the members own
		// now, so direct tools show it held and a direct KIP-848 member
		// that converts the group keeps off it. kproxy's groups change
		// owners at their rebalances, so this costs one rebalance of the
		// anchor alone per kproxy rebalance that moves partitions.
		return opJoin, true
	case !now.Before(a.nextHeartbeat):
		return opHeartbeat, true
	}
	return 0, false
}

// work runs a's requests until it has nothing to do.
func (as *Anchors) work(a *anchor) {
	for {
		now := time.Now()
		a.mu.Lock()
		op, ok := a.nextOpLocked(now)
		if ok && !a.retryAt.IsZero() && now.Before(a.retryAt) {
			ok = false // the scheduler kicks it again once the retry is due
		}
		if !ok && a.handback != nil && !a.forgotten && a.state == anchorIn && a.retryAt.IsZero() {
			// A hand-back checks the cluster's group every
			// handbackCheckEvery: wait here for the next check rather
			// than for the scheduler's next tick.
			wait := time.Until(a.handback.nextCheck)
			a.mu.Unlock()
			select {
			case <-as.stop:
				a.mu.Lock()
				a.running = false
				a.broadcastLocked()
				a.mu.Unlock()
				return
			case <-time.After(max(wait, 0)):
			}
			continue
		}
		if !ok {
			a.running = false
			a.broadcastLocked()
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		var err error
		switch op {
		case opJoin:
			err = as.join(a)
		case opHeartbeat:
			err = as.heartbeat(a)
		case opHandback:
			err = as.checkHandback(a)
		case opLeave:
			a.mu.Lock()
			memberID := a.memberID
			a.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = as.leave(ctx, a.group, memberID)
			cancel()
			if err == nil {
				a.mu.Lock()
				a.state, a.memberID, a.gen = anchorOut, "", 0
				a.broadcastLocked()
				a.mu.Unlock()
			}
		}
		a.mu.Lock()
		if err != nil {
			a.failures++
			a.retryAt = time.Now().Add(anchorBackoff(a.failures))
			as.log.Warn("anchor request failed", "group", a.group, "failures", a.failures, "err", err)
			if a.failures == anchorGiveUp && a.state == anchorOut {
				as.log.Error("the group's anchor cannot join the cluster's group; its commits go unanchored until it can "+
					"(kproxy's principal needs READ on the group, and --group-anchor-session-timeout must lie within the cluster's group.min/max.session.timeout.ms)",
					"group", a.group, "err", err)
			}
		} else {
			a.failures, a.retryAt = 0, time.Time{}
		}
		a.mu.Unlock()
	}
}

// request sends req to the coordinator of group, under the set's bound;
// a JoinGroup or SyncGroup on a client of the joins pool, any other on
// one of the store's (internal/clientpool).
func (as *Anchors) request(ctx context.Context, group string, req kmsg.Request, code func(kmsg.Response) int16) (kmsg.Response, error) {
	if k := req.Key(); as.joins != nil && (k == kmsg.JoinGroup.Int16() || k == kmsg.SyncGroup.Int16()) {
		cl, err := as.joins.Get(ctx)
		if err != nil {
			return nil, err
		}
		defer as.joins.Put(cl)
		return as.up.RequestOn(ctx, cl, upstream.CoordinatorGroup, group, req, req.MaxVersion(), code)
	}
	if as.reqs != nil {
		return as.up.Request(ctx, upstream.CoordinatorGroup, group, req, req.MaxVersion(), code)
	}
	select {
	case as.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-as.sem }()
	return as.up.Request(ctx, upstream.CoordinatorGroup, group, req, req.MaxVersion(), code)
}

// describeOne describes group alone on its coordinator through request:
// req is the describe (DescribeGroups, ConsumerGroupDescribe) naming
// group only, entries lists the groups of its answer, of type R, and code
// reads an entry's error code. It returns group's entry; found is false
// when the answer holds none, and an answer of more than one entry is an
// error.
func describeOne[R kmsg.Response, G any](ctx context.Context, as *Anchors, group string, req kmsg.Request, entries func(R) []G, code func(G) int16) (g G, found bool, err error) {
	resp, err := as.request(ctx, group, req, func(r kmsg.Response) int16 {
		if gs := entries(r.(R)); len(gs) > 0 {
			return code(gs[0])
		}
		return 0
	})
	if err != nil {
		return g, false, fmt.Errorf("describing group %q: %w", group, err)
	}
	switch gs := entries(resp.(R)); len(gs) {
	case 0:
		return g, false, nil
	case 1:
		return gs[0], true, nil
	default:
		return g, false, fmt.Errorf("describing group %q: %d groups in the answer", group, len(gs))
	}
}

// describeGroup is describeOne with DescribeGroups.
func (as *Anchors) describeGroup(ctx context.Context, group string) (kmsg.DescribeGroupsResponseGroup, bool, error) {
	return describeOne(ctx, as, group, &kmsg.DescribeGroupsRequest{Groups: []string{group}},
		func(r *kmsg.DescribeGroupsResponse) []kmsg.DescribeGroupsResponseGroup { return r.Groups },
		func(g kmsg.DescribeGroupsResponseGroup) int16 { return g.ErrorCode })
}

// describeAnchored is the anchors' Describe*Group: group's entry as
// describe (describeOne) finds it, an error when the answer holds no
// entry.
func describeAnchored[G any](as *Anchors, group string, describe func(*Anchors) (G, bool, error)) (G, error) {
	g, found, err := describe(as)
	if err == nil && !found {
		err = fmt.Errorf("describing group %q: no group in the answer", group)
	}
	return g, err
}

// ClusterGroup is what the cluster's coordinator holds for one group id.
type ClusterGroup struct {
	// Kind is the group's type on the cluster, as ListGroups names it
	// ("classic", "consumer", "share", "streams"), or "" when the
	// cluster has no group of that id.
	Kind string
	// Members is whether the group has members there.
	Members bool
	// Anchored is whether one of those members is our anchor.
	Anchored bool
	// MemberIDs are the member ids of the classic group's members other
	// than our anchor.
	MemberIDs []string
}

// Live reports whether the cluster's coordinator serves the group: it
// has members there and none is our anchor, or it is of a kind only the
// cluster serves (share and streams groups, KIP-932 and KIP-1071, even
// with no members: their state lives on the cluster).
func (c ClusterGroup) Live() bool {
	return (c.Members && !c.Anchored) || c.Kind == "share" || c.Kind == "streams"
}

// liveOnCluster asks the cluster whether it serves group itself
// (ClusterGroup.Live).
func (as *Anchors) liveOnCluster(ctx context.Context, group string) (bool, error) {
	c, err := as.describeOnCluster(ctx, group)
	return c.Live(), err
}

// describeOnCluster asks the cluster what it holds for group. Kafka 4
// answers DescribeGroups for a group of another type with
// GROUP_ID_NOT_FOUND "Group <id> is not a classic group." and for a
// group it does not have with "Group <id> not found." (its
// GroupMetadataManager); only the former costs the describes of the
// other types, in the order a group is likeliest to be found: consumer,
// share, streams. Kafka 3.x answers with no error and no members (state
// Dead for a group it does not have).
func (as *Anchors) describeOnCluster(ctx context.Context, group string) (ClusterGroup, error) {
	g, found, err := as.describeGroup(ctx, group)
	if err != nil || !found {
		return ClusterGroup{}, err
	}
	switch g.ErrorCode {
	case 0:
		if len(g.Members) > 0 {
			c := ClusterGroup{Kind: "classic", Members: true}
			for _, m := range g.Members {
				if as.isAnchor(m.InstanceID) {
					c.Anchored = true
				} else {
					c.MemberIDs = append(c.MemberIDs, m.MemberID)
				}
			}
			return c, nil
		}
		if g.State != "Dead" {
			// An empty classic group (offsets only), or, on 3.x, a
			// KIP-848 group described without its members.
			c, err := as.describeKind(ctx, group, "consumer")
			if err != nil || c.Kind != "" {
				return c, err
			}
			return ClusterGroup{Kind: "classic"}, nil
		}
	case kerr.GroupIDNotFound.Code:
		if g.ErrorMessage != nil && *g.ErrorMessage == "Group "+group+" not found." {
			return ClusterGroup{}, nil
		}
	default:
		return ClusterGroup{}, fmt.Errorf("describing group %q: %w", group, kerr.ErrorForCode(g.ErrorCode))
	}
	for _, kind := range []string{"consumer", "share", "streams"} {
		c, err := as.describeKind(ctx, group, kind)
		if err != nil || c.Kind != "" {
			return c, err
		}
	}
	return ClusterGroup{}, nil
}

// describeKind describes group with the describe API of kind (KIP-848's
// ConsumerGroupDescribe, KIP-932's ShareGroupDescribe, KIP-1071's
// StreamsGroupDescribe); Kind is "" when the cluster lacks that API or
// has no group of that kind.
func (as *Anchors) describeKind(ctx context.Context, group, kind string) (ClusterGroup, error) {
	switch kind {
	case "consumer":
		return describeKindWith(ctx, as, group, kind, &kmsg.ConsumerGroupDescribeRequest{Groups: []string{group}},
			func(r *kmsg.ConsumerGroupDescribeResponse) []kmsg.ConsumerGroupDescribeResponseGroup { return r.Groups },
			func(g kmsg.ConsumerGroupDescribeResponseGroup) (int16, int) { return g.ErrorCode, len(g.Members) })
	case "share":
		return describeKindWith(ctx, as, group, kind, &kmsg.ShareGroupDescribeRequest{GroupIDs: []string{group}},
			func(r *kmsg.ShareGroupDescribeResponse) []kmsg.ShareGroupDescribeResponseGroup { return r.Groups },
			func(g kmsg.ShareGroupDescribeResponseGroup) (int16, int) { return g.ErrorCode, len(g.Members) })
	case "streams":
		return describeKindWith(ctx, as, group, kind, &kmsg.StreamsGroupDescribeRequest{Groups: []string{group}},
			func(r *kmsg.StreamsGroupDescribeResponse) []kmsg.StreamsGroupDescribeResponseGroup { return r.Groups },
			func(g kmsg.StreamsGroupDescribeResponseGroup) (int16, int) { return g.ErrorCode, len(g.Members) })
	}
	return ClusterGroup{}, fmt.Errorf("describing group %q: unknown kind %q", group, kind)
}

// describeKindWith is describeKind with req, the describe of kind naming
// group only (describeOne), read giving an entry's error code and how
// many members it lists.
func describeKindWith[R kmsg.Response, G any](ctx context.Context, as *Anchors, group, kind string, req kmsg.Request, entries func(R) []G, read func(G) (code int16, members int)) (ClusterGroup, error) {
	if !as.up.SupportsKey(ctx, req.Key()) {
		return ClusterGroup{}, nil
	}
	g, found, err := describeOne(ctx, as, group, req, entries, func(g G) int16 {
		code, _ := read(g)
		return code
	})
	if err != nil {
		return ClusterGroup{}, fmt.Errorf("describing %s group: %w", kind, err)
	}
	if !found {
		return ClusterGroup{}, nil
	}
	switch code, members := read(g); code {
	case 0:
		return ClusterGroup{Kind: kind, Members: members > 0}, nil
	case kerr.GroupIDNotFound.Code:
		return ClusterGroup{}, nil
	default:
		return ClusterGroup{}, fmt.Errorf("describing %s group %q: %w", kind, group, kerr.ErrorForCode(code))
	}
}

// subscription is the consumer protocol metadata of an anchor for a.
func subscription(a groupstate.Anchor) []byte {
	if a.ProtocolType != "consumer" {
		return nil
	}
	m := kmsg.NewConsumerMemberMetadata()
	m.Version = 1
	m.Topics = a.Topics
	for _, t := range sortedTopics(a.Owned) {
		m.OwnedPartitions = append(m.OwnedPartitions, kmsg.ConsumerMemberMetadataOwnedPartition{Topic: t, Partitions: a.Owned[t]})
	}
	return m.AppendTo(nil)
}

// consumerAssignment is the consumer protocol assignment of owned.
func consumerAssignment(owned map[string][]int32) []byte {
	m := kmsg.NewConsumerMemberAssignment()
	for _, t := range sortedTopics(owned) {
		m.Topics = append(m.Topics, kmsg.ConsumerMemberAssignmentTopic{Topic: t, Partitions: owned[t]})
	}
	return m.AppendTo(nil)
}

// sortedTopics returns owned's topics sorted.
func sortedTopics(owned map[string][]int32) []string {
	ts := make([]string, 0, len(owned))
	for t := range owned {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// sessionForLocked is the session timeout a's next join asks for
// (a.mu held): its members' longest, within [MinSessionTimeout,
// SessionTimeout]; SessionTimeout when the members' is unknown or the
// cluster refused a shorter one.
func (as *Anchors) sessionForLocked(a *anchor) time.Duration {
	s := a.want.SessionTimeout
	if s <= 0 || a.longSession {
		return as.opts.SessionTimeout
	}
	return min(max(s, as.opts.MinSessionTimeout), as.opts.SessionTimeout)
}

// heartbeatEvery is how often an anchor of session timeout session
// heartbeats: HeartbeatInterval, or a quarter of the session when
// shorter.
func (as *Anchors) heartbeatEvery(session time.Duration) time.Duration {
	if session <= 0 {
		return as.opts.HeartbeatInterval
	}
	return min(as.opts.HeartbeatInterval, session/4)
}

// errAnchorFenced is the error of a request that found the anchor
// replaced by another kproxy's.
var errAnchorFenced = errors.New("anchor fenced by another kproxy")

// join (re)joins a's membership: a JoinGroup with the instance id and an
// empty member id (a static member rejoining so replaces its previous
// member id without a rebalance), then a SyncGroup, as leader with the
// assignment. Before the first join it checks that the group is not live
// on the cluster without an anchor.
func (as *Anchors) join(a *anchor) error {
	ctx, cancel := context.WithTimeout(context.Background(), as.opts.RebalanceTimeout+as.opts.SessionTimeout)
	defer cancel()
	a.mu.Lock()
	checked := a.checked
	a.mu.Unlock()
	if !checked {
		live, err := as.liveOnCluster(ctx, a.group)
		if err != nil {
			return err
		}
		if live {
			as.lose(a, AnchorLiveOnCluster)
			return nil
		}
		a.mu.Lock()
		a.checked = true
		a.mu.Unlock()
	}
	// Hold commits off and wait for those in flight: the replacement
	// would fence them.
	a.mu.Lock()
	prev := a.state
	a.state = anchorJoining
	for a.commits > 0 {
		ch := a.changed
		a.mu.Unlock()
		<-ch
		a.mu.Lock()
	}
	want := a.want
	session := as.sessionForLocked(a)
	memberID := ""
	if prev == anchorIn && (!a.rejoin || a.rejoinKnown) {
		memberID = a.memberID
	}
	plan := a.takeover
	a.takeover = nil
	// The engine took the static members handed over out of its group
	// before handOver was set (groupstate.Engine.HandBack), so want, and
	// the Anchor read again for the sync, no longer hold their partitions.
	handOver := a.handOver
	a.handOver = nil
	a.rejoin, a.rejoinKnown = false, false
	a.broadcastLocked()
	a.mu.Unlock()

	fail := func(err error) error {
		a.mu.Lock()
		if a.state == anchorJoining {
			a.state = prev
			if prev == anchorIn {
				a.rejoin, a.rejoinKnown = true, memberID != ""
			}
		}
		a.broadcastLocked()
		a.mu.Unlock()
		return err
	}

	meta := subscription(want)
	var protocols []kmsg.JoinGroupRequestProtocol
	for _, name := range want.Protocols {
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name, p.Metadata = name, meta
		protocols = append(protocols, p)
	}
	if len(protocols) == 0 {
		p := kmsg.NewJoinGroupRequestProtocol()
		p.Name, p.Metadata = "kproxy", meta
		protocols = append(protocols, p)
	}
	req := classic.Join{
		Group: a.group, MemberID: memberID, InstanceID: &as.opts.InstanceID,
		ProtocolType: want.ProtocolType, Protocols: protocols,
		SessionTimeout: session, RebalanceTimeout: as.opts.RebalanceTimeout,
	}.Request()
	resp, err := as.joinTakingOver(ctx, a, plan, req)
	if err != nil {
		return fail(fmt.Errorf("anchor join of group %q: %w", a.group, err))
	}
	jr := resp.(*kmsg.JoinGroupResponse)
	switch jr.ErrorCode {
	case 0:
	case kerr.FencedInstanceID.Code:
		as.lose(a, AnchorFenced)
		return nil
	case kerr.UnknownMemberID.Code:
		// The cluster forgot the anchor (its session ended): join
		// again as a new instance.
		err := fail(fmt.Errorf("anchor join of group %q: %w", a.group, kerr.ErrorForCode(jr.ErrorCode)))
		a.mu.Lock()
		a.rejoinKnown = false
		a.mu.Unlock()
		return err
	case kerr.MemberIDRequired.Code, kerr.RebalanceInProgress.Code:
		// A pre-KIP-345 answer or a race with a rebalance: try again.
		return fail(fmt.Errorf("anchor join of group %q: %w", a.group, kerr.ErrorForCode(jr.ErrorCode)))
	case kerr.InvalidSessionTimeout.Code:
		if session < as.opts.SessionTimeout {
			// The members' session is below the cluster's
			// group.min.session.timeout.ms: join again with the
			// anchors' own.
			a.mu.Lock()
			a.longSession = true
			a.mu.Unlock()
			as.log.Info("the cluster refused the members' session timeout for the anchor; it joins with --group-anchor-session-timeout",
				"group", a.group, "session", session, "anchor_session", as.opts.SessionTimeout)
			if plan == nil {
				_ = fail(nil)
				return as.join(a) // once: the session is SessionTimeout now
			}
		}
		return fail(fmt.Errorf("anchor join of group %q with session timeout %v: %w", a.group, session, kerr.ErrorForCode(jr.ErrorCode)))
	default:
		return fail(fmt.Errorf("anchor join of group %q: %w", a.group, kerr.ErrorForCode(jr.ErrorCode)))
	}
	if jr.LeaderID == "" && as.handBackConsumer(ctx, a, jr.MemberID) {
		// The cluster's group is a KIP-848 group now (anchor_takeover_kip848.go).
		return nil
	}
	if jr.LeaderID != jr.MemberID {
		// Another member leads: the cluster's group was live with
		// members of its own when the anchor joined. kproxy stops
		// serving the group; the anchor leaves.
		as.log.Warn("anchor joined a group led by another member; handing the group to the cluster", "group", a.group, "leader", jr.LeaderID)
		_ = as.leave(ctx, a.group, jr.MemberID)
		as.lose(a, AnchorLiveOnCluster)
		return nil
	}
	me := classic.Joined(a.group, &as.opts.InstanceID, jr)
	var assignments []kmsg.SyncGroupRequestGroupAssignment
	var heldVersion uint64 // the Anchor whose partitions this sync assigns
	if !jr.SkipAssignment {
		a.mu.Lock()
		owned := a.want.Owned
		heldVersion = a.want.Version
		a.mu.Unlock()
		for _, m := range jr.Members {
			ga := kmsg.NewSyncGroupRequestGroupAssignment()
			ga.MemberID = m.MemberID
			switch {
			case m.MemberID == jr.MemberID:
				ga.MemberAssignment = consumerAssignment(owned)
			case m.InstanceID != nil && handOver[*m.InstanceID] != nil:
				// A static member of kproxy's moved back: what it
				// was assigned there (anchor_handback.go).
				ga.MemberAssignment = consumerAssignment(handOver[*m.InstanceID])
			default:
				// A member that reached the cluster directly: the
				// partitions are kproxy's members' (see above).
				ga.MemberAssignment = consumerAssignment(nil)
			}
			assignments = append(assignments, ga)
		}
	}
	protocol := ""
	if jr.Protocol != nil {
		protocol = *jr.Protocol
	}
	sreq := me.Sync(want.ProtocolType, protocol, assignments)
	sresp, err := as.request(ctx, a.group, sreq, func(r kmsg.Response) int16 { return r.(*kmsg.SyncGroupResponse).ErrorCode })
	if err != nil {
		// The cluster holds the member its JoinGroup made: remember it,
		// so that a kproxy closing now (the likeliest cause: its clients
		// closed under the sync) makes it leave rather than wait out its
		// session in the cluster's group.
		a.mu.Lock()
		if a.state == anchorJoining && prev != anchorIn {
			a.memberID, a.gen = jr.MemberID, jr.Generation
		}
		a.mu.Unlock()
		return fail(fmt.Errorf("anchor sync of group %q: %w", a.group, err))
	}
	switch code := sresp.(*kmsg.SyncGroupResponse).ErrorCode; classic.OutcomeOf(code) {
	case classic.OK:
	case classic.Fenced:
		as.lose(a, AnchorFenced)
		return nil
	default:
		// REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID:
		// the group moved on; join again.
		a.mu.Lock()
		a.state, a.memberID, a.gen, a.rejoin = anchorOut, jr.MemberID, jr.Generation, true
		a.broadcastLocked()
		a.mu.Unlock()
		return fmt.Errorf("anchor sync of group %q: %w", a.group, kerr.ErrorForCode(code))
	}
	a.mu.Lock()
	a.state, a.memberID, a.gen, a.have, a.session = anchorIn, jr.MemberID, jr.Generation, want, session
	a.nextHeartbeat = time.Now().Add(as.heartbeatEvery(session))
	a.broadcastLocked()
	handsBack := as.handsBack(a)
	a.mu.Unlock()
	if !jr.SkipAssignment && as.opts.OnHeld != nil {
		as.opts.OnHeld(a.group, heldVersion)
	}
	if others := len(jr.Members) - 1; others > 0 && plan == nil && handsBack && handOver == nil {
		// A member reached the cluster's group directly and joined
		// this generation (given nothing above): hand the group back.
		// The engine's members joining the cluster's group start the
		// rebalance the anchor then waits in (anchor_handback.go).
		// The member's join is answered already (with nothing), so
		// no join hands it its partitions: the anchor's would start a
		// rebalance waiting for its next heartbeat.
		as.beginHandback(a, as.joinView(jr), false)
	}
	as.log.Debug("group anchored", "group", a.group, "member", jr.MemberID, "generation", jr.Generation)
	return nil
}

// heartbeat keeps a's session and learns of rebalances.
func (as *Anchors) heartbeat(a *anchor) error {
	a.mu.Lock()
	memberID, gen := a.memberID, a.gen
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := classic.Member{Group: a.group, MemberID: memberID, InstanceID: &as.opts.InstanceID, Generation: gen}.Heartbeat()
	resp, err := as.request(ctx, a.group, req, func(r kmsg.Response) int16 { return r.(*kmsg.HeartbeatResponse).ErrorCode })
	if err != nil {
		return fmt.Errorf("anchor heartbeat of group %q: %w", a.group, err)
	}
	code := resp.(*kmsg.HeartbeatResponse).ErrorCode
	outcome := classic.OutcomeOf(code)
	if outcome == classic.Fenced {
		as.fenced(a.group, memberID)
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.memberID != memberID || a.state != anchorIn {
		return nil
	}
	switch outcome {
	case classic.OK:
		a.nextHeartbeat = time.Now().Add(as.heartbeatEvery(a.session))
	case classic.Rejoin, classic.Stale:
		if code == kerr.RebalanceInProgress.Code && (a.handback != nil || as.handsBack(a)) {
			// The cluster waits for the anchor: a hand-back in
			// progress keeps it waiting, or one may begin.
			a.handbackCheck = a.handback == nil
			a.nextHeartbeat = time.Now().Add(as.heartbeatEvery(a.session))
			a.broadcastLocked()
			return nil
		}
		if a.handback != nil {
			// The cluster dropped the anchor meanwhile (its rebalance
			// timeout passed): the hand-back ends with it.
			a.state = anchorOut
		}
		a.rejoin, a.rejoinKnown = true, code != kerr.UnknownMemberID.Code
		a.broadcastLocked()
	default:
		return fmt.Errorf("anchor heartbeat of group %q: %w", a.group, kerr.ErrorForCode(code))
	}
	return nil
}

// leave takes memberID (the anchor) out of group.
func (as *Anchors) leave(ctx context.Context, group, memberID string) error {
	req := classic.Member{Group: group, MemberID: memberID, InstanceID: &as.opts.InstanceID}.Leave("kproxy's group is empty")
	resp, err := as.request(ctx, group, req, func(r kmsg.Response) int16 { return r.(*kmsg.LeaveGroupResponse).ErrorCode })
	if err != nil {
		return fmt.Errorf("anchor leave of group %q: %w", group, err)
	}
	if err := classic.LeaveError(resp.(*kmsg.LeaveGroupResponse)); err != nil && !classic.Gone(err) {
		// Gone: left already, or replaced by another kproxy's anchor.
		return fmt.Errorf("anchor leave of group %q: %w", group, err)
	}
	return nil
}

// lose marks a fenced (it is dead) and reports it.
func (as *Anchors) lose(a *anchor, why AnchorLoss) {
	a.mu.Lock()
	if a.state == anchorFenced || a.forgotten {
		a.mu.Unlock()
		return
	}
	// The entry stays, fenced, until the engine drops the group
	// (Unanchor) or loads it again (checkLoad): meanwhile no commit of
	// the group leaves this store, anonymous ones included (the cluster
	// accepts a TxnOffsetCommit without a member in any state).
	a.state = anchorFenced
	a.broadcastLocked()
	a.mu.Unlock()
	as.log.Info("group anchor lost; the group is no longer served here", "group", a.group, "why", why.String())
	if as.opts.OnLost != nil {
		go as.opts.OnLost(a.group, why)
	}
}

// commitIdentity waits until group's anchor can carry a commit and
// returns its identity, counting the commit in flight (release with
// done). ok is false when the group has no anchor to commit under (no
// members in kproxy, or anchoring is off): the commit is a simple one.
func (as *Anchors) commitIdentity(ctx context.Context, group string) (memberID string, gen int32, ok bool, done func(), err error) {
	a := as.get(group, false)
	if a == nil {
		return "", 0, false, nil, nil
	}
	for {
		a.mu.Lock()
		switch {
		case a.state == anchorFenced:
			a.mu.Unlock()
			return "", 0, false, nil, fmt.Errorf("commit for group %q: %w: %w", group, errAnchorFenced, kerr.NotCoordinator)
		case a.forgotten || !a.wanted || (a.want.Members == 0 && a.state != anchorIn):
			a.mu.Unlock()
			return "", 0, false, nil, nil
		case a.state == anchorOut && a.failures >= anchorGiveUp:
			// The anchor cannot join (kproxy's principal lacks group
			// READ, the cluster's session bounds refuse it...): commit
			// as without anchors rather than not at all. The cluster
			// accepts such a commit only while its group is empty.
			a.mu.Unlock()
			return "", 0, false, nil, nil
		case a.state == anchorIn && (!a.rejoin || a.handback != nil):
			// A hand-back never rejoins: its commits go on under the
			// membership it holds until the anchor leaves.
			a.commits++
			memberID, gen = a.memberID, a.gen
			a.mu.Unlock()
			return memberID, gen, true, func() {
				a.mu.Lock()
				a.commits--
				a.broadcastLocked()
				a.mu.Unlock()
			}, nil
		}
		ch := a.changed
		wait := time.Second
		if !a.retryAt.IsZero() {
			wait = max(time.Until(a.retryAt), 10*time.Millisecond)
		}
		a.mu.Unlock()
		as.kick(a)
		t := time.NewTimer(wait)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", 0, false, nil, fmt.Errorf("commit for group %q: waiting for its anchor: %w", group, ctx.Err())
		}
		t.Stop()
	}
}

// needRejoin marks group's anchor for a rejoin after a commit found its
// generation or member id stale.
func (as *Anchors) needRejoin(group, memberID string, known bool) {
	a := as.get(group, false)
	if a == nil {
		return
	}
	a.mu.Lock()
	if a.memberID == memberID && a.state == anchorIn {
		a.rejoin, a.rejoinKnown = true, known
		a.broadcastLocked()
	}
	a.mu.Unlock()
	as.kick(a)
}

// fenced marks group's anchor fenced after a commit found it replaced.
func (as *Anchors) fenced(group, memberID string) {
	a := as.get(group, false)
	if a == nil {
		return
	}
	a.mu.Lock()
	same := a.memberID == memberID
	a.mu.Unlock()
	if same {
		as.lose(a, AnchorFenced)
	}
}

// AwaitGone implements kafkastore.Anchors: it waits until group's
// anchor holds no membership (it left, was forgotten or fenced), for a
// DeleteGroups the engine allowed: the cluster would refuse it while the
// anchor is a member.
func (as *Anchors) AwaitGone(ctx context.Context, group string) error {
	a := as.get(group, false)
	if a == nil {
		return nil
	}
	for {
		a.mu.Lock()
		if a.state != anchorIn && a.state != anchorJoining && !a.running {
			a.mu.Unlock()
			return nil
		}
		ch := a.changed
		a.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the anchor of group %q to leave: %w", group, ctx.Err())
		}
	}
}

// CheckLoad implements kafkastore.Anchors: the load-time check of
// group (the store's LoadGroupMetadata). A group whose members the
// cluster serves without an anchor is not the engine's
// (groupstate.ErrGroupLiveOnCluster). A group found anchored, or empty,
// needs no second check before its anchor's first join. A group with a
// takeover prepared (anchor_takeover.go) is not asked about: its record
// is returned instead.
func (as *Anchors) CheckLoad(ctx context.Context, group string) (takeover []byte, err error) {
	a := as.get(group, true)
	if takeover = as.takeTakeover(group, a); takeover == nil {
		live, err := as.liveOnCluster(ctx, group)
		if err != nil {
			return nil, err
		}
		if live {
			if as.opts.OnLive != nil {
				as.opts.OnLive(group)
			}
			return nil, fmt.Errorf("group %q: %w", group, groupstate.ErrGroupLiveOnCluster)
		}
	}
	a.mu.Lock()
	if a.state == anchorFenced {
		// Loaded again after a loss: start over.
		a.state, a.memberID, a.gen, a.rejoin = anchorOut, "", 0, false
	}
	a.checked = true
	a.mu.Unlock()
	return takeover, nil
}

// anchorBackoff is the wait after n failed anchor requests in a row:
// 100ms doubling to 30s, so that thousands of anchors a cluster refuses
// do not flood it.
func anchorBackoff(n int) time.Duration {
	return min(100*time.Millisecond<<min(n-1, 9), 30*time.Second)
}

// anchorGiveUp is the number of failed requests in a row after which a
// group whose anchor never joined commits without it (commitIdentity).
const anchorGiveUp = 3

// maxAnchoredAttempts bounds the tries of one anchored commit: each retry
// follows a rejoin of the anchor (the cluster's group moved on).
const maxAnchoredAttempts = 5

// Commit implements kafkastore.Anchors: one OffsetCommit of group
// under its anchor (anchoredSend); anchored is false (and nothing was
// sent) when the group has no anchor to commit under.
func (as *Anchors) Commit(ctx context.Context, group string, build func() *kmsg.OffsetCommitRequest) (*kmsg.OffsetCommitResponse, bool, error) {
	r, anchored, err := as.anchoredSend(ctx, group, "offset commit", func(memberID string, gen int32) kmsg.Request {
		req := build()
		req.MemberID, req.Generation, req.InstanceID = memberID, gen, &as.opts.InstanceID
		return req
	}, firstCommitCode)
	if r == nil {
		return nil, anchored, err
	}
	return r.(*kmsg.OffsetCommitResponse), true, nil
}

// TxnCommit implements kafkastore.Anchors: an application's
// TxnOffsetCommit (already validated by the engine against kproxy's
// generation) under group's anchor, so the cluster's member checks fence
// it as a plain commit; anchored is false when the group has no anchor.
func (as *Anchors) TxnCommit(ctx context.Context, req *kmsg.TxnOffsetCommitRequest) (*kmsg.TxnOffsetCommitResponse, bool, error) {
	r, anchored, err := as.anchoredSend(ctx, req.Group, "txn offset commit", func(memberID string, gen int32) kmsg.Request {
		req.MemberID, req.Generation, req.InstanceID = memberID, gen, &as.opts.InstanceID
		return req
	}, firstTxnCommitCode)
	if r == nil {
		return nil, anchored, err
	}
	return r.(*kmsg.TxnOffsetCommitResponse), true, nil
}

// anchoredSend sends the request build makes for the anchor's identity
// to group's coordinator, and reads code (the first partition error)
// from the answer: FENCED_INSTANCE_ID loses the anchor (an error
// wrapping NOT_COORDINATOR); ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID and
// REBALANCE_IN_PROGRESS rejoin the anchor and send again (the engine
// sends the commits of one partition one at a time, so no newer commit
// of these partitions went out; commits of other partitions may be in
// flight beside this one, each retried on its own). A nil
// response with anchored false means the group has no anchor.
func (as *Anchors) anchoredSend(ctx context.Context, group, what string, build func(memberID string, gen int32) kmsg.Request, code func(kmsg.Response) int16) (kmsg.Response, bool, error) {
	for attempt := 0; ; attempt++ {
		memberID, gen, ok, done, err := as.commitIdentity(ctx, group)
		if err != nil {
			return nil, true, fmt.Errorf("%s for group %q: %w", what, group, err)
		}
		if !ok {
			return nil, false, nil
		}
		req := build(memberID, gen)
		resp, err := as.up.Request(ctx, upstream.CoordinatorGroup, group, req, req.MaxVersion(), code)
		done()
		if err != nil {
			return nil, true, fmt.Errorf("%s for group %q: %w", what, group, err)
		}
		switch c := code(resp); classic.OutcomeOf(c) {
		case classic.Fenced:
			as.fenced(group, memberID)
			return nil, true, fmt.Errorf("%s for group %q: %w: %w", what, group, errAnchorFenced, kerr.NotCoordinator)
		case classic.Stale, classic.Rejoin:
			if attempt+1 >= maxAnchoredAttempts {
				return nil, true, fmt.Errorf("%s for group %q: anchor kept failing: %w", what, group, kerr.ErrorForCode(c))
			}
			as.needRejoin(group, memberID, c != kerr.UnknownMemberID.Code)
			continue
		}
		return resp, true, nil
	}
}

// firstCommitCode is the first partition error of an OffsetCommit answer
// (its errors are per partition, and every one says the same for the
// group-level failures).
func firstCommitCode(resp kmsg.Response) int16 {
	for _, t := range resp.(*kmsg.OffsetCommitResponse).Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return p.ErrorCode
			}
		}
	}
	return 0
}

// firstTxnCommitCode is firstCommitCode for TxnOffsetCommit.
func firstTxnCommitCode(resp kmsg.Response) int16 {
	for _, t := range resp.(*kmsg.TxnOffsetCommitResponse).Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return p.ErrorCode
			}
		}
	}
	return 0
}

// LiveOnCluster reports whether the cluster's own coordinator serves
// group: it has members there, none of them an anchor of this store's
// instance id (a KIP-848 group with members counts too). Anchoring must
// be on.
func (as *Anchors) LiveOnCluster(ctx context.Context, group string) (bool, error) {
	c, err := as.DescribeOnCluster(ctx, group)
	return c.Live(), err
}

// DescribeOnCluster asks the cluster what it holds for group: its kind
// there, whether it has members, whether our anchor is one of them.
func (as *Anchors) DescribeOnCluster(ctx context.Context, group string) (ClusterGroup, error) {
	return as.describeOnCluster(ctx, group)
}

// GroupCoordinator returns the node id of group's coordinator, asked
// afresh or as last learnt (the store's primitive, for the forwarding
// decisions).
func (as *Anchors) GroupCoordinator(ctx context.Context, group string, fresh bool) (int32, error) {
	if fresh {
		return as.up.FreshCoordinator(ctx, upstream.CoordinatorGroup, group)
	}
	return as.up.Coordinator(ctx, upstream.CoordinatorGroup, group)
}

// JoinForMemberID sends join to group's coordinator on a client of the
// store's and returns the answer: a JoinGroup without a member id (v4
// and later) is answered at once, with the id the member is to join
// with (KIP-394), so it never waits on a rebalance.
func (as *Anchors) JoinForMemberID(ctx context.Context, join *kmsg.JoinGroupRequest) (*kmsg.JoinGroupResponse, error) {
	resp, err := as.up.Request(ctx, upstream.CoordinatorGroup, join.Group, join, join.Version,
		func(r kmsg.Response) int16 { return r.(*kmsg.JoinGroupResponse).ErrorCode })
	if err != nil {
		return nil, fmt.Errorf("join %q at the cluster for a member id: %w", join.Group, err)
	}
	return resp.(*kmsg.JoinGroupResponse), nil
}

// maxDescribeBatch bounds the groups of one polling DescribeGroups.
const maxDescribeBatch = 500

// heldAnchors returns the anchors that are members of their groups,
// synced and idle (no rejoin asked, no worker running), by group.
func (as *Anchors) heldAnchors() map[string]*anchor {
	as.mu.Lock()
	defer as.mu.Unlock()
	held := make(map[string]*anchor)
	for g, a := range as.groups {
		a.mu.Lock()
		if a.state == anchorIn && !a.rejoin && !a.running {
			held[g] = a
		}
		a.mu.Unlock()
	}
	return held
}

// byCoordinator groups the groups of held by their coordinator's node.
func (as *Anchors) byCoordinator(ctx context.Context, held map[string]*anchor) map[int32][]string {
	byNode := make(map[int32][]string)
	for g := range held {
		node, err := as.up.Coordinator(ctx, upstream.CoordinatorGroup, g)
		if err != nil {
			continue
		}
		byNode[node] = append(byNode[node], g)
	}
	return byNode
}

// pollRebalances describes the groups whose anchor is a member, in
// batches per coordinator, and marks for a rejoin each one the cluster
// is rebalancing: a member reached it directly, and the cluster waits
// for the anchor, which rejoins and, leading, keeps what kproxy's
// members own (package doc). It runs on the scheduler, every
// PollInterval; watchRebalances finds most of these sooner.
func (as *Anchors) pollRebalances() {
	ctx, cancel := context.WithTimeout(context.Background(), as.opts.PollInterval)
	defer cancel()
	held := as.heldAnchors()
	if len(held) == 0 {
		return
	}
	for node, groups := range as.byCoordinator(ctx, held) {
		as.describeHeld(ctx, node, groups, held)
	}
}

// describeHeld describes groups, all coordinated by node, in batches,
// and acts on what the cluster holds for each (held names their
// anchors): a member of the cluster's own in it makes the anchor check
// for a hand-back, a rebalance without one makes it rejoin.
func (as *Anchors) describeHeld(ctx context.Context, node int32, groups []string, held map[string]*anchor) {
	for len(groups) > 0 {
		batch := groups[:min(len(groups), maxDescribeBatch)]
		groups = groups[len(batch):]
		req := kmsg.NewPtrDescribeGroupsRequest()
		req.Groups = batch
		resp, err := req.RequestWith(ctx, as.up.Client().Broker(int(node)))
		if err != nil {
			continue
		}
		for _, g := range resp.Groups {
			a := held[g.Group]
			if a == nil || g.ErrorCode != 0 {
				continue
			}
			others := 0
			for _, m := range g.Members {
				if !as.isAnchor(m.InstanceID) {
					others++
				}
			}
			rebalancing := g.State == "PreparingRebalance" || g.State == "CompletingRebalance"
			if !rebalancing && others == 0 {
				continue
			}
			a.mu.Lock()
			switch {
			case a.state != anchorIn || a.handback != nil:
			case others > 0 && as.handsBack(a):
				// A member of the cluster's own: rebalancing to take
				// it in, or in a generation the anchor led (given
				// nothing). Either way the group goes back.
				a.handbackCheck = true
			case rebalancing:
				a.rejoin, a.rejoinKnown = true, true
			}
			a.mu.Unlock()
			as.kick(a)
		}
	}
}

// rebalancingStates are the group states ListGroups is asked for by
// watchRebalances: a classic group rebalancing (a member joined it), and
// a KIP-848 group reconciling (Kafka converted the anchored classic
// group when a KIP-848 member joined it: its online upgrade, KIP-848).
var rebalancingStates = []string{"PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling"}

// watchRebalances finds, every RebalanceWatchInterval until the anchors
// stop, the anchored groups the cluster rebalances: one ListGroups
// filtered by state (KIP-518; v4 and up) to each coordinator of an
// anchored group, whose answer names only the groups rebalancing, so
// that a member moved back to the brokers is seen within a fraction of
// a second at the cost of one small request per coordinator. The
// classic groups among them are described (describeHeld); a KIP-848 one
// makes its anchor rejoin, whose JoinGroup answer starts the KIP-848
// hand-back (handBackConsumer). A cluster that cannot filter is left to
// pollRebalances.
//
// A member that leaves kproxy's group is the likeliest to be moved
// back: for leaveWatch after a member left, its group is described
// every leaveWatchEvery, so that the hand-back begins before kproxy's
// own rebalance for the leave completes and is folded into it (one
// rebalance, as when the same move is made directly).
func (as *Anchors) watchRebalances() {
	t := time.NewTicker(leaveWatchEvery)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-as.stop:
			return
		case <-t.C:
		}
		if time.Since(last) >= as.opts.RebalanceWatchInterval {
			last = time.Now()
			as.watchOnce()
			continue
		}
		as.watchLeft()
	}
}

// leaveWatch is how long a group is watched closely after a member left
// kproxy's group (watchRebalances): the moved member's restart against
// the brokers.
const leaveWatch = 3 * time.Second

// leaveWatchEvery is how often such a group is described.
const leaveWatchEvery = 50 * time.Millisecond

// watchLeft describes the groups a member left within leaveWatch.
func (as *Anchors) watchLeft() {
	held := as.heldAnchors()
	now := time.Now()
	for g, a := range held {
		a.mu.Lock()
		watched := now.Before(a.watchUntil) && a.handback == nil
		a.mu.Unlock()
		if !watched {
			delete(held, g)
		}
	}
	if len(held) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for node, groups := range as.byCoordinator(ctx, held) {
		as.describeHeld(ctx, node, groups, held)
	}
}

// watchOnce is one round of watchRebalances.
func (as *Anchors) watchOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), max(as.opts.RebalanceWatchInterval, time.Second))
	defer cancel()
	held := as.heldAnchors()
	if len(held) == 0 {
		return
	}
	for node, groups := range as.byCoordinator(ctx, held) {
		ours := make(map[string]bool, len(groups))
		for _, g := range groups {
			ours[g] = true
		}
		req := kmsg.NewPtrListGroupsRequest()
		req.StatesFilter = rebalancingStates
		resp, err := req.RequestWith(ctx, as.up.Client().Broker(int(node)))
		if err != nil || resp.ErrorCode != 0 || resp.GetVersion() < 4 {
			continue
		}
		var classicGroups []string
		for _, g := range resp.Groups {
			a := held[g.Group]
			if a == nil || !ours[g.Group] {
				continue
			}
			if g.GroupType == "consumer" {
				a.mu.Lock()
				if a.state == anchorIn && a.handback == nil {
					a.rejoin, a.rejoinKnown = true, true
				}
				a.mu.Unlock()
				as.kick(a)
				continue
			}
			classicGroups = append(classicGroups, g.Group)
		}
		if len(classicGroups) > 0 {
			as.describeHeld(ctx, node, classicGroups, held)
		}
	}
}
