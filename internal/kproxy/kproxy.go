// Package kproxy assembles a running kproxy from one Config: kproxy's own
// client of the upstream cluster, telemetry (tap), the group settings and
// GROUP configs (internal/groupconfig), the offset store, the coordinator
// engine (local, or distributed with the fleet runtime of
// internal/fleetrun), coexistence with the cluster's coordinator
// (internal/coexist), the share service (internal/shares), authorization,
// the proxy's listeners and the admin HTTP server. It builds and wires
// them and holds no domain logic. The command (serve, dev), the
// end-to-end tests and the browser test's server all build kproxy here,
// so they run the same thing; the command only turns its YAML file and
// flags into a Config.
package kproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/metric"

	"github.com/kproxy/kproxy/fleet"
	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/internal/coexist"
	"github.com/kproxy/kproxy/internal/fleetrun"
	"github.com/kproxy/kproxy/internal/groupconfig"
	"github.com/kproxy/kproxy/internal/shares"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// GroupsMode says who serves consumer groups.
type GroupsMode string

const (
	// GroupsDistributed: the kproxies in front of the cluster serve
	// groups, one owner per group (docs/fleet.md).
	GroupsDistributed GroupsMode = "distributed"
	// GroupsLocal: this kproxy alone serves the groups of its clients.
	GroupsLocal GroupsMode = "local"
	// GroupsForward: the brokers serve groups; kproxy forwards.
	GroupsForward GroupsMode = "forward"
)

// Config is everything Start needs. The zero value of a field means the
// default of the package it configures unless said otherwise.
type Config struct {
	// Upstream lists the cluster's bootstrap brokers.
	Upstream []string
	// DialTimeout bounds kproxy's own client's dials to the cluster;
	// zero keeps franz-go's default.
	DialTimeout time.Duration
	// UpstreamOpts are further options of kproxy's own client of the
	// cluster (the store's, the fleet's and the admin server's), after
	// the seeds, DialTimeout and the client id "kproxy".
	UpstreamOpts []kgo.Opt
	// Proxy configures the listeners. Start sets Coordinator and
	// MeterProvider; Upstreams defaults to Upstream and Logger to
	// Logger.
	Proxy proxy.Config
	// Groups chooses who serves consumer groups and configures the
	// engine.
	Groups GroupsConfig
	// Authorization authorizes the group requests kproxy serves itself
	// with the cluster's ACLs (authz.go); the zero value is off.
	// Proxy.RequireSASL closes unauthenticated connections that send
	// them.
	Authorization AuthorizationConfig
	// Telemetry configures traces and metrics. Start sets InstanceID;
	// Logger defaults to Logger.
	Telemetry tap.Config
	// AdminListen is the admin HTTP server's address (health,
	// readiness, metrics, the group API, the event stream, the web
	// view); empty runs none.
	AdminListen string
	// AdminWrap, when set, wraps the admin handler (the browser test's
	// server adds its control endpoint this way).
	AdminWrap func(http.Handler) http.Handler
	// AdminTLS, when set, makes the admin server HTTPS with the
	// source's certificate (client certificates as the source says;
	// AdminWrap decides what needs one).
	AdminTLS *proxy.TLSSource
	// FleetView, when set, answers /api/fleet instead of the fleet
	// runtime (the browser test serves a fixed fleet).
	FleetView func() tap.FleetView
	// ID names this process: its fleet member and the owner of its
	// traces. Empty: host, pid and start time.
	ID string
	// Logger receives every component's logs; nil discards them.
	Logger *slog.Logger
}

