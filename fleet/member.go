package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/classic"
)

// Owner is one entry of the fleet table: who owns a partition.
type Owner struct {
	// ID is the owner's kproxy id (Config.ID).
	ID string `json:"id"`
	// MemberID is the owner's member id in the fleet group.
	MemberID string `json:"member_id"`
	// Peer is the owner's advertised peer address.
	Peer string `json:"peer"`
	// Generation is the fleet generation since which this owner holds
	// the partition; it changes only when the partition moves.
	Generation int32 `json:"generation"`
}

// IsZero reports whether o is the zero Owner: the partition has no
// owner right now (it is in transition, or no member may own).
func (o Owner) IsZero() bool { return o.MemberID == "" }

// Status is a member's state: Snapshot returns it, and the admin
// server's /api/fleet serves it as its "member" (tap.FleetView). The JSON
// keys are a stable API: fields may be added, none renamed or dropped.
type Status struct {
	// ID is the kproxy id, MemberID its member id in the fleet group and
	// Peer its advertised peer address.
	ID       string `json:"id"`
	MemberID string `json:"member_id"`
	Peer     string `json:"peer"`
	// Owner is false for a relay (--fleet-role relay): it owns nothing.
	Owner bool `json:"owner"`
	// Group is the fleet group (__kproxy_fleet or __kproxy_fleet.<name>).
	Group string `json:"group"`
	// Generation is the fleet generation this member is in.
	Generation int32 `json:"generation"`
	// LeaderID is the member id of the fleet leader; Leader reports
	// whether that is this member.
	LeaderID string `json:"leader_member_id"`
	Leader   bool   `json:"leader"`
	// Joining is true while the member is between deciding to rejoin
	// and a successful JoinGroup.
	Joining bool `json:"joining"`
	// Table is indexed by partition: who owns each one; a zero Owner has
	// no owner now (in transition). It may be shorter than the groups
	// topic's partition count (empty before the first generation).
	Table []Owner `json:"table"`
	// Owned is what Owns is true for, ascending: the partitions assigned
	// to this member (served only once claimed).
	Owned []int32 `json:"owned"`
	// LeaseValid and LeaseRemaining: the lease and how long it still
	// holds (JSON in nanoseconds).
	LeaseValid     bool          `json:"lease_valid"`
	LeaseRemaining time.Duration `json:"lease_remaining_ns"`
	// Counters since New: generations this member completed (successful
	// SyncGroup), partitions gained, revoked (cooperatively given up)
	// and lost, and how often the member was fenced (unknown member,
	// illegal generation) and its lease ran out.
	Generations  uint64 `json:"generations"`
	Gained       uint64 `json:"gained"`
	Revoked      uint64 `json:"revoked"`
	Lost         uint64 `json:"lost"`
	Fenced       uint64 `json:"fenced"`
	LeaseExpired uint64 `json:"lease_expired"`
}

// Member is one kproxy's membership in the fleet group: the member loop
// against the brokers' coordinator, the lease and the table. Create it
// with New, run it with Run; Owns, LeaseValid, Table, OwnerOf, Snapshot,
// Changed and Drop may be called from any goroutine.
type Member struct {
	cfg  Config // immutable after New
	log  *slog.Logger
	base time.Time // immutable after New: the origin of every lease time

	// view is what Owns and LeaseValid read, lock-free: the owned bits
	// and the lease deadline, replaced whole (under mu) on every change.
	view atomic.Pointer[view]

	kick    chan struct{}  // buffered 1: pend changed, the loop should look
	leaveCh chan leaveReq  // Leave → loop
	running atomic.Bool    // Run was called
	done    chan struct{}  // closed when Run returns
	wg      sync.WaitGroup // the heartbeater and watchdog goroutines

	// Owned by the loop goroutine (Run).
	leaving *leaveReq       // a Leave that interrupted a request
	claimed map[int32]bool  // what the last JoinGroup's metadata claimed
	runCtx  context.Context // Run's context, parent of the heartbeaters

	mu sync.Mutex
	// Guarded by mu.
	memberID   string
	generation int32
	leaderID   string
	joining    bool
	owned      map[int32]int32 // p → generation since which it is ours
	table      []Owner
	changed    chan struct{}
	lease      leaseState
	hb         *heartbeater // the current one; a report from another is stale
	fenceEpoch uint64       // bumped when the membership is void; results of older requests are discarded
	cbCtx      context.Context
	cbCancel   context.CancelFunc
	pend       pending
	stats      Status // only the counter fields are used
}

// view is an immutable snapshot read by Owns.
type view struct {
	owned    []bool
	deadline time.Duration // since base; math.MinInt64 = no lease
}

// pending is what happened off the loop that the loop must act on.
type pending struct {
	lost   []int32 // removed from owned; OnLost not yet called
	rejoin bool    // a new generation is needed
	fresh  bool    // the member id is void: rejoin with an empty one
}

