package groupconfig

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/proxy"
)

// The GROUP configs (KIP-848, Kafka's GroupConfig) kproxy applies to the
// KIP-848 groups it serves, in place of the engine-wide
// group.consumer.session.timeout.ms and group.consumer.heartbeat.interval.ms,
// as Kafka's coordinator does. They are set on the cluster
// (`kafka-configs --entity-type groups --entity-name G --alter
// --add-config consumer.session.timeout.ms=...`, directly or through
// kproxy, which forwards IncrementalAlterConfigs untouched) and read here.
//
// The share groups kproxy serves (KIP-932) take their share.* GROUP
// configs the same way. On a cluster without GROUP configs (before Kafka
// 4.0) kproxy keeps them itself (Store, Service) and Configs reads them
// from its Store instead of the cluster (UseStore).
const (
	groupConfigSession  = "consumer.session.timeout.ms"
	groupConfigInterval = "consumer.heartbeat.interval.ms"
)

// shareGroupConfigs are the share groups' GROUP configs (Kafka's
// GroupConfig), read with the KIP-848 ones.
var shareGroupConfigs = []string{
	"share.session.timeout.ms", "share.heartbeat.interval.ms", "share.record.lock.duration.ms",
	"share.delivery.count.limit", "share.partition.max.record.locks", "share.auto.offset.reset", "share.isolation.level",
	"share.renew.acknowledge.enable",
}

// setShareConfig applies one share.* GROUP config to s.
func setShareConfig(s *groupstate.ShareSettings, name, value string) {
	value = strings.TrimSpace(value)
	ms := func() time.Duration {
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil || v <= 0 {
			return 0
		}
		return time.Duration(v) * time.Millisecond
	}
	n := func() int {
		v, err := strconv.Atoi(value)
		if err != nil || v <= 0 {
			return 0
		}
		return v
	}
	switch name {
	case "share.session.timeout.ms":
		s.SessionTimeout = ms()
	case "share.heartbeat.interval.ms":
		s.HeartbeatInterval = ms()
	case "share.record.lock.duration.ms":
		s.LockDuration = ms()
	case "share.delivery.count.limit":
		s.DeliveryLimit = n()
	case "share.partition.max.record.locks":
		s.MaxRecordLocks = n()
	case "share.auto.offset.reset":
		// A by_duration value that does not parse is logged where it
		// would apply (package shares), which then takes latest.
		if _, isDur, _ := groupstate.ShareResetDuration(value); isDur || value == "earliest" || value == "latest" {
			s.AutoOffsetReset = value
		}
	case "share.isolation.level":
		s.ReadCommitted = value == "read_committed"
	case "share.renew.acknowledge.enable":
		s.RenewDisabled = strings.EqualFold(value, "false")
	}
}

const (
	// groupConfigsRefresh is how often the configs of every group asked
	// about are read again.
	groupConfigsRefresh = 30 * time.Second
	// groupConfigsForget drops a group nobody asked about for this long.
	groupConfigsForget = 10 * time.Minute
	// groupConfigsBatch bounds the groups of one DescribeConfigs.
	groupConfigsBatch = 500
	// groupConfigsFirstWait bounds how long a group's first joining
	// heartbeat waits for the group's first read.
	groupConfigsFirstWait = 500 * time.Millisecond
)

// Configs caches the GROUP configs of the groups the engine serves.
// Get answers from the cache at once (it runs on the engine's shard
// loops at every KIP-848 heartbeat). A group's first joining heartbeat
// waits for its first read (WaitFirstRead, at most
// groupConfigsFirstWait), so that it is answered with the group's own
// settings, as Kafka's coordinator answers it; a heartbeat after a change
// on the cluster gets the new settings once the next refresh read them
// (every groupConfigsRefresh), or at once when the change went through
// kproxy (Altered: as Kafka's coordinator applies a group's new configs
// as soon as they are set).
type Configs struct {
	cl      kmsg.Requestor // kproxy's own client of the cluster; immutable
	log     *slog.Logger   // immutable
	refresh time.Duration  // immutable
	wake    chan struct{}  // buffered(1): a group to read was added

	mu      sync.Mutex
	entries map[string]*groupConfigEntry // guarded by mu
	// off: the cluster has no GROUP configs (a broker before KIP-848's,
	// or one that refuses the resource type); nothing is asked again.
	off bool // guarded by mu

	// failing: the last read failed (written by Run, one log line per
	// episode; read by Unread, which then does not make joins wait).
	failing atomic.Bool
	// Owned by Run: whether a group's describe was refused was logged.
	refusedLogged bool
	// local, when set (UseStore, before Run), is where the groups'
	// configs are read instead of the cluster; immutable after.
	local *Store
}

