package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/tap"
)

// fileConfig is the configuration file's shape; configs/kproxy.yaml
// documents every field. Precedence: defaults < file < flags.
type fileConfig struct {
	Upstream        []string        `yaml:"upstream"`
	Listen          string          `yaml:"listen"`
	AdvertiseHost   string          `yaml:"advertise_host"`
	AdvertisePort   int             `yaml:"advertise_port"`
	BrokerPorts     map[int32]int   `yaml:"broker_ports"`
	MaxFrameBytes   int32           `yaml:"max_frame_bytes"`
	MaxGroupRequest int32           `yaml:"max_group_request_bytes"`
	MaxRewriteResp  int32           `yaml:"max_rewrite_response_bytes"`
	FrameMemory     int64           `yaml:"frame_memory_bytes"`
	MaxInFlight     int             `yaml:"max_in_flight"`
	RequestTimeout  time.Duration   `yaml:"request_timeout"`
	IdleTimeout     time.Duration   `yaml:"idle_timeout"`
	MaxConns        int             `yaml:"max_connections"`
	MaxConnsPerHost int             `yaml:"max_connections_per_host"`
	DialTimeout     time.Duration   `yaml:"dial_timeout"`
	MetadataRefresh time.Duration   `yaml:"metadata_interval"`
	ShutdownTimeout time.Duration   `yaml:"shutdown_timeout"`
	AdminListen     string          `yaml:"admin_listen"`
	Log             logConfig       `yaml:"log"`
	Groups          groupsConfig    `yaml:"groups"`
	Telemetry       telemetryConfig `yaml:"telemetry"`

	// Security (security.go).
	TLS            listenerTLSConfig  `yaml:"tls"`
	UpstreamTLS    upstreamTLSConfig  `yaml:"upstream_tls"`
	UpstreamSASL   upstreamSASLConfig `yaml:"upstream_sasl"`
	AdminTokenFile string             `yaml:"admin_token_file"`
	// TLS on the peer and admin listeners (security_listeners.go).
	listenerSecurity `yaml:",inline"`

	// Group authorization (authz.go).
	Authorization authorizationConfig `yaml:"group_authorization"`

	// sources names, by Kafka config name, the group settings given by
	// the file (loadFile) or a flag (resolve): only those override the
	// cluster's values (kproxy.GroupsConfig.SettingSources).
	sources map[string]string
	// dialVia is the hidden --upstream-dial-via (dialvia.go); nil: none.
	dialVia dialVia
}

// groupSettingKeys are the keys of the file's groups section that set one
// of the group settings kproxy otherwise takes from the cluster, with
// Kafka's name for each. Only their presence is decoded.
type groupSettingKeys struct {
	Groups struct {
		MinSessionTimeout     any `yaml:"min_session_timeout"`
		MaxSessionTimeout     any `yaml:"max_session_timeout"`
		InitialRebalanceDelay any `yaml:"initial_rebalance_delay"`
		MaxSize               any `yaml:"max_size"`
		Consumer              struct {
			SessionTimeout    any `yaml:"session_timeout"`
			HeartbeatInterval any `yaml:"heartbeat_interval"`
			MaxSize           any `yaml:"max_size"`
			Assignors         any `yaml:"assignors"`
			MigrationPolicy   any `yaml:"migration_policy"`
		} `yaml:"consumer"`
		Share struct {
			SessionTimeout          any `yaml:"session_timeout"`
			HeartbeatInterval       any `yaml:"heartbeat_interval"`
			RecordLockDuration      any `yaml:"record_lock_duration"`
			DeliveryCountLimit      any `yaml:"delivery_count_limit"`
			PartitionMaxRecordLocks any `yaml:"partition_max_record_locks"`
			MaxSize                 any `yaml:"max_size"`
		} `yaml:"share"`
	} `yaml:"groups"`
}

