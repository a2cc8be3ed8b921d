package proxy

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/metric"

	"github.com/kproxy/kproxy/codec"
)

// Locator says which kproxy owns a group (docs/fleet.md, "Ownership"). It
// must be safe for concurrent use.
type Locator interface {
	// Locate says where group's requests go: local=true means the local
	// coordinator; otherwise addr is the owner's peer address. ok=false
	// means the group has no owner right now.
	Locate(group string) (local bool, addr string, ok bool)
	// Changed returns a channel that is closed when the table changes
	// next, to wait briefly for an owner to appear.
	Changed() <-chan struct{}
	// Peers lists the peer addresses of every owner other than this
	// kproxy, for requests that ask every owner (ListGroups).
	Peers() []string
}

// RouterConfig configures a Router. Every field but Locator has a usable
// zero value.
type RouterConfig struct {
	// Local serves the groups this kproxy owns; nil on a kproxy that owns
	// none (a relay): a group located here then gets
	// COORDINATOR_NOT_AVAILABLE.
	Local Coordinator
	// Locator says who owns each group; nil means every group is local
	// (a single kproxy).
	Locator Locator
	// Dialer connects to peers; nil uses a net.Dialer.
	Dialer Dialer
	// RelayTimeout bounds dialling a peer and waiting for its answer;
	// default 5s. JoinGroup and SyncGroup wait for the rebalance instead
	// (see timeoutFor).
	RelayTimeout time.Duration
	// PeerKeepalive is how long a peer connection may go without
	// answering a keepalive before it is closed and its owner treated as
	// unreachable (requests for its groups fail at once until a
	// reconnection is answered); a keepalive is sent after half of it
	// without a frame read. Default RelayTimeout/3, so that a silent
	// owner is found within 1.75 of it, inside the relay timeout.
	PeerKeepalive time.Duration
	// WaitForOwner is how long a request for a group without an owner
	// waits for one before it is answered COORDINATOR_NOT_AVAILABLE;
	// default 1s.
	WaitForOwner time.Duration
	// KeepCutOffMembers turns off answering UNKNOWN_MEMBER_ID to a
	// member whose requests stopped reaching an owner for longer than
	// the owner keeps it (relay_members.go): the member then keeps its
	// partitions while an owner gives them away, as without kproxy. For
	// measurements; the zero value tells members.
	KeepCutOffMembers bool
	// ConsumerSessionTimeout is the session timeout the owners give
	// KIP-848 members (group.consumer.session.timeout.ms), for telling
	// them to give up in time (relay_members.go); the fleet's kproxies
	// take it from the same cluster or the same flags. Zero: KIP-848
	// members are never told.
	ConsumerSessionTimeout time.Duration
	// ConsumerSessionTimeoutOf, when set, gives a group's own session
	// timeout for its KIP-848 members (its GROUP config
	// consumer.session.timeout.ms, as the owners apply it); zero means
	// ConsumerSessionTimeout.
	ConsumerSessionTimeoutOf func(group string) time.Duration
	// Messages serves the kproxy messages (peer_message.go) SendPeer
	// sends for groups owned here; give the PeerServer the same
	// registry. nil: such messages are answered PeerUnknownType.
	Messages *PeerMessages
	// Logger; nil discards.
	Logger *slog.Logger
	// MeterProvider records kproxy.relay.requests and
	// kproxy.relay.duration; nil records nothing.
	MeterProvider metric.MeterProvider
}

// defaultRebalanceTimeout bounds a relayed SyncGroup when no JoinGroup
// with a longer rebalance timeout was seen: Kafka's default
// max.poll.interval.ms, the consumer's rebalance timeout.
const defaultRebalanceTimeout = 5 * time.Minute

