// Package coexist is kproxy living beside the cluster's own group
// coordinator (docs/anchors.md), in one place:
//
//   - the anchors (anchor.go): one classic member per group the engine
//     serves, in the cluster's group of the same id, under whose
//     identity the group's commits reach the cluster's coordinator; the
//     store asks them through kafkastore.Anchors;
//   - the takeover of a forwarded group, the anchors' part
//     (anchor_takeover.go, anchor_takeover_kip848.go) and the watching
//     and deciding part (takeover.go, takeover_kip848.go; across a
//     fleet, takeover_fleet.go);
//   - the hand-back of a group to the cluster (anchor_handback.go);
//   - which groups are forwarded to the cluster's coordinator, and when
//     (forward.go), and what the anchors' news changes there (Enable);
//   - the cluster's own groups, as ListGroups and DescribeGroups through
//     kproxy show those the engine does not hold (clustergroups.go).
//
// It has one entry for each side: Coexist.AttachEngine for the engine
// (the Engine interface is all it asks of it; the engine's own side of
// takeover and hand-back stays in groupstate: consumer_takeover.go,
// classic_handback.go, anchor.go) and Coexist.Forwarder for the data
// path (the proxy.GroupForwarder that proxy/forward.go asks). The
// assembly (internal/kproxy) builds it with Enable and wires those. The
// cluster's groups (NewClusterGroups) stand apart from Enable: the
// assembly gives them to the engine as its Config.ClusterGroups
// whenever its store is over the cluster, anchors on or off.
//
// It is internal: its API is the assembly's wiring, not for programs
// that embed kproxy, like internal/shares beside it.
package coexist

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// Engine is what coexistence asks of the coordinator engine;
// *groupstate.Engine implements it.
type Engine interface {
	// Unload drops the groups match selects from the engine.
	Unload(match func(group string) bool)
	// HandBack starts handing group back to the cluster's coordinator:
	// how long its members may take to rejoin there, false if the
	// engine does not hand it back; freed is what the static members
	// of instance ids moved (restarted against the brokers) were
	// assigned, the engine having replaced them.
	HandBack(group string, moved []string) (wait time.Duration, freed map[string]map[string][]int32, ok bool)
	// ConsumerTakeoverRecord builds the engine's record of a KIP-848
	// group taken over from the cluster.
	ConsumerTakeoverRecord(groupstate.ConsumerTakeover) ([]byte, error)
	// ConsumerHeartbeatInterval is the heartbeat interval the engine
	// gives KIP-848 members.
	ConsumerHeartbeatInterval() time.Duration
	// AnchorHeld reports that the anchor of group synced the Anchor of
	// version (groupstate.Anchor.Version).
	AnchorHeld(group string, version uint64)
}

var _ Engine = (*groupstate.Engine)(nil)

// Config configures Enable.
type Config struct {
	// Store is the engine's store over the cluster; Enable turns its
	// anchors on. Required.
	Store *kafkastore.Store
	// FleetName is the fleet's name ("" for a single kproxy): the
	// anchors' group.instance.id is DefaultAnchorInstanceID, with
	// ".<FleetName>" appended in a fleet.
	FleetName string
	// SessionTimeout, MinSessionTimeout and HeartbeatInterval are the
	// anchors' (AnchorOptions); zero takes the defaults.
	SessionTimeout, MinSessionTimeout, HeartbeatInterval time.Duration
	// JoinClients bounds the anchors' join clients (kafkastore).
	JoinClients int
	// NewClient builds a client of the cluster for an anchor's join
	// and sync.
	NewClient func() (*kgo.Client, error)
	// Local: a single kproxy (not a fleet). A group whose anchor is
	// lost for any reason is then forwarded to the cluster's
	// coordinator; in a fleet only when the cluster serves it or it was
	// handed back (another kproxy may own it next).
	Local bool
	// Owns says which groups this kproxy serves; nil: every group. A
	// forwarded group is taken over by its owner.
	Owns func(group string) bool
	// Logger; nil discards.
	Logger *slog.Logger
}

// Coexist is one kproxy's coexistence with the cluster's coordinator.
// Built by Enable during the assembly; its methods are safe for
// concurrent use once Start ran.
type Coexist struct {
	anchors *Anchors        // immutable
	fw      *forwardSet     // immutable
	watcher *forwardWatcher // immutable
	log     *slog.Logger    // immutable
	// engine is the attached Engine (AttachEngine), nil before; read by
	// the store's anchor callbacks on their goroutines.
	engine atomic.Pointer[engineRef]

	stopOnce sync.Once
	stop     context.CancelFunc // set by Start
}

// engineRef boxes an Engine for an atomic pointer.
type engineRef struct{ e Engine }

