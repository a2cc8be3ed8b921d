package kproxy

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// setGroupConfigs sets GROUP configs of group directly on the cluster.
func setGroupConfigs(ctx context.Context, t *testing.T, cl *kgo.Client, group string, kv map[string]string) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	for k, v := range kv {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value = k, kmsg.StringPtr(v)
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("setting %v on group %s: %v", kv, group, err)
	}
}

// TestGroupConfigsApplied: a KIP-848 group served by kproxy takes the
// heartbeat interval and session timeout set on the cluster for that
// group (kafka-configs --entity-type groups), as Kafka's coordinator
// does, from its first heartbeat on, a change of them within a refresh,
// and another group keeps the engine's.
func TestGroupConfigsApplied(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	direct, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	setGroupConfigs(ctx, t, direct, "own", map[string]string{
		"consumer.heartbeat.interval.ms": "1500",
		"consumer.session.timeout.ms":    "3000",
	})

	const refresh = 500 * time.Millisecond
	s, err := Start(ctx, Config{
		Upstream: c.ListenAddrs(),
		Proxy:    proxy.Config{Listen: "127.0.0.1:0"},
		Groups: GroupsConfig{
			Mode: GroupsLocal,
			Engine: groupstate.Config{
				ConsumerMinSessionTimeout: time.Second, ConsumerMaxSessionTimeout: time.Minute,
				ConsumerSessionTimeout: 20 * time.Second, ConsumerHeartbeatInterval: 5 * time.Second,
			},
			GroupConfigsRefresh: refresh,
		},
		Telemetry: tap.Config{Getenv: func(string) string { return "" }},
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	type member struct {
		group, id string
		epoch     int32
	}
	beat := func(m *member) int32 {
		t.Helper()
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Group, req.MemberID, req.MemberEpoch = m.group, m.id, m.epoch
		if m.epoch == 0 {
			req.RebalanceTimeoutMillis = 10000
			req.SubscribedTopicNames = []string{"t"}
			req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		}
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			t.Fatalf("heartbeat of %s in %s: %v", m.id, m.group, err)
		}
		if resp.MemberID != nil {
			m.id = *resp.MemberID
		}
		m.epoch = resp.MemberEpoch
		return resp.HeartbeatIntervalMillis
	}
	// waitInterval heartbeats until m is told want (the group's configs
	// are read a moment after its first heartbeat).
	waitInterval := func(m *member, want int32) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			got := beat(m)
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s told a heartbeat interval of %dms, want %dms", m.group, got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	members := func(group string) int {
		t.Helper()
		req := kmsg.NewPtrConsumerGroupDescribeRequest()
		req.Groups = []string{group}
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.Groups[0].ErrorCode)
		}
		if err != nil {
			t.Fatalf("describing %s: %v", group, err)
		}
		return len(resp.Groups[0].Members)
	}

	// The first answer already has the group's own interval: the join
	// waited for the group's first read, as Kafka's coordinator knows
	// the group's configs when it answers.
	own := &member{group: "own", id: "own-1"}
	if got := beat(own); got != 1500 {
		t.Fatalf("the first heartbeat of a group with its own 1500ms interval told %dms", got)
	}
	plain := &member{group: "plain", id: "plain-1"}
	beat(plain)
	time.Sleep(2 * refresh)
	if got := beat(plain); got != 5000 {
		t.Fatalf("a group without configs of its own told %dms, want the engine's 5000ms", got)
	}

	// The group's 3s session, not the engine's 20s: silent, the member
	// is there 1.5s on and gone 6s on.
	beat(own)
	last := time.Now()
	time.Sleep(1500 * time.Millisecond)
	if n := members("own"); n != 1 {
		t.Fatalf("the member gone %v after its last heartbeat, before the group's 3s session", time.Since(last))
	}
	for members("own") != 0 {
		if time.Since(last) > 6*time.Second {
			t.Fatalf("the member still there %v after its last heartbeat: the group's 3s session not applied", time.Since(last))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the member of the group with a 3s session expired %v after its last heartbeat", time.Since(last).Round(10*time.Millisecond))

	// A change on the cluster applies within a refresh.
	setGroupConfigs(ctx, t, direct, "own", map[string]string{"consumer.heartbeat.interval.ms": "2500"})
	own2 := &member{group: "own", id: "own-2"}
	waitInterval(own2, 2500)
}

// destGroupConfigsAlteredThroughKproxy: a group's GROUP configs changed
// with an IncrementalAlterConfigs that goes through kproxy are read again
// as soon as the cluster answered it, not at the next refresh (30 s here),
// as Kafka's coordinator applies a group's new configs at once.
func TestGroupConfigsAlteredThroughKproxy(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Start(ctx, Config{
		Upstream: c.ListenAddrs(),
		Proxy:    proxy.Config{Listen: "127.0.0.1:0"},
		Groups: GroupsConfig{
			Mode: GroupsLocal,
			Engine: groupstate.Config{
				ConsumerMinSessionTimeout: time.Second, ConsumerMaxSessionTimeout: time.Minute,
				ConsumerSessionTimeout: 20 * time.Second, ConsumerHeartbeatInterval: 5 * time.Second,
			},
			GroupConfigsRefresh: 30 * time.Second,
		},
		Telemetry: tap.Config{Getenv: func(string) string { return "" }},
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	id, epoch := "m-altered", int32(0)
	beat := func() int32 {
		t.Helper()
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Group, req.MemberID, req.MemberEpoch = "altered", id, epoch
		if epoch == 0 {
			req.RebalanceTimeoutMillis = 10000
			req.SubscribedTopicNames = []string{"t"}
			req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		}
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		if resp.MemberID != nil {
			id = *resp.MemberID
		}
		epoch = resp.MemberEpoch
		return resp.HeartbeatIntervalMillis
	}
	if got := beat(); got != 5000 {
		t.Fatalf("first heartbeat interval %d ms, want the engine's 5000", got)
	}
	setGroupConfigs(ctx, t, cl, "altered", map[string]string{"consumer.heartbeat.interval.ms": "1500"})
	deadline := time.Now().Add(3 * time.Second)
	for {
		got := beat()
		if got == 1500 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("heartbeat interval %d ms 3 s after the change went through kproxy, want 1500", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