// GroupsConfig configures the serving of consumer groups.
type GroupsConfig struct {
	// Mode is distributed, local or forward.
	Mode GroupsMode
	// ServeShares makes kproxy serve share groups (KIP-932) itself
	// (package shares), in local or distributed mode. Otherwise the
	// cluster serves them and kproxy forwards their requests.
	ServeShares bool
	// SharesAuto, with ServeShares false and the engine on (local or
	// distributed), serves share groups when the cluster lacks them
	// (its brokers do not advertise ShareGroupHeartbeat) or when the
	// groups topic holds share groups kproxy served before; else they
	// are forwarded (shares.Decide). It is decided once, at start.
	SharesAuto bool
	// Engine configures the coordinator engine (local and distributed).
	// Start sets Store, ClusterGroups and Owns; Logger defaults to
	// Logger; Events, when set, receives every event after tap's sink.
	Engine groupstate.Config
	// WrapStore, when set, wraps the local mode's store before the
	// engine gets it (a benchmark drops the group records this way).
	WrapStore func(groupstate.OffsetStore) groupstate.OffsetStore
	// Fleet configures distributed mode.
	Fleet FleetConfig
	// Anchors configures the groups' anchors in the cluster's own
	// coordinator (docs/anchors.md), in local and distributed mode.
	Anchors AnchorsConfig
	// SettingSources names, by Kafka config name, the group settings of
	// Engine the command took from a flag or the file
	// (groupconfig.SourceFlag, SourceFile). Every other setting Engine
	// leaves at its zero value is taken from the cluster
	// (DescribeConfigs, package groupconfig); a non-zero field is
	// explicit (SourceConfig). A listed setting is
	// explicit even at its zero value.
	SettingSources map[string]string
	// IgnoreClusterSettings keeps the engine's defaults for the settings
	// Engine leaves unset instead of the cluster's; the cluster is still
	// read, for the admin API.
	IgnoreClusterSettings bool
	// SettingsRefresh is how often the cluster's group settings are
	// re-read to report a change (applied at the next start): 0 means a
	// minute, negative never.
	SettingsRefresh time.Duration
	// GroupConfigsRefresh is how often the GROUP configs of the KIP-848
	// groups served here (consumer.session.timeout.ms,
	// consumer.heartbeat.interval.ms; package groupconfig) are read again,
	// applied at each group's next heartbeat: 0 means 30s.
	GroupConfigsRefresh time.Duration
}

// AnchorsConfig configures anchoring (docs/anchors.md).
type AnchorsConfig struct {
	// Disabled serves groups without anchors: the cluster sees kproxy's
	// groups as empty groups with offsets, and groups live on the
	// cluster are not forwarded.
	Disabled bool
	// SessionTimeout is the anchors' session timeout in the cluster
	// (0: 2m); HeartbeatInterval how often they heartbeat (0: a quarter
	// of it).
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	// JoinClients bounds the anchors' joins and syncs in flight at once,
	// each on an upstream client of its own (0: 256).
	JoinClients int
}

// FleetConfig configures distributed groups (docs/fleet.md).
type FleetConfig struct {
	// Name keeps two fleets in front of one cluster apart: "" uses the
	// fleet group __kproxy_fleet and the groups topic __kproxy_groups,
	// NAME uses __kproxy_fleet.NAME and __kproxy_groups.NAME.
	Name string
	// Relay makes this kproxy own no groups and relay every group
	// request to its owner; otherwise it is an owner.
	Relay bool
	// SessionTimeout is the fleet membership's session;
	// HeartbeatInterval how often this kproxy heartbeats the fleet.
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	// PeerListen is where other kproxies reach this one; empty uses the
	// proxy's listen host on an ephemeral port.
	PeerListen string
	// PeerAdvertise is the peer address told to other kproxies, when it
	// differs from PeerListen.
	PeerAdvertise string
	// KeepCutOffMembers turns off telling the members whose requests
	// this kproxy relays or serves to give up their partitions once no
	// owner is reachable past their session (proxy.RouterConfig); for
	// measuring what members see without it. The zero value tells them.
	KeepCutOffMembers bool
	// PeerTLS, when set, makes the peer wire mutual TLS: the peer
	// listener requires a certificate chaining to the source's CA
	// bundle (its ClientCAFile, required), and this kproxy presents the
	// source's certificate to the owners it relays to and verifies
	// theirs against the same CA.
	PeerTLS *proxy.TLSSource
	// PeerTLSServerName is the name an owner's certificate must carry;
	// empty: the host of the peer address it advertises.
	PeerTLSServerName string
}

