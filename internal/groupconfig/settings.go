package groupconfig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/tap"
)

// The group settings kproxy takes from the cluster (issue 21). A group
// behaves through kproxy as on the cluster behind it: unless a setting is
// given explicitly (a flag, the config file, or a non-zero field of the
// engine's Config), the engine uses the value the brokers answer
// DescribeConfigs (BROKER) with, and kproxy's own default only when the
// cluster cannot be read or does not name the setting. The names and
// Kafka's defaults are those of Kafka's GroupCoordinatorConfig (classic
// group configs and KIP-848's consumer group configs) and
// ShareGroupConfig (KIP-932's share group configs). Kafka documents
// them as static: a broker reads them at start, so they change only with
// a broker restart. kproxy likewise reads them once before its engine is
// built (the engine's Config is immutable after groupstate.New, read by
// the shard loops without locks) and re-reads them periodically only to
// report a change, which it applies at its own next start.

// Setting sources, as the admin API names them.
const (
	SourceFlag    = "flag"    // a command-line flag
	SourceFile    = "file"    // the configuration file
	SourceConfig  = "config"  // a field of Config set by the program embedding kproxy
	SourceCluster = "cluster" // the cluster's DescribeConfigs answer
	SourceDefault = "default" // kproxy's default (Kafka's, where kproxy has the setting)
)

// defaultGroupSettingsRefresh is SettingsConfig.Refresh's default.
const defaultGroupSettingsRefresh = time.Minute

// groupSetting is one group setting: its Kafka name and how it maps onto
// the engine's Config.
type groupSetting struct {
	name string // Kafka's broker config name
	// set reports whether cfg gives the setting explicitly.
	set func(cfg *groupstate.Config) bool
	// apply parses the cluster's value into cfg.
	apply func(cfg *groupstate.Config, v string) error
	// show renders the value cfg gives the engine, def the engine's
	// default for a zero field. Nil for a setting the engine does not
	// have (reported only).
	show func(cfg *groupstate.Config) string
	def  string
}