// leaseState holds the two lower bounds the lease is made of, as times
// since base measured with Config.Now when the proving request was sent.
type leaseState struct {
	armed bool
	// alive: the broker reset this member's session timer after this
	// time (a Heartbeat answered NONE or REBALANCE_IN_PROGRESS, or a
	// successful JoinGroup or SyncGroup, was sent then).
	alive time.Duration
	// stable: the group was not preparing a rebalance after this time
	// (a Heartbeat answered NONE, or a successful JoinGroup or
	// SyncGroup, was sent then), so any rebalance that could complete
	// without this member began later.
	stable time.Duration
}

type heartbeater struct {
	memberID string
	gen      int32
	cancel   context.CancelFunc
}

type leaveReq struct {
	ctx  context.Context
	done chan error
}

var errLeaving = errors.New("leaving")

// New validates cfg and returns a Member that has not joined yet.
func New(cfg Config) (*Member, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Member{
		cfg:     cfg,
		log:     cfg.Logger.With("fleet_group", cfg.Group, "fleet_id", cfg.ID),
		base:    cfg.Now(),
		kick:    make(chan struct{}, 1),
		leaveCh: make(chan leaveReq),
		done:    make(chan struct{}),
		owned:   make(map[int32]int32),
		table:   make([]Owner, cfg.Partitions),
		changed: make(chan struct{}),
	}
	m.cbCtx, m.cbCancel = context.WithCancel(context.Background())
	m.publishLocked()
	return m, nil
}

// now is the lease clock: time since base on Config.Now.
func (m *Member) now() time.Duration { return m.cfg.Now().Sub(m.base) }

// Owns reports whether p is assigned to this member in the current
// generation and the lease is valid. It is cheap (one atomic load and a
// clock read) and meant to be called per request.
func (m *Member) Owns(p int32) bool {
	v := m.view.Load()
	if p < 0 || int(p) >= len(v.owned) || !v.owned[p] {
		return false
	}
	return m.now() < v.deadline
}

// LeaseValid reports whether the lease is valid now: the coordinator
// cannot have handed this member's partitions to anyone else yet.
func (m *Member) LeaseValid() bool { return m.now() < m.view.Load().deadline }

// Table returns a copy of this member's latest view of the table,
// indexed by partition; a zero Owner means no owner right now. Entries
// naming other members are as of the last SyncGroup (an owner that moved
// answers NOT_COORDINATOR); entries naming this member are cleared the
// moment it stops owning. Owns is authoritative for this member.
func (m *Member) Table() []Owner {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.table)
}

// OwnerOf returns the table entry of p (zero if p is out of range).
func (m *Member) OwnerOf(p int32) Owner {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p < 0 || int(p) >= len(m.table) {
		return Owner{}
	}
	return m.table[p]
}

// Changed returns a channel that is closed when the table changes
// (then a new one is returned): relays waiting for an owner wait on it.
func (m *Member) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// Snapshot returns the member's state for /api/fleet.
func (m *Member) Snapshot() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.ID, s.MemberID, s.Peer, s.Owner, s.Group = m.cfg.ID, m.memberID, m.cfg.PeerAddr, m.cfg.Owner, m.cfg.Group
	s.Generation, s.LeaderID, s.Joining = m.generation, m.leaderID, m.joining
	s.Leader = m.memberID != "" && m.leaderID == m.memberID
	s.Table = slices.Clone(m.table)
	s.Owned = slices.Sorted(maps.Keys(m.owned))
	if s.Owned == nil {
		s.Owned = []int32{}
	}
	if rem := remaining(m.view.Load().deadline, m.now()); rem > 0 {
		s.LeaseValid, s.LeaseRemaining = true, rem
	}
	return s
}

// Drop makes this member stop owning p at once, because the owner
// failed it (its transactional writes were fenced). OnLost([p]) follows
// on the loop, like every other loss, and the member rejoins so the
// leader reassigns p.
func (m *Member) Drop(p int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.owned[p]; ok {
		m.log.Warn("fleet partition dropped", "partition", p)
		m.loseLocked([]int32{p})
	}
}

