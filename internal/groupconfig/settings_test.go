package groupconfig

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kproxy/kproxy/groupstate"
)

// settingsBy indexes resolved settings by name.
func settingsBy(rs []resolvedSetting) map[string]resolvedSetting {
	m := make(map[string]resolvedSetting, len(rs))
	for _, r := range rs {
		m[r.name] = r
	}
	return m
}

func TestGroupSettingsPrecedence(t *testing.T) {
	cluster := clusterGroupSettings{broker: 1, values: map[string]string{
		"group.initial.rebalance.delay.ms":         "0",
		"group.min.session.timeout.ms":             "1000",
		"group.max.session.timeout.ms":             "300000",
		"group.max.size":                           "2147483647",
		"group.consumer.session.timeout.ms":        "30000",
		"group.consumer.min.session.timeout.ms":    "10000",
		"group.consumer.max.session.timeout.ms":    "50000",
		"group.consumer.heartbeat.interval.ms":     "2000",
		"group.consumer.min.heartbeat.interval.ms": "1000",
		"group.consumer.assignors":                 "org.apache.kafka.coordinator.group.assignor.RangeAssignor,uniform",
		"group.consumer.max.size":                  "7",
		"group.consumer.migration.policy":          "UPGRADE",
		"group.share.session.timeout.ms":           "10000",
		"group.share.heartbeat.interval.ms":        "2000",
		"group.share.record.lock.duration.ms":      "15000",
		"group.share.delivery.count.limit":         "3",
		"group.share.partition.max.record.locks":   "500",
		"group.share.max.size":                     "20",
	}}
	for _, tc := range []struct {
		name    string
		cfg     groupstate.Config
		sources map[string]string
		cluster clusterGroupSettings
		want    groupstate.Config
		source  map[string]string // by setting; unlisted: not checked
	}{{
		name:    "the cluster fills every unset setting",
		cluster: cluster,
		want: groupstate.Config{
			InitialRebalanceDelay: -1, MinSessionTimeout: time.Second, MaxSessionTimeout: 5 * time.Minute, MaxGroupSize: 2147483647,
			ConsumerSessionTimeout: 30 * time.Second, ConsumerMinSessionTimeout: 10 * time.Second, ConsumerMaxSessionTimeout: 50 * time.Second,
			ConsumerHeartbeatInterval: 2 * time.Second, ConsumerAssignors: []string{"range", "uniform"}, ConsumerMaxGroupSize: 7,
			ConsumerMigrationPolicy: groupstate.MigrationUpgrade,
			ShareDefaults: groupstate.ShareSettings{SessionTimeout: 10 * time.Second, HeartbeatInterval: 2 * time.Second,
				LockDuration: 15 * time.Second, DeliveryLimit: 3, MaxRecordLocks: 500, MaxSize: 20},
		},
		source: map[string]string{"group.initial.rebalance.delay.ms": SourceCluster, "group.consumer.assignors": SourceCluster,
			"group.share.session.timeout.ms": SourceCluster, "group.share.delivery.count.limit": SourceCluster,
			"group.consumer.min.heartbeat.interval.ms": SourceCluster, "group.consumer.max.heartbeat.interval.ms": SourceDefault},
	}, {
		name: "flags and the file win; a listed zero is explicit",
		cfg:  groupstate.Config{InitialRebalanceDelay: 2 * time.Second, ConsumerAssignors: []string{"uniform"}},
		sources: map[string]string{"group.initial.rebalance.delay.ms": SourceFlag, "group.max.size": SourceFlag,
			"group.consumer.assignors": SourceFile},
		cluster: cluster,
		want: groupstate.Config{
			InitialRebalanceDelay: 2 * time.Second, MinSessionTimeout: time.Second, MaxSessionTimeout: 5 * time.Minute, MaxGroupSize: 0,
			ConsumerSessionTimeout: 30 * time.Second, ConsumerMinSessionTimeout: 10 * time.Second, ConsumerMaxSessionTimeout: 50 * time.Second,
			ConsumerHeartbeatInterval: 2 * time.Second, ConsumerAssignors: []string{"uniform"}, ConsumerMaxGroupSize: 7,
			ConsumerMigrationPolicy: groupstate.MigrationUpgrade,
			ShareDefaults: groupstate.ShareSettings{SessionTimeout: 10 * time.Second, HeartbeatInterval: 2 * time.Second,
				LockDuration: 15 * time.Second, DeliveryLimit: 3, MaxRecordLocks: 500, MaxSize: 20},
		},
		source: map[string]string{"group.initial.rebalance.delay.ms": SourceFlag, "group.max.size": SourceFlag,
			"group.consumer.assignors": SourceFile, "group.min.session.timeout.ms": SourceCluster},
	}, {
		name:    "a non-zero engine field set by the embedding program wins (the e2e stack)",
		cfg:     groupstate.Config{InitialRebalanceDelay: -1, MinSessionTimeout: time.Second},
		cluster: clusterGroupSettings{values: map[string]string{"group.initial.rebalance.delay.ms": "5000", "group.min.session.timeout.ms": "6000"}},
		want:    groupstate.Config{InitialRebalanceDelay: -1, MinSessionTimeout: time.Second},
		source:  map[string]string{"group.initial.rebalance.delay.ms": SourceConfig, "group.min.session.timeout.ms": SourceConfig, "group.max.size": SourceDefault},
	}, {
		name:    "an unreadable cluster leaves the defaults",
		cfg:     groupstate.Config{MaxGroupSize: 3},
		cluster: clusterGroupSettings{broker: -1, err: errors.New("no DescribeConfigs right")},
		want:    groupstate.Config{MaxGroupSize: 3},
		source:  map[string]string{"group.max.size": SourceConfig, "group.initial.rebalance.delay.ms": SourceDefault, "group.consumer.assignors": SourceDefault},
	}, {
		name: "an explicit KIP-848 session widens the cluster's bounds",
		cfg:  groupstate.Config{ConsumerSessionTimeout: 5 * time.Second},
		cluster: clusterGroupSettings{values: map[string]string{"group.consumer.min.session.timeout.ms": "45000",
			"group.consumer.max.session.timeout.ms": "60000", "group.consumer.heartbeat.interval.ms": "1000"}},
		want: groupstate.Config{ConsumerSessionTimeout: 5 * time.Second, ConsumerMinSessionTimeout: 5 * time.Second,
			ConsumerMaxSessionTimeout: time.Minute, ConsumerHeartbeatInterval: time.Second},
	}, {
		name: "values kproxy cannot use are left at the default",
		cluster: clusterGroupSettings{values: map[string]string{"group.consumer.assignors": "com.example.Sticky,range",
			"group.min.session.timeout.ms": "soon", "group.consumer.migration.policy": "sideways"}},
		want:   groupstate.Config{},
		source: map[string]string{"group.consumer.assignors": SourceDefault, "group.min.session.timeout.ms": SourceDefault, "group.consumer.migration.policy": SourceDefault},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, rs := resolveGroupSettings(tc.cfg, tc.sources, tc.cluster)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("engine config\n got %+v\nwant %+v", got, tc.want)
			}
			if len(rs) != len(groupSettings) {
				t.Fatalf("%d settings reported, want %d", len(rs), len(groupSettings))
			}
			by := settingsBy(rs)
			for name, src := range tc.source {
				if by[name].source != src {
					t.Errorf("%s: source %q, want %q (%+v)", name, by[name].source, src, by[name])
				}
			}
			// Every resolution builds an engine.
			got.Store = groupstate.NewMemoryStore()
			eng, err := groupstate.New(got)
			if err != nil {
				t.Fatalf("engine refuses the resolved config: %v", err)
			}
			eng.Close()
		})
	}
}

