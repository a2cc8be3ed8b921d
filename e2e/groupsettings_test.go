package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/groupconfig"
	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// This file checks that kproxy takes its group settings from the
// cluster (issue 21, internal/groupconfig/settings.go): the brokers'
// group.initial.rebalance.delay.ms and session bounds apply through
// kproxy without a flag, a flag overrides them, a cluster that cannot be
// read leaves kproxy's defaults, and /api/group-settings says which
// value came from where.

// clusterGroupConfigs is a cluster configured as the issue's
// ConsumerPerformance run was: no initial rebalance delay, and members
// may ask for 1s sessions.
var clusterGroupConfigs = map[string]string{
	"group.initial.rebalance.delay.ms": "0",
	"group.min.session.timeout.ms":     "1000",
}

// clusterSettingsStack is a local-mode stack in front of a cluster with
// clusterGroupConfigs, whose engine config leaves the group settings
// unset, as `kproxy serve` without flags does (the stack's default sets
// them explicitly).
func clusterSettingsStack(t *testing.T, opts ...stackOpt) *stack {
	t.Helper()
	opts = append([]stackOpt{
		engineOpt(func(c *groupstate.Config) { c.InitialRebalanceDelay, c.MinSessionTimeout = 0, 0 }),
		func(c *kproxy.Config) { c.AdminListen = "127.0.0.1:0" },
	}, opts...)
	return newStackOn(t, []kfake.Opt{kfake.BrokerConfigs(clusterGroupConfigs)}, opts...)
}

// groupSettings reads /api/group-settings from the admin server at addr.
func groupSettings(t *testing.T, addr string) (tap.GroupSettingsView, map[string]tap.GroupSetting) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/api/group-settings")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/api/group-settings: %s", resp.Status)
	}
	var v tap.GroupSettingsView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("decoding /api/group-settings: %v", err)
	}
	by := make(map[string]tap.GroupSetting, len(v.Settings))
	for _, s := range v.Settings {
		by[s.Name] = s
	}
	return v, by
}

// wantSetting fails unless the setting has value and source.
func wantSetting(t *testing.T, by map[string]tap.GroupSetting, name, value, source string) {
	t.Helper()
	s, ok := by[name]
	if !ok {
		t.Fatalf("/api/group-settings does not list %s", name)
	}
	if s.Value != value || s.Source != source {
		t.Errorf("%s = %q from %s, want %q from %s (%+v)", name, s.Value, s.Source, value, source, s)
	}
}

// firstAssignment starts a consumer of topic in a new group with a 1s
// session through seeds and returns the time from the client's start
// to its first assignment.
func firstAssignment(t *testing.T, seeds []string, group, topic string) time.Duration {
	t.Helper()
	return firstAssignmentWith(t, seeds, group, topic, time.Second)
}

// firstAssignmentWith is firstAssignment with the given session timeout.
func firstAssignmentWith(t *testing.T, seeds []string, group, topic string, session time.Duration) time.Duration {
	t.Helper()
	assigned := make(chan time.Time, 1)
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.SessionTimeout(session), kgo.HeartbeatInterval(300*time.Millisecond),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			if len(m[topic]) > 0 {
				select {
				case assigned <- time.Now():
				default:
				}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	}()
	select {
	case at := <-assigned:
		return at.Sub(start)
	case <-time.After(20 * time.Second):
		t.Fatalf("group %s: no assignment within 20s", group)
		return 0
	}
}