// Server is a running kproxy. It is built by Start and owned by its
// caller; every field is written during Start only, except that
// Shutdown runs the closers once.
type Server struct {
	cfg      Config
	log      *slog.Logger
	id       string      // this process's id: fleet member, traces
	upstream *kgo.Client // kproxy's own client of the cluster
	// upstreamOpts built upstream; a client of its own is built from
	// them where sharing upstream's connections would hold requests up
	// (the fleet member's). Immutable after wire.
	upstreamOpts []kgo.Opt
	engine       *groupstate.Engine // nil with groups forwarded
	shares       *shares.Service    // nil unless share groups are served
	// shareService is what the proxy hands share requests to: shares,
	// authorized when group authorization is on (authz.go).
	shareService proxy.ShareService
	fleet        *fleetrun.Runtime // nil unless groups are distributed
	tap          *tap.Tap
	coordinator  proxy.Coordinator
	// coexist is the coexistence with the cluster's coordinator:
	// anchors, forwarding, takeover (nil with anchors off or groups
	// forwarded); immutable after wiring.
	coexist       *coexist.Coexist
	meterProvider metric.MeterProvider
	events        []func(groupstate.Event)
	proxy         *proxy.Proxy
	adminAddr     string // "" without an admin server
	// groupSettings reports the engine's group settings and where they
	// came from (nil with groups forwarded); immutable after wiring,
	// internally synchronised.
	groupSettings *groupconfig.Settings
	// groupConfigs caches the KIP-848 groups' own GROUP configs (nil
	// when the embedding program sets Engine.GroupSettings itself, or
	// with groups forwarded); immutable after wiring, internally
	// synchronised.
	groupConfigs *groupconfig.Configs
	// groupConfigService answers GROUP config requests where kproxy
	// keeps them (groupconfigs.go; nil where the cluster has them);
	// immutable after wiring.
	groupConfigService proxy.Coordinator
	// closers run in reverse order at shutdown.
	closers []func(context.Context) error

	shutdownOnce sync.Once
	shutdownErr  error // written once by Shutdown
}

// Start builds kproxy from cfg and starts it: it returns once clients can
// connect to Addr. Shutdown stops it. On error, everything started is
// stopped again.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := wire(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := wireAuthz(ctx, s, cfg); err != nil {
		s.close(context.Background())
		return nil, err
	}
	log := cfg.Logger
	pcfg := cfg.Proxy
	if len(pcfg.Upstreams) == 0 {
		pcfg.Upstreams = cfg.Upstream
	}
	if pcfg.Logger == nil {
		pcfg.Logger = log
	}
	pcfg.Coordinator = s.coordinator
	if s.shareService != nil {
		pcfg.Shares = s.shareService
	}
	if s.coexist != nil {
		pcfg.Forwarder = s.coexist.Forwarder()
	}
	if s.groupConfigs != nil && pcfg.ConfigsAltered == nil {
		pcfg.ConfigsAltered = s.groupConfigs.Altered
	}
	if s.groupConfigService != nil {
		pcfg.GroupConfigs = s.groupConfigService
	}
	pcfg.MeterProvider = s.meterProvider
	p, err := proxy.New(pcfg)
	if err != nil {
		s.close(context.Background())
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		s.close(context.Background())
		return nil, err
	}
	s.proxy = p
	if err := s.startAdmin(ctx); err != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = s.Shutdown(sctx)
		return nil, err
	}
	return s, nil
}