func (k *groupSettingKeys) set() map[string]any {
	g := &k.Groups
	return map[string]any{
		"group.min.session.timeout.ms":           g.MinSessionTimeout,
		"group.max.session.timeout.ms":           g.MaxSessionTimeout,
		"group.initial.rebalance.delay.ms":       g.InitialRebalanceDelay,
		"group.max.size":                         g.MaxSize,
		"group.consumer.session.timeout.ms":      g.Consumer.SessionTimeout,
		"group.consumer.heartbeat.interval.ms":   g.Consumer.HeartbeatInterval,
		"group.consumer.max.size":                g.Consumer.MaxSize,
		"group.consumer.assignors":               g.Consumer.Assignors,
		"group.consumer.migration.policy":        g.Consumer.MigrationPolicy,
		"group.share.session.timeout.ms":         g.Share.SessionTimeout,
		"group.share.heartbeat.interval.ms":      g.Share.HeartbeatInterval,
		"group.share.record.lock.duration.ms":    g.Share.RecordLockDuration,
		"group.share.delivery.count.limit":       g.Share.DeliveryCountLimit,
		"group.share.partition.max.record.locks": g.Share.PartitionMaxRecordLocks,
		"group.share.max.size":                   g.Share.MaxSize,
	}
}

// setBy records that source (file or flag) gives the group setting name.
func (c *fileConfig) setBy(name, source string) {
	if c.sources == nil {
		c.sources = make(map[string]string)
	}
	c.sources[name] = source
}

// explicit reports whether a flag or the file gives the group setting.
func (c *fileConfig) explicit(name string) bool {
	_, ok := c.sources[name]
	return ok
}

type logConfig struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // text or json
}

type groupsConfig struct {
	Mode string `yaml:"mode"` // distributed, local or forward
	// Shares says who serves share groups (KIP-932): auto (the default:
	// kproxy's engine where the cluster lacks them or kproxy served them
	// before, else the cluster), forward (the cluster) or serve
	// (kproxy's engine, local or distributed).
	Shares                string        `yaml:"shares"`
	MinSessionTimeout     time.Duration `yaml:"min_session_timeout"`
	MaxSessionTimeout     time.Duration `yaml:"max_session_timeout"`
	InitialRebalanceDelay time.Duration `yaml:"initial_rebalance_delay"`
	MaxSize               int           `yaml:"max_size"`
	CheckCommitOwnership  bool          `yaml:"check_commit_ownership"`
	// SettingsFromCluster takes the group settings no flag or file key
	// sets from the cluster (docs/group-settings.md); false keeps
	// kproxy's defaults for them.
	SettingsFromCluster bool                 `yaml:"settings_from_cluster"`
	Consumer            consumerGroupsConfig `yaml:"consumer"`
	// Share holds the defaults of the share groups kproxy serves (not to
	// be confused with Shares above, which says who serves them).
	Share   shareGroupsConfig `yaml:"share"`
	Fleet   fleetConfig       `yaml:"fleet"`
	Anchors anchorsConfig     `yaml:"anchors"`
}

// anchorsConfig configures the groups' anchors in the cluster's own
// coordinator (docs/anchors.md).
type anchorsConfig struct {
	Enabled           bool          `yaml:"enabled"`
	SessionTimeout    time.Duration `yaml:"session_timeout"`
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// JoinClients bounds the anchors' JoinGroup and SyncGroup in flight
	// at once, each on a client of its own (0: 256).
	JoinClients int `yaml:"join_clients"`
}

// fleetConfig configures distributed groups (docs/fleet.md): the kproxies
// in front of one cluster that agree on one owner per group.
type fleetConfig struct {
	// Name keeps two fleets in front of one cluster apart: "" uses the
	// fleet group __kproxy_fleet and the groups topic __kproxy_groups,
	// NAME uses __kproxy_fleet.NAME and __kproxy_groups.NAME.
	Name string `yaml:"name"`
	// Role is owner (may own groups) or relay (owns nothing, relays
	// every group request to its owner).
	Role string `yaml:"role"`
	// SessionTimeout is the fleet membership's session: a kproxy that
	// stops heartbeating loses its groups after it.
	SessionTimeout    time.Duration `yaml:"session_timeout"`
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// PeerListen is where other kproxies reach this one; the default is
	// the listen host on an ephemeral port.
	PeerListen string `yaml:"peer_listen"`
	// PeerAdvertise is the peer address told to other kproxies, when it
	// differs from PeerListen (a pod IP behind 0.0.0.0).
	PeerAdvertise string `yaml:"peer_advertise"`
}