// Enable turns on cfg.Store's anchors and the per-group forwarding that
// goes with them.
func Enable(cfg Config) *Coexist {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Coexist{log: log}
	var fw *forwardSet
	instance := DefaultAnchorInstanceID
	if cfg.FleetName != "" {
		instance += "." + cfg.FleetName
	}
	as := newAnchors(cfg.Store, AnchorOptions{
		InstanceID:        instance,
		SessionTimeout:    cfg.SessionTimeout,
		MinSessionTimeout: cfg.MinSessionTimeout,
		HeartbeatInterval: cfg.HeartbeatInterval,
		NewClient:         cfg.NewClient,
		JoinClients:       cfg.JoinClients,
		MemberHeartbeatInterval: func() time.Duration {
			if e := c.attached(); e != nil {
				return e.ConsumerHeartbeatInterval()
			}
			return 0
		},
		OnHeld: func(group string, version uint64) {
			if e := c.attached(); e != nil {
				e.AnchorHeld(group, version)
			}
		},
		MembersFenced: func(group string, since time.Time, ids []string) map[string]bool {
			return c.watcher.fencedSince(group, since, ids) // set below, before as.start
		},
		OnLost: func(group string, why AnchorLoss) {
			if why == AnchorLiveOnCluster || why == AnchorHandedBack || cfg.Local {
				fw.mark(group)
			}
			if e := c.attached(); e != nil {
				e.Unload(func(g string) bool { return g == group })
			}
			log.Info("group handed to the cluster's coordinator", "group", group, "why", why.String())
		},
		OnHandBack: func(group string, moved []string) (time.Duration, map[string]map[string][]int32, bool) {
			e := c.attached()
			if e == nil {
				return 0, nil, false
			}
			// Forwarding first: the members' JoinGroups after the
			// engine's REBALANCE_IN_PROGRESS go to the cluster.
			fw.handBack(group)
			wait, freed, ok := e.HandBack(group, moved)
			if !ok {
				fw.set(group, forwardEntry{at: time.Now()})
				return 0, nil, false
			}
			log.Info("a member reached the cluster's group directly: handing the group back", "group", group)
			return wait, freed, true
		},
		OnLive: func(group string) {
			if !fw.Forwarded(group) {
				log.Info("group live on the cluster's coordinator: forwarded to it", "group", group)
			}
			fw.mark(group)
		},
	})
	fw = newForwardSet(as)
	c.anchors, c.fw = as, fw
	c.watcher = newForwardWatcher(fw, as, cfg.Owns, log)
	as.start() // the callbacks above run from here on
	return c
}

func (c *Coexist) attached() Engine {
	if r := c.engine.Load(); r != nil {
		return r.e
	}
	return nil
}

// AttachEngine is the engine's entry: the engine built over the store,
// which lost anchors unload, hand-backs ask, and takeovers build their
// records with. Call it before Start.
func (c *Coexist) AttachEngine(e Engine) {
	c.engine.Store(&engineRef{e: e})
	c.watcher.consumerRecord = e.ConsumerTakeoverRecord
}

// Forwarder is the data path's entry (proxy.Config.Forwarder): it
// names the groups the cluster's coordinator serves and watches the
// requests forwarded there.
func (c *Coexist) Forwarder() proxy.GroupForwarder { return c.watcher }

// HandedBack reports whether group's requests go to the cluster's
// coordinator, or are about to: forwarded, or being handed back by this
// kproxy's anchor. An owner refusing a member's request for such a
// group says so to the relaying kproxy (proxy.PeerServerConfig.Forwarded),
// which then passes the refusal on instead of waiting for a next owner.
func (c *Coexist) HandedBack(group string) bool {
	return c.fw.Forwarded(group) || c.fw.handingBack(group)
}

// Forwarded lists the groups forwarded now, for the admin API.
func (c *Coexist) Forwarded() []tap.ForwardedGroup { return c.fw.list() }

// RegisterMessages registers the kproxy messages coexistence serves in
// a fleet (takeover reports) on msgs.
func (c *Coexist) RegisterMessages(msgs *proxy.PeerMessages) {
	msgs.Handle(reportType, reportVersion, c.watcher.handleReport)
}

// SendFunc sends a kproxy message to a group's owner
// (proxy.Router.SendPeer).
type SendFunc func(ctx context.Context, group, typ string, version int16, payload []byte) ([]byte, error)

// JoinFleet makes this kproxy, named id in the fleet, report the members
// it forwards to their groups' owners through send. Call it before
// Start.
func (c *Coexist) JoinFleet(id string, send SendFunc) {
	c.watcher.id, c.watcher.send = id, send
}

// Guard wraps the engine's coordinator in a fleet: it refuses the
// takeover reports of kproxies of an earlier version before the engine
// sees them (takeover_fleet.go).
func (c *Coexist) Guard(co proxy.Coordinator) proxy.Coordinator {
	return legacyReportGuard{Coordinator: co}
}

// Start starts the takeover loop. Stop ends it.
func (c *Coexist) Start() {
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	go c.watcher.run(ctx)
}

// Stop ends the takeover loop; safe without Start and more than once.
func (c *Coexist) Stop() {
	c.stopOnce.Do(func() {
		if c.stop != nil {
			c.stop()
		}
	})
}

// CloseAnchors ends the anchors, leaving their groups when leave is
// true; bounded by ctx. Call it before the store's client closes.
func (c *Coexist) CloseAnchors(ctx context.Context, leave bool) {
	c.anchors.Close(ctx, leave)
}