// wire builds what runs around the proxy: the upstream client,
// telemetry and, unless groups are forwarded, the engine (and in
// distributed mode the fleet runtime). Closers run in reverse order.
func wire(ctx context.Context, cfg Config) (*Server, error) {
	log := cfg.Logger
	w := &Server{cfg: cfg, log: log, id: cfg.ID}
	if w.id == "" {
		w.id = fleetrun.NewID()
	}
	opts := []kgo.Opt{kgo.SeedBrokers(cfg.Upstream...), kgo.ClientID("kproxy")}
	if cfg.DialTimeout > 0 {
		opts = append(opts, kgo.DialTimeout(cfg.DialTimeout))
	}
	opts = append(opts, cfg.UpstreamOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("upstream client: %w", err)
	}
	w.upstream, w.upstreamOpts = cl, opts
	w.closers = append(w.closers, func(context.Context) error { cl.Close(); return nil })
	if err := wireTelemetry(ctx, w, cfg.Telemetry, log); err != nil {
		w.close(context.Background())
		return nil, err
	}
	if cfg.Groups.SharesAuto && !cfg.Groups.ServeShares && cfg.Groups.Mode != GroupsForward {
		topic := kafkastore.DefaultGroupsTopic
		if cfg.Groups.Mode == GroupsDistributed {
			_, topic = fleetrun.Names(cfg.Groups.Fleet.Name)
		}
		held := kafkastore.NewWith(cl, kafkastore.Options{GroupsTopic: topic, Logger: log.With("component", "store")})
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		choice, err := shares.Decide(dctx, cl, func(ctx context.Context) ([]string, error) {
			return held.GroupsWhere(ctx, groupstate.IsShareGroupRecord)
		})
		cancel()
		if err != nil {
			w.close(context.Background())
			return nil, fmt.Errorf("share groups auto: %w (start with --share-groups serve or forward to choose)", err)
		}
		cfg.Groups.ServeShares = choice.Serve
		switch {
		case len(choice.Held) > 0:
			log.Warn("share groups: kproxy serves them", "why", choice.Why)
		case choice.Serve:
			log.Info("share groups: kproxy serves them", "why", choice.Why)
		default:
			log.Info("share groups: kproxy forwards them", "why", choice.Why)
		}
	}
	if cfg.Groups.ServeShares && cfg.Groups.Mode == GroupsForward {
		w.close(context.Background())
		return nil, fmt.Errorf("serving share groups needs groups mode local or distributed, not %q", cfg.Groups.Mode)
	}
	if cfg.Groups.Mode == GroupsForward {
		return w, nil
	}
	engCfg := cfg.Groups.Engine
	var probe func() (bool, error)
	if engCfg.GroupSettings == nil {
		probe = w.probeGroupConfigs(ctx)
	}
	w.groupSettings = groupconfig.ReadSettings(ctx, kadm.NewClient(cl), groupconfig.SettingsConfig{
		Sources:       cfg.Groups.SettingSources,
		IgnoreCluster: cfg.Groups.IgnoreClusterSettings,
		Refresh:       cfg.Groups.SettingsRefresh,
		Logger:        log.With("component", "group_settings"),
	}, &engCfg)
	w.runUntilClose(w.groupSettings.Run)
	if engCfg.GroupSettings == nil { // else the embedding program's own
		w.groupConfigs = groupconfig.NewConfigs(cl, cfg.Groups.GroupConfigsRefresh, log.With("component", "group_configs"))
		engCfg.GroupSettings = w.groupConfigs.Get
		w.keepGroupConfigs(probe)
		w.runUntilClose(w.groupConfigs.Run)
	}
	if engCfg.Logger == nil {
		engCfg.Logger = log.With("component", "engine")
	}
	if extra := engCfg.Events; extra != nil {
		w.events = append(w.events, extra)
	}
	engCfg.Events = w.publish
	if cfg.Groups.Mode == GroupsDistributed {
		if err := startFleet(ctx, w, cfg, engCfg, log); err != nil {
			w.close(context.Background())
			return nil, err
		}
		return w, nil
	}
	ks := kafkastore.New(cl)
	w.enableAnchors(ks, cfg, func() bool { return true }, nil)
	var store groupstate.OffsetStore = ks
	if cfg.Groups.WrapStore != nil {
		store = cfg.Groups.WrapStore(store)
	}
	engCfg.Store = store
	engCfg.ClusterGroups = coexist.NewClusterGroups(ks.Cluster())
	eng, err := groupstate.New(engCfg)
	if err != nil {
		w.close(context.Background())
		return nil, w.groupSettings.EngineError(err)
	}
	w.engine = eng
	if w.coexist != nil {
		w.coexist.AttachEngine(eng)
	}
	w.coordinator = w.engineCoordinator(eng)
	w.startCoexist()
	// The engine closes before the upstream client it stores through.
	w.closers = append(w.closers, func(context.Context) error { eng.Close(); return nil })
	if cfg.Groups.ServeShares {
		if err := w.startShares(eng, log); err != nil {
			w.close(context.Background())
			return nil, err
		}
	}
	return w, nil
}