// consumerGroupsConfig configures KIP-848 (group.protocol=consumer) groups.
type consumerGroupsConfig struct {
	SessionTimeout    time.Duration `yaml:"session_timeout"`
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	MaxSize           int           `yaml:"max_size"`
	Assignors         []string      `yaml:"assignors"`
	// MigrationPolicy is group.consumer.migration.policy: bidirectional
	// (Kafka's default), upgrade, downgrade or disabled.
	MigrationPolicy string `yaml:"migration_policy"`
	// TopicRefreshInterval is how often the topics KIP-848 groups are
	// assigned from are reloaded from the cluster: a partition increase,
	// a deleted topic or a new regex match changes a group within it
	// plus a heartbeat (groupstate.Config.TopicRefreshInterval).
	TopicRefreshInterval time.Duration `yaml:"topic_refresh_interval"`
}

// shareGroupsConfig holds the group.share.* settings of the share groups
// kproxy serves (KIP-932), for a group without a share.* GROUP config of
// its own. A key left out takes the cluster's value: Kafka 4.0 and later
// name them, 3.x does not, and there Kafka's defaults apply unless set
// here.
type shareGroupsConfig struct {
	SessionTimeout          time.Duration `yaml:"session_timeout"`
	HeartbeatInterval       time.Duration `yaml:"heartbeat_interval"`
	RecordLockDuration      time.Duration `yaml:"record_lock_duration"`
	DeliveryCountLimit      int           `yaml:"delivery_count_limit"`
	PartitionMaxRecordLocks int           `yaml:"partition_max_record_locks"`
	MaxSize                 int           `yaml:"max_size"`
}

type telemetryConfig struct {
	ServiceName string           `yaml:"service_name"`
	Traces      tap.TracesConfig `yaml:"traces"`
}

func defaultConfig() fileConfig {
	return fileConfig{
		Listen:          "127.0.0.1:9092",
		MaxFrameBytes:   100 << 20,
		MaxGroupRequest: 8 << 20,
		MaxRewriteResp:  100 << 20,
		FrameMemory:     256 << 20,
		MaxInFlight:     128,
		RequestTimeout:  30 * time.Second,
		IdleTimeout:     10 * time.Minute,
		MaxConns:        50000,
		MaxConnsPerHost: 10000,
		DialTimeout:     10 * time.Second,
		MetadataRefresh: 30 * time.Second,
		ShutdownTimeout: 15 * time.Second,
		Log:             logConfig{Level: "info", Format: "text"},
		Groups: groupsConfig{
			Mode:                  "distributed",
			Shares:                "auto",
			MinSessionTimeout:     6 * time.Second,
			MaxSessionTimeout:     30 * time.Minute,
			InitialRebalanceDelay: 3 * time.Second,
			SettingsFromCluster:   true,
			Consumer: consumerGroupsConfig{
				SessionTimeout:    45 * time.Second,
				HeartbeatInterval: 5 * time.Second,
				Assignors:         []string{"uniform", "range"},
				MigrationPolicy:   string(groupstate.MigrationBidirectional),
				// Kafka's coordinator sees topic changes in its metadata
				// image at once; one Metadata request every 2s comes close.
				TopicRefreshInterval: 2 * time.Second,
			},
			Fleet: fleetConfig{
				Role:              "owner",
				SessionTimeout:    10 * time.Second,
				HeartbeatInterval: time.Second,
			},
			Anchors: anchorsConfig{Enabled: true, SessionTimeout: 2 * time.Minute, HeartbeatInterval: 30 * time.Second, JoinClients: 256},
		},
		Telemetry:     telemetryConfig{ServiceName: "kproxy"},
		Authorization: defaultAuthorization(),
	}
}

// loadFile merges the YAML file at path over c. Unknown keys are errors,
// so a typo does not silently fall back to a default.
func (c *fileConfig) loadFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, err)
	}
	var keys groupSettingKeys
	if err := yaml.Unmarshal(b, &keys); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	for name, n := range keys.set() {
		if n != nil {
			c.setBy(name, "file")
		}
	}
	return nil
}

