package fleetrun

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/kproxy/kproxy/fleet"
	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/internal/upstream"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// Runtime ties together, in distributed mode, the fleet member (who
// should own which partition of the groups topic), the transactional
// store (who can write it) and the engine (who serves the groups): a
// partition is served here only once the store has claimed it, and is
// unloaded before it is given up (docs/fleet.md). Its fields are
// immutable once Join returned, unless said otherwise.
type Runtime struct {
	id         string
	group      string // the fleet group
	partitions int
	member     *fleet.Member // set by Join, before the member runs
	store      *kafkastore.Store
	engine     *groupstate.Engine // set by Join, before the member runs
	log        *slog.Logger

	// serving[p] is set once p is claimed and cleared before p is
	// unloaded; written by the member loop's callbacks and by onFenced,
	// read on every group request.
	serving []atomic.Bool
	// locks[p] serializes the claim, release and drop of partition p
	// between the member loop's callbacks and the unloads they start
	// (the work of different partitions runs in parallel).
	locks []sync.Mutex
	// unloading counts the unloads of lost partitions still running
	// (onLost); the member's closer waits for them.
	unloading sync.WaitGroup
	// moves counts ownership changes seen here (claims, releases,
	// losses); fenced counts partitions dropped because a newer owner
	// fenced this one. Both also feed the metrics below.
	moves  atomic.Int64
	fenced atomic.Int64
	// movesMetric counts ownership changes by kind (claimed, released,
	// lost, fenced, claim_failed); immutable after New.
	movesMetric metric.Int64Counter
	// txnMetric records each groups-partition transaction's duration by
	// outcome; immutable after New.
	txnMetric metric.Float64Histogram

	peer *proxy.PeerServer // set by Join, before the member runs

	// changedMu guards changed, closed and replaced whenever what Locate
	// answers may have changed: the fleet's table, or a partition
	// starting or stopping to be served here (a claim finishing). A
	// request waiting for an owner wakes on it.
	changedMu sync.Mutex
	changed   chan struct{}
}

// upstreamSupportsTransactions asks a broker for its API versions and
// reports which of the transactional APIs distributed mode needs it
// lacks.
func upstreamSupportsTransactions(ctx context.Context, cl *kgo.Client) error {
	have, err := upstream.Keys(ctx, cl)
	if err != nil {
		return fmt.Errorf("asking the upstream for its API versions: %w", err)
	}
	var missing []string
	for _, key := range []int16{22, 24, 25, 26, 28} { // InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
		if _, ok := have[key]; !ok {
			missing = append(missing, kmsg.NameForKey(key))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the upstream cluster does not support transactions (missing %v), which --groups distributed needs to fence a stale owner; "+
			"run --groups local (one kproxy sees every member of its groups) or --groups forward (the brokers serve groups)", missing)
	}
	return nil
}

// Names returns the fleet group and the groups topic for a fleet
// name.
func Names(name string) (group, topic string) {
	if name == "" {
		return "__kproxy_fleet", kafkastore.DefaultGroupsTopic
	}
	return "__kproxy_fleet." + name, kafkastore.DefaultGroupsTopic + "." + name
}

// NewID names this process in the fleet: host, pid and start time,
// so a restarted kproxy is a new member.
func NewID() string {
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixMilli()%1_000_000, 36)
}

// Config configures a Runtime.
type Config struct {
	// ID is this kproxy's fleet member id (NewID by default).
	ID string
	// Client is kproxy's own client of the cluster: the store's.
	Client *kgo.Client
	// Name is the fleet's name (Names).
	Name          string
	Logger        *slog.Logger
	MeterProvider metric.MeterProvider
}

// New builds the runtime of distributed mode before its engine: it
// checks that the cluster has transactions, builds the store over the
// fleet's groups topic in transactional mode and reads its partition
// count. The engine built next gates on Owns and stores through Store;
// Join then starts the fleet member.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := upstreamSupportsTransactions(ctx, cfg.Client); err != nil {
		return nil, err
	}
	group, topic := Names(cfg.Name)
	f := &Runtime{id: cfg.ID, group: group, log: log.With("component", "fleet"), changed: make(chan struct{})}
	if f.id == "" {
		f.id = NewID()
	}
	f.store = kafkastore.NewWith(cfg.Client, kafkastore.Options{GroupsTopic: topic, Logger: log.With("component", "store")})
	f.store.EnableTransactions(kafkastore.TxnOptions{OnFenced: f.onFenced, OnTransaction: f.onTransaction})
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	n, err := f.store.Partitions(pctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("groups topic %s: %w", topic, err)
	}
	f.partitions = n
	f.serving = make([]atomic.Bool, n)
	f.locks = make([]sync.Mutex, n)
	if err := f.registerMetrics(cfg.MeterProvider); err != nil {
		return nil, err
	}
	return f, nil
}

