package kproxy

import (
	"context"
	"log/slog"
	"sync"
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

// describeConfigsFake answers DescribeConfigs for GROUP resources from
// configs (group -> name -> value), refusing the groups in refused with
// GROUP_AUTHORIZATION_FAILED, or every resource with code when it is set;
// asked records the groups of each request.
type describeConfigsFake struct {
	mu      sync.Mutex
	configs map[string]map[string]string
	refused map[string]bool
	code    int16
	err     error // the request fails
	asked   [][]string
}

func (f *describeConfigsFake) Request(_ context.Context, req kmsg.Request) (kmsg.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	q := req.(*kmsg.DescribeConfigsRequest)
	resp := q.ResponseKind().(*kmsg.DescribeConfigsResponse)
	var asked []string
	for _, r := range q.Resources {
		asked = append(asked, r.ResourceName)
		rr := kmsg.NewDescribeConfigsResponseResource()
		rr.ResourceType, rr.ResourceName = r.ResourceType, r.ResourceName
		switch {
		case f.code != 0:
			rr.ErrorCode = f.code
		case f.refused[r.ResourceName]:
			rr.ErrorCode = kerr.GroupAuthorizationFailed.Code
		default:
			for _, name := range r.ConfigNames {
				c := kmsg.NewDescribeConfigsResponseResourceConfig()
				c.Name, c.Source, c.Value = name, kmsg.ConfigSourceDefaultConfig, kmsg.StringPtr("1")
				if v, ok := f.configs[r.ResourceName][name]; ok {
					c.Source, c.Value = kmsg.ConfigSourceGroupConfig, kmsg.StringPtr(v)
				}
				rr.Configs = append(rr.Configs, c)
			}
		}
		resp.Resources = append(resp.Resources, rr)
	}
	f.asked = append(f.asked, asked)
	return resp, nil
}

// TestGroupConfigsReads: only values set on the group count; a group the
// cluster refuses to describe keeps the engine's settings and is not
// asked again with every new group; a cluster without GROUP configs is
// not asked again at all.
func TestGroupConfigsReads(t *testing.T) {
	ctx := context.Background()
	f := &describeConfigsFake{
		configs: map[string]map[string]string{"a": {"consumer.session.timeout.ms": "50000"}},
		refused: map[string]bool{"b": true},
	}
	gc := newGroupConfigs(f, slog.New(slog.DiscardHandler))
	gc.get("a")
	gc.get("b")
	if !gc.readOnce(ctx, false) {
		t.Fatal("the cluster's answer turned group configs off")
	}
	if got := gc.get("a"); got != (groupstate.GroupSettings{ConsumerSessionTimeout: 50 * time.Second}) {
		t.Fatalf("group a: %+v, want its own 50s session and no interval (the default-sourced value is not the group's)", got)
	}
	if got := gc.get("b"); got != (groupstate.GroupSettings{}) {
		t.Fatalf("refused group b: %+v, want the engine's", got)
	}
	gc.get("c")
	gc.readOnce(ctx, false)
	if last := f.asked[len(f.asked)-1]; len(last) != 1 || last[0] != "c" {
		t.Fatalf("a new group's read asked for %v, want [c] alone", last)
	}
	gc.readOnce(ctx, true) // the refresh asks for every group, b included
	if last := f.asked[len(f.asked)-1]; len(last) != 3 {
		t.Fatalf("the refresh asked for %v, want a, b and c", last)
	}

	off := &describeConfigsFake{code: kerr.InvalidRequest.Code}
	gc = newGroupConfigs(off, slog.New(slog.DiscardHandler))
	gc.get("a")
	if gc.readOnce(ctx, false) {
		t.Fatal("a cluster answering INVALID_REQUEST for GROUP resources left group configs on")
	}
	gc.get("d")
	if n := len(off.asked); n != 1 {
		t.Fatalf("%d requests, want the first alone", n)
	}
}

// TestGroupConfigsFirstRead: a joining member's wait (unread) ends with
// the group's first read, whatever it found, and no join waits once the
// group was read, while the reads fail, or on a cluster without GROUP
// configs.
func TestGroupConfigsFirstRead(t *testing.T) {
	ctx := context.Background()
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	f := &describeConfigsFake{
		configs: map[string]map[string]string{"a": {"consumer.heartbeat.interval.ms": "1500"}},
		refused: map[string]bool{"b": true},
	}
	gc := newGroupConfigs(f, slog.New(slog.DiscardHandler))
	a, b := gc.unread("a"), gc.unread("b")
	if a == nil || b == nil || closed(a) || closed(b) {
		t.Fatal("groups never read: a join must wait for their first read")
	}
	if again := gc.unread("a"); again != a {
		t.Fatal("a second join of the same unread group must wait for the same read")
	}
	gc.readOnce(ctx, false)
	if !closed(a) || !closed(b) {
		t.Fatal("the first read, a refusal included, must end the joins' wait")
	}
	if gc.unread("a") != nil || gc.unread("b") != nil {
		t.Fatal("a group read once must not make joins wait")
	}
	if got := gc.get("a").ConsumerHeartbeatInterval; got != 1500*time.Millisecond {
		t.Fatalf("group a's interval %v after its first read, want 1.5s", got)
	}

	f.err = context.DeadlineExceeded
	c := gc.unread("c")
	gc.readOnce(ctx, false)
	if closed(c) {
		t.Fatal("a failed read is no read: the join's wait ends at its bound")
	}
	if gc.unread("d") != nil {
		t.Fatal("while the reads fail, joins must not wait")
	}
	f.err = nil
	gc.readOnce(ctx, false)
	if !closed(c) {
		t.Fatal("the read after the failure must end the wait of c")
	}

	off := &describeConfigsFake{code: kerr.InvalidRequest.Code}
	gc = newGroupConfigs(off, slog.New(slog.DiscardHandler))
	e := gc.unread("e")
	gc.readOnce(ctx, false)
	if !closed(e) {
		t.Fatal("a cluster without GROUP configs must end the joins' wait")
	}
	if gc.unread("f") != nil {
		t.Fatal("a cluster without GROUP configs must not make joins wait")
	}
}

// TestGroupConfigsAlteredThroughKproxy: a group's GROUP configs changed
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