// groupSettings lists the settings in the order the admin API shows them.
var groupSettings = []groupSetting{
	msSetting("group.initial.rebalance.delay.ms", "3000",
		func(c *groupstate.Config) *time.Duration { return &c.InitialRebalanceDelay }, true),
	msSetting("group.min.session.timeout.ms", "6000",
		func(c *groupstate.Config) *time.Duration { return &c.MinSessionTimeout }, false),
	msSetting("group.max.session.timeout.ms", "1800000",
		func(c *groupstate.Config) *time.Duration { return &c.MaxSessionTimeout }, false),
	intSetting("group.max.size", "unlimited", func(c *groupstate.Config) *int { return &c.MaxGroupSize }),
	msSetting("group.consumer.session.timeout.ms", "45000",
		func(c *groupstate.Config) *time.Duration { return &c.ConsumerSessionTimeout }, false),
	msSetting("group.consumer.min.session.timeout.ms", "45000",
		func(c *groupstate.Config) *time.Duration { return &c.ConsumerMinSessionTimeout }, false),
	msSetting("group.consumer.max.session.timeout.ms", "60000",
		func(c *groupstate.Config) *time.Duration { return &c.ConsumerMaxSessionTimeout }, false),
	msSetting("group.consumer.heartbeat.interval.ms", "5000",
		func(c *groupstate.Config) *time.Duration { return &c.ConsumerHeartbeatInterval }, false),
	// KIP-848's bounds of a group's own consumer.heartbeat.interval.ms
	// (a GROUP config, which kproxy does not have): reported only.
	{name: "group.consumer.min.heartbeat.interval.ms"},
	{name: "group.consumer.max.heartbeat.interval.ms"},
	{
		name: "group.consumer.assignors",
		set:  func(c *groupstate.Config) bool { return c.ConsumerAssignors != nil },
		apply: func(c *groupstate.Config, v string) error {
			as, err := parseAssignors(v)
			if err != nil {
				return err
			}
			c.ConsumerAssignors = as
			return nil
		},
		show: func(c *groupstate.Config) string { return strings.Join(c.ConsumerAssignors, ",") },
		def:  groupstate.AssignorUniform + "," + groupstate.AssignorRange,
	},
	intSetting("group.consumer.max.size", "unlimited", func(c *groupstate.Config) *int { return &c.ConsumerMaxGroupSize }),
	{
		name: "group.consumer.migration.policy",
		set:  func(c *groupstate.Config) bool { return c.ConsumerMigrationPolicy != "" },
		apply: func(c *groupstate.Config, v string) error {
			p, err := groupstate.ParseMigrationPolicy(strings.TrimSpace(v))
			if err != nil {
				return err
			}
			c.ConsumerMigrationPolicy = p
			return nil
		},
		show: func(c *groupstate.Config) string { return string(c.ConsumerMigrationPolicy) },
		def:  string(groupstate.MigrationBidirectional),
	},
	// KIP-932's share group settings (Kafka's ShareGroupConfig), for
	// the share groups kproxy serves; a group's own share.* GROUP
	// configs override them.
	msSetting("group.share.session.timeout.ms", "45000",
		func(c *groupstate.Config) *time.Duration { return &c.ShareDefaults.SessionTimeout }, false),
	msSetting("group.share.heartbeat.interval.ms", "5000",
		func(c *groupstate.Config) *time.Duration { return &c.ShareDefaults.HeartbeatInterval }, false),
	msSetting("group.share.record.lock.duration.ms", "30000",
		func(c *groupstate.Config) *time.Duration { return &c.ShareDefaults.LockDuration }, false),
	intSetting("group.share.delivery.count.limit", "5", func(c *groupstate.Config) *int { return &c.ShareDefaults.DeliveryLimit }),
	intSetting("group.share.partition.max.record.locks", "2000", func(c *groupstate.Config) *int { return &c.ShareDefaults.MaxRecordLocks }),
	intSetting("group.share.max.size", "200", func(c *groupstate.Config) *int { return &c.ShareDefaults.MaxSize }),
}

// msSetting is a setting in milliseconds held as a Duration. With
// zeroIsNone, a cluster's 0 means none, which the engine spells as a
// negative duration (InitialRebalanceDelay).
func msSetting(name, def string, field func(*groupstate.Config) *time.Duration, zeroIsNone bool) groupSetting {
	return groupSetting{
		name: name,
		def:  def,
		set:  func(c *groupstate.Config) bool { return *field(c) != 0 },
		apply: func(c *groupstate.Config, v string) error {
			ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
			if err != nil {
				return fmt.Errorf("not a number of milliseconds: %w", err)
			}
			switch {
			case ms < 0:
				return fmt.Errorf("negative: %d", ms)
			case ms == 0 && zeroIsNone:
				*field(c) = -1
			case ms == 0:
				return errors.New("zero")
			default:
				*field(c) = time.Duration(ms) * time.Millisecond
			}
			return nil
		},
		show: func(c *groupstate.Config) string {
			d := *field(c)
			if d < 0 {
				return "0"
			}
			return strconv.FormatInt(d.Milliseconds(), 10)
		},
	}
}

// intSetting is a size limit; the engine's 0 is unlimited.
func intSetting(name, def string, field func(*groupstate.Config) *int) groupSetting {
	return groupSetting{
		name: name,
		def:  def,
		set:  func(c *groupstate.Config) bool { return *field(c) != 0 },
		apply: func(c *groupstate.Config, v string) error {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
			if err != nil {
				return fmt.Errorf("not a number: %w", err)
			}
			if n <= 0 {
				return fmt.Errorf("not positive: %d", n)
			}
			*field(c) = int(n)
			return nil
		},
		show: func(c *groupstate.Config) string {
			if n := *field(c); n > 0 {
				return strconv.Itoa(n)
			}
			return "unlimited"
		},
	}
}