// UseStore makes c read the groups' configs from st (kproxy's own, for a
// cluster without GROUP configs) instead of the cluster, and read a
// group again as soon as st changes it; before Run.
func (c *Configs) UseStore(st *Store) {
	c.local = st
	st.OnChange(c.changed)
}

// groupConfigEntry is one group's cache entry; its fields are guarded
// by Configs.mu, but for readCh, which is immutable.
type groupConfigEntry struct {
	settings groupstate.GroupSettings
	read     bool          // read at least once
	stale    bool          // changed on the cluster since the last read
	readCh   chan struct{} // closed when read turns true, or the entry is dropped
	used     time.Time     // last get
}

func newGroupConfigEntry(now time.Time) *groupConfigEntry {
	return &groupConfigEntry{used: now, readCh: make(chan struct{})}
}

// markRead records the entry's first read; c.mu is held.
func (e *groupConfigEntry) markRead() {
	if !e.read {
		e.read = true
		close(e.readCh)
	}
}

// NewConfigs returns an empty cache reading the groups' configs with cl
// (kproxy's own client of the cluster) once Run runs, every refresh (0:
// 30s).
func NewConfigs(cl kmsg.Requestor, refresh time.Duration, log *slog.Logger) *Configs {
	if refresh <= 0 {
		refresh = groupConfigsRefresh
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Configs{cl: cl, log: log, refresh: refresh, wake: make(chan struct{}, 1),
		entries: map[string]*groupConfigEntry{}}
}

// Get is groupstate.Config.GroupSettings.
func (c *Configs) Get(group string) groupstate.GroupSettings {
	now := time.Now()
	c.mu.Lock()
	if c.off {
		c.mu.Unlock()
		return groupstate.GroupSettings{}
	}
	e := c.entries[group]
	if e == nil {
		c.entries[group] = newGroupConfigEntry(now)
		c.mu.Unlock()
		c.kick()
		return groupstate.GroupSettings{}
	}
	e.used = now
	gs := e.settings
	c.mu.Unlock()
	return gs
}

// Unread returns a channel closed once group's configs are read for the
// first time, asking for that read as Get does; nil when they were read
// already, or when no read is coming soon: the cluster has no GROUP
// configs, or the last read failed.
func (c *Configs) Unread(group string) <-chan struct{} {
	if c.failing.Load() {
		return nil
	}
	now := time.Now()
	c.mu.Lock()
	if c.off {
		c.mu.Unlock()
		return nil
	}
	e := c.entries[group]
	if e != nil {
		e.used = now
		read, ch := e.read, e.readCh
		c.mu.Unlock()
		if read {
			return nil
		}
		return ch
	}
	e = newGroupConfigEntry(now)
	c.entries[group] = e
	c.mu.Unlock()
	c.kick()
	return e.readCh
}

// Altered is proxy.Config.ConfigsAltered: the groups whose GROUP configs
// a forwarded AlterConfigs or IncrementalAlterConfigs changed (the
// cluster answered their resource without error) are read again now
// rather than at the next refresh. Groups not cached are left alone:
// their first read comes when they are first asked about.
func (c *Configs) Altered(resp kmsg.Response) {
	var groups []string
	switch r := resp.(type) {
	case *kmsg.IncrementalAlterConfigsResponse:
		for _, res := range r.Resources {
			if res.ResourceType == kmsg.ConfigResourceTypeGroupConfig && res.ErrorCode == 0 {
				groups = append(groups, res.ResourceName)
			}
		}
	case *kmsg.AlterConfigsResponse:
		for _, res := range r.Resources {
			if res.ResourceType == kmsg.ConfigResourceTypeGroupConfig && res.ErrorCode == 0 {
				groups = append(groups, res.ResourceName)
			}
		}
	}
	c.changed(groups)
}

// changed marks groups' cache entries stale and has Run read them again.
func (c *Configs) changed(groups []string) {
	if len(groups) == 0 {
		return
	}
	stale := false
	c.mu.Lock()
	for _, g := range groups {
		if e := c.entries[g]; e != nil {
			e.stale, stale = true, true
		}
	}
	c.mu.Unlock()
	if stale {
		c.kick()
	}
}

// kick wakes Run to read the groups added.
func (c *Configs) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Run reads the groups added since the last read as they come, and every
// refresh all of them, until ctx ends.
func (c *Configs) Run(ctx context.Context) {
	tick := time.NewTicker(c.refresh)
	defer tick.Stop()
	for {
		all := false
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-tick.C:
			all = true
		}
		if !c.readOnce(ctx, all) {
			return
		}
	}
}

