package groupstate

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Config configures an Engine. The zero value of every field except Store
// is a documented default.
type Config struct {
	// Clock is the engine's only source of time; nil means the real clock.
	Clock Clock
	// Store persists offsets; it is required. If it also implements
	// GroupMetadataStore, group metadata is persisted and reloaded so
	// that a restart forces no rebalance (classic_persist.go).
	Store OffsetStore
	// Logger receives the engine's logs; nil discards them.
	Logger *slog.Logger
	// Events receives every state change. It is called on the goroutine
	// of the loop that owns the group and must not block; nil drops
	// events.
	Events func(Event)
	// Shards is the number of event loops; 0 means runtime.GOMAXPROCS(0).
	Shards int
	// MinSessionTimeout and MaxSessionTimeout bound the session timeout a
	// JoinGroup may ask for (group.min/max.session.timeout.ms); 0 means
	// 6s and 30m.
	MinSessionTimeout, MaxSessionTimeout time.Duration
	// InitialRebalanceDelay delays the first rebalance of an empty group
	// (group.initial.rebalance.delay.ms); 0 means 3s, negative means no
	// delay.
	InitialRebalanceDelay time.Duration
	// MaxGroupSize limits the members of a group (group.max.size); 0
	// means unlimited.
	MaxGroupSize int
	// NewMemberJoinTimeout removes a new member that does not complete
	// its first join (KAFKA-7610); 0 means 5m.
	NewMemberJoinTimeout time.Duration
	// CheckCommitOwnership rejects commits for partitions that the
	// committing member was not assigned in the current generation. The
	// assignment is decoded from the standard consumer protocol; groups of
	// other protocol types, and assignments that do not decode, are not
	// checked.
	CheckCommitOwnership bool
	// StoreTimeout bounds every store call; 0 means 30s.
	StoreTimeout time.Duration
	// ConsumerSessionTimeout is the session timeout of KIP-848 members
	// (group.consumer.session.timeout.ms); 0 means 45s. It must lie
	// within [ConsumerMinSessionTimeout, ConsumerMaxSessionTimeout],
	// which default to 45s and 60s.
	ConsumerSessionTimeout                               time.Duration
	ConsumerMinSessionTimeout, ConsumerMaxSessionTimeout time.Duration
	// ConsumerHeartbeatInterval is the heartbeat interval told to KIP-848
	// members (group.consumer.heartbeat.interval.ms); 0 means 5s. It must
	// be shorter than ConsumerSessionTimeout.
	ConsumerHeartbeatInterval time.Duration
	// GroupSettings, when set, gives a group's own KIP-848 settings: its
	// GROUP configs consumer.session.timeout.ms and
	// consumer.heartbeat.interval.ms (KIP-848), which Kafka reads at each
	// heartbeat in place of ConsumerSessionTimeout and
	// ConsumerHeartbeatInterval. A zero field keeps the engine's; a
	// session outside [ConsumerMinSessionTimeout,
	// ConsumerMaxSessionTimeout], or an interval not shorter than the
	// session, is not used. It is called on the shard loops at every
	// heartbeat, so it must be cheap, must not block and must be safe
	// for concurrent use.
	GroupSettings func(group string) GroupSettings
	// ConsumerMaxGroupSize limits the members of a KIP-848 group
	// (group.consumer.max.size); 0 means unlimited.
	ConsumerMaxGroupSize int
	// ConsumerMigrationPolicy is group.consumer.migration.policy: which
	// online conversions between classic and KIP-848 groups are allowed
	// (consumer_migration.go). "" means MigrationBidirectional, Kafka's
	// default.
	ConsumerMigrationPolicy MigrationPolicy
	// ConsumerAssignors lists the server-side assignors KIP-848 members
	// may ask for; the first is the default. nil means [uniform, range].
	ConsumerAssignors []string
	// TopicRefreshInterval is how often the topic metadata KIP-848 groups
	// assign from is reloaded from the store (TopicMetadataStore): a
	// partition increase, a deleted topic or a new regex match changes
	// a group within it (Kafka's coordinator sees such changes in its
	// metadata image at once). 0 means 2s. A heartbeat that subscribes
	// to a topic the cache does not know does not wait for it: it asks
	// for a refresh at once (consumer_topics.go).
	TopicRefreshInterval time.Duration
	// Owns reports whether this engine serves group: in a fleet, whether
	// this kproxy owns the partition of the groups topic the group lives
	// in (docs/fleet.md). nil means every group, a single kproxy. It is
	// called on the loops every time a request for a group is
	// dispatched, once per group of a multi-group request, and for
	// every group ListGroups would list, so it must be cheap, safe for
	// concurrent use and must not block or call into the Engine (an
	// atomic load). A group it refuses is answered NOT_COORDINATOR (in
	// its slot for DescribeGroups, DeleteGroups, OffsetFetch v8+ and
	// ConsumerGroupDescribe; ListGroups leaves it out) and no state is
	// created or loaded for it. Turning it false does not drop what the
	// engine holds: call Unload for that (unload.go).
	Owns func(group string) bool
	// ClusterGroups, when set, is the cluster's own groups: ListGroups,
	// DescribeGroups and ConsumerGroupDescribe answer for a group the
	// engine does not hold as the cluster does (ClusterGroups). nil: such
	// a group is what the store knows of it.
	ClusterGroups ClusterGroups
	// ShareSettings, when set, gives a share group's settings (its
	// share.* GROUP configs); it is called on the loops, so it must be
	// cheap, must not block and must be safe for concurrent use. nil
	// means Kafka's defaults (share_group.go).
	ShareSettings func(group string) ShareSettings
	// ShareDefaults are the cluster's group.share.* broker settings: a
	// share group's settings where its own (ShareSettings, or
	// GroupSettings' Share) leave a field zero; a zero field here means
	// Kafka's default.
	ShareDefaults ShareSettings
	// EmptyGroupRetention is how long the engine keeps the state of a
	// group that has been Empty (protocol type, generation) before
	// forgetting it; its offsets stay in the store, so it then shows as
	// a simple group. 0 means 7 days (offsets.retention.minutes);
	// negative means forever.
	EmptyGroupRetention time.Duration
}