// parseAssignors maps Kafka's group.consumer.assignors (built-in names or
// class names, KIP-848) onto kproxy's assignors. Kafka's UniformAssignor
// and RangeAssignor are kproxy's uniform and range; a custom assignor has
// no counterpart and is left out. The first one is the default, as in
// Kafka.
func parseAssignors(v string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		var name string
		switch a {
		case "":
			continue
		case groupstate.AssignorUniform, "org.apache.kafka.coordinator.group.assignor.UniformAssignor":
			name = groupstate.AssignorUniform
		case groupstate.AssignorRange, "org.apache.kafka.coordinator.group.assignor.RangeAssignor":
			name = groupstate.AssignorRange
		default:
			if len(out) == 0 {
				// The cluster's default assignor is a custom one:
				// members that name none would be assigned
				// differently through kproxy.
				return nil, fmt.Errorf("the default assignor %q is not one kproxy has (uniform, range)", a)
			}
			continue // a custom assignor members must ask for by name
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no assignor in %q", v)
	}
	return out, nil
}

// clusterGroupSettings is one read of the cluster's group settings.
type clusterGroupSettings struct {
	broker int32
	values map[string]string // by Kafka name; only the settings the broker named
	at     time.Time
	err    error // why the cluster could not be read
}

// readClusterGroupSettings asks one broker of the cluster for its group
// settings (DescribeConfigs, resource type BROKER, that broker's id: a
// broker describes its own static and dynamic configs and their
// defaults, KIP-226). Sensitive configs are never kept.
func readClusterGroupSettings(ctx context.Context, adm *kadm.Client) clusterGroupSettings {
	out := clusterGroupSettings{broker: -1, at: time.Now()}
	brokers, err := adm.ListBrokers(ctx)
	if err != nil {
		out.err = fmt.Errorf("listing the brokers: %w", err)
		return out
	}
	if len(brokers) == 0 {
		out.err = errors.New("the cluster named no broker")
		return out
	}
	out.broker = brokers[0].NodeID
	rcs, err := adm.DescribeBrokerConfigs(ctx, out.broker)
	if err != nil {
		out.err = fmt.Errorf("describing broker %d's configs: %w", out.broker, err)
		return out
	}
	rc, err := rcs.On(strconv.Itoa(int(out.broker)), nil)
	if err == nil && rc.Err != nil {
		err = rc.Err
		if rc.ErrMessage != "" {
			err = fmt.Errorf("%w: %s", rc.Err, rc.ErrMessage)
		}
	}
	if err != nil {
		out.err = fmt.Errorf("describing broker %d's configs: %w", out.broker, err)
		return out
	}
	out.values = make(map[string]string)
	for _, c := range rc.Configs {
		if c.Sensitive || c.Value == nil {
			continue
		}
		if slices.ContainsFunc(groupSettings, func(s groupSetting) bool { return s.name == c.Key }) {
			out.values[c.Key] = *c.Value
		}
	}
	return out
}

// resolvedSetting is where one setting's effective value came from.
type resolvedSetting struct {
	name    string
	value   string // what the engine uses; "" for a setting it does not have
	source  string
	problem string // why the cluster's value was not used, if it was not
}