// Leave leaves the fleet gracefully (SIGTERM): OnRevoked with everything
// this member owns, then LeaveGroup, then Run returns nil. It returns the
// LeaveGroup error, or ctx's error if ctx ends first (OnRevoked's ctx is
// derived from it). Leave on a Member whose Run is not running returns
// nil.
func (m *Member) Leave(ctx context.Context) error {
	if !m.running.Load() {
		return nil
	}
	r := leaveReq{ctx: ctx, done: make(chan error, 1)}
	select {
	case m.leaveCh <- r:
	case <-m.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ---- state changes, all under mu ----

// publishLocked replaces the view Owns reads.
func (m *Member) publishLocked() {
	v := &view{owned: make([]bool, m.cfg.Partitions), deadline: m.deadlineLocked()}
	for p := range m.owned {
		v.owned[p] = true
	}
	m.view.Store(v)
}

// deadlineLocked is the lease: valid while now is before
//
//	min(alive + SessionTimeout, stable + RebalanceTimeout) - LeaseMargin.
//
// The first bound is the session: the broker expels a member a session
// after it received the member's last heartbeat, which it received after
// the heartbeat was sent. The second is the rebalance: a rebalance the
// member is not part of completes without it at the earliest a rebalance
// timeout after it began, and it began after the last moment the member
// saw the group not rebalancing. (The join's own start is not a bound: the
// rebalance may have begun before the member noticed it.)
func (m *Member) deadlineLocked() time.Duration {
	l := m.lease
	if !l.armed {
		return math.MinInt64
	}
	return min(l.alive+m.cfg.SessionTimeout, l.stable+m.cfg.RebalanceTimeout) - m.cfg.LeaseMargin
}

// remaining is how long a lease with deadline lasts after now (<= 0:
// expired or none).
func remaining(deadline, now time.Duration) time.Duration {
	if deadline == math.MinInt64 {
		return 0
	}
	return deadline - now
}

// proveLocked records that a request sent at sent proved the membership
// (alive) and, if stable, that the group was not rebalancing. It first
// ends ownership if the lease already ran out, so a late proof never
// revives a lease that Owns has already seen expire.
func (m *Member) proveLocked(sent time.Duration, stable bool) {
	m.checkExpiryLocked(m.now())
	if !m.lease.armed {
		m.lease = leaseState{armed: true, alive: sent, stable: sent}
	} else {
		m.lease.alive = max(m.lease.alive, sent)
		if stable {
			m.lease.stable = max(m.lease.stable, sent)
		}
	}
	m.publishLocked()
}

// checkExpiryLocked loses everything owned if the lease ran out.
func (m *Member) checkExpiryLocked(now time.Duration) {
	if len(m.owned) == 0 || now < m.deadlineLocked() {
		return
	}
	m.stats.LeaseExpired++
	m.log.Warn("fleet lease expired, dropping owned partitions and leaving to rejoin fresh", "owned", len(m.owned),
		"lease_overdue", -remaining(m.deadlineLocked(), now), "member_id", m.memberID)
	m.loseAllLocked()
	m.abandonLocked()
}

// abandonLocked gives up the membership whose lease ran out: its
// heartbeats stop, a LeaveGroup for it goes out without anyone waiting
// for the answer, and the member rejoins with a fresh id.
//
// A lease runs out when no heartbeat was answered for the session minus
// the margin. The coordinator expires a member a session after the last
// heartbeat it received; but where only the answers are lost (a one-way
// partition), the heartbeats heartbeatLoop keeps sending arrive, and the
// coordinator keeps the member and with it the partitions this kproxy
// just dropped: nobody served them for 13 s of a 30 s fault
// (fault-owner-upstream-responses-held) where the coordinator, told
// nothing, would have moved them after a session. Kafka's own consumer
// sends no heartbeat while one is unanswered, so its coordinator
// expires it; this member stops its heartbeats here. The LeaveGroup,
// where it gets through, hands the partitions on at once; one delivered
// late (after heal) names a member id no longer used.
func (m *Member) abandonLocked() {
	id := m.memberID
	m.fenceEpoch++ // a join in flight under the old id is void
	m.lease = leaseState{}
	m.stopHeartbeatLocked()
	m.pend.fresh = true
	m.publishLocked()
	if id == "" || m.runCtx == nil {
		return
	}
	ctx := m.runCtx
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		ctx, cancel := context.WithTimeout(ctx, m.cfg.SessionTimeout)
		defer cancel()
		req := classic.Member{Group: m.cfg.Group, MemberID: id}.Leave("kproxy's fleet lease ran out")
		if resp, err := req.RequestWith(ctx, m.cfg.Client); err != nil {
			m.log.Debug("fleet: the leave of a membership whose lease ran out got no answer", "member_id", id, "err", err)
		} else if err := classic.LeaveError(resp); err != nil {
			m.log.Debug("fleet: the leave of a membership whose lease ran out", "member_id", id, "err", err)
		}
	}()
}

// fenceLocked voids the membership: the coordinator no longer knows
// this member (or its generation). Everything owned is lost, the lease
// and the heartbeater stop, and the member rejoins with a fresh id.
func (m *Member) fenceLocked(why string) {
	m.stats.Fenced++
	m.log.Warn("fleet membership lost, rejoining fresh", "reason", why, "member_id", m.memberID, "owned", len(m.owned))
	m.loseAllLocked()
	m.fenceEpoch++
	m.lease = leaseState{}
	m.stopHeartbeatLocked()
	m.pend.fresh = true
	m.publishLocked()
}

// loseAllLocked loses everything owned and cancels the callbacks' ctx.
func (m *Member) loseAllLocked() {
	m.loseLocked(slices.Sorted(maps.Keys(m.owned)))
	m.cbCancel()
}

// loseLocked removes ps from owned (Owns turns false), clears this
// member's table entries for them, queues OnLost and asks for a rejoin.
func (m *Member) loseLocked(ps []int32) {
	if len(ps) > 0 {
		for _, p := range ps {
			delete(m.owned, p)
		}
		m.stats.Lost += uint64(len(ps))
		m.pend.lost = append(m.pend.lost, ps...)
		m.clearSelfLocked()
		m.publishLocked()
	}
	m.pend.rejoin = true
	m.kickLocked()
}

// clearSelfLocked clears table entries naming this member for
// partitions it no longer owns.
func (m *Member) clearSelfLocked() {
	t := slices.Clone(m.table)
	for p, o := range t {
		if _, ok := m.owned[int32(p)]; !ok && o.MemberID != "" && o.MemberID == m.memberID {
			t[p] = Owner{}
		}
	}
	m.setTableLocked(t)
}

func (m *Member) setTableLocked(t []Owner) {
	if slices.Equal(t, m.table) {
		return
	}
	m.table = t
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *Member) kickLocked() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *Member) stopHeartbeatLocked() {
	if m.hb != nil {
		m.hb.cancel()
		m.hb = nil
	}
}