// Engine is kproxy's embedded consumer-group coordinator (classic and
// KIP-848 groups). It is
// safe for concurrent use; all group state is owned by its shard loops.
type Engine struct {
	cfg    Config // immutable after New
	clock  Clock  // immutable after New
	log    *slog.Logger
	shards []*shard // immutable after New

	// ctx is cancelled by Close; store calls derive from it.
	ctx    context.Context
	cancel context.CancelFunc
	// storeWG counts store goroutines so that Close can wait for them;
	// storeMu guards storeClosed, which refuses new ones after Close.
	storeWG     sync.WaitGroup
	storeMu     sync.Mutex
	storeClosed bool
	closed      atomic.Bool

	// shareMetrics counts what share groups did (share_ops.go).
	shareMetrics shareMetrics

	// illegalTransitions counts refused state transitions (a bug if
	// non-zero); tests assert it stays zero.
	illegalTransitions atomic.Int64

	// meta is cfg.Store as a GroupMetadataStore, nil when the store keeps
	// no group metadata (immutable after New).
	meta GroupMetadataStore
	// anchors is cfg.Store as an AnchorStore, nil when the store keeps
	// no anchors (anchor.go; immutable after New).
	anchors AnchorStore
	// metaInflight counts group metadata operations (loads, saves,
	// tombstones) queued or running, until their completion ran; tests
	// wait for it to drop to zero.
	metaInflight atomic.Int64

	// topics caches the cluster's topics for KIP-848 groups (read by the
	// loops without a lock, replaced by refreshes); topicTimer, guarded
	// by storeMu, is the periodic refresh (consumer_topics.go).
	topics     atomic.Pointer[topicSnapshot]
	topicTimer Timer
	// topicSeq numbers refreshes as they start, so that a slower, older
	// refresh never replaces a newer answer.
	topicSeq atomic.Uint64
	// topicMu guards the refresh scheduler below: topicStored, the number
	// of the refresh whose answer topics holds; topicInflight, set while
	// a refresh runs, and topicInflightStart, when (Clock) it started;
	// topicLastStart, when the last refresh started (rate limit of
	// requestTopicRefresh); topicAgain, set when a refresh was asked for
	// after the running one started; topicWaiters, the heartbeats
	// waiting for a refresh (awaitTopics). No one waits while holding
	// it: waiters are callbacks that post to their loop.
	topicMu            sync.Mutex
	topicStored        uint64
	topicInflight      bool
	topicInflightStart time.Time
	topicLastStart     time.Time
	topicAgain         bool
	topicWaiters       []*topicWaiter
}

