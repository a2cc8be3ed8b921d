package main

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestShippedConfigParses keeps configs/kproxy.yaml in step with the
// config struct: every key in it is known, and it states the defaults.
func TestShippedConfigParses(t *testing.T) {
	c := defaultConfig()
	if err := c.loadFile("../../configs/kproxy.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	d := defaultConfig()
	if c.Listen != d.Listen || !reflect.DeepEqual(c.Groups, d.Groups) || c.MaxFrameBytes != d.MaxFrameBytes || c.DialTimeout != d.DialTimeout {
		t.Fatalf("the shipped file does not state the defaults: %+v", c)
	}
}

func TestFlagsOverrideFile(t *testing.T) {
	cmd, fs := serveCmd()
	if err := cmd.Flags().Parse([]string{"--config", "../../configs/kproxy.yaml", "--upstream", "a:1,b:2", "--group-initial-rebalance-delay", "0s",
		"--group-consumer-topic-refresh-interval", "500ms"}); err != nil {
		t.Fatal(err)
	}
	c, err := fs.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Upstream, ",") != "a:1,b:2" || c.Groups.InitialRebalanceDelay != 0 || c.Groups.Consumer.TopicRefreshInterval != 500*time.Millisecond {
		t.Fatalf("flags did not override: %+v", c)
	}
	if c.Groups.MaxSessionTimeout != 30*time.Minute {
		t.Fatalf("file value lost: %+v", c.Groups)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := defaultConfig()
	c.Groups.Mode = "bogus"
	c.Log.Format = "xml"
	c.Groups.Consumer.TopicRefreshInterval = 0
	c.Groups.Share.SessionTimeout, c.Groups.Share.HeartbeatInterval, c.Groups.Share.DeliveryCountLimit = 5*time.Second, 10*time.Second, 0
	for _, name := range []string{"group.share.session.timeout.ms", "group.share.heartbeat.interval.ms", "group.share.delivery.count.limit"} {
		c.setBy(name, "file")
	}
	err := c.validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"no upstream", "groups.mode", "log.format", "groups.consumer.topic_refresh_interval",
		"groups.share.heartbeat_interval 10s must be shorter than session_timeout 5s", "groups.share.delivery_count_limit 0 must be at least 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestGroupSettingSources guards that only a flag given on the command
// line or a key present in the file overrides the cluster's group
// settings: the engine gets the others at their zero value, which the
// assembly fills from the cluster.
func TestGroupSettingSources(t *testing.T) {
	file := t.TempDir() + "/kproxy.yaml"
	if err := os.WriteFile(file, []byte("groups:\n  max_size: 0\n  consumer:\n    heartbeat_interval: 2s\n    assignors: [range]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, fs := serveCmd()
	if err := cmd.Flags().Parse([]string{"--config", file, "--upstream", "a:1", "--group-initial-rebalance-delay", "0s",
		"--group-min-session-timeout", "1s"}); err != nil {
		t.Fatal(err)
	}
	c, err := fs.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"group.initial.rebalance.delay.ms":     "flag",
		"group.min.session.timeout.ms":         "flag",
		"group.max.size":                       "file",
		"group.consumer.heartbeat.interval.ms": "file",
		"group.consumer.assignors":             "file",
	}
	if !reflect.DeepEqual(c.sources, want) {
		t.Fatalf("sources %v, want %v", c.sources, want)
	}
	e := engineConfig(c)
	if e.InitialRebalanceDelay != -1 || e.MinSessionTimeout != time.Second || e.ConsumerHeartbeatInterval != 2*time.Second ||
		!reflect.DeepEqual(e.ConsumerAssignors, []string{"range"}) {
		t.Fatalf("explicit settings lost: %+v", e)
	}
	if e.MaxSessionTimeout != 0 || e.ConsumerSessionTimeout != 0 || e.ConsumerMaxGroupSize != 0 || e.ConsumerMigrationPolicy != "" {
		t.Fatalf("a default reached the engine as if explicit: %+v", e)
	}

	// The share group defaults (groups.share): a key given reaches the
	// engine's ShareDefaults, the others stay the cluster's.
	if err := os.WriteFile(file, []byte("groups:\n  share:\n    session_timeout: 10s\n    heartbeat_interval: 1s\n    delivery_count_limit: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, fs = serveCmd()
	if err := cmd.Flags().Parse([]string{"--config", file, "--upstream", "a:1"}); err != nil {
		t.Fatal(err)
	}
	if c, err = fs.resolve(); err != nil {
		t.Fatal(err)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	want = map[string]string{
		"group.share.session.timeout.ms":    "file",
		"group.share.heartbeat.interval.ms": "file",
		"group.share.delivery.count.limit":  "file",
	}
	if !reflect.DeepEqual(c.sources, want) {
		t.Fatalf("share sources %v, want %v", c.sources, want)
	}
	sd := engineConfig(c).ShareDefaults
	if sd.SessionTimeout != 10*time.Second || sd.HeartbeatInterval != time.Second || sd.DeliveryLimit != 3 ||
		sd.LockDuration != 0 || sd.MaxRecordLocks != 0 || sd.MaxSize != 0 {
		t.Fatalf("share defaults %+v, want session 10s, heartbeat 1s, delivery limit 3 and the rest the cluster's", sd)
	}

	// Without flags or file, nothing is explicit.
	cmd, fs = serveCmd()
	if err := cmd.Flags().Parse([]string{"--upstream", "a:1"}); err != nil {
		t.Fatal(err)
	}
	if c, err = fs.resolve(); err != nil {
		t.Fatal(err)
	}
	if len(c.sources) != 0 {
		t.Fatalf("sources %v without flags or file", c.sources)
	}
	if e := engineConfig(c); e.MinSessionTimeout != 0 || e.InitialRebalanceDelay != 0 || e.ConsumerAssignors != nil {
		t.Fatalf("defaults reached the engine: %+v", e)
	}
}