// readOnce reads the groups not read yet (all: every group, forgetting
// those unused for groupConfigsForget); false once the cluster has no
// GROUP configs.
func (c *Configs) readOnce(ctx context.Context, all bool) bool {
	now := time.Now()
	var groups []string
	c.mu.Lock()
	for g, e := range c.entries {
		switch {
		case all && now.Sub(e.used) > groupConfigsForget:
			e.markRead() // nobody waits on it any more; closed all the same
			delete(c.entries, g)
		case all || !e.read || e.stale:
			groups = append(groups, g)
		}
	}
	c.mu.Unlock()
	for len(groups) > 0 && ctx.Err() == nil {
		n := min(len(groups), groupConfigsBatch)
		read, err := c.describe(ctx, groups[:n])
		groups = groups[n:]
		if errors.Is(err, errNoGroupConfigs) {
			c.mu.Lock()
			for _, e := range c.entries {
				e.markRead() // the joins waiting go on with the engine's
			}
			c.off, c.entries = true, nil
			c.mu.Unlock()
			c.log.Info("the cluster has no group configs (KIP-848 GROUP resources): every group has the engine's consumer session timeout and heartbeat interval", "err", err)
			return false
		}
		if err != nil {
			if !c.failing.Swap(true) {
				c.log.Warn("cannot read the groups' own configs: their members keep the settings they have until a read succeeds", "err", err)
			}
			return true
		}
		if c.failing.Swap(false) {
			c.log.Info("reading the groups' own configs again")
		}
		var refused []string
		c.mu.Lock()
		for g, r := range read {
			e := c.entries[g]
			if e == nil {
				continue
			}
			// A refused group is asked again at the next refresh, not
			// at every new group's read.
			if r.err == nil {
				if e.read && e.settings != r.settings {
					c.log.Info("group config changed", "group", g,
						"consumer_session_timeout", r.settings.ConsumerSessionTimeout, "consumer_heartbeat_interval", r.settings.ConsumerHeartbeatInterval)
				}
				e.settings = r.settings
				e.stale = false
			} else {
				refused = append(refused, g)
			}
			e.markRead()
		}
		c.mu.Unlock()
		if len(refused) > 0 && !c.refusedLogged {
			c.refusedLogged = true
			c.log.Warn("the cluster refuses to describe some groups' configs (kproxy's principal needs DESCRIBE_CONFIGS on them): they keep the engine's settings; logged once",
				"example_group", refused[0], "err", read[refused[0]].err)
		}
	}
	return true
}

// errNoGroupConfigs: the cluster does not know GROUP config resources.
var errNoGroupConfigs = errors.New("no group configs on the cluster")