// median of three or more durations.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestGroupSettingsFromCluster: without flags, kproxy uses the cluster's
// group.initial.rebalance.delay.ms=0 and group.min.session.timeout.ms=1000
// (a 1s session is accepted, and a new group is assigned without kproxy's
// own 3s delay), and the admin API names the cluster as their source.
// It measures a new group's time to its first assignment directly on the
// cluster and through kproxy.
func TestGroupSettingsFromCluster(t *testing.T) {
	s := clusterSettingsStack(t)
	v, by := groupSettings(t, s.kproxy.AdminAddr())
	if v.Cluster.Error != "" || v.Cluster.Broker < 0 {
		t.Fatalf("the cluster was not read: %+v", v.Cluster)
	}
	wantSetting(t, by, "group.initial.rebalance.delay.ms", "0", groupconfig.SourceCluster)
	wantSetting(t, by, "group.min.session.timeout.ms", "1000", groupconfig.SourceCluster)
	// kfake's own defaults are the cluster's values too.
	wantSetting(t, by, "group.max.session.timeout.ms", "300000", groupconfig.SourceCluster)
	wantSetting(t, by, "group.consumer.heartbeat.interval.ms", "5000", groupconfig.SourceCluster)
	// kfake does not name these: kproxy's defaults stand.
	wantSetting(t, by, "group.consumer.assignors", "uniform,range", groupconfig.SourceDefault)
	wantSetting(t, by, "group.consumer.min.session.timeout.ms", "45000", groupconfig.SourceDefault)
	for _, gs := range v.Settings {
		if gs.Source == groupconfig.SourceCluster && (gs.Cluster == nil || *gs.Cluster != gs.Value) {
			t.Errorf("%s: taken from the cluster as %q but the cluster's value is reported as %v", gs.Name, gs.Value, gs.Cluster)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic = "settings-first-assignment"
	s.produce(ctx, topic, 6, 12)
	var direct, through []time.Duration
	for i := range 3 {
		direct = append(direct, firstAssignment(t, s.cluster.ListenAddrs(), fmt.Sprintf("direct-%d", i), topic))
		through = append(through, firstAssignment(t, []string{s.addr()}, fmt.Sprintf("kproxy-%d", i), topic))
	}
	d, k := median(direct), median(through)
	t.Logf("first assignment of a new classic group (1s session, cluster delay 0), median of 3: direct %v, through kproxy %v (%.2fx); runs direct %v, kproxy %v",
		d.Round(time.Millisecond), k.Round(time.Millisecond), float64(k)/float64(d), direct, through)
	// kproxy's own default would hold every new group for 3s.
	if k >= 2*time.Second {
		t.Fatalf("through kproxy a new group waited %v for its first assignment: the cluster's group.initial.rebalance.delay.ms=0 was not applied", k)
	}
	// kproxy served the groups it was asked for itself.
	if n := len(s.eventsOf(groupstate.EventGroupCreated)); n < len(through) {
		t.Fatalf("kproxy's engine created %d groups, want %d", n, len(through))
	}
}

// TestGroupSettingsFlagOverridesCluster runs `kproxy serve` with
// --group-initial-rebalance-delay against the same cluster: the flag wins
// over the cluster's 0, the cluster's min session still applies, and the
// admin API says which came from where.
func TestGroupSettingsFlagOverridesCluster(t *testing.T) {
	c, err := kproxy.NewDevCluster(3, 0, testLogger(), kfake.BrokerConfigs(clusterGroupConfigs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	k := startKproxy(t, "kproxy", c.ListenAddrs(), "--groups", "local", "--group-initial-rebalance-delay", "1500ms")
	_, by := groupSettings(t, k.admin)
	wantSetting(t, by, "group.initial.rebalance.delay.ms", "1500", groupconfig.SourceFlag)
	wantSetting(t, by, "group.min.session.timeout.ms", "1000", groupconfig.SourceCluster)
	if cv := by["group.initial.rebalance.delay.ms"].Cluster; cv == nil || *cv != "0" {
		t.Errorf("the cluster's overridden value is not reported: %v", cv)
	}

	const topic = "settings-flag"
	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 3, 1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		t.Fatalf("creating %s: %v", topic, err)
	}
	// A 1s session is accepted (the cluster's bound) and the new group
	// waits the flag's 1.5s.
	d := firstAssignment(t, []string{k.addr}, "flagged", topic)
	t.Logf("first assignment through kproxy with --group-initial-rebalance-delay 1500ms: %v", d.Round(time.Millisecond))
	if d < 1500*time.Millisecond {
		t.Fatalf("first assignment after %v: the flag's 1.5s delay was not applied", d)
	}
}

// TestGroupSettingsClusterUnreadable: a cluster that refuses
// DescribeConfigs on its brokers (no DescribeConfigs right) leaves
// kproxy's defaults, the admin API says why, and groups are still served.
func TestGroupSettingsClusterUnreadable(t *testing.T) {
	s := clusterSettingsStack(t)
	s.stop()
	s.cluster.ControlKey(int16(kmsg.DescribeConfigs), func(r kmsg.Request) (kmsg.Response, error, bool) {
		s.cluster.KeepControl()
		req := r.(*kmsg.DescribeConfigsRequest)
		if len(req.Resources) == 0 || req.Resources[0].ResourceType != kmsg.ConfigResourceTypeBroker {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
		for _, rr := range req.Resources {
			res := kmsg.NewDescribeConfigsResponseResource()
			res.ResourceType, res.ResourceName = rr.ResourceType, rr.ResourceName
			res.ErrorCode = kerr.ClusterAuthorizationFailed.Code
			resp.Resources = append(resp.Resources, res)
		}
		return resp, nil, true
	})
	s.start()
	v, by := groupSettings(t, s.kproxy.AdminAddr())
	if !strings.Contains(v.Cluster.Error, "CLUSTER_AUTHORIZATION_FAILED") {
		t.Errorf("cluster read error %q, want CLUSTER_AUTHORIZATION_FAILED", v.Cluster.Error)
	}
	wantSetting(t, by, "group.initial.rebalance.delay.ms", "3000", groupconfig.SourceDefault)
	wantSetting(t, by, "group.min.session.timeout.ms", "6000", groupconfig.SourceDefault)
	wantSetting(t, by, "group.max.session.timeout.ms", "1800000", groupconfig.SourceDefault)
	for _, gs := range v.Settings {
		if gs.Cluster != nil {
			t.Errorf("%s: a cluster value %q is reported from a cluster that was not read", gs.Name, *gs.Cluster)
		}
	}
	// kproxy's 6s minimum stands: a 1s session is refused as Kafka
	// refuses it outside its bounds.
	cl := s.client()
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group, req.ProtocolType, req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = "unreadable", "consumer", 1000, 1000
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name = "range"
	req.Protocols = append(req.Protocols, p)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != kerr.InvalidSessionTimeout {
		t.Fatalf("JoinGroup with a 1s session: %v, want INVALID_SESSION_TIMEOUT (kproxy's default bound)", err)
	}
}

// TestGroupSettingsRefreshReportsClusterChange: kproxy re-reads the
// cluster's group settings periodically; a change is reported by the
// admin API as the cluster's value next to the one in use, which stays
// (the engine's settings are fixed once it is built, as a broker's are
// until it restarts) and applies at kproxy's next start.
func TestGroupSettingsRefreshReportsClusterChange(t *testing.T) {
	s := clusterSettingsStack(t, func(c *kproxy.Config) { c.Groups.SettingsRefresh = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := "2000"
	rs, err := kadm.NewClient(s.client()).AlterBrokerConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "group.min.session.timeout.ms", Value: &v}})
	if err == nil {
		for _, r := range rs {
			if r.Err != nil {
				err = r.Err
			}
		}
	}
	if err != nil {
		t.Fatalf("altering the cluster's group.min.session.timeout.ms: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, by := groupSettings(t, s.kproxy.AdminAddr())
		if cv := by["group.min.session.timeout.ms"].Cluster; cv != nil && *cv == "2000" {
			wantSetting(t, by, "group.min.session.timeout.ms", "1000", groupconfig.SourceCluster)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster's change is not reported within 10s: %+v", by["group.min.session.timeout.ms"])
		}
		time.Sleep(20 * time.Millisecond)
	}
	// At the next start, kproxy takes it.
	s.stop()
	s.start()
	_, by := groupSettings(t, s.kproxy.AdminAddr())
	wantSetting(t, by, "group.min.session.timeout.ms", "2000", groupconfig.SourceCluster)
}

// TestGroupSettingsFromClusterDisabled: with --group-settings-from-cluster
// false (GroupsConfig.IgnoreClusterSettings) kproxy keeps its defaults
// and still reports the cluster's values beside them.
func TestGroupSettingsFromClusterDisabled(t *testing.T) {
	s := clusterSettingsStack(t, func(c *kproxy.Config) { c.Groups.IgnoreClusterSettings = true })
	_, by := groupSettings(t, s.kproxy.AdminAddr())
	wantSetting(t, by, "group.initial.rebalance.delay.ms", "3000", groupconfig.SourceDefault)
	wantSetting(t, by, "group.min.session.timeout.ms", "6000", groupconfig.SourceDefault)
	if cv := by["group.initial.rebalance.delay.ms"].Cluster; cv == nil || *cv != "0" {
		t.Errorf("the cluster's value is not reported: %v", cv)
	}
	// kproxy's own 3s delay holds a new group (6s session: kproxy's
	// minimum), as it did before kproxy read the cluster.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const topic = "settings-disabled"
	s.produce(ctx, topic, 3, 3)
	d := firstAssignmentWith(t, []string{s.addr()}, "defaults", topic, 6*time.Second)
	t.Logf("first assignment through kproxy with its own defaults (3s initial delay): %v", d.Round(time.Millisecond))
	if d < 3*time.Second {
		t.Fatalf("first assignment after %v: kproxy's 3s default delay was not applied", d)
	}
}

// TestGroupSettingsConflictNamesSources: an override that contradicts
// the cluster (a maximum session below the cluster's minimum) stops
// kproxy at start with an error naming both settings and their sources.
func TestGroupSettingsConflictNamesSources(t *testing.T) {
	c, err := kproxy.NewDevCluster(1, 0, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	k, err := kproxy.Start(context.Background(), kproxy.Config{
		Upstream: c.ListenAddrs(),
		Proxy:    proxy.Config{Listen: "127.0.0.1:0"},
		Groups: kproxy.GroupsConfig{Mode: kproxy.GroupsLocal,
			Engine:         groupstate.Config{MaxSessionTimeout: 3 * time.Second},
			SettingSources: map[string]string{"group.max.session.timeout.ms": groupconfig.SourceFlag}},
		Telemetry: tap.Config{Getenv: func(string) string { return "" }},
		Logger:    testLogger(),
	})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		k.Shutdown(ctx)
		t.Fatal("kproxy started with a maximum session below the cluster's minimum")
	}
	for _, want := range []string{"group.min.session.timeout.ms=6000 from cluster", "group.max.session.timeout.ms=3000 from flag"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}