// Store is the transactional store of the fleet's groups topic.
func (f *Runtime) Store() *kafkastore.Store { return f.store }

// JoinConfig configures Join.
type JoinConfig struct {
	// Engine serves the groups of the partitions claimed here; built
	// over Store, gated on Owns.
	Engine *groupstate.Engine
	// Peer is this kproxy's peer server; Advertise the address told to
	// the fleet ("": Peer's).
	Peer      *proxy.PeerServer
	Advertise string
	// Client is the fleet member's own client of the cluster (not
	// shared with the anchors' joins: a JoinGroup held by the broker
	// would hold up the others on the same connection).
	Client *kgo.Client
	// Relay makes this kproxy own no partition.
	Relay                             bool
	SessionTimeout, HeartbeatInterval time.Duration
}

// Join starts the fleet member: partitions assigned here are claimed
// and served, revoked ones unloaded and handed over. leave hands them
// over and stops the member; call it before the engine and the peer
// server close.
func (f *Runtime) Join(jc JoinConfig) (leave func(context.Context) error, err error) {
	f.engine, f.peer = jc.Engine, jc.Peer
	advertise := jc.Advertise
	if advertise == "" {
		advertise = jc.Peer.Addr()
	}
	m, err := fleet.New(fleet.Config{
		Client:            jc.Client,
		Group:             f.group,
		ID:                f.id,
		PeerAddr:          advertise,
		Partitions:        int32(f.partitions),
		Owner:             !jc.Relay,
		SessionTimeout:    jc.SessionTimeout,
		HeartbeatInterval: jc.HeartbeatInterval,
		Logger:            f.log,
		OnAssigned:        f.onAssigned,
		OnRevoked:         f.onRevoked,
		OnLost:            f.onLost,
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	f.member = m
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go f.forwardTableChanges(runCtx)
	go func() {
		defer close(done)
		if err := m.Run(runCtx); err != nil && runCtx.Err() == nil {
			f.log.Error("fleet member stopped", "err", err)
		}
	}()
	role := "owner"
	if jc.Relay {
		role = "relay"
	}
	f.log.Info("fleet: joining", "fleet_group", f.group, "groups_topic", f.store.GroupsTopic(), "partitions", f.partitions, "id", f.id, "peer", advertise, "role", role)
	return func(ctx context.Context) error {
		err := m.Leave(ctx)
		stop()
		<-done
		f.unloading.Wait()
		return err
	}, nil
}

// LastOwner reports whether no other kproxy owns a partition in this
// member's latest view of the fleet table (read when kproxy stops).
func (f *Runtime) LastOwner() bool {
	if f.member == nil {
		return true
	}
	for _, o := range f.member.Table() {
		if !o.IsZero() && o.ID != f.id {
			return false
		}
	}
	return true
}

// partitionOf is the groups-topic partition holding group.
func (f *Runtime) partitionOf(group string) int32 {
	return kafkastore.GroupPartition(group, f.partitions)
}

// Owns is the engine's ownership gate: group's partition is claimed here
// and the fleet lease still holds.
func (f *Runtime) Owns(group string) bool {
	p := f.partitionOf(group)
	return f.serving[p].Load() && f.member.Owns(p)
}

// Locate implements proxy.Locator.
func (f *Runtime) Locate(group string) (local bool, addr string, ok bool) {
	if f.Owns(group) {
		return true, "", true
	}
	p := f.partitionOf(group)
	table := f.member.Table()
	if int(p) >= len(table) {
		return false, "", false
	}
	o := table[p]
	if o.ID == "" || o.ID == f.id {
		// Nobody owns p right now, or it is ours but not claimed yet.
		return false, "", false
	}
	return false, o.Peer, true
}

// Changed implements proxy.Locator.
func (f *Runtime) Changed() <-chan struct{} {
	f.changedMu.Lock()
	defer f.changedMu.Unlock()
	return f.changed
}

// notify wakes whoever waits on Changed.
func (f *Runtime) notify() {
	f.changedMu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.changedMu.Unlock()
}

// forwardTableChanges turns the member's table changes into notify calls
// until ctx ends.
func (f *Runtime) forwardTableChanges(ctx context.Context) {
	for {
		select {
		case <-f.member.Changed():
			f.notify()
		case <-ctx.Done():
			return
		}
	}
}

// Peers implements proxy.Locator: every other owner's peer address.
func (f *Runtime) Peers() []string {
	seen := map[string]bool{}
	var out []string
	for _, o := range f.member.Table() {
		if o.ID == "" || o.ID == f.id || seen[o.Peer] {
			continue
		}
		seen[o.Peer] = true
		out = append(out, o.Peer)
	}
	return out
}

// ownerRecord is what a claim writes as p's owner record.
func (f *Runtime) ownerRecord(gen int32) []byte {
	b, _ := json.Marshal(struct {
		ID         string `json:"id"`
		Peer       string `json:"peer"`
		Generation int32  `json:"fleet_generation"`
		At         int64  `json:"at_ms"`
	}{f.id, f.peer.Addr(), gen, time.Now().UnixMilli()})
	return b
}

// onAssigned claims the partitions the fleet gave this kproxy. A claim
// that fails leaves the partition unserved; the member is told to drop
// it so the fleet can give it to someone who can.
//
// Each claim is logged at debug; one info line sums them up (a start of
// `kproxy dev` claims every partition of the groups topic at once).
func (f *Runtime) onAssigned(ctx context.Context, gen int32, gained []int32) {
	var (
		wg      sync.WaitGroup
		claimed atomic.Int64
		begin   = time.Now()
	)
	for _, p := range gained {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.locks[p].Lock()
			defer f.locks[p].Unlock()
			start := time.Now()
			if err := f.store.Claim(ctx, p, f.ownerRecord(gen)); err != nil {
				f.log.Warn("fleet: claiming a partition failed", "partition", p, "generation", gen, "err", err)
				f.moved(ctx, "claim_failed")
				go f.member.Drop(p)
				return
			}
			f.serving[p].Store(true)
			f.notify()
			f.moved(ctx, "claimed")
			claimed.Add(1)
			f.log.Debug("fleet: partition claimed", "partition", p, "generation", gen, "took", time.Since(start))
			// The groups with members load now, not on their next
			// request, as Kafka's coordinator loads a partition's groups
			// when it becomes its leader: what must run for them without
			// a request starts at once (the members' session timers; their
			// anchor, which replaces the previous owner's in the cluster's
			// group even when no member talks to kproxy any more, as in a
			// hand-back, docs/anchors.md).
			if groups := f.store.ClaimedGroups(p, groupstate.RecordHasMembers); len(groups) > 0 {
				f.engine.Load(groups)
				f.log.Debug("fleet: loading the groups with members of a claimed partition", "partition", p, "groups", len(groups))
			}
		}()
	}
	wg.Wait()
	if len(gained) > 0 {
		f.log.Info("fleet: partitions claimed", "claimed", claimed.Load(), "failed", int64(len(gained))-claimed.Load(),
			"generation", gen, "took", time.Since(begin))
	}
}

// onRevoked hands partitions over: stop serving, unload their groups
// (parked requests get NOT_COORDINATOR), let the in-flight transaction
// finish, then give them up. Each partition is handed over on a
// goroutine of its own, so a partition whose store call is stuck (its
// unload waits for it, up to the engine's store timeout) holds up no
// other partition's hand-over; onRevoked returns once all are done.
func (f *Runtime) onRevoked(ctx context.Context, lost []int32) {
	var wg sync.WaitGroup
	for _, p := range lost {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.locks[p].Lock()
			defer f.locks[p].Unlock()
			f.serving[p].Store(false)
			start := time.Now()
			f.engine.Unload(f.matcher(p))
			f.store.Release(ctx, p)
			f.moved(ctx, "released")
			f.log.Debug("fleet: partition handed over", "partition", p, "took", time.Since(start))
		}()
	}
	wg.Wait()
	if len(lost) > 0 {
		f.log.Info("fleet: partitions handed over", "count", len(lost))
	}
}