// Router is the Coordinator a kproxy's sessions use in distributed mode:
// it sends each group request to the local coordinator when the group is
// owned here and otherwise relays it to the owner over the peer wire
// (peer.go). Requests naming several groups are split by owner and the
// answers merged in request order. Handle never blocks on the network.
//
// The router answers COORDINATOR_NOT_AVAILABLE when a group has no owner
// within WaitForOwner, or its owner cannot be reached, cuts the connection
// with the request in flight, goes silent (a keepalive unanswered for
// PeerKeepalive; then at once, until the owner answers again), or does
// not answer in time: such a request is
// never resent, since the owner may have acted on it. Every answer an
// owner gives reaches the client as given, except that a member's
// request an owner refuses (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
// COORDINATOR_LOAD_IN_PROGRESS) follows its group to the next owner
// for a while (relay_follow.go); both errors make a client look the
// coordinator up again, which brings it back to its local kproxy. A member (classic or
// KIP-848) whose requests stopped reaching an owner (relayed or local:
// a kproxy whose fleet lease ran out finds no owner for its groups) for
// longer than the owner keeps it is answered UNKNOWN_MEMBER_ID instead,
// so that it gives up its partitions before an owner gives them away
// (relay_members.go).
type Router struct {
	cfg     RouterConfig   // immutable after NewRouter
	loc     Locator        // immutable
	log     *slog.Logger   // immutable
	pool    *peerPool      // immutable; safe for concurrent use
	metrics *relayMetrics  // immutable
	members *memberTracker // immutable; safe for concurrent use

	// maxRebalance is the longest JoinGroup rebalance timeout relayed so
	// far, in milliseconds; it bounds a relayed SyncGroup.
	maxRebalance atomic.Int64

	// unknownTypes holds the peer address and message type pairs
	// already logged as unknown to the peer (SendPeer); safe for
	// concurrent use.
	unknownTypes sync.Map

	closing   chan struct{} // closed by Close: waits for an owner end
	closeOnce sync.Once
	mu        sync.Mutex
	closed    bool           // guarded by mu: no new waiting goroutine
	wg        sync.WaitGroup // goroutines waiting for an owner
}