// startHeartbeatLocked replaces the heartbeater with one for memberID
// in gen.
func (m *Member) startHeartbeatLocked(memberID string, gen int32) {
	m.stopHeartbeatLocked()
	ctx, cancel := context.WithCancel(m.runCtx)
	h := &heartbeater{memberID: memberID, gen: gen, cancel: cancel}
	m.hb = h
	m.wg.Add(1)
	go m.heartbeatLoop(ctx, h)
}

// ---- the heartbeater and the watchdog ----

// heartbeatLoop heartbeats for one (member id, generation) until
// replaced. It keeps going while the loop rejoins and while callbacks
// run: answers REBALANCE_IN_PROGRESS keep the session (and the lease)
// alive during a rebalance.
//
// A heartbeat goes out every HeartbeatInterval whether or not the ones
// before were answered, each waiting up to SessionTimeout-LeaseMargin
// (past that its proof is worth nothing). Waiting for each answer before
// sending the next, on a link with 2 s round trips and a 6 s session, a
// heartbeat went out every 2 s, timed out at session/3 = 2 s, and the
// newest proof was always a round trip old: the lease (send time +
// session - margin) ran out at the very moment the next answer came, and
// kproxy dropped every partition it owned over and over while a direct
// client on the same link kept its session (fault-owner-upstream-slow-2s).
func (m *Member) heartbeatLoop(ctx context.Context, h *heartbeater) {
	defer m.wg.Done()
	defer h.cancel()
	timeout := max(m.cfg.HeartbeatInterval, m.cfg.SessionTimeout-m.cfg.LeaseMargin)
	// At most one heartbeat per interval is in flight per timeout.
	slots := make(chan struct{}, max(1, int(timeout/m.cfg.HeartbeatInterval)+1))
	var inflight sync.WaitGroup
	defer inflight.Wait()
	t := time.NewTicker(m.cfg.HeartbeatInterval)
	defer t.Stop()
	var lastErr string // guarded by m.mu
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		select {
		case slots <- struct{}{}:
		default:
			continue // every slot waits on a slow answer; the next tick tries again
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer func() { <-slots }()
			sent := m.now()
			req := classic.Member{Group: m.cfg.Group, MemberID: h.memberID, Generation: h.gen}.Heartbeat()
			rctx, cancel := context.WithTimeout(ctx, timeout)
			resp, err := req.RequestWith(rctx, m.cfg.Client)
			cancel()
			if ctx.Err() != nil {
				return
			}
			var code error
			if err == nil {
				code = kerr.ErrorForCode(resp.ErrorCode)
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.hb != h {
				h.cancel()
				return
			}
			switch {
			case err != nil:
				if s := err.Error(); s != lastErr {
					m.log.Info("fleet heartbeat failed", "err", err)
					lastErr = s
				}
				m.checkExpiryLocked(m.now())
			case code == nil:
				lastErr = ""
				m.proveLocked(sent, true)
			case errors.Is(code, kerr.RebalanceInProgress):
				m.proveLocked(sent, false)
				if !m.joining {
					m.pend.rejoin = true
					m.kickLocked()
				}
			case errors.Is(code, kerr.UnknownMemberID), errors.Is(code, kerr.FencedInstanceID):
				m.fenceLocked("heartbeat: " + code.Error())
			case errors.Is(code, kerr.IllegalGeneration) && !m.joining:
				m.fenceLocked("heartbeat: " + code.Error())
			default:
				// While joining, ILLEGAL_GENERATION only says the group
				// moved on; the join tells whether with this member.
				m.checkExpiryLocked(m.now())
			}
		}()
	}
}

// watchdog ends ownership the moment the lease runs out, even while the
// heartbeater waits for an answer and the loop runs a callback.
func (m *Member) watchdog(ctx context.Context) {
	defer m.wg.Done()
	tick := max(m.cfg.HeartbeatInterval/4, time.Millisecond)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		now := m.now()
		m.checkExpiryLocked(now)
		wait := tick
		if d := remaining(m.deadlineLocked(), now); len(m.owned) > 0 && d > 0 && d < wait {
			wait = d
		}
		m.mu.Unlock()
		t.Reset(wait)
	}
}

// ---- the member loop ----