// onLost drops partitions at once, writing nothing. Their groups are
// unloaded in the background, one goroutine per partition: an unload
// waits for the store calls of its own partition's groups only, and
// neither the member loop nor another partition waits for it. A later
// claim of the same partition waits for its unload (locks[p], taken
// here before onLost returns).
func (f *Runtime) onLost(lost []int32) {
	for _, p := range lost {
		f.serving[p].Store(false)
	}
	for _, p := range lost {
		f.store.Drop(p)
		f.locks[p].Lock()
		f.unloading.Add(1)
		go func() {
			defer f.unloading.Done()
			defer f.locks[p].Unlock()
			start := time.Now()
			f.engine.Unload(f.matcher(p))
			f.log.Debug("fleet: groups of a lost partition unloaded", "partition", p, "took", time.Since(start))
		}()
		f.moved(context.Background(), "lost")
		f.log.Warn("fleet: partition lost", "partition", p)
	}
}

// onFenced is the store's report that a newer owner fenced p: stop
// serving it now, unload its groups and tell the fleet.
func (f *Runtime) onFenced(p int32) {
	if int(p) >= len(f.serving) || !f.serving[p].Swap(false) {
		return
	}
	f.fenced.Add(1)
	f.moved(context.Background(), "fenced")
	f.log.Warn("fleet: fenced by a newer owner; dropping the partition", "partition", p)
	go func() {
		f.engine.Unload(f.matcher(p))
		f.member.Drop(p)
	}()
}

