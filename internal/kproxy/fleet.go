package kproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
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
	"github.com/kproxy/kproxy/internal/coexist"
	"github.com/kproxy/kproxy/internal/shares"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// fleetRuntime ties together, in distributed mode, the fleet member (who
// should own which partition of the groups topic), the transactional
// store (who can write it) and the engine (who serves the groups): a
// partition is served here only once the store has claimed it, and is
// unloaded before it is given up (docs/fleet.md).
type fleetRuntime struct {
	id         string
	partitions int
	member     *fleet.Member
	store      *kafkastore.Store
	engine     *groupstate.Engine // set once, before the member runs
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
	// lost, fenced, claim_failed); immutable after startFleet.
	movesMetric metric.Int64Counter
	// txnMetric records each groups-partition transaction's duration by
	// outcome; immutable after startFleet.
	txnMetric metric.Float64Histogram

	peer *proxy.PeerServer

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
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName, req.ClientSoftwareVersion = "kproxy", "1"
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("asking the upstream for its API versions: %w", err)
	}
	have := map[int16]bool{}
	for _, k := range resp.ApiKeys {
		have[k.ApiKey] = true
	}
	var missing []string
	for _, key := range []int16{22, 24, 25, 26, 28} { // InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
		if !have[key] {
			missing = append(missing, kmsg.NameForKey(key))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the upstream cluster does not support transactions (missing %v), which --groups distributed needs to fence a stale owner; "+
			"run --groups local (one kproxy sees every member of its groups) or --groups forward (the brokers serve groups)", missing)
	}
	return nil
}

// fleetNames returns the fleet group and the groups topic for a fleet
// name.
func fleetNames(name string) (group, topic string) {
	if name == "" {
		return "__kproxy_fleet", kafkastore.DefaultGroupsTopic
	}
	return "__kproxy_fleet." + name, kafkastore.DefaultGroupsTopic + "." + name
}

// kproxyID names this process in the fleet: host, pid and start time,
// so a restarted kproxy is a new member.
func kproxyID() string {
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixMilli()%1_000_000, 36)
}

// startFleet builds the distributed-mode coordinator: the store in
// transactional mode, the engine gated on ownership, the peer server,
// the fleet member and the router. The returned coordinator is what the
// proxy serves group requests through.
func startFleet(ctx context.Context, w *Server, cfg Config, engCfg groupstate.Config, log *slog.Logger) error {
	fc := cfg.Groups.Fleet
	if err := upstreamSupportsTransactions(ctx, w.upstream); err != nil {
		return err
	}
	group, topic := fleetNames(fc.Name)
	f := &fleetRuntime{id: w.id, log: log.With("component", "fleet"), changed: make(chan struct{})}
	f.store = kafkastore.NewWith(w.upstream, kafkastore.Options{GroupsTopic: topic, Logger: log.With("component", "store")})
	f.store.EnableTransactions(kafkastore.TxnOptions{OnFenced: f.onFenced, OnTransaction: f.onTransaction})
	w.enableAnchors(f.store, cfg, f.lastOwner, f.owns)
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	n, err := f.store.Partitions(pctx)
	cancel()
	if err != nil {
		return fmt.Errorf("groups topic %s: %w", topic, err)
	}
	f.partitions = n
	f.serving = make([]atomic.Bool, n)
	f.locks = make([]sync.Mutex, n)
	if err := f.registerMetrics(w.meterProvider); err != nil {
		return err
	}

	engCfg.Store = f.store
	engCfg.ClusterGroups = coexist.NewClusterGroups(f.store)
	engCfg.Owns = f.owns
	eng, err := groupstate.New(engCfg)
	if err != nil {
		return w.groupSettings.EngineError(err)
	}
	f.engine = eng
	w.engine = eng
	if w.coexist != nil {
		w.coexist.AttachEngine(eng)
	}
	w.closers = append(w.closers, func(context.Context) error { eng.Close(); return nil })

	listen := fc.PeerListen
	if listen == "" {
		host, _, _ := net.SplitHostPort(cfg.Proxy.Listen)
		listen = net.JoinHostPort(host, "0")
	}
	// Kproxy messages from other kproxies, and for groups owned here.
	messages := proxy.NewPeerMessages()
	if w.coexist != nil {
		w.coexist.RegisterMessages(messages)
	}
	if cfg.Groups.ServeShares {
		// Share steps of members behind other kproxies (internal/shares).
		for _, kind := range shares.MsgKinds {
			messages.Handle(kind, 0, shares.PeerHandler(eng, kind))
		}
	}
	peer, err := proxy.NewPeerServer(proxy.PeerServerConfig{
		Listen:      listen,
		Coordinator: w.fleetCoordinator(eng),
		Logger:      log.With("component", "peer"),
		MaxFrame:    cfg.Proxy.MaxFrame,
		TLS:         fc.PeerTLS,
		Serving:     f.owns,
		Messages:    messages,
	})
	if err != nil {
		return fmt.Errorf("peer listener: %w", err)
	}
	f.peer = peer
	w.closers = append(w.closers, func(context.Context) error { peer.Close(); return nil })
	advertise := fc.PeerAdvertise
	if advertise == "" {
		advertise = peer.Addr()
	}

	// The fleet member joins with a client of its own. A kgo client
	// sends every JoinGroup and SyncGroup to a broker on one connection,
	// and a broker handles one request of a connection at a time: on
	// upstream's, the fleet's JoinGroup, held by the broker until every
	// kproxy rejoined (up to a fleet heartbeat), held up every anchor's
	// join and sync to that broker, and with them the rebalances of the
	// groups served here (a cooperative rebalance's second round waited
	// 0.45 s for a fleet rejoin after a heal); the other way round,
	// anchors' joins held in a cluster rebalance would delay the
	// fleet's own join and so its lease.
	fcl, err := kgo.NewClient(w.upstreamOpts...)
	if err != nil {
		return fmt.Errorf("fleet client: %w", err)
	}
	w.closers = append(w.closers, func(context.Context) error { fcl.Close(); return nil })
	m, err := fleet.New(fleet.Config{
		Client:            fcl,
		Group:             group,
		ID:                f.id,
		PeerAddr:          advertise,
		Partitions:        int32(n),
		Owner:             !fc.Relay,
		SessionTimeout:    fc.SessionTimeout,
		HeartbeatInterval: fc.HeartbeatInterval,
		Logger:            log.With("component", "fleet"),
		OnAssigned:        f.onAssigned,
		OnRevoked:         f.onRevoked,
		OnLost:            f.onLost,
	})
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
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
	// Closers run in reverse: the member leaves (handing its partitions
	// over) before the engine and the peer server close.
	w.closers = append(w.closers, func(ctx context.Context) error {
		err := m.Leave(ctx)
		stop()
		<-done
		f.unloading.Wait()
		return err
	})
	var dialer proxy.Dialer // nil: plaintext
	if fc.PeerTLS != nil {
		if dialer, err = proxy.PeerTLSDialer(fc.PeerTLS, fc.PeerTLSServerName); err != nil {
			return err
		}
	}
	router := proxy.NewRouter(proxy.RouterConfig{
		Dialer:        dialer,
		Local:         w.fleetCoordinator(eng),
		Locator:       f,
		Messages:      messages,
		Logger:        log.With("component", "router"),
		MeterProvider: w.meterProvider,

		KeepCutOffMembers:      fc.KeepCutOffMembers,
		ConsumerSessionTimeout: eng.ConsumerSessionTimeout(),
		ConsumerSessionTimeoutOf: func(group string) time.Duration {
			session, _ := eng.ConsumerSettings(group)
			return session
		},
	})
	w.closers = append(w.closers, func(context.Context) error { router.Close(); return nil })
	w.coordinator = router
	if cfg.Groups.ServeShares {
		if err := w.startShares(shares.Routed(eng, f, router, log.With("component", "shares")), log); err != nil {
			return err
		}
	}
	if w.coexist != nil {
		w.coexist.JoinFleet(f.id, router.SendPeer)
		w.startCoexist()
	}
	w.fleet = f
	log.Info("fleet: joining", "fleet_group", group, "groups_topic", topic, "partitions", n, "id", f.id, "peer", advertise, "role", fleetRole(fc))
	return nil
}