// Run joins the fleet and runs the member loop until ctx is done or
// Leave completes. It rejoins after errors with backoff. When ctx ends
// without Leave it sends no LeaveGroup (the coordinator expires the
// member a session later) and calls OnLost with whatever was owned.
// Run returns nil after Leave or ctx, and an error only if it was
// already called.
func (m *Member) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return errors.New("fleet: Run called twice")
	}
	defer close(m.done)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.runCtx = runCtx
	m.mu.Lock()
	m.cbCtx, m.cbCancel = context.WithCancel(runCtx)
	m.mu.Unlock()
	m.wg.Add(1)
	go m.watchdog(runCtx)

	m.loop(runCtx)

	if m.leaving != nil {
		m.leaving.done <- m.leave(m.leaving.ctx)
	}
	cancel()
	m.mu.Lock()
	lost := append(m.pend.lost, slices.Sorted(maps.Keys(m.owned))...)
	m.stats.Lost += uint64(len(m.owned))
	clear(m.owned)
	m.pend = pending{}
	m.lease = leaseState{}
	m.joining = false
	m.stopHeartbeatLocked()
	m.clearSelfLocked()
	m.publishLocked()
	m.mu.Unlock()
	m.wg.Wait()
	if len(lost) > 0 {
		m.cfg.OnLost(lost)
	}
	return nil
}