// validate reports every problem at once.
func (c *fileConfig) validate() error {
	var errs []error
	if len(c.Upstream) == 0 {
		errs = append(errs, errors.New("no upstream broker: set --upstream or upstream in the config file"))
	}
	switch c.Groups.Mode {
	case "distributed", "local", "forward":
	default:
		errs = append(errs, fmt.Errorf("groups.mode %q: want distributed, local or forward", c.Groups.Mode))
	}
	switch c.Groups.Shares {
	case "forward", "auto":
	case "serve":
		if c.Groups.Mode == "forward" {
			errs = append(errs, fmt.Errorf("groups.shares serve needs groups.mode local or distributed (kproxy's engine serves share groups), not %q", c.Groups.Mode))
		}
	default:
		errs = append(errs, fmt.Errorf("groups.shares %q: want forward, serve or auto", c.Groups.Shares))
	}
	if fl := c.Groups.Fleet; c.Groups.Mode == "distributed" {
		if fl.Role != "owner" && fl.Role != "relay" {
			errs = append(errs, fmt.Errorf("groups.fleet.role %q: want owner or relay", fl.Role))
		}
		if fl.HeartbeatInterval <= 0 || fl.HeartbeatInterval*3 > fl.SessionTimeout {
			errs = append(errs, fmt.Errorf("groups.fleet.heartbeat_interval %v must be positive and at most a third of session_timeout %v", fl.HeartbeatInterval, fl.SessionTimeout))
		}
		if strings.ContainsAny(fl.Name, "/ ") {
			errs = append(errs, fmt.Errorf("groups.fleet.name %q: no slashes or spaces", fl.Name))
		}
		for name, addr := range map[string]string{"peer_listen": fl.PeerListen, "peer_advertise": fl.PeerAdvertise} {
			if addr == "" {
				continue
			}
			if _, _, err := net.SplitHostPort(addr); err != nil {
				errs = append(errs, fmt.Errorf("groups.fleet.%s %q: %w", name, addr, err))
			}
		}
	}
	// Settings left to the cluster are checked by the engine once the
	// cluster's values are in.
	if c.explicit("group.min.session.timeout.ms") && c.explicit("group.max.session.timeout.ms") &&
		c.Groups.MinSessionTimeout > c.Groups.MaxSessionTimeout {
		errs = append(errs, fmt.Errorf("groups.min_session_timeout %v exceeds max_session_timeout %v", c.Groups.MinSessionTimeout, c.Groups.MaxSessionTimeout))
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		errs = append(errs, fmt.Errorf("advertise_port %d out of range", c.AdvertisePort))
	}
	if c.MaxGroupRequest < 0 || c.MaxRewriteResp < 0 || c.FrameMemory < 0 {
		errs = append(errs, errors.New("max_group_request_bytes, max_rewrite_response_bytes and frame_memory_bytes must be >= 0"))
	}
	if c.Groups.MaxSize < 0 {
		errs = append(errs, errors.New("groups.max_size must be >= 0"))
	}
	if cg := c.Groups.Consumer; c.explicit("group.consumer.heartbeat.interval.ms") && c.explicit("group.consumer.session.timeout.ms") &&
		cg.HeartbeatInterval >= cg.SessionTimeout {
		errs = append(errs, fmt.Errorf("groups.consumer.heartbeat_interval %v must be shorter than session_timeout %v", cg.HeartbeatInterval, cg.SessionTimeout))
	}
	errs = append(errs, c.checkShare()...)
	for _, a := range c.Groups.Consumer.Assignors {
		if a != "uniform" && a != "range" {
			errs = append(errs, fmt.Errorf("groups.consumer.assignors: unknown assignor %q (uniform, range)", a))
		}
	}
	if d := c.Groups.Consumer.TopicRefreshInterval; d < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("groups.consumer.topic_refresh_interval %v must be at least 100ms", d))
	}
	if _, err := groupstate.ParseMigrationPolicy(c.Groups.Consumer.MigrationPolicy); err != nil {
		errs = append(errs, fmt.Errorf("groups.consumer.migration_policy: %w", err))
	}
	if _, err := parseLevel(c.Log.Level); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateSecurity()...)
	errs = append(errs, c.validateListenerSecurity()...)
	errs = append(errs, c.validateAuthorization()...)
	switch c.Log.Format {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("log.format %q: want text or json", c.Log.Format))
	}
	return errors.Join(errs...)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log.level %q: %w", s, err)
	}
	return l, nil
}