// matcher selects the groups of partition p.
func (f *Runtime) matcher(p int32) func(string) bool {
	return func(group string) bool { return f.partitionOf(group) == p }
}

// Status implements the admin server's /api/fleet.
func (f *Runtime) Status() tap.FleetView {
	s := f.member.Snapshot()
	v := tap.FleetView{
		ID: f.id, Peer: s.Peer, PeerListen: f.peer.Addr(), Partitions: f.partitions,
		Serving: []int32{}, Moves: f.moves.Load(), Fenced: f.fenced.Load(), LeaseValid: s.LeaseValid,
		Member: s,
	}
	for p := range f.serving {
		if f.serving[p].Load() && f.member.Owns(int32(p)) {
			v.Serving = append(v.Serving, int32(p))
		}
	}
	return v
}

// registerMetrics registers the fleet's instruments: ownership moves by
// kind and the partitions served here.
func (f *Runtime) registerMetrics(mp metric.MeterProvider) error {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/kproxy/kproxy/fleet")
	var err error
	f.movesMetric, err = m.Int64Counter("kproxy.fleet.ownership_moves",
		metric.WithDescription("groups-topic partitions claimed, released, lost or fenced by this kproxy"))
	if err != nil {
		return fmt.Errorf("fleet metrics: %w", err)
	}
	f.txnMetric, err = m.Float64Histogram("kproxy.fleet.transaction.duration",
		metric.WithUnit("s"),
		metric.WithDescription("one groups-partition transaction, first request to EndTxn's answer: what an OffsetCommit or a leader's SyncGroup waits for"),
		metric.WithExplicitBucketBoundaries(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))
	if err != nil {
		return fmt.Errorf("fleet metrics: %w", err)
	}
	_, err = m.Int64ObservableGauge("kproxy.fleet.partitions_served",
		metric.WithDescription("groups-topic partitions this kproxy serves now"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			n := int64(0)
			for p := range f.serving {
				if f.serving[p].Load() {
					n++
				}
			}
			o.Observe(n)
			return nil
		}))
	if err != nil {
		return fmt.Errorf("fleet metrics: %w", err)
	}
	return nil
}

// onTransaction records one groups-partition transaction.
func (f *Runtime) onTransaction(_ int32, took time.Duration, _ int, err error) {
	outcome := "committed"
	if err != nil {
		outcome = "failed"
	}
	f.txnMetric.Record(context.Background(), took.Seconds(), metric.WithAttributes(attribute.String("outcome", outcome)))
}

// moved counts one ownership change of kind.
func (f *Runtime) moved(ctx context.Context, kind string) {
	f.moves.Add(1)
	f.movesMetric.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", kind)))
}