// startShares starts the share service over ops: the engine, or in a
// fleet the engine behind the router (shares.Routed).
func (w *Server) startShares(ops shares.Ops, log *slog.Logger) error {
	scfg := shares.Config{
		Engine:    ops,
		NewClient: func() (*kgo.Client, error) { return kgo.NewClient(w.upstreamOpts...) },
		Logger:    log.With("component", "shares"),
	}
	if w.groupConfigs != nil {
		scfg.ConfigsRead = w.groupConfigs.Unread
	}
	svc, err := shares.New(scfg)
	if err != nil {
		return err
	}
	w.shares, w.shareService = svc, svc
	// The service closes before the engine it asks.
	w.closers = append(w.closers, func(context.Context) error { svc.Close(); return nil })
	return nil
}

// startCoexist starts the takeover loop of the coexistence with the
// cluster's coordinator, if there is one, once wiring set it up.
func (w *Server) startCoexist() {
	if w.coexist == nil {
		return
	}
	w.coexist.Start()
	w.closers = append(w.closers, func(context.Context) error { w.coexist.Stop(); return nil })
}

// publish fans an engine event out to the sinks registered at wiring
// time (tap, then Config.Groups.Engine.Events). It runs on the engine's
// loop goroutines and never blocks.
func (w *Server) publish(ev groupstate.Event) {
	for _, f := range w.events {
		f(ev)
	}
}

// EngineCoordinator adapts a groupstate.Engine to proxy.Coordinator: the
// proxy's client becomes the engine's request context.
func EngineCoordinator(e *groupstate.Engine) proxy.Coordinator { return engineCoordinator{e: e} }

// engineCoordinator adapts groupstate.Engine to proxy.Coordinator.
type engineCoordinator struct{ e *groupstate.Engine }

func (c engineCoordinator) Handle(cl proxy.Client, req kmsg.Request, reply func(kmsg.Response)) {
	c.e.Handle(groupstate.RequestContext{ClientID: cl.ID, ClientHost: cl.Host}, req, reply)
}

// engineCoordinator is eng as the proxy's coordinator: with the groups'
// own configs read here, a joining KIP-848 member waits for its group's
// first read (groupconfig.Configs.WaitFirstRead).
func (w *Server) engineCoordinator(eng *groupstate.Engine) proxy.Coordinator {
	var c proxy.Coordinator = engineCoordinator{e: eng}
	if w.groupConfigs != nil {
		c = w.groupConfigs.WaitFirstRead(c)
	}
	return c
}

// runUntilClose runs loop on a goroutine of its own until kproxy stops:
// its closer ends loop's context and waits for it to return (before the
// upstream client closes: closers run in reverse).
func (w *Server) runUntilClose(loop func(context.Context)) {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); loop(ctx) }()
	w.closers = append(w.closers, func(context.Context) error { stop(); <-done; return nil })
}

// Addr is the proxy's bootstrap address.
func (w *Server) Addr() string { return w.proxy.Addr() }

// AdminAddr is the admin server's address, "" without one.
func (w *Server) AdminAddr() string { return w.adminAddr }

// Engine is the coordinator engine, nil with groups forwarded.
func (w *Server) Engine() *groupstate.Engine { return w.engine }