func (c *fileConfig) logger() *slog.Logger {
	level, _ := parseLevel(c.Log.Level)
	opts := &slog.HandlerOptions{Level: level}
	if c.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// flagSet binds the flags shared by serve and dev. Flags are applied over
// the file only when set on the command line (see apply).
type flagSet struct {
	fs          *pflag.FlagSet
	configPath  string
	upstream    []string
	listen      string
	advertise   string
	advPort     int
	adminListen string
	logLevel    string
	groupsMode  string
	sharesMode  string
	minSession  time.Duration
	maxSession  time.Duration
	initDelay   time.Duration
	maxSize     int
	checkOwner  bool
	fromCluster bool
	anchors     anchorsConfig
	migration   string
	topicEvery  time.Duration
	maxFrame    int32
	fleet       fleetConfig
	maxGroupReq int32
	maxRewrite  int32
	frameMemory int64
	reqTimeout  time.Duration
	idleTimeout time.Duration
	maxConns    int
	maxPerHost  int
	security    securityFlags
	listenerSec listenerSecurityFlags
	authz       authzFlags
}

func bindFlags(fs *pflag.FlagSet, withUpstream bool) *flagSet {
	f := &flagSet{fs: fs}
	fs.StringVar(&f.configPath, "config", "", "YAML configuration file (see configs/kproxy.yaml)")
	if withUpstream {
		fs.StringSliceVar(&f.upstream, "upstream", nil, "upstream bootstrap brokers, HOST:PORT[,HOST:PORT...]")
	}
	fs.StringVar(&f.listen, "listen", "127.0.0.1:9092", "bootstrap listener; broker N is served on port+1+N")
	fs.StringVar(&f.advertise, "advertise-host", "", "host advertised to clients (default: the listen host)")
	fs.IntVar(&f.advPort, "advertise-port", 0, "bootstrap port advertised to clients behind a port mapping; broker ports shift with it (default: the listen port)")
	fs.StringVar(&f.adminListen, "admin-listen", "", "admin HTTP server (health, metrics, API, web view), e.g. 127.0.0.1:9644")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.groupsMode, "groups", "distributed", "distributed: the kproxies in front of the cluster serve consumer groups, one owner per group; local: this kproxy alone serves the groups of its clients; forward: the brokers do")
	fs.StringVar(&f.sharesMode, "share-groups", "auto", "auto: kproxy serves share groups (KIP-932) where the cluster lacks them or where it served them before, the cluster serves them otherwise (decided at start; docs/share-groups.md); forward: the cluster serves them; serve: kproxy serves them (needs --groups local or distributed)")
	fs.StringVar(&f.fleet.PeerListen, "peer-listen", "", "where other kproxies of the fleet reach this one, HOST:PORT (default: the listen host, an ephemeral port)")
	fs.StringVar(&f.fleet.PeerAdvertise, "peer-advertise", "", "peer address told to the other kproxies, when it differs from --peer-listen")
	fs.StringVar(&f.fleet.Name, "fleet-name", "", "keeps fleets in front of one cluster apart (fleet group __kproxy_fleet.NAME, groups topic __kproxy_groups.NAME)")
	fs.StringVar(&f.fleet.Role, "fleet-role", "owner", "owner: may own groups; relay: owns none and relays group requests to their owners")
	fs.DurationVar(&f.fleet.SessionTimeout, "fleet-session-timeout", 10*time.Second, "a kproxy that stops heartbeating the fleet loses its groups after this long")
	fs.DurationVar(&f.fleet.HeartbeatInterval, "fleet-heartbeat-interval", time.Second, "how often a kproxy heartbeats the fleet")
	fs.DurationVar(&f.minSession, "group-min-session-timeout", 6*time.Second, "smallest session timeout a member may ask for; unset: the cluster's group.min.session.timeout.ms, this default if it cannot be read")
	fs.DurationVar(&f.maxSession, "group-max-session-timeout", 30*time.Minute, "largest session timeout a member may ask for; unset: the cluster's group.max.session.timeout.ms, this default if it cannot be read")
	fs.DurationVar(&f.initDelay, "group-initial-rebalance-delay", 3*time.Second, "wait for more members before a new group's first rebalance (0 disables); unset: the cluster's group.initial.rebalance.delay.ms, this default if it cannot be read")
	fs.IntVar(&f.maxSize, "group-max-size", 0, "most members per group (0: unlimited); unset: the cluster's group.max.size, this default if it cannot be read")
	fs.BoolVar(&f.fromCluster, "group-settings-from-cluster", true, "take the group settings no flag or file sets (group.initial.rebalance.delay.ms, session bounds, group.max.size, group.consumer.*) from the cluster with DescribeConfigs; false: kproxy's defaults (docs/group-settings.md)")
	fs.BoolVar(&f.checkOwner, "group-check-commit-ownership", false, "reject commits for partitions the member was not assigned in this generation")
	fs.BoolVar(&f.anchors.Enabled, "group-anchors", true, "anchor every served group in the cluster's own coordinator with one static member, so direct tools see it live and commits are fenced by the cluster; groups live on the cluster are forwarded to it (docs/anchors.md)")
	fs.DurationVar(&f.anchors.SessionTimeout, "group-anchor-session-timeout", 2*time.Minute, "longest session timeout of the anchors in the cluster (an anchor joins with its members' longest session, at least 6s, in a fleet at least two fleet sessions, at most this: how long the cluster keeps the anchor of a kproxy that is gone)")
	fs.IntVar(&f.anchors.JoinClients, "group-anchor-join-clients", 256, "most anchor joins in flight at once, each on an upstream connection of its own (a join the cluster holds, as an empty group's first for group.initial.rebalance.delay.ms, holds up no other)")
	fs.DurationVar(&f.topicEvery, "group-consumer-topic-refresh-interval", 2*time.Second, "how often the topics of KIP-848 groups are reloaded from the cluster: partition increases, deleted topics and new regex matches reach a group within it")
	fs.StringVar(&f.migration, "group-consumer-migration-policy", "bidirectional", "online conversion between classic and consumer (KIP-848) groups: bidirectional, upgrade, downgrade or disabled; unset: the cluster's group.consumer.migration.policy, this default if it cannot be read")
	fs.Int32Var(&f.maxFrame, "max-frame-bytes", 100<<20, "largest request or response frame")
	fs.Int32Var(&f.maxGroupReq, "max-group-request-bytes", 8<<20, "largest request kproxy reads whole to serve itself (group APIs)")
	fs.Int32Var(&f.maxRewrite, "max-rewrite-response-bytes", 100<<20, "largest upstream response kproxy reads whole to rewrite broker addresses (Metadata...)")
	fs.DurationVar(&f.reqTimeout, "request-timeout", 30*time.Second, "time a request may take to arrive whole once its first byte has")
	fs.DurationVar(&f.idleTimeout, "idle-timeout", 10*time.Minute, "close client connections idle this long (Kafka's connections.max.idle.ms)")
	fs.IntVar(&f.maxConns, "max-connections", 50000, "client connections open at once; more are closed at accept")
	fs.IntVar(&f.maxPerHost, "max-connections-per-host", 10000, "client connections from one IP address; more are closed at accept")
	fs.Int64Var(&f.frameMemory, "frame-memory-bytes", 256<<20, "process-wide limit on bytes of frames held whole at once; a frame that does not fit closes its connection")
	f.security.bind(fs, withUpstream)
	f.listenerSec.bind(fs)
	if withUpstream {
		f.authz.bind(fs)
	}
	return f
}