// NewRouter returns a router; Close releases its peer connections.
func NewRouter(cfg RouterConfig) *Router {
	if cfg.RelayTimeout <= 0 {
		cfg.RelayTimeout = 5 * time.Second
	}
	if cfg.WaitForOwner <= 0 {
		cfg.WaitForOwner = time.Second
	}
	if cfg.PeerKeepalive <= 0 {
		cfg.PeerKeepalive = cfg.RelayTimeout / 3
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Dialer == nil {
		cfg.Dialer = (&net.Dialer{}).DialContext
	}
	loc := cfg.Locator
	if loc == nil {
		loc = allLocal{}
	}
	log := cfg.Logger.With("component", "router")
	metrics := newRelayMetrics(cfg.MeterProvider)
	return &Router{
		cfg:     cfg,
		loc:     loc,
		log:     log,
		pool:    newPeerPool(cfg.Dialer, cfg.RelayTimeout, cfg.PeerKeepalive, log, metrics),
		metrics: metrics,
		members: newMemberTracker(log, cfg.KeepCutOffMembers, cfg.ConsumerSessionTimeout, cfg.ConsumerSessionTimeoutOf),
		closing: make(chan struct{}),
	}
}

// allLocal is the Locator of a single kproxy.
type allLocal struct{}

func (allLocal) Locate(string) (bool, string, bool) { return true, "", true }
func (allLocal) Changed() <-chan struct{}           { return nil }
func (allLocal) Peers() []string                    { return nil }

// Close answers every relayed request still in flight with
// COORDINATOR_NOT_AVAILABLE and closes the peer connections. Requests
// handled later go to the local coordinator when they are local and are
// answered COORDINATOR_NOT_AVAILABLE otherwise.
func (r *Router) Close() {
	r.closeOnce.Do(func() {
		close(r.closing)
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.wg.Wait()
		r.pool.close()
	})
}

// dest is where a request goes: the local coordinator or a peer address.
type dest struct {
	local bool
	addr  string
}

// memberDest is d as the member tracker names it (memberReq.dest).
func (d dest) memberDest() string {
	if d.local {
		return destLocal
	}
	return d.addr
}

func (r *Router) locate(group string) (dest, bool) {
	local, addr, ok := r.loc.Locate(group)
	return dest{local: local, addr: addr}, ok
}

// Handle routes one group request; reply is called exactly once with a
// response of the request's version.
func (r *Router) Handle(c Client, req kmsg.Request, reply func(kmsg.Response)) {
	version := req.GetVersion()
	done := func(resp kmsg.Response) {
		resp.SetVersion(version)
		reply(resp)
	}
	api, ok := groupAPIs[req.Key()]
	switch {
	case !ok:
		// Not a group API: the local coordinator answers it as it
		// would without a router.
		r.send(dest{local: true}, c, req, done)
	case req.Key() == 16:
		r.listGroups(c, req, done)
	default:
		groups := api.groups(req)
		if api.multi == nil || len(groups) == 1 {
			r.single(c, req, groups[0], done)
		} else {
			r.split(c, req, api.multi, groups, done)
		}
	}
}

// single routes a request for one group.
func (r *Router) single(c Client, req kmsg.Request, group string, done func(kmsg.Response)) {
	d, ok := r.locate(group)
	if jg, isJoin := req.(*kmsg.JoinGroupRequest); isJoin && jg.MemberID == "" {
		if !ok || r.ownerDown(d) {
			r.holdJoin(c, jg, group, done)
			return
		}
	}
	if ok {
		r.relay(d, c, req, group, done)
		return
	}
	start := time.Now()
	// A member whose requests have found no owner for most of its
	// session is told to give up at once (relay_members.go): a kproxy
	// that lost its fleet lease does not know the new owner.
	mr, tracked := memberOf(req)
	if tracked && r.members.check(mr, start) {
		r.metrics.record(req.Key(), outcomeMemberExpired, 0)
		done(codec.GroupErrorResponse(req, errUnknownMemberID))
		return
	}
	req = CloneRequest(req) // the wait outlives the caller's buffers
	r.goWait(func() {
		var d dest
		if !r.await(func() (ok bool) { d, ok = r.locate(group); return ok }) {
			r.metrics.record(req.Key(), outcomeNoOwner, time.Since(start))
			if tracked {
				r.members.noOwner(mr, time.Now())
				r.failMember(mr, req, done)
				return
			}
			done(codec.GroupErrorResponse(req, errCoordinatorNotAvailable))
			return
		}
		r.relay(d, c, req, group, done)
	})
}

// ownerDown says whether d is a peer in an unreachable episode.
func (r *Router) ownerDown(d dest) bool {
	if d.local {
		return false
	}
	_, down := r.pool.episode(d.addr)
	return down
}

// holdJoin routes the JoinGroup of a member joining afresh (no member
// id: it owns nothing) whose group has no owner, or whose owner is in an
// unreachable episode: instead of COORDINATOR_NOT_AVAILABLE at once, it
// waits for an owner that can be reached (the episode's end, or a table
// change that names another owner), for at most the join's rebalance
// timeout, and is then sent. A JoinGroup is the one group request a
// client expects to wait (a broker holds it for the whole rebalance), and
// nothing the member does waits behind it; answered at once, the client
// would retry only after its backoff (franz-go's grows to 5s, Kafka's to
// 1s), so that a member cut off from its owner joined again up to that
// long after heal, where a directly connected member's join, held in
// TCP, goes on the moment the link heals. Past the wait it is sent
// anyway: an owner still down answers it COORDINATOR_NOT_AVAILABLE at
// once.
func (r *Router) holdJoin(c Client, jg *kmsg.JoinGroupRequest, group string, done func(kmsg.Response)) {
	start := time.Now()
	hold := r.timeoutFor(jg) - r.cfg.RelayTimeout
	req := CloneRequest(jg) // the wait outlives the caller's buffers
	r.goWait(func() {
		t := time.NewTimer(hold)
		defer t.Stop()
		for {
			changed := r.loc.Changed() // before locating: no change is missed
			d, ok := r.locate(group)
			var ended <-chan struct{}
			if ok {
				var down bool
				if ended, down = r.pool.episode(d.addr); d.local || !down {
					r.send(d, c, req, done)
					return
				}
			}
			select {
			case <-ended: // nil, never ready, while there is no owner
			case <-changed:
			case <-t.C:
				if ok {
					r.send(d, c, req, done)
					return
				}
				r.metrics.record(req.Key(), outcomeNoOwner, time.Since(start))
				done(codec.GroupErrorResponse(req, errCoordinatorNotAvailable))
				return
			case <-r.closing:
				done(codec.GroupErrorResponse(req, errCoordinatorNotAvailable))
				return
			}
		}
	})
}

// split routes a request naming several groups: one subset per
// destination, answers merged in request order. Groups without an owner
// wait for one together; those still without one get
// COORDINATOR_NOT_AVAILABLE while the rest are answered by their owners.
func (r *Router) split(c Client, req kmsg.Request, sp splitter, groups []string, done func(kmsg.Response)) {
	dests := make([]dest, len(groups))
	have := make([]bool, len(groups))
	locateAll := func() bool {
		all := true
		for i, g := range groups {
			if !have[i] {
				dests[i], have[i] = r.locate(g)
				all = all && have[i]
			}
		}
		return all
	}
	if locateAll() {
		r.fanOut(c, req, sp, dests, have, done)
		return
	}
	req = CloneRequest(req)
	start := time.Now()
	r.goWait(func() {
		if !r.await(locateAll) {
			r.metrics.record(req.Key(), outcomeNoOwner, time.Since(start))
		}
		r.fanOut(c, req, sp, dests, have, done)
	})
}

// fanOut sends each destination its subset of req (have[i] false: group i
// has no owner) and merges the answers.
func (r *Router) fanOut(c Client, req kmsg.Request, sp splitter, dests []dest, have []bool, done func(kmsg.Response)) {
	var order []dest
	byDest := map[dest][]int{}
	var orphans []int
	for i, d := range dests {
		if !have[i] {
			orphans = append(orphans, i)
			continue
		}
		if _, ok := byDest[d]; !ok {
			order = append(order, d)
		}
		byDest[d] = append(byDest[d], i)
	}
	parts := make([]part, len(order), len(order)+1)
	for i, d := range order {
		parts[i].idx = byDest[d]
	}
	if len(orphans) > 0 {
		parts = append(parts, part{idx: orphans, resp: codec.GroupErrorResponse(sp.subset(req, orphans), errCoordinatorNotAvailable)})
	}
	var mu sync.Mutex
	left := len(order)
	if left == 0 {
		done(sp.merge(req, parts))
		return
	}
	for i, d := range order {
		r.send(d, c, sp.subset(req, parts[i].idx), func(resp kmsg.Response) {
			mu.Lock()
			parts[i].resp = resp
			left--
			last := left == 0
			mu.Unlock()
			if last {
				done(sp.merge(req, parts))
			}
		})
	}
}

// listGroups asks the local coordinator and every other owner, and merges
// their groups (a group listed twice, as during a handover, once). If an
// owner fails, the groups of the others are still listed, with the
// owner's error (as Kafka lists what it has with
// COORDINATOR_LOAD_IN_PROGRESS while a partition loads).
func (r *Router) listGroups(c Client, req kmsg.Request, done func(kmsg.Response)) {
	var dests []dest
	if r.cfg.Local != nil {
		dests = append(dests, dest{local: true})
	}
	seen := map[string]bool{}
	for _, a := range r.loc.Peers() {
		if a != "" && !seen[a] {
			seen[a] = true
			dests = append(dests, dest{addr: a})
		}
	}
	if len(dests) == 0 {
		done(kmsg.NewPtrListGroupsResponse())
		return
	}
	resps := make([]kmsg.Response, len(dests))
	var mu sync.Mutex
	left := len(dests)
	for i, d := range dests {
		r.send(d, c, req, func(resp kmsg.Response) {
			mu.Lock()
			resps[i] = resp
			left--
			last := left == 0
			mu.Unlock()
			if last {
				done(mergeListGroups(resps))
			}
		})
	}
}

func mergeListGroups(resps []kmsg.Response) *kmsg.ListGroupsResponse {
	out := kmsg.NewPtrListGroupsResponse()
	seen := map[string]bool{}
	for _, r := range resps {
		lg, ok := r.(*kmsg.ListGroupsResponse)
		if !ok {
			lg = &kmsg.ListGroupsResponse{ErrorCode: errCoordinatorNotAvailable}
		}
		if out.ErrorCode == 0 {
			out.ErrorCode = lg.ErrorCode
		}
		out.ThrottleMillis = max(out.ThrottleMillis, lg.ThrottleMillis)
		for _, g := range lg.Groups {
			if !seen[g.Group] {
				seen[g.Group] = true
				out.Groups = append(out.Groups, g)
			}
		}
	}
	return out
}

// send hands req to its destination; done gets the answer, or
// COORDINATOR_NOT_AVAILABLE if there is none. The requests of group
// members, local or relayed, go through the member tracker
// (relay_members.go), which may answer UNKNOWN_MEMBER_ID instead.
func (r *Router) send(d dest, c Client, req kmsg.Request, done func(kmsg.Response)) {
	r.sendTo(d, c, req, done, nil)
}

// sendTo is send; when took is not nil, an answer the owner gave (not
// one the relay made up) is first offered to took, and done is not
// called when took returns true (took then answers through done).
func (r *Router) sendTo(d dest, c Client, req kmsg.Request, done func(kmsg.Response), took func(resp kmsg.Response, handedBack bool) bool) {
	start := time.Now()
	key := req.Key()
	mr, tracked := memberOf(req)
	mr.dest = d.memberDest()
	var counted bool
	if tracked {
		var expired bool
		if expired, counted = r.members.begin(mr, start); expired {
			r.metrics.record(key, outcomeMemberExpired, 0)
			done(codec.GroupErrorResponse(req, errUnknownMemberID))
			return
		}
	}
	var leave *kmsg.LeaveGroupRequest
	var leave848 *memberKey
	switch q := req.(type) {
	case *kmsg.LeaveGroupRequest:
		leave = CloneRequest(q).(*kmsg.LeaveGroupRequest) // read after Handle returned
	case *kmsg.ConsumerGroupHeartbeatRequest:
		if q.MemberEpoch < 0 {
			leave848 = &memberKey{q.Group, q.MemberID}
		}
	}
	// finish tells the tracker how the request ended.
	finish := func(resp kmsg.Response, o outcome) {
		switch {
		case tracked:
			r.members.end(mr, counted, start, time.Now(), resp, o)
		case o != outcomeOK:
		case leave != nil:
			r.members.left(leave)
		case leave848 != nil:
			if cr, ok := resp.(*kmsg.ConsumerGroupHeartbeatResponse); ok && cr.ErrorCode == 0 {
				r.members.left848(leave848.group, leave848.member)
			}
		}
	}
	if d.local {
		if r.cfg.Local == nil {
			finish(nil, outcomeNoOwner)
			done(codec.GroupErrorResponse(req, errCoordinatorNotAvailable))
			return
		}
		group, watch := storeBound(req)
		if !watch {
			r.cfg.Local.Handle(c, req, func(resp kmsg.Response) {
				finish(resp, outcomeOK)
				done(resp)
			})
			return
		}
		// Answered COORDINATOR_NOT_AVAILABLE at once should the group
		// stop being served here while the store holds the answer.
		fallback := codec.GroupErrorResponse(req, errCoordinatorNotAvailable) // req is not read after Handle returns
		whileServed(func() bool {
			d, ok := r.locate(group)
			return ok && d.local
		}, func(reply func(kmsg.Response)) {
			r.cfg.Local.Handle(c, req, reply)
		}, func(resp kmsg.Response) {
			finish(resp, outcomeOK)
			done(resp)
		}, func() {
			r.metrics.record(key, outcomeNoOwner, time.Since(start))
			finish(nil, outcomeNoOwner)
			done(fallback)
		})
		return
	}
	r.pool.do(d.addr, c, req, r.timeoutFor(req), func(resp kmsg.Response, o outcome, handedBack bool) {
		r.metrics.record(key, o, time.Since(start))
		finish(resp, o)
		if o == outcomeOK && took != nil && took(resp, handedBack) {
			return
		}
		if o != outcomeOK {
			if tracked {
				r.failMember(mr, req, done)
				return
			}
			resp = codec.GroupErrorResponse(req, errCoordinatorNotAvailable)
		}
		done(resp)
	})
}

// failMember answers a request of member mr that did not reach an owner.
// When the member is about to be told to give up (within RelayTimeout),
// the answer waits for that moment and is UNKNOWN_MEMBER_ID: the member
// then learns it on time whatever its client's retry backoff after
// COORDINATOR_NOT_AVAILABLE (franz-go's grows to 5s). Otherwise it is
// COORDINATOR_NOT_AVAILABLE at once.
func (r *Router) failMember(mr memberReq, req kmsg.Request, done func(kmsg.Response)) {
	// Both answers are built now: req is not read once this returns.
	key := req.Key()
	unavailable := codec.GroupErrorResponse(req, errCoordinatorNotAvailable)
	expired := codec.GroupErrorResponse(req, errUnknownMemberID)
	answer := func() {
		// Where the group is now: a request that failed where the
		// group was may be answered up to a relay timeout later, when
		// the group has moved (its new owner, local or a peer, loaded it
		// with fresh session timers and answers for its member itself).
		// Told UNKNOWN_MEMBER_ID then, the member dropped an id its new
		// owner still held, and that owner's next rebalance waited a
		// session for it (seen on Kafka 4.1.1: the member on the healthy
		// kproxy told 12 ms before its group loaded there).
		now := mr
		if d, ok := r.locate(mr.key.group); ok {
			now.dest = d.memberDest()
		}
		if r.members.check(now, time.Now()) {
			r.metrics.record(key, outcomeMemberExpired, 0)
			done(expired)
			return
		}
		done(unavailable)
	}
	wait, ok := r.members.untilVerdict(mr, time.Now())
	if !ok || wait <= 0 || wait > r.cfg.RelayTimeout || r.movedFrom(mr) {
		answer()
		return
	}
	// The wait ends early when the group moves: its new owner answers
	// for the member (COORDINATOR_NOT_AVAILABLE now sends the client
	// there), where holding the answer to the verdict moment held up
	// every later answer on the member's connection. Seen on Kafka
	// 4.1.1 (fault-owner-upstream-responses-held): the group moved to
	// this kproxy 4 s into the fault, the member's relayed commit was
	// answered 8 s in, and its heartbeats' answers waited behind it.
	r.goWait(func() {
		t := time.NewTimer(wait)
		defer t.Stop()
		for {
			changed := r.loc.Changed() // before locating: no change is missed
			if r.movedFrom(mr) {
				answer()
				return
			}
			select {
			case <-t.C:
				answer()
				return
			case <-changed:
			case <-r.closing:
				done(unavailable)
				return
			}
		}
	})
}

// movedFrom reports whether mr's group is now located somewhere other
// than where mr was sent (mr.dest; "" when it had no owner).
func (r *Router) movedFrom(mr memberReq) bool {
	d, ok := r.locate(mr.key.group)
	return ok && d.memberDest() != mr.dest
}

// storeBound names the group of a request whose local answer may wait
// for a store write: OffsetCommit, SyncGroup (the leader's) and
// ConsumerGroupHeartbeat (a new epoch or assignment). JoinGroup and
// SyncGroup parked for a rebalance are answered NOT_COORDINATOR by the
// engine's Unload.
func storeBound(req kmsg.Request) (group string, ok bool) {
	switch q := req.(type) {
	case *kmsg.OffsetCommitRequest:
		return q.Group, true
	case *kmsg.SyncGroupRequest:
		return q.Group, true
	case *kmsg.ConsumerGroupHeartbeatRequest:
		return q.Group, true
	}
	return "", false
}

// timeoutFor is how long a relayed request may wait for its answer. A
// JoinGroup is parked until the rebalance completes, at most its
// rebalance timeout (v0: its session timeout); a SyncGroup waits for the
// leader's, bounded by the same timeout, which the SyncGroup does not
// carry: it gets the longest rebalance timeout seen, at least Kafka's
// default. Both add RelayTimeout for the network and the store.
func (r *Router) timeoutFor(req kmsg.Request) time.Duration {
	switch q := req.(type) {
	case *kmsg.JoinGroupRequest:
		ms := q.RebalanceTimeoutMillis
		if q.Version == 0 {
			ms = q.SessionTimeoutMillis
		}
		ms = max(ms, 0)
		for {
			cur := r.maxRebalance.Load()
			if int64(ms) <= cur || r.maxRebalance.CompareAndSwap(cur, int64(ms)) {
				break
			}
		}
		return time.Duration(ms)*time.Millisecond + r.cfg.RelayTimeout
	case *kmsg.SyncGroupRequest:
		wait := max(defaultRebalanceTimeout, time.Duration(r.maxRebalance.Load())*time.Millisecond)
		return wait + r.cfg.RelayTimeout
	}
	return r.cfg.RelayTimeout
}

// goWait runs f on a goroutine that Close waits for; after Close, on the
// caller's (await then returns at once).
func (r *Router) goWait(f func()) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		f()
		return
	}
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// await polls located after every table change until it reports true,
// for at most WaitForOwner; false if it never did or the router closed.
func (r *Router) await(located func() bool) bool {
	t := time.NewTimer(r.cfg.WaitForOwner)
	defer t.Stop()
	for {
		changed := r.loc.Changed() // before locating: no change is missed
		if located() {
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return false
		case <-r.closing:
			return false
		}
	}
}