// resolveGroupSettings fills the settings cfg leaves unset from the
// cluster's values. sources names where the command took the explicit
// ones from (flag, file) by Kafka name; an entry marks a setting explicit
// even when its field is zero (--group-max-size 0, unlimited). cluster.values
// is nil when the cluster could not be read.
func resolveGroupSettings(cfg groupstate.Config, sources map[string]string, cluster clusterGroupSettings) (groupstate.Config, []resolvedSetting) {
	out := make([]resolvedSetting, 0, len(groupSettings))
	explicit := func(s groupSetting) (string, bool) {
		if src, ok := sources[s.name]; ok {
			return src, true
		}
		if s.set != nil && s.set(&cfg) {
			return SourceConfig, true
		}
		return "", false
	}
	sessionExplicit := false
	for _, s := range groupSettings {
		r := resolvedSetting{name: s.name, source: SourceDefault}
		v, fromCluster := cluster.values[s.name]
		switch src, isExplicit := explicit(s); {
		case s.apply == nil:
			// Reported only: the engine has no such setting.
			if fromCluster {
				r.value, r.source = v, SourceCluster
			}
			r.problem = "kproxy has no per-group consumer.heartbeat.interval.ms for it to bound"
		case isExplicit:
			r.source = src
			if s.name == "group.consumer.session.timeout.ms" {
				sessionExplicit = true
			}
		case fromCluster:
			if err := s.apply(&cfg, v); err != nil {
				r.problem = fmt.Sprintf("the cluster's value %q: %v", v, err)
			} else {
				r.source = SourceCluster
			}
		}
		out = append(out, r)
	}
	// An explicit KIP-848 session timeout outside the bounds it would get
	// from the cluster (or the defaults) widens them: the bounds bound a
	// group's own session timeout in Kafka, and the explicit value is the
	// operator's choice for every group here.
	if sessionExplicit {
		lo, hi := cfg.ConsumerMinSessionTimeout, cfg.ConsumerMaxSessionTimeout
		if lo == 0 {
			lo = 45 * time.Second
		}
		if hi == 0 {
			hi = 60 * time.Second
		}
		if s := cfg.ConsumerSessionTimeout; s > 0 {
			cfg.ConsumerMinSessionTimeout, cfg.ConsumerMaxSessionTimeout = min(lo, s), max(hi, s)
		}
	}
	for i, s := range groupSettings {
		if s.show == nil {
			continue
		}
		if out[i].source == SourceDefault && !s.set(&cfg) {
			out[i].value = s.def
		} else {
			out[i].value = s.show(&cfg)
		}
	}
	return cfg, out
}

// Settings is what the admin API reports about the group settings: what
// the engine was built with, and the cluster's latest answer. Built
// before the engine; mu guards latest, written by Run and read by the
// admin server.
type Settings struct {
	applied []resolvedSetting // immutable after ReadSettings
	ignore  bool              // the cluster's values are not used (immutable)
	unread  bool              // the cluster could not be read at the start (immutable)
	log     *slog.Logger      // immutable
	adm     *kadm.Client      // immutable
	every   time.Duration     // Run's period, negative: none (immutable)

	mu     sync.Mutex
	latest clusterGroupSettings // guarded by mu
}

// EngineError wraps an error of groupstate.New with the settings that
// did not come from kproxy's defaults, so that a conflict between an
// override and the cluster's value names both.
func (s *Settings) EngineError(err error) error {
	var set []string
	for _, r := range s.applied {
		if r.source != SourceDefault && r.value != "" {
			set = append(set, fmt.Sprintf("%s=%s from %s", r.name, r.value, r.source))
		}
	}
	if len(set) == 0 {
		return fmt.Errorf("coordinator engine: %w", err)
	}
	return fmt.Errorf("coordinator engine (group settings %s): %w", strings.Join(set, ", "), err)
}

// View is /api/group-settings.
func (s *Settings) View() tap.GroupSettingsView {
	s.mu.Lock()
	latest := s.latest
	s.mu.Unlock()
	v := tap.GroupSettingsView{
		Cluster: tap.GroupSettingsRead{Broker: latest.broker, At: latest.at},
	}
	if latest.err != nil {
		v.Cluster.Error = latest.err.Error()
	}
	for _, r := range s.applied {
		gs := tap.GroupSetting{Name: r.name, Value: r.value, Source: r.source, Note: r.problem}
		if cv, ok := latest.values[r.name]; ok {
			gs.Cluster = &cv
		}
		v.Settings = append(v.Settings, gs)
	}
	return v
}