// resolve builds the effective configuration: defaults, then the file,
// then every flag given on the command line.
func (f *flagSet) resolve() (fileConfig, error) {
	c := defaultConfig()
	if f.configPath != "" {
		if err := c.loadFile(f.configPath); err != nil {
			return c, err
		}
	}
	set := func(name string, apply func()) {
		if f.fs.Changed(name) {
			apply()
		}
	}
	// setGroup is set for a group setting kproxy otherwise takes from the
	// cluster: the flag becomes its source.
	setGroup := func(flag, setting string, apply func()) {
		set(flag, func() { apply(); c.setBy(setting, "flag") })
	}
	set("upstream", func() { c.Upstream = f.upstream })
	set("listen", func() { c.Listen = f.listen })
	set("advertise-host", func() { c.AdvertiseHost = f.advertise })
	set("advertise-port", func() { c.AdvertisePort = f.advPort })
	set("admin-listen", func() { c.AdminListen = f.adminListen })
	set("log-level", func() { c.Log.Level = f.logLevel })
	set("groups", func() { c.Groups.Mode = f.groupsMode })
	set("share-groups", func() { c.Groups.Shares = f.sharesMode })
	setGroup("group-min-session-timeout", "group.min.session.timeout.ms", func() { c.Groups.MinSessionTimeout = f.minSession })
	setGroup("group-max-session-timeout", "group.max.session.timeout.ms", func() { c.Groups.MaxSessionTimeout = f.maxSession })
	setGroup("group-initial-rebalance-delay", "group.initial.rebalance.delay.ms", func() { c.Groups.InitialRebalanceDelay = f.initDelay })
	setGroup("group-max-size", "group.max.size", func() { c.Groups.MaxSize = f.maxSize })
	set("group-settings-from-cluster", func() { c.Groups.SettingsFromCluster = f.fromCluster })
	set("group-check-commit-ownership", func() { c.Groups.CheckCommitOwnership = f.checkOwner })
	setGroup("group-consumer-migration-policy", "group.consumer.migration.policy", func() { c.Groups.Consumer.MigrationPolicy = f.migration })
	set("group-consumer-topic-refresh-interval", func() { c.Groups.Consumer.TopicRefreshInterval = f.topicEvery })
	set("group-anchors", func() { c.Groups.Anchors.Enabled = f.anchors.Enabled })
	set("group-anchor-session-timeout", func() {
		c.Groups.Anchors.SessionTimeout = f.anchors.SessionTimeout
		c.Groups.Anchors.HeartbeatInterval = f.anchors.SessionTimeout / 4
	})
	set("group-anchor-join-clients", func() { c.Groups.Anchors.JoinClients = f.anchors.JoinClients })
	set("max-frame-bytes", func() { c.MaxFrameBytes = f.maxFrame })
	set("peer-listen", func() { c.Groups.Fleet.PeerListen = f.fleet.PeerListen })
	set("peer-advertise", func() { c.Groups.Fleet.PeerAdvertise = f.fleet.PeerAdvertise })
	set("fleet-name", func() { c.Groups.Fleet.Name = f.fleet.Name })
	set("fleet-role", func() { c.Groups.Fleet.Role = f.fleet.Role })
	set("fleet-session-timeout", func() { c.Groups.Fleet.SessionTimeout = f.fleet.SessionTimeout })
	set("fleet-heartbeat-interval", func() { c.Groups.Fleet.HeartbeatInterval = f.fleet.HeartbeatInterval })
	set("max-group-request-bytes", func() { c.MaxGroupRequest = f.maxGroupReq })
	set("max-rewrite-response-bytes", func() { c.MaxRewriteResp = f.maxRewrite })
	set("frame-memory-bytes", func() { c.FrameMemory = f.frameMemory })
	set("request-timeout", func() { c.RequestTimeout = f.reqTimeout })
	set("idle-timeout", func() { c.IdleTimeout = f.idleTimeout })
	set("max-connections", func() { c.MaxConns = f.maxConns })
	set("max-connections-per-host", func() { c.MaxConnsPerHost = f.maxPerHost })
	f.security.apply(f.fs, &c)
	f.listenerSec.apply(f.fs, &c)
	f.authz.apply(f.fs, &c)
	return c, nil
}

