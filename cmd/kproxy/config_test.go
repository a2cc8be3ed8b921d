package main

import (
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
	err := c.validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"no upstream", "groups.mode", "log.format", "groups.consumer.topic_refresh_interval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