// refresh re-reads the cluster's settings and logs each change to a
// setting the engine took from the cluster or from its default: it
// applies at kproxy's next start.
func (s *Settings) refresh(ctx context.Context, adm *kadm.Client) {
	now := readClusterGroupSettings(ctx, adm)
	s.mu.Lock()
	prev := s.latest
	s.latest = now
	s.mu.Unlock()
	switch {
	case s.ignore:
		return
	case now.err != nil && prev.err == nil:
		s.log.Warn("cannot re-read the cluster's group settings; the ones in use stay", "err", now.err)
		return
	case now.err != nil:
		s.log.Debug("cannot re-read the cluster's group settings", "err", now.err)
		return
	case prev.err != nil && s.unread:
		// Had the cluster been readable at the start, the engine
		// would use its values: say so once.
		s.log.Warn("the cluster's group settings can be read now; kproxy applies them at its next start (GET /api/group-settings compares)",
			"broker", now.broker)
		return
	case prev.err != nil:
		s.log.Info("read the cluster's group settings again", "broker", now.broker)
		return // a change while unreadable is shown by the admin API
	}
	for _, r := range s.applied {
		if r.source != SourceCluster && r.source != SourceDefault {
			continue
		}
		was, wasOK := prev.values[r.name]
		is, isOK := now.values[r.name]
		if was != is || wasOK != isOK {
			s.log.Warn("the cluster's group setting changed; kproxy applies it at its next start",
				"setting", r.name, "in_use", r.value, "cluster", is)
		}
	}
}

// SettingsConfig configures ReadSettings.
type SettingsConfig struct {
	// Sources names, by Kafka config name, the settings the command
	// took from a flag or the file (SourceFlag, SourceFile); a listed
	// setting is explicit even at its zero value.
	Sources map[string]string
	// IgnoreCluster keeps kproxy's defaults for the settings the
	// engine's Config leaves unset; the cluster is still read, for the
	// admin API.
	IgnoreCluster bool
	// Refresh is how often Run re-reads the cluster's settings to
	// report a change: 0 means a minute, negative never.
	Refresh time.Duration
	Logger  *slog.Logger
}

// ReadSettings reads the cluster's group settings into engCfg, before
// the engine is built, and returns what the admin API reports about
// them; Run re-reads them. Nothing here is on a request's path.
func ReadSettings(ctx context.Context, adm *kadm.Client, sc SettingsConfig, engCfg *groupstate.Config) *Settings {
	log := sc.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cluster := readClusterGroupSettings(rctx, adm)
	cancel()
	use := cluster
	if sc.IgnoreCluster {
		use.values = nil // read for the admin API only
	}
	resolved, applied := resolveGroupSettings(*engCfg, sc.Sources, use)
	*engCfg = resolved
	every := sc.Refresh
	if every == 0 {
		every = defaultGroupSettingsRefresh
	}
	st := &Settings{applied: applied, ignore: sc.IgnoreCluster, unread: cluster.err != nil, latest: cluster, log: log, adm: adm, every: every}
	switch {
	case sc.IgnoreCluster:
		log.Info("group settings: the cluster's are not used (kproxy's defaults where no flag or file sets them)", "cluster_read_err", cluster.err)
	case cluster.err != nil:
		log.Warn("cannot read the cluster's group settings: kproxy's defaults stand where no flag or file sets them", "err", cluster.err)
	default:
		var fromCluster []string
		for _, r := range applied {
			if r.source == SourceCluster {
				fromCluster = append(fromCluster, r.name+"="+r.value)
			}
			if r.problem != "" && r.source != SourceCluster && cluster.values[r.name] != "" {
				log.Warn("the cluster's group setting is not used", "setting", r.name, "why", r.problem)
			}
		}
		log.Info("group settings from the cluster", "broker", cluster.broker, "settings", fromCluster)
	}
	return st
}

// Run re-reads the cluster's group settings every SettingsConfig.Refresh
// until ctx ends, reporting changes (refresh); it returns at once when
// the refresh is off.
func (s *Settings) Run(ctx context.Context) {
	if s.every < 0 {
		return
	}
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			s.refresh(rctx, s.adm)
			cancel()
		}
	}
}