// New validates cfg and starts the engine's loops.
func New(cfg Config) (*Engine, error) {
	var problems []error
	if cfg.Store == nil {
		problems = append(problems, errors.New("groupstate: Config.Store is required"))
	}
	if cfg.Shards < 0 {
		problems = append(problems, fmt.Errorf("groupstate: Config.Shards %d is negative", cfg.Shards))
	}
	if cfg.MaxGroupSize < 0 {
		problems = append(problems, fmt.Errorf("groupstate: Config.MaxGroupSize %d is negative", cfg.MaxGroupSize))
	}
	if cfg.MinSessionTimeout < 0 || cfg.MaxSessionTimeout < 0 || cfg.NewMemberJoinTimeout < 0 || cfg.StoreTimeout < 0 {
		problems = append(problems, errors.New("groupstate: timeouts must not be negative"))
	}
	if cfg.MinSessionTimeout == 0 {
		cfg.MinSessionTimeout = 6 * time.Second
	}
	if cfg.MaxSessionTimeout == 0 {
		cfg.MaxSessionTimeout = 30 * time.Minute
	}
	if cfg.MinSessionTimeout > cfg.MaxSessionTimeout {
		problems = append(problems, fmt.Errorf("groupstate: MinSessionTimeout %v exceeds MaxSessionTimeout %v", cfg.MinSessionTimeout, cfg.MaxSessionTimeout))
	}
	problems = append(problems, defaultConsumerConfig(&cfg)...)
	if p, err := ParseMigrationPolicy(string(cfg.ConsumerMigrationPolicy)); err != nil {
		problems = append(problems, fmt.Errorf("groupstate: Config.ConsumerMigrationPolicy: %w", err))
	} else {
		cfg.ConsumerMigrationPolicy = p
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Shards == 0 {
		cfg.Shards = runtime.GOMAXPROCS(0)
	}
	if cfg.InitialRebalanceDelay == 0 {
		cfg.InitialRebalanceDelay = 3 * time.Second
	}
	if cfg.InitialRebalanceDelay < 0 {
		cfg.InitialRebalanceDelay = 0
	}
	if cfg.NewMemberJoinTimeout == 0 {
		cfg.NewMemberJoinTimeout = 5 * time.Minute
	}
	if cfg.StoreTimeout == 0 {
		cfg.StoreTimeout = 30 * time.Second
	}
	if cfg.EmptyGroupRetention == 0 {
		cfg.EmptyGroupRetention = 7 * 24 * time.Hour
	}
	e := &Engine{cfg: cfg, clock: cfg.Clock, log: cfg.Logger}
	e.meta, _ = cfg.Store.(GroupMetadataStore)
	e.anchors, _ = cfg.Store.(AnchorStore)
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.shards = make([]*shard, cfg.Shards)
	for i := range e.shards {
		s := &shard{
			e:      e,
			id:     i,
			groups: make(map[string]group),
			ops:    make(map[string]*opQueue),

			metaOps: make(map[string]*opQueue),
			known:   make(map[string]struct{}),
			loading: make(map[string][]parkedReq),
			wake:    make(chan struct{}, 1),
			done:    make(chan struct{}),
		}
		e.shards[i] = s
		go s.run()
	}
	e.startTopicRefresher()
	return e, nil
}

// GroupSettings are a group's own settings, overriding the engine's
// (Config.GroupSettings); a zero field keeps the engine's.
type GroupSettings struct {
	ConsumerSessionTimeout    time.Duration // consumer.session.timeout.ms
	ConsumerHeartbeatInterval time.Duration // consumer.heartbeat.interval.ms
	// Share holds a share group's share.* configs, used when
	// Config.ShareSettings is nil.
	Share ShareSettings
}

// ConsumerSessionTimeout is the session timeout the engine gives KIP-848
// members (Config.ConsumerSessionTimeout, its default applied).
func (e *Engine) ConsumerSessionTimeout() time.Duration { return e.cfg.ConsumerSessionTimeout }

// ConsumerHeartbeatInterval is the heartbeat interval the engine gives
// KIP-848 members (Config.ConsumerHeartbeatInterval, its default
// applied).
func (e *Engine) ConsumerHeartbeatInterval() time.Duration { return e.cfg.ConsumerHeartbeatInterval }

// owns applies Config.Owns.
func (e *Engine) owns(group string) bool {
	return e.cfg.Owns == nil || e.cfg.Owns(group)
}

// shardFor returns the loop that owns group id.
func (e *Engine) shardFor(id string) *shard {
	if len(e.shards) == 1 {
		return e.shards[0]
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return e.shards[h.Sum32()%uint32(len(e.shards))]
}

// Handle serves one group request. reply is called exactly once, maybe
// later, from any goroutine (often an engine loop: it must not block),
// with a response of the request's version. The engine keeps req: the
// caller must not modify it afterwards. Requests of a type Handle does not
// serve (see Keys) are logged and answered with the request's empty
// response kind.
func (e *Engine) Handle(rc RequestContext, req kmsg.Request, reply func(kmsg.Response)) {
	version := req.GetVersion()
	once := func(resp kmsg.Response) {
		resp.SetVersion(version)
		reply(resp)
	}
	if e.closed.Load() {
		once(errorResponse(req, errCoordinatorNotAvailable))
		return
	}
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		e.onGroup(r.Group, req, once, func(s *shard) { s.joinGroup(rc, r, once) })
	case *kmsg.SyncGroupRequest:
		e.onGroup(r.Group, req, once, func(s *shard) { s.syncGroup(r, once) })
	case *kmsg.HeartbeatRequest:
		// While the group loads a heartbeat is answered NONE at once
		// (Kafka does the same); it does not wait for the load.
		s := e.shardFor(r.Group)
		if !s.post(func() {
			if !e.gate(r.Group, req, once) {
				return
			}
			if s.loadPending(r.Group) {
				resp := kmsg.NewPtrHeartbeatResponse()
				once(resp)
				return
			}
			s.heartbeat(r, once)
		}) {
			once(errorResponse(req, errCoordinatorNotAvailable))
		}
	case *kmsg.LeaveGroupRequest:
		e.onGroup(r.Group, req, once, func(s *shard) { s.leaveGroup(r, once) })
	case *kmsg.OffsetCommitRequest:
		e.onGroup(r.Group, req, once, func(s *shard) { s.offsetCommit(r, once) })
	case *kmsg.TxnOffsetCommitRequest:
		e.onGroup(r.Group, req, once, func(s *shard) { s.txnOffsetCommit(r, once) })
	case *kmsg.OffsetDeleteRequest:
		e.onGroup(r.Group, req, once, func(s *shard) { s.offsetDelete(r, once) })
	case *kmsg.OffsetFetchRequest:
		e.offsetFetch(r, once)
	case *kmsg.DescribeGroupsRequest:
		e.describeGroups(r, once)
	case *kmsg.ListGroupsRequest:
		e.listGroups(r, once)
	case *kmsg.DeleteGroupsRequest:
		e.deleteGroups(r, once)
	case *kmsg.ConsumerGroupHeartbeatRequest:
		e.onGroup(r.Group, req, once, func(s *shard) { s.consumerHeartbeat(rc, r, once, false) })
	case *kmsg.ConsumerGroupDescribeRequest:
		e.consumerGroupDescribe(r, once)
	case *kmsg.ShareGroupHeartbeatRequest:
		e.onGroup(r.GroupID, req, once, func(s *shard) { s.shareHeartbeat(rc, r, once, false) })
	case *kmsg.ShareGroupDescribeRequest:
		e.shareGroupDescribe(r, once)
	case *kmsg.DescribeShareGroupOffsetsRequest:
		e.describeShareGroupOffsets(r, once)
	case *kmsg.AlterShareGroupOffsetsRequest:
		e.onGroup(r.GroupID, req, once, func(s *shard) { s.alterShareGroupOffsets(r, once) })
	case *kmsg.DeleteShareGroupOffsetsRequest:
		e.onGroup(r.GroupID, req, once, func(s *shard) { s.deleteShareGroupOffsets(r, once) })
	default:
		e.log.Error("groupstate: request not served by the engine", "api_key", req.Key(), "version", version)
		once(errorResponse(req, errUnsupportedVersion))
	}
}

// onGroup runs fn on the loop that owns group once the group's persisted
// metadata is loaded, or answers COORDINATOR_NOT_AVAILABLE if the engine
// closed meanwhile (COORDINATOR_LOAD_IN_PROGRESS if the load failed,
// NOT_COORDINATOR if the engine does not own the group).
func (e *Engine) onGroup(group string, req kmsg.Request, reply func(kmsg.Response), fn func(*shard)) {
	s := e.shardFor(group)
	if !s.post(func() {
		if !e.gate(group, req, reply) {
			return
		}
		s.whenLoaded(group, func() { fn(s) }, func(code int16) { reply(errorResponse(req, code)) })
	}) {
		reply(errorResponse(req, errCoordinatorNotAvailable))
	}
}

// Groups returns a snapshot of every group the engine holds, sorted by
// group id.
func (e *Engine) Groups() []GroupSnapshot {
	var (
		mu  sync.Mutex
		all []GroupSnapshot
		wg  sync.WaitGroup
	)
	for _, s := range e.shards {
		wg.Add(1)
		if !s.post(func() {
			defer wg.Done()
			snaps := make([]GroupSnapshot, 0, len(s.groups))
			for _, g := range s.groups {
				snap := g.snapshot()
				snap.Kind = g.groupKind()
				snaps = append(snaps, snap)
			}
			mu.Lock()
			all = append(all, snaps...)
			mu.Unlock()
		}) {
			wg.Done()
		}
	}
	wg.Wait()
	sort.Slice(all, func(i, j int) bool { return all[i].Group < all[j].Group })
	return all
}

// Group returns a snapshot of one group, and false if the engine holds no
// such group.
func (e *Engine) Group(id string) (GroupSnapshot, bool) {
	s := e.shardFor(id)
	type res struct {
		snap GroupSnapshot
		ok   bool
	}
	ch := make(chan res, 1)
	if !s.post(func() {
		g, ok := s.groups[id]
		if !ok {
			ch <- res{}
			return
		}
		snap := g.snapshot()
		snap.Kind = g.groupKind()
		ch <- res{snap, true}
	}) {
		return GroupSnapshot{}, false
	}
	r := <-ch
	return r.snap, r.ok
}

// Close answers every parked request with COORDINATOR_NOT_AVAILABLE, stops
// the loops and waits for in-flight store calls. It is idempotent.
func (e *Engine) Close() {
	if e.closed.Swap(true) {
		return
	}
	e.stopTopicTimer()
	for _, s := range e.shards {
		s.shutdown()
	}
	for _, s := range e.shards {
		<-s.done
	}
	e.storeMu.Lock()
	e.storeClosed = true
	e.storeMu.Unlock()
	e.cancel()
	e.storeWG.Wait()
	e.releaseTopicWaiters()
}

// shard is one single-threaded event loop and the groups it owns.
type shard struct {
	e  *Engine // immutable
	id int     // immutable

	// groups, ops and timerSeq are owned by the loop goroutine. groups
	// is the registry of the loop's groups of every kind (kinds.go).
	groups   map[string]group
	ops      map[string]*opQueue
	timerSeq uint64
	// anchorVersion numbers the Anchors the loop's KIP-848 groups hand
	// the store (Anchor.Version): one sequence for the shard, so that a
	// group unloaded and loaded again never reuses a version a sync of
	// its earlier instance may still report (consumer_withhold.go).
	anchorVersion uint64

	// metaOps, known and loading are owned by the loop goroutine too.
	// metaOps holds the FIFOs of group metadata operations (separate
	// from offset operations, so a slow commit never delays a sync);
	// known holds the group ids whose load completed (found or not);
	// loading holds the requests parked while their group loads.
	metaOps map[string]*opQueue
	known   map[string]struct{}
	loading map[string][]parkedReq

	// mu guards queue and closed: the mailbox between posters and the
	// loop.
	mu     sync.Mutex
	queue  []func()
	closed bool
	wake   chan struct{} // signalled when queue becomes non-empty
	done   chan struct{} // closed when the loop exits
}

// post queues fn to run on the loop. It reports false, without queueing,
// once the shard has shut down.
func (s *shard) post(fn func()) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.queue = append(s.queue, fn)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

// shutdown queues the final event, which tears down every group, and
// refuses further posts.
func (s *shard) shutdown() {
	s.mu.Lock()
	s.queue = append(s.queue, s.teardown)
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run is the loop: it drains the mailbox in order until teardown ran.
func (s *shard) run() {
	defer close(s.done)
	var batch []func()
	for {
		<-s.wake
		s.mu.Lock()
		batch, s.queue = s.queue, batch[:0]
		closed := s.closed
		s.mu.Unlock()
		for i, fn := range batch {
			fn()
			batch[i] = nil
		}
		if closed {
			// A closed mailbox accepts nothing more; drain what was
			// queued before the teardown marker, then exit.
			s.mu.Lock()
			rest := s.queue
			s.queue = nil
			s.mu.Unlock()
			for _, fn := range rest {
				fn()
			}
			return
		}
	}
}

// teardown answers parked requests and stops timers; it runs last.
func (s *shard) teardown() {
	for _, g := range s.groups {
		g.teardown()
	}
	s.groups = map[string]group{}
	for id, parked := range s.loading {
		delete(s.loading, id)
		for _, p := range parked {
			p.fail(errCoordinatorNotAvailable)
		}
	}
	s.abortOps()
}

// nextTimerID returns a fresh timer key.
func (s *shard) nextTimerID() uint64 {
	s.timerSeq++
	return s.timerSeq
}

// emit delivers ev to the configured sink.
func (s *shard) emit(ev Event) {
	if s.e.cfg.Events != nil {
		s.e.cfg.Events(ev)
	}
}

// realClock is the Clock over package time.
type realClock struct{}

// Now returns the wall-clock time.
func (realClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