func TestGroupSettingsReportedValues(t *testing.T) {
	_, rs := resolveGroupSettings(groupstate.Config{InitialRebalanceDelay: -1}, map[string]string{"group.initial.rebalance.delay.ms": SourceFlag},
		clusterGroupSettings{values: map[string]string{"group.max.session.timeout.ms": "300000", "group.consumer.max.heartbeat.interval.ms": "15000"}})
	by := settingsBy(rs)
	for name, want := range map[string]resolvedSetting{
		"group.initial.rebalance.delay.ms":         {value: "0", source: SourceFlag},
		"group.max.session.timeout.ms":             {value: "300000", source: SourceCluster},
		"group.min.session.timeout.ms":             {value: "6000", source: SourceDefault},
		"group.max.size":                           {value: "unlimited", source: SourceDefault},
		"group.consumer.assignors":                 {value: "uniform,range", source: SourceDefault},
		"group.consumer.migration.policy":          {value: "bidirectional", source: SourceDefault},
		"group.consumer.max.heartbeat.interval.ms": {value: "15000", source: SourceCluster},
	} {
		if got := by[name]; got.value != want.value || got.source != want.source {
			t.Errorf("%s: %q from %s, want %q from %s", name, got.value, got.source, want.value, want.source)
		}
	}
}

func TestParseAssignors(t *testing.T) {
	for in, want := range map[string][]string{
		"uniform,range": {"uniform", "range"},
		"org.apache.kafka.coordinator.group.assignor.UniformAssignor, org.apache.kafka.coordinator.group.assignor.RangeAssignor": {"uniform", "range"},
		"range":                    {"range"},
		"range,com.example.Sticky": {"range"},
		"com.example.Sticky,range": nil,
		"":                         nil,
	} {
		got, err := parseAssignors(in)
		if (err != nil) != (want == nil) || !reflect.DeepEqual(got, want) {
			t.Errorf("parseAssignors(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}