// checkShare checks the groups.share keys the file gives: durations and
// counts positive (Kafka's bounds are at least 1), the heartbeat shorter
// than the session.
func (c *fileConfig) checkShare() []error {
	sg := c.Groups.Share
	var errs []error
	for _, d := range []struct {
		name, key string
		v         time.Duration
	}{
		{"group.share.session.timeout.ms", "session_timeout", sg.SessionTimeout},
		{"group.share.heartbeat.interval.ms", "heartbeat_interval", sg.HeartbeatInterval},
		{"group.share.record.lock.duration.ms", "record_lock_duration", sg.RecordLockDuration},
	} {
		if c.explicit(d.name) && d.v < time.Millisecond {
			errs = append(errs, fmt.Errorf("groups.share.%s %v must be at least 1ms", d.key, d.v))
		}
	}
	for _, n := range []struct {
		name, key string
		v         int
	}{
		{"group.share.delivery.count.limit", "delivery_count_limit", sg.DeliveryCountLimit},
		{"group.share.partition.max.record.locks", "partition_max_record_locks", sg.PartitionMaxRecordLocks},
		{"group.share.max.size", "max_size", sg.MaxSize},
	} {
		if c.explicit(n.name) && n.v < 1 {
			errs = append(errs, fmt.Errorf("groups.share.%s %d must be at least 1", n.key, n.v))
		}
	}
	if c.explicit("group.share.session.timeout.ms") && c.explicit("group.share.heartbeat.interval.ms") &&
		sg.HeartbeatInterval >= sg.SessionTimeout {
		errs = append(errs, fmt.Errorf("groups.share.heartbeat_interval %v must be shorter than session_timeout %v", sg.HeartbeatInterval, sg.SessionTimeout))
	}
	return errs
}
