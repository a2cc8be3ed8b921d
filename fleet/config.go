package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	// DefaultGroup is the upstream group the fleet joins when
	// Config.Group is empty.
	DefaultGroup = "__kproxy_fleet"
	// ProtocolType is the fleet group's protocol type. It is not
	// "consumer", so lag tools and consumer-group tooling leave the
	// group alone.
	ProtocolType = "kproxy"
	// ProtocolName is the one protocol every member offers: the sticky
	// cooperative assignor of this package with the v1 metadata and
	// assignment documents (codec.go).
	ProtocolName = "sticky-cooperative"

	DefaultSessionTimeout    = 10 * time.Second
	DefaultHeartbeatInterval = 1 * time.Second
	DefaultRebalanceTimeout  = 30 * time.Second
	DefaultLeaseMargin       = 2 * time.Second
)

// Config configures a Member. The zero value of every optional field
// means its documented default.
type Config struct {
	// Client talks to the brokers. Group requests are sent with
	// req.RequestWith(ctx, Client), which routes them to the group's
	// coordinator. Required; the Member never closes it.
	Client *kgo.Client
	// Group is the upstream classic group, default DefaultGroup.
	Group string
	// ID is this kproxy's stable id, carried in the metadata and shown
	// in the table. Required. It is deliberately not used as
	// group.instance.id (KIP-345 static membership): a static member
	// that comes back takes over its previous incarnation's member and
	// assignment at once, without a rebalance, while that incarnation,
	// if it was only paused or cut off, may still hold a valid lease:
	// two kproxies would both own the same partitions. A restarted
	// kproxy (or a second process started by mistake with the same id)
	// joins as a new dynamic member instead; its previous incarnation
	// leaves (LeaveGroup on SIGTERM) or expires a session after its last
	// heartbeat, by which time its lease has run out.
	ID string
	// PeerAddr is the advertised peer address other kproxies relay to,
	// carried in the metadata and the table.
	PeerAddr string
	// Partitions is P, the groups topic's partition count. Required.
	Partitions int32
	// Owner false makes this member a relay: it owns nothing, is still
	// a member and still receives the table.
	Owner bool

	// SessionTimeout, HeartbeatInterval and RebalanceTimeout are sent
	// to the coordinator (JoinGroup) and drive the heartbeat loop;
	// defaults 10s, 1s, 30s.
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	RebalanceTimeout  time.Duration
	// LeaseMargin is subtracted from every lease bound (default 2s): it
	// absorbs clock rate differences and the time a reply takes to
	// reach the loop.
	LeaseMargin time.Duration
	// Now is the clock the lease is measured with, default time.Now
	// (monotonic). Tests inject a clock that jumps.
	Now func() time.Time
	// Logger receives the member's logs; default discards.
	Logger *slog.Logger

	// The callbacks are called on the member loop goroutine, in order,
	// never concurrently with each other. Heartbeats go on while one
	// runs. Each may be nil. A callback may call Owns, Table, OwnerOf,
	// Snapshot and Drop, but not Leave (Leave waits for the loop).

	// OnAssigned is called with the partitions that became this
	// member's in generation gen. The callee claims them (fence, load,
	// claim) and may block up to RebalanceTimeout; ctx is cancelled
	// when that passes, when the lease is lost or when Run stops. Owns
	// is already true for them when it is called.
	OnAssigned func(ctx context.Context, gen int32, gained []int32)
	// OnRevoked is the cooperative give-up: the partitions are no
	// longer this member's in the new generation (or Leave was called).
	// Owns is already false for them when it is called; the callee lets
	// in-flight work finish, unloads them and returns. The member then
	// rejoins so the leader can give them to their new owner. ctx is
	// cancelled when the lease is lost: stop writing at once then.
	OnRevoked func(ctx context.Context, revoked []int32)
	// OnLost is called when partitions were lost without a give-up:
	// the lease ran out, the coordinator answered that this member is
	// unknown or of an old generation, Drop was called, or Run stopped
	// without Leave. Owns is already false for them; the callee drops
	// them at once and writes nothing more.
	OnLost func(lost []int32)
}

// withDefaults returns cfg with defaults filled in, or every problem
// found.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.RebalanceTimeout == 0 {
		cfg.RebalanceTimeout = DefaultRebalanceTimeout
	}
	if cfg.LeaseMargin == 0 {
		cfg.LeaseMargin = DefaultLeaseMargin
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.OnAssigned == nil {
		cfg.OnAssigned = func(context.Context, int32, []int32) {}
	}
	if cfg.OnRevoked == nil {
		cfg.OnRevoked = func(context.Context, []int32) {}
	}
	if cfg.OnLost == nil {
		cfg.OnLost = func([]int32) {}
	}

	var errs []error
	if cfg.Client == nil {
		errs = append(errs, errors.New("config.Client is required"))
	}
	if cfg.ID == "" {
		errs = append(errs, errors.New("config.ID is required"))
	}
	if cfg.Partitions <= 0 || cfg.Partitions > maxDocPartitions {
		errs = append(errs, fmt.Errorf("config.Partitions %d: want 1..%d", cfg.Partitions, maxDocPartitions))
	}
	ms := func(d time.Duration) bool { return d >= time.Millisecond && d.Milliseconds() <= math.MaxInt32 }
	if !ms(cfg.SessionTimeout) {
		errs = append(errs, fmt.Errorf("SessionTimeout %v out of range", cfg.SessionTimeout))
	}
	if !ms(cfg.RebalanceTimeout) {
		errs = append(errs, fmt.Errorf("RebalanceTimeout %v out of range", cfg.RebalanceTimeout))
	}
	if cfg.LeaseMargin < 0 || cfg.LeaseMargin >= cfg.SessionTimeout || cfg.LeaseMargin >= cfg.RebalanceTimeout {
		errs = append(errs, fmt.Errorf("LeaseMargin %v: want 0 < margin < SessionTimeout (%v) and < RebalanceTimeout (%v)",
			cfg.LeaseMargin, cfg.SessionTimeout, cfg.RebalanceTimeout))
	}
	if cfg.HeartbeatInterval <= 0 || cfg.HeartbeatInterval >= cfg.SessionTimeout-cfg.LeaseMargin {
		errs = append(errs, fmt.Errorf("HeartbeatInterval %v: want 0 < interval < SessionTimeout - LeaseMargin (%v)",
			cfg.HeartbeatInterval, cfg.SessionTimeout-cfg.LeaseMargin))
	}
	if len(errs) > 0 {
		return cfg, fmt.Errorf("fleet config: %w", errors.Join(errs...))
	}
	return cfg, nil
}