// loop runs until ctx is done or a Leave arrived (m.leaving).
func (m *Member) loop(ctx context.Context) {
	const minBackoff, maxBackoff = 50 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	for ctx.Err() == nil && m.leaving == nil {
		jr, err := m.join(ctx)
		if err == nil {
			var doc assignmentDoc
			doc, err = m.sync(ctx, jr)
			if err == nil {
				backoff = minBackoff
				if rejoin := m.apply(jr, doc); rejoin {
					continue
				}
				m.await(ctx, nil, true)
				continue
			}
		}
		switch {
		case errors.Is(err, errLeaving), ctx.Err() != nil:
			return
		case errors.Is(err, errRejoin):
			continue
		}
		m.log.Info("fleet rejoin after error", "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		m.await(ctx, t.C, false)
		t.Stop()
		backoff = min(2*backoff, maxBackoff)
	}
}

// learnTableTimeout bounds one of learnTable's DescribeGroups, which a
// fresh join waits for.
const learnTableTimeout = 2 * time.Second

// learnTable reads the fleet group's current table from the cluster
// (DescribeGroups of a Stable group: each member's assignment carries
// the whole table; Kafka describes a rebalancing group's members without
// their assignments, so it is read before the join) and, if it is of a
// later generation than gen (this member's last) and no generation was
// applied since, takes it for routing. A member joining afresh knows no
// owner for the partitions it held before (its own entries were cleared)
// and nothing of moves since its lease ran out, while its JoinGroup waits
// at the broker until every other member rejoined, up to a heartbeat
// interval and more: meanwhile the relays would hold every request of
// those groups. Routing by the cluster's current table is safe whatever
// it says: an owner answers only for the groups it owns (NOT_COORDINATOR
// otherwise), and this member's own entries are left out, so it serves
// nothing until its join completes.
//
// It returns an error only when the cluster gave no answer (or ctx ended,
// or a Leave arrived: errLeaving); any answer, a group not Stable or not
// found included, is nil.
func (m *Member) learnTable(ctx context.Context, gen int32) error {
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{m.cfg.Group}
	resp, err := request[*kmsg.DescribeGroupsResponse](m, ctx, learnTableTimeout, req)
	if err != nil {
		return err
	}
	if len(resp.Groups) != 1 || resp.Groups[0].ErrorCode != 0 || resp.Groups[0].State != "Stable" {
		return nil
	}
	var doc assignmentDoc
	for _, gm := range resp.Groups[0].Members {
		d, err := decodeAssignment(gm.MemberAssignment)
		if err == nil && d.Partitions == m.cfg.Partitions && d.Gen > doc.Gen {
			doc = d
		}
	}
	if doc.Gen <= gen {
		return nil
	}
	table := make([]Owner, m.cfg.Partitions)
	for _, e := range doc.Table {
		if e.ID != m.cfg.ID {
			table[e.P] = Owner{ID: e.ID, MemberID: e.MemberID, Peer: e.Peer, Generation: e.Gen}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.generation != gen || len(m.owned) > 0 {
		return nil // a generation was applied meanwhile
	}
	m.setTableLocked(table)
	m.log.Debug("fleet: table read from the cluster while joining", "generation", doc.Gen, "partitions", len(doc.Table))
	return nil
}

// learnTableUntilAnswered calls learnTable until the cluster answers it,
// at most one attempt per learnTableRetry. A fresh join sends no
// JoinGroup before: one sent while this kproxy is cut off from the
// brokers is held by the partition and reaches the coordinator when it
// heals, and the rebalance it starts makes the group unreadable
// (rebalancing) until the other members rejoin at their next heartbeat,
// so the relays would hold the groups this member routes until then
// (0.5 s after a 35 s cut in fault-owner-upstream-cut, where a describe
// answered at the heal routes them at once).
func (m *Member) learnTableUntilAnswered(ctx context.Context, gen int32) error {
	for {
		start := time.Now()
		err := m.learnTable(ctx, gen)
		if err == nil || errors.Is(err, errLeaving) || ctx.Err() != nil {
			return err
		}
		m.log.Debug("fleet: no answer to reading the table before a fresh join; trying again", "err", err)
		if wait := learnTableRetry - time.Since(start); wait > 0 {
			t := time.NewTimer(wait)
			m.await(ctx, t.C, false)
			t.Stop()
			if m.leaving != nil {
				return errLeaving
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
}

// learnTableRetry is the least time between two attempts of
// learnTableUntilAnswered (one that fails at once, as when the client is
// refused a connection, would otherwise spin).
const learnTableRetry = 100 * time.Millisecond

// errRejoin says a new JoinGroup is needed now (not an error to back off
// from).
var errRejoin = errors.New("rejoin")

// await blocks until ready fires, ctx is done, a Leave arrives (stored
// in m.leaving) or, with stopOnRejoin, a rejoin is asked for. It calls
// OnLost for losses as they are queued.
func (m *Member) await(ctx context.Context, ready <-chan time.Time, stopOnRejoin bool) {
	m.awaitCh(ctx, nil, ready, stopOnRejoin)
}

func (m *Member) awaitCh(ctx context.Context, done <-chan struct{}, ready <-chan time.Time, stopOnRejoin bool) {
	for {
		m.mu.Lock()
		lost := m.pend.lost
		m.pend.lost = nil
		rejoin := m.pend.rejoin
		m.mu.Unlock()
		if len(lost) > 0 {
			m.cfg.OnLost(lost)
		}
		if stopOnRejoin && rejoin {
			return
		}
		select {
		case <-done:
			return
		case <-ready:
			return
		case <-ctx.Done():
			return
		case r := <-m.leaveCh:
			m.leaving = &r
			return
		case <-m.kick:
		}
	}
}

// request sends req on the loop's behalf, giving up if ctx ends or a
// Leave arrives (errLeaving); OnLost keeps being delivered meanwhile.
func request[R kmsg.Response](m *Member, ctx context.Context, timeout time.Duration, req kmsg.Request) (R, error) {
	var zero R
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var (
		resp kmsg.Response
		err  error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err = m.cfg.Client.Request(rctx, req) // what req.RequestWith does: routed to the coordinator
	}()
	m.awaitCh(ctx, done, nil, false)
	select {
	case <-done:
	default: // ctx ended or a Leave arrived
		cancel()
		<-done
		if m.leaving != nil {
			return zero, errLeaving
		}
		return zero, ctx.Err()
	}
	if err != nil {
		return zero, err
	}
	r, ok := resp.(R)
	if !ok {
		return zero, fmt.Errorf("unexpected response type %T", resp)
	}
	return r, nil
}

// joinResult is a successful JoinGroup.
type joinResult struct {
	memberID string
	gen      int32
	leaderID string
	protocol string
	members  []kmsg.JoinGroupResponseMember
	epoch    uint64
}

// join sends JoinGroup until it succeeds (following MEMBER_ID_REQUIRED
// and fresh rejoins), or returns the error to back off from.
func (m *Member) join(ctx context.Context) (joinResult, error) {
	learned := false
	for attempt := 0; ; attempt++ {
		m.awaitDeliverLost()
		m.mu.Lock()
		if m.pend.fresh {
			m.pend.fresh = false
			m.memberID = ""
		}

		m.pend.rejoin = false
		m.joining = true
		memberID := m.memberID
		owned := make([]ownedPart, 0, len(m.owned))
		m.claimed = make(map[int32]bool, len(m.owned))
		for _, p := range slices.Sorted(maps.Keys(m.owned)) {
			owned = append(owned, ownedPart{P: p, Gen: m.owned[p]})
			m.claimed[p] = true
		}
		epoch := m.fenceEpoch
		gen := m.generation
		m.mu.Unlock()
		if memberID == "" && !learned {
			// Joining afresh (a first start, a lost lease): the join may
			// wait at the broker for the others to rejoin; the table is
			// read first, while the group is still Stable.
			if err := m.learnTableUntilAnswered(ctx, gen); err != nil {
				return joinResult{}, err
			}
			learned = true
		}

		proto := kmsg.NewJoinGroupRequestProtocol()
		proto.Name = ProtocolName
		proto.Metadata = encodeMeta(memberMeta{
			ID: m.cfg.ID, Peer: m.cfg.PeerAddr, Owner: m.cfg.Owner,
			Partitions: m.cfg.Partitions, Owned: owned,
		})
		req := classic.Join{
			Group: m.cfg.Group, MemberID: memberID, ProtocolType: ProtocolType,
			Protocols:      []kmsg.JoinGroupRequestProtocol{proto},
			SessionTimeout: m.cfg.SessionTimeout, RebalanceTimeout: m.cfg.RebalanceTimeout,
		}.Request()
		sent := m.now()
		resp, err := request[*kmsg.JoinGroupResponse](m, ctx, m.cfg.RebalanceTimeout+m.cfg.SessionTimeout, req)
		if err != nil {
			return joinResult{}, fmt.Errorf("joining fleet group %q: %w", m.cfg.Group, err)
		}
		code := kerr.ErrorForCode(resp.ErrorCode)
		switch {
		case code == nil:
		case errors.Is(code, kerr.MemberIDRequired) && attempt < 3:
			m.mu.Lock()
			m.memberID = resp.MemberID
			m.mu.Unlock()
			continue
		case (errors.Is(code, kerr.UnknownMemberID) || errors.Is(code, kerr.IllegalGeneration) ||
			errors.Is(code, kerr.FencedInstanceID)) && attempt < 3:
			m.mu.Lock()
			m.fenceLocked("join: " + code.Error())
			m.mu.Unlock()
			continue
		default:
			return joinResult{}, fmt.Errorf("joining fleet group %q: %w", m.cfg.Group, code)
		}

		m.mu.Lock()
		if m.fenceEpoch != epoch { // voided while the join was in flight
			m.mu.Unlock()
			continue
		}
		m.memberID = resp.MemberID
		m.generation = resp.Generation
		m.leaderID = resp.LeaderID
		m.joining = false
		m.proveLocked(sent, true)
		m.startHeartbeatLocked(resp.MemberID, resp.Generation)
		m.mu.Unlock()
		protocol := ""
		if resp.Protocol != nil {
			protocol = *resp.Protocol
		}
		return joinResult{
			memberID: resp.MemberID, gen: resp.Generation, leaderID: resp.LeaderID,
			protocol: protocol, members: resp.Members, epoch: epoch,
		}, nil
	}
}

// awaitDeliverLost calls OnLost for queued losses without waiting.
func (m *Member) awaitDeliverLost() {
	m.mu.Lock()
	lost := m.pend.lost
	m.pend.lost = nil
	m.mu.Unlock()
	if len(lost) > 0 {
		m.cfg.OnLost(lost)
	}
}

// sync sends SyncGroup, with the assignment if this member leads.
func (m *Member) sync(ctx context.Context, jr joinResult) (assignmentDoc, error) {
	var assignments []kmsg.SyncGroupRequestGroupAssignment
	if jr.leaderID == jr.memberID {
		assignments = m.leaderAssign(jr)
	}
	req := classic.Member{Group: m.cfg.Group, MemberID: jr.memberID, Generation: jr.gen}.Sync(ProtocolType, jr.protocol, assignments)
	sent := m.now()
	resp, err := request[*kmsg.SyncGroupResponse](m, ctx, m.cfg.RebalanceTimeout+m.cfg.SessionTimeout, req)
	if err != nil {
		return assignmentDoc{}, fmt.Errorf("syncing fleet group %q: %w", m.cfg.Group, err)
	}
	code := kerr.ErrorForCode(resp.ErrorCode)
	switch {
	case code == nil:
	case errors.Is(code, kerr.RebalanceInProgress):
		return assignmentDoc{}, errRejoin
	case errors.Is(code, kerr.UnknownMemberID), errors.Is(code, kerr.IllegalGeneration), errors.Is(code, kerr.FencedInstanceID):
		m.mu.Lock()
		if m.fenceEpoch == jr.epoch {
			m.fenceLocked("sync: " + code.Error())
		}
		m.mu.Unlock()
		return assignmentDoc{}, errRejoin
	default:
		return assignmentDoc{}, fmt.Errorf("syncing fleet group %q: %w", m.cfg.Group, code)
	}
	doc, err := decodeAssignment(resp.MemberAssignment)
	if err != nil {
		// Without a readable assignment this member cannot know what
		// it may own: give everything up and try again.
		m.mu.Lock()
		if m.fenceEpoch == jr.epoch {
			m.loseAllLocked()
		}
		m.mu.Unlock()
		return assignmentDoc{}, fmt.Errorf("fleet group %q generation %d: %w", m.cfg.Group, jr.gen, err)
	}
	m.mu.Lock()
	if m.fenceEpoch == jr.epoch {
		m.proveLocked(sent, true)
	}
	m.mu.Unlock()
	return doc, nil
}

// leaderAssign runs the assignor over the JoinGroup members.
func (m *Member) leaderAssign(jr joinResult) []kmsg.SyncGroupRequestGroupAssignment {
	in := make([]assignInput, 0, len(jr.members))
	for _, jm := range jr.members {
		meta, err := decodeMeta(jm.ProtocolMetadata)
		if err != nil {
			m.log.Warn("fleet member metadata unreadable, treating it as a relay", "member_id", jm.MemberID, "err", err)
			meta = memberMeta{}
		} else if meta.Partitions != m.cfg.Partitions {
			m.log.Warn("fleet member configured with another partition count", "member_id", jm.MemberID,
				"id", meta.ID, "its_partitions", meta.Partitions, "partitions", m.cfg.Partitions)
		}
		in = append(in, assignInput{MemberID: jm.MemberID, Meta: meta})
	}
	pl := assign(m.cfg.Partitions, jr.gen, in)
	if len(pl.Contested) > 0 {
		m.log.Warn("fleet partitions claimed by more than one member, leaving them unassigned", "partitions", pl.Contested)
	}
	doc := assignmentDoc{Gen: jr.gen, Leader: m.cfg.ID, Partitions: m.cfg.Partitions}
	for p, o := range pl.Table {
		if !o.IsZero() {
			doc.Table = append(doc.Table, tableEntry{P: int32(p), ID: o.ID, MemberID: o.MemberID, Peer: o.Peer, Gen: o.Generation})
		}
	}
	out := make([]kmsg.SyncGroupRequestGroupAssignment, 0, len(in))
	for _, a := range in {
		d := doc
		d.Yours = pl.Yours[a.MemberID]
		sa := kmsg.NewSyncGroupRequestGroupAssignment()
		sa.MemberID = a.MemberID
		sa.MemberAssignment = encodeAssignment(d)
		out = append(out, sa)
	}
	return out
}

// apply installs a generation's assignment: partitions kept stay, gained
// ones go to OnAssigned, owned ones missing go to OnRevoked. It reports
// whether the member must rejoin at once: a partition it claimed was not
// given to it, so the leader waits for a generation where it is free.
func (m *Member) apply(jr joinResult, doc assignmentDoc) (rejoin bool) {
	if doc.Partitions != m.cfg.Partitions {
		m.log.Warn("fleet assignment for another partition count", "its_partitions", doc.Partitions, "partitions", m.cfg.Partitions)
	}
	table := make([]Owner, m.cfg.Partitions)
	for _, e := range doc.Table {
		if e.P < m.cfg.Partitions {
			table[e.P] = Owner{ID: e.ID, MemberID: e.MemberID, Peer: e.Peer, Generation: e.Gen}
		}
	}
	mine := make(map[int32]bool, len(doc.Yours))
	for _, p := range doc.Yours {
		if p < m.cfg.Partitions && table[p].MemberID == jr.memberID {
			mine[p] = true
		} else {
			m.log.Warn("fleet assignment gives a partition the table does not", "partition", p)
		}
	}

	m.mu.Lock()
	if m.fenceEpoch != jr.epoch { // fenced since: this generation is void
		m.mu.Unlock()
		return true
	}
	// A lease that ran out since the sync was answered loses what is
	// owned (OnLost) and accepts nothing new; the member rejoins.
	now := m.now()
	m.checkExpiryLocked(now)
	leaseOK := now < m.deadlineLocked()
	var revoked, gained []int32
	for _, p := range slices.Sorted(maps.Keys(m.owned)) {
		if !mine[p] {
			revoked = append(revoked, p)
			delete(m.owned, p)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(mine)) {
		if _, ok := m.owned[p]; !ok && leaseOK {
			gained = append(gained, p)
			m.owned[p] = table[p].Generation
		}
	}
	if !leaseOK {
		rejoin = true
	}
	for p := range m.claimed {
		if !mine[p] {
			rejoin = true
		}
	}
	m.generation = jr.gen
	m.setTableLocked(table)
	m.clearSelfLocked()
	m.stats.Generations++
	m.stats.Gained += uint64(len(gained))
	m.stats.Revoked += uint64(len(revoked))
	m.publishLocked()
	if m.cbCtx.Err() != nil {
		m.cbCtx, m.cbCancel = context.WithCancel(m.runCtx)
	}
	cbCtx := m.cbCtx
	rejoin = rejoin || m.pend.rejoin
	m.mu.Unlock()

	m.log.Info("fleet generation", "generation", jr.gen, "member_id", jr.memberID, "leader", jr.leaderID == jr.memberID,
		"owned", len(mine), "gained", gained, "revoked", revoked, "rejoin", rejoin)
	if len(revoked) > 0 {
		m.cfg.OnRevoked(cbCtx, revoked)
	}
	if len(gained) > 0 {
		actx, cancel := context.WithTimeout(cbCtx, m.cfg.RebalanceTimeout)
		m.cfg.OnAssigned(actx, jr.gen, gained)
		cancel()
	}
	m.mu.Lock()
	rejoin = rejoin || m.pend.rejoin
	m.mu.Unlock()
	return rejoin
}

// leave gives everything up (OnRevoked), then sends LeaveGroup.
func (m *Member) leave(ctx context.Context) error {
	m.mu.Lock()
	revoked := slices.Sorted(maps.Keys(m.owned))
	clear(m.owned)
	m.stats.Revoked += uint64(len(revoked))
	m.clearSelfLocked()
	m.publishLocked()
	cbCtx := m.cbCtx
	m.mu.Unlock()

	if len(revoked) > 0 {
		rctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(cbCtx, cancel)
		m.cfg.OnRevoked(rctx, revoked)
		stop()
		cancel()
	}

	m.mu.Lock()
	memberID := m.memberID
	m.stopHeartbeatLocked()
	m.lease = leaseState{}
	m.memberID = ""
	m.fenceEpoch++
	m.publishLocked()
	m.mu.Unlock()
	if memberID == "" {
		return nil
	}
	req := classic.Member{Group: m.cfg.Group, MemberID: memberID}.Leave("kproxy leaving the fleet")
	resp, err := req.RequestWith(ctx, m.cfg.Client)
	if err != nil {
		return fmt.Errorf("leaving fleet group %q: %w", m.cfg.Group, err)
	}
	if err := classic.LeaveError(resp); err != nil {
		return fmt.Errorf("leaving fleet group %q as %s: %w", m.cfg.Group, memberID, err)
	}
	m.log.Info("fleet left", "member_id", memberID, "revoked", revoked)
	return nil
}
