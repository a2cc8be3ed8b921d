package kproxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/coexist"
	"github.com/kproxy/kproxy/internal/fleetrun"
	"github.com/kproxy/kproxy/internal/shares"
	"github.com/kproxy/kproxy/proxy"
)

// startFleet wires distributed mode (docs/fleet.md): the fleet runtime
// (package fleetrun: the transactional store, ownership), the engine
// gated on it, the peer server, the fleet member and the router, which
// becomes the proxy's coordinator.
func startFleet(ctx context.Context, w *Server, cfg Config, engCfg groupstate.Config, log *slog.Logger) error {
	fc := cfg.Groups.Fleet
	f, err := fleetrun.New(ctx, fleetrun.Config{
		ID: w.id, Client: w.upstream, Name: fc.Name, Logger: log, MeterProvider: w.meterProvider,
	})
	if err != nil {
		return err
	}
	w.enableAnchors(f.Store(), cfg, f.LastOwner, f.Owns)

	engCfg.Store = f.Store()
	engCfg.ClusterGroups = coexist.NewClusterGroups(f.Store().Cluster())
	engCfg.Owns = f.Owns
	eng, err := groupstate.New(engCfg)
	if err != nil {
		return w.groupSettings.EngineError(err)
	}
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
	var forwarded func(string) bool
	if w.coexist != nil {
		forwarded = w.coexist.HandedBack
	}
	peer, err := proxy.NewPeerServer(proxy.PeerServerConfig{
		Forwarded:   forwarded,
		Listen:      listen,
		Coordinator: w.fleetCoordinator(eng),
		Logger:      log.With("component", "peer"),
		MaxFrame:    cfg.Proxy.MaxFrame,
		TLS:         fc.PeerTLS,
		Serving:     f.Owns,
		Messages:    messages,
	})
	if err != nil {
		return fmt.Errorf("peer listener: %w", err)
	}
	w.closers = append(w.closers, func(context.Context) error { peer.Close(); return nil })

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
	leave, err := f.Join(fleetrun.JoinConfig{
		Engine:            eng,
		Peer:              peer,
		Advertise:         fc.PeerAdvertise,
		Client:            fcl,
		Relay:             fc.Relay,
		SessionTimeout:    fc.SessionTimeout,
		HeartbeatInterval: fc.HeartbeatInterval,
	})
	if err != nil {
		return err
	}
	// Closers run in reverse: the member leaves (handing its partitions
	// over) before the engine and the peer server close.
	w.closers = append(w.closers, leave)
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
		w.coexist.JoinFleet(w.id, router.SendPeer)
		w.startCoexist()
	}
	w.fleet = f
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