// describe reads the two configs of groups with one DescribeConfigs.
// Only values set on the group itself count (source GROUP_CONFIG): a
// group without them has the engine's, which came from the same
// cluster's broker settings. A group the cluster refuses to describe
// (no DESCRIBE_CONFIGS right on it) has the refusal; it keeps what it
// had.
func (c *Configs) describe(ctx context.Context, groups []string) (map[string]groupConfigRead, error) {
	if c.local != nil {
		select {
		case <-c.local.Ready():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		out := make(map[string]groupConfigRead, len(groups))
		for _, g := range groups {
			out[g] = groupConfigRead{settings: settingsOf(c.local.Group(g))}
		}
		return out, nil
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, g := range groups {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, g
		r.ConfigNames = append([]string{groupConfigSession, groupConfigInterval}, shareGroupConfigs...)
		req.Resources = append(req.Resources, r)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(rctx, c.cl)
	if err != nil {
		return nil, err
	}
	out := make(map[string]groupConfigRead, len(groups))
	for _, r := range resp.Resources {
		switch err := kerr.ErrorForCode(r.ErrorCode); {
		case err == nil:
		case errors.Is(err, kerr.InvalidRequest), errors.Is(err, kerr.UnsupportedVersion):
			return nil, errors.Join(errNoGroupConfigs, err)
		default:
			out[r.ResourceName] = groupConfigRead{err: err}
			continue
		}
		out[r.ResourceName] = groupConfigRead{settings: settingsOf(setOnGroup(r))}
	}
	return out, nil
}

// setOnGroup is the configs a described GROUP resource has set on the
// group itself (source GROUP_CONFIG), by name.
func setOnGroup(r kmsg.DescribeConfigsResponseResource) map[string]string {
	set := map[string]string{}
	for _, cfg := range r.Configs {
		if cfg.Source == kmsg.ConfigSourceGroupConfig && cfg.Value != nil {
			set[cfg.Name] = *cfg.Value
		}
	}
	return set
}

// settingsOf is the engine's settings for a group's own configs (those
// set on it).
func settingsOf(set map[string]string) groupstate.GroupSettings {
	var gs groupstate.GroupSettings
	for name, value := range set {
		if strings.HasPrefix(name, "share.") {
			setShareConfig(&gs.Share, name, value)
			continue
		}
		ms, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err != nil || ms <= 0 {
			continue
		}
		switch name {
		case groupConfigSession:
			gs.ConsumerSessionTimeout = time.Duration(ms) * time.Millisecond
		case groupConfigInterval:
			gs.ConsumerHeartbeatInterval = time.Duration(ms) * time.Millisecond
		}
	}
	return gs
}

// groupConfigRead is one group's answer: its settings, or why the
// cluster refused to describe it.
type groupConfigRead struct {
	settings groupstate.GroupSettings
	err      error
}

// WaitFirstRead is next with, for a KIP-848 member joining a group
// whose GROUP configs were not read yet, a wait for that read (at most
// groupConfigsFirstWait), so that its first answer carries the group's
// own heartbeat interval and its session the group's timeout, as from
// Kafka's coordinator; once per group, and never while the reads fail.
func (c *Configs) WaitFirstRead(next proxy.Coordinator) proxy.Coordinator {
	return firstReadWaiter{next: next, gc: c}
}

// firstReadWaiter is Configs.WaitFirstRead's coordinator.
type firstReadWaiter struct {
	next proxy.Coordinator
	gc   *Configs
}

func (w firstReadWaiter) Handle(cl proxy.Client, req kmsg.Request, reply func(kmsg.Response)) {
	if q, ok := req.(*kmsg.ConsumerGroupHeartbeatRequest); ok && q.MemberEpoch == 0 {
		if read := w.gc.Unread(q.Group); read != nil {
			req := proxy.CloneRequest(req) // the wait outlives the caller's buffers
			go func() {
				t := time.NewTimer(groupConfigsFirstWait)
				defer t.Stop()
				select {
				case <-read:
				case <-t.C:
				}
				w.next.Handle(cl, req, reply)
			}()
			return
		}
	}
	w.next.Handle(cl, req, reply)
}