// Tap is kproxy's telemetry.
func (w *Server) Tap() *tap.Tap { return w.tap }

// Upstream is kproxy's own client of the cluster.
func (w *Server) Upstream() *kgo.Client { return w.upstream }

// Shutdown drains in-flight requests until ctx ends, then stops
// everything Start started, in reverse order. Only the first call does
// anything; later calls return its result.
func (w *Server) Shutdown(ctx context.Context) error {
	w.shutdownOnce.Do(func() { w.shutdownErr = w.shutdown(ctx) })
	return w.shutdownErr
}

func (w *Server) shutdown(ctx context.Context) error {
	log := w.log
	grace := 2 * time.Second
	if d, ok := ctx.Deadline(); ok {
		grace = min(grace, time.Until(d)/2)
	}
	drained := make(chan error, 1)
	go func() { drained <- w.proxy.Shutdown(ctx) }()
	var errP error
	select {
	case errP = <-drained:
	case <-time.After(grace):
		// Requests parked in the engine (a JoinGroup waiting for a
		// rebalance) would hold the drain until the deadline: closing
		// the engine answers them, and the drain finishes.
		log.Info("closing the coordinator to answer parked group requests")
		if w.engine != nil {
			w.engine.Close()
		}
		errP = <-drained
	}
	errW := w.close(ctx)
	err := errors.Join(errP, errW)
	if err != nil {
		log.Warn("shutdown incomplete", "err", err)
	} else {
		log.Info("shutdown complete")
	}
	return err
}

func (w *Server) close(ctx context.Context) error {
	var err error
	for i := len(w.closers) - 1; i >= 0; i-- {
		if e := w.closers[i](ctx); e != nil && err == nil {
			err = e
		}
	}
	return err
}

// enableAnchors turns on the anchors of store and the per-group
// forwarding that goes with them (package coexist, docs/anchors.md),
// unless disabled. leaveOnClose, asked when kproxy stops, makes the
// anchors leave their groups then: in local mode always (nobody takes
// them over), in a fleet when no other owner is left to replace them
// (the last kproxy of the fleet stops: the application's members go on
// on the brokers at once, without waiting for the anchors' sessions to
// expire). owns says which groups this kproxy serves (nil: all, local
// mode).
func (w *Server) enableAnchors(store *kafkastore.Store, cfg Config, leaveOnClose func() bool, owns func(string) bool) {
	ac := cfg.Groups.Anchors
	if ac.Disabled {
		return
	}
	// An anchor joins with its members' longest session (so a kproxy
	// that died holds the cluster's group no longer than its members
	// would); in a fleet at least two fleet sessions, so that the next
	// owner replaces it before its session ends.
	var minSession time.Duration
	if cfg.Groups.Mode == GroupsDistributed {
		fs := cfg.Groups.Fleet.SessionTimeout
		if fs <= 0 {
			fs = fleet.DefaultSessionTimeout
		}
		minSession = 2 * fs
	}
	c := coexist.Enable(coexist.Config{
		Store:             store,
		FleetName:         cfg.Groups.Fleet.Name,
		SessionTimeout:    ac.SessionTimeout,
		MinSessionTimeout: minSession,
		HeartbeatInterval: ac.HeartbeatInterval,
		// Each join and sync on a client of its own: one the cluster
		// holds (an empty group's initial rebalance delay, a hand-back
		// waiting for the cluster's members) holds up no other.
		NewClient:   func() (*kgo.Client, error) { return kgo.NewClient(w.upstreamOpts...) },
		JoinClients: ac.JoinClients,
		Local:       cfg.Groups.Mode == GroupsLocal,
		Owns:        owns,
		Logger:      w.log.With("component", "anchors"),
	})
	w.coexist = c
	// Runs before the upstream client closes (closers run in reverse).
	w.closers = append(w.closers, func(ctx context.Context) error {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c.CloseAnchors(lctx, leaveOnClose())
		return nil
	})
}