// fleetCoordinator is eng as the fleet's coordinator (the peer server's
// and the router's local one): with anchors, the takeover reports of
// kproxies of an earlier version are refused before eng sees them
// (coexist.Coexist.Guard).
func (w *Server) fleetCoordinator(eng *groupstate.Engine) proxy.Coordinator {
	if w.coexist == nil {
		return w.engineCoordinator(eng)
	}
	return w.coexist.Guard(w.engineCoordinator(eng))
}

// lastOwner reports whether no other kproxy owns a partition in this
// member's latest view of the fleet table (read when kproxy stops).
func (f *fleetRuntime) lastOwner() bool {
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

// fleetRole names this kproxy's role in the fleet, as the command's
// --fleet-role does.
func fleetRole(fc FleetConfig) string {
	if fc.Relay {
		return "relay"
	}
	return "owner"
}

// partitionOf is the groups-topic partition holding group.
func (f *fleetRuntime) partitionOf(group string) int32 {
	return kafkastore.GroupPartition(group, f.partitions)
}

// owns is the engine's ownership gate: group's partition is claimed here
// and the fleet lease still holds.
func (f *fleetRuntime) owns(group string) bool {
	p := f.partitionOf(group)
	return f.serving[p].Load() && f.member.Owns(p)
}

// Locate implements proxy.Locator.
func (f *fleetRuntime) Locate(group string) (local bool, addr string, ok bool) {
	if f.owns(group) {
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
func (f *fleetRuntime) Changed() <-chan struct{} {
	f.changedMu.Lock()
	defer f.changedMu.Unlock()
	return f.changed
}

// notify wakes whoever waits on Changed.
func (f *fleetRuntime) notify() {
	f.changedMu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.changedMu.Unlock()
}

// forwardTableChanges turns the member's table changes into notify calls
// until ctx ends.
func (f *fleetRuntime) forwardTableChanges(ctx context.Context) {
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
func (f *fleetRuntime) Peers() []string {
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
func (f *fleetRuntime) ownerRecord(gen int32) []byte {
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
func (f *fleetRuntime) onAssigned(ctx context.Context, gen int32, gained []int32) {
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
func (f *fleetRuntime) onRevoked(ctx context.Context, lost []int32) {
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
func (f *fleetRuntime) onLost(lost []int32) {
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
func (f *fleetRuntime) onFenced(p int32) {
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
func (f *fleetRuntime) matcher(p int32) func(string) bool {
	return func(group string) bool { return f.partitionOf(group) == p }
}

// status implements the admin server's /api/fleet.
func (f *fleetRuntime) status() tap.FleetView {
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
func (f *fleetRuntime) registerMetrics(mp metric.MeterProvider) error {
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
func (f *fleetRuntime) onTransaction(_ int32, took time.Duration, _ int, err error) {
	outcome := "committed"
	if err != nil {
		outcome = "failed"
	}
	f.txnMetric.Record(context.Background(), took.Seconds(), metric.WithAttributes(attribute.String("outcome", outcome)))
}

// moved counts one ownership change of kind.
func (f *fleetRuntime) moved(ctx context.Context, kind string) {
	f.moves.Add(1)
	f.movesMetric.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", kind)))
}
