package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kproxy/kproxy/internal/groupconfig"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// GROUP configs on a cluster without them (Kafka 3.x): kproxy keeps
// them itself (internal/groupconfig Store and Service) and its share
// groups take them.

// hideGroupConfigs makes the in-memory cluster answer GROUP config
// resources as Kafka 3.6.2 does (measured): DescribeConfigs answers each
// GROUP resource INVALID_REQUEST, AlterConfigs and
// IncrementalAlterConfigs answer it INVALID_REQUEST "Unknown resource
// type 32"; other resources are the cluster's.
func hideGroupConfigs(c *kfake.Cluster) { hideGroupConfigsWhile(c, func() bool { return true }) }

// hideGroupConfigsWhile is hideGroupConfigs for as long as hidden says:
// then the cluster answers GROUP configs itself, as once upgraded to
// Kafka 4.0+.
func hideGroupConfigsWhile(c *kfake.Cluster, hidden func() bool) {
	for _, key := range []int16{int16(kmsg.DescribeConfigs), int16(kmsg.AlterConfigs), int16(kmsg.IncrementalAlterConfigs)} {
		c.ControlKey(key, func(r kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if !hidden() {
				return nil, nil, false
			}
			msg := "Unknown resource type 32"
			switch req := r.(type) {
			case *kmsg.DescribeConfigsRequest:
				if len(req.Resources) == 0 || req.Resources[0].ResourceType != kmsg.ConfigResourceTypeGroupConfig {
					return nil, nil, false
				}
				resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
				for _, rr := range req.Resources {
					res := kmsg.NewDescribeConfigsResponseResource()
					res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, kerr.InvalidRequest.Code
					resp.Resources = append(resp.Resources, res)
				}
				return resp, nil, true
			case *kmsg.IncrementalAlterConfigsRequest:
				if len(req.Resources) == 0 || req.Resources[0].ResourceType != kmsg.ConfigResourceTypeGroupConfig {
					return nil, nil, false
				}
				resp := req.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
				for _, rr := range req.Resources {
					res := kmsg.NewIncrementalAlterConfigsResponseResource()
					res.ResourceType, res.ResourceName, res.ErrorCode, res.ErrorMessage = rr.ResourceType, rr.ResourceName, kerr.InvalidRequest.Code, &msg
					resp.Resources = append(resp.Resources, res)
				}
				return resp, nil, true
			case *kmsg.AlterConfigsRequest:
				if len(req.Resources) == 0 || req.Resources[0].ResourceType != kmsg.ConfigResourceTypeGroupConfig {
					return nil, nil, false
				}
				resp := req.ResponseKind().(*kmsg.AlterConfigsResponse)
				for _, rr := range req.Resources {
					res := kmsg.NewAlterConfigsResponseResource()
					res.ResourceType, res.ResourceName, res.ErrorCode, res.ErrorMessage = rr.ResourceType, rr.ResourceName, kerr.InvalidRequest.Code, &msg
					resp.Resources = append(resp.Resources, res)
				}
				return resp, nil, true
			}
			return nil, nil, false
		})
	}
}

// alterGroupConfig sets (value non-nil) or deletes one GROUP config of
// group with IncrementalAlterConfigs through cl; it returns the
// resource's error and message.
func alterGroupConfig(ctx context.Context, t *testing.T, cl *kgo.Client, group, name string, value *string) (string, error) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = name, value
	if value == nil {
		c.Op = kmsg.IncrementalAlterConfigOpDelete
	}
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("IncrementalAlterConfigs: %v", err)
	}
	if len(resp.Resources) != 1 {
		t.Fatalf("IncrementalAlterConfigs: %d resources answered, want 1", len(resp.Resources))
	}
	msg := ""
	if m := resp.Resources[0].ErrorMessage; m != nil {
		msg = *m
	}
	return msg, kerr.ErrorForCode(resp.Resources[0].ErrorCode)
}

// describeGroupConfig reads one GROUP config of group through cl: its
// value and source, or the resource's error.
func describeGroupConfig(ctx context.Context, t *testing.T, cl *kgo.Client, group, name string) (string, kmsg.ConfigSource, error) {
	t.Helper()
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName, res.ConfigNames = kmsg.ConfigResourceTypeGroupConfig, group, []string{name}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("DescribeConfigs: %v", err)
	}
	if len(resp.Resources) != 1 {
		t.Fatalf("DescribeConfigs: %d resources answered, want 1", len(resp.Resources))
	}
	r := resp.Resources[0]
	if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
		return "", 0, err
	}
	for _, c := range r.Configs {
		if c.Name == name && c.Value != nil {
			return *c.Value, c.Source, nil
		}
	}
	t.Fatalf("DescribeConfigs of %s: %s not answered", group, name)
	return "", 0, nil
}

// shareRead runs a share consumer of group on topic through addr and
// returns the values it received (each accepted): for at most d, and for
// shareReadGrace more once enough says it has what it waits for (a
// record that should not come would have come with those). during, if
// set, runs after each poll from d/3 on.
func shareRead(t *testing.T, addr, group, topic string, d time.Duration, during func(), enough func(got map[string]bool) bool) map[string]bool {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ShareGroup(group), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	var stop time.Time
	for ctx.Err() == nil && (stop.IsZero() || time.Now().Before(stop)) {
		pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := cl.PollRecords(pctx, 100)
		pcancel()
		fs.EachRecord(func(r *kgo.Record) { got[string(r.Value)] = true; r.Ack(kgo.AckAccept) })
		_ = cl.FlushAcks(ctx)
		if during != nil && time.Since(start) > d/3 {
			during()
		}
		if stop.IsZero() && enough(got) {
			stop = time.Now().Add(shareReadGrace)
		}
	}
	return got
}

// shareReadGrace is how long shareRead reads on once it has what it
// waits for.
const shareReadGrace = 1500 * time.Millisecond

// newShareServeStack starts kproxy serving share groups in front of an
// in-memory cluster without share groups of its own; on3x hides the
// cluster's GROUP configs too, as a Kafka 3.x cluster answers (before
// kproxy starts: kproxy decides at start).
func newShareServeStack(t *testing.T, on3x bool) *stack {
	t.Helper()
	c, err := kproxy.NewDevCluster(3, 0, testLogger(), noShareCluster()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if on3x {
		hideGroupConfigs(c)
	}
	s := &stack{t: t, cluster: c, listen: "127.0.0.1:0",
		opts: []stackOpt{func(c *kproxy.Config) { c.Groups.ServeShares = true }}}
	s.start()
	return s
}

// TestGroupConfigsKeptOn3x: in front of a cluster without GROUP configs
// (a Kafka 3.6 cluster as it answers), share.auto.offset.reset=earliest
// set through kproxy with IncrementalAlterConfigs is read back through
// it and through a second kproxy in front of the same cluster, and a
// share consumer through kproxy then reads the records produced before
// it joined; a group without the config reads none of them (Kafka's
// default, latest), only one produced after it joined.
func TestGroupConfigsKeptOn3x(t *testing.T) {
	s := newShareServeStack(t, true)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const topic, n = "gc-3x", 20
	s.produce(ctx, topic, 1, n)

	direct, err := kgo.NewClient(kgo.SeedBrokers(s.cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, _, err := describeGroupConfig(ctx, t, direct, "gc-earliest", "share.auto.offset.reset"); err == nil {
		t.Fatal("the cluster itself answers GROUP DescribeConfigs: it does not look like 3.x")
	}

	admin := s.client()
	earliest := "earliest"
	if msg, err := alterGroupConfig(ctx, t, admin, "gc-earliest", "share.auto.offset.reset", &earliest); err != nil {
		t.Fatalf("setting share.auto.offset.reset through kproxy: %v (%s)", err, msg)
	}
	v, src, err := describeGroupConfig(ctx, t, admin, "gc-earliest", "share.auto.offset.reset")
	if err != nil || v != "earliest" || src != kmsg.ConfigSourceGroupConfig {
		t.Fatalf("share.auto.offset.reset through kproxy: %q %v %v, want earliest GROUP_CONFIG", v, src, err)
	}
	if v, src, err := describeGroupConfig(ctx, t, admin, "gc-latest", "share.auto.offset.reset"); err != nil || v != "latest" || src != kmsg.ConfigSourceDefaultConfig {
		t.Fatalf("share.auto.offset.reset of a group without it: %q %v %v, want latest DEFAULT_CONFIG", v, src, err)
	}
	// Kafka's checks: an unknown name and a bad value are INVALID_CONFIG.
	bad := "middle"
	if msg, err := alterGroupConfig(ctx, t, admin, "gc-earliest", "share.auto.offset.reset", &bad); err != kerr.InvalidConfig || !strings.Contains(msg, "share.auto.offset.reset") {
		t.Errorf("share.auto.offset.reset=middle: %v %q, want INVALID_CONFIG", err, msg)
	}
	if msg, err := alterGroupConfig(ctx, t, admin, "gc-earliest", "no.such.config", &bad); err != kerr.InvalidConfig || msg != "Unknown group config name: no.such.config" {
		t.Errorf("no.such.config: %v %q, want INVALID_CONFIG", err, msg)
	}

	// A request naming another resource too goes to the cluster as it
	// came (the shim above lets the in-memory cluster answer a request
	// whose first resource is not GROUP, GROUP ones with its own configs,
	// where Kafka 3.x answers INVALID_REQUEST): not kproxy's earliest.
	mixed := kmsg.NewPtrDescribeConfigsRequest()
	for _, rt := range []kmsg.ConfigResourceType{kmsg.ConfigResourceTypeTopic, kmsg.ConfigResourceTypeGroupConfig} {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType, r.ResourceName = rt, topic
		if rt == kmsg.ConfigResourceTypeGroupConfig {
			r.ResourceName, r.ConfigNames = "gc-earliest", []string{"share.auto.offset.reset"}
		}
		mixed.Resources = append(mixed.Resources, r)
	}
	resp, err := mixed.RequestWith(ctx, admin)
	if err != nil || len(resp.Resources) != 2 || resp.Resources[0].ErrorCode != 0 {
		t.Fatalf("a mixed DescribeConfigs through kproxy: %+v %v", resp, err)
	}
	for _, c := range resp.Resources[1].Configs {
		if c.Value != nil && *c.Value == "earliest" {
			t.Errorf("a mixed DescribeConfigs was answered by kproxy, not the cluster: %+v", resp.Resources[1])
		}
	}

	// A second kproxy in front of the same cluster reads the same store.
	second := &stack{t: t, cluster: s.cluster, opts: s.opts, listen: "127.0.0.1:0"}
	second.start()
	admin2 := second.client()
	if v, _, err := describeGroupConfig(ctx, t, admin2, "gc-earliest", "share.auto.offset.reset"); err != nil || v != "earliest" {
		t.Fatalf("share.auto.offset.reset through the second kproxy: %q %v, want earliest", v, err)
	}
	// An alter through the second is seen by the first.
	three := "3"
	if msg, err := alterGroupConfig(ctx, t, admin2, "gc-earliest", "share.delivery.count.limit", &three); err != nil {
		t.Fatalf("share.delivery.count.limit through the second kproxy: %v (%s)", err, msg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, _, err := describeGroupConfig(ctx, t, admin, "gc-earliest", "share.delivery.count.limit")
		if err == nil && v == "3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("share.delivery.count.limit set through the second kproxy reads %q %v through the first after 10s", v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The share group with earliest reads the records produced before it.
	got := shareRead(t, s.addr(), "gc-earliest", topic, 8*time.Second, nil, func(got map[string]bool) bool { return len(got) >= n })
	for i := range n {
		if !got[strconv.Itoa(i)] {
			t.Errorf("gc-earliest: record %d produced before the group joined was not delivered (%d of %d)", i, len(got), n)
			break
		}
	}
	// Without the config (latest) none of them; records produced after
	// the group joined (one after each poll from a third of the way on,
	// so that one comes after its share-partition started) show that the
	// consumer reads.
	after := 0
	got = shareRead(t, s.addr(), "gc-latest", topic, 8*time.Second, func() {
		r := &kgo.Record{Topic: topic, Value: []byte("after-join-" + strconv.Itoa(after))}
		after++
		if err := direct.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Errorf("producing after the join: %v", err)
		}
	}, func(got map[string]bool) bool {
		for v := range got {
			if strings.HasPrefix(v, "after-join-") {
				return true
			}
		}
		return false
	})
	for i := range n {
		if got[strconv.Itoa(i)] {
			t.Errorf("gc-latest: record %d produced before the group joined was delivered", i)
			break
		}
	}
	afterGot := 0
	for v := range got {
		if strings.HasPrefix(v, "after-join-") {
			afterGot++
		}
	}
	if afterGot == 0 {
		t.Errorf("gc-latest: none of the %d records produced after the join was delivered (got %v)", after, got)
	}
}

// TestGroupConfigsAuthorizedOn3x: with group authorization on, the
// GROUP configs kproxy keeps are described with DESCRIBE_CONFIGS (or
// ALTER_CONFIGS) on the group and altered with ALTER_CONFIGS, as Kafka 4
// checks them: a principal with only READ on its groups gets
// GROUP_AUTHORIZATION_FAILED for both.
func TestGroupConfigsAuthorizedOn3x(t *testing.T) {
	e := newAuthzEnvOn(t, kproxy.GroupsLocal, nil, hideGroupConfigs, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := e.client(t, e.cluster.ListenAddrs(), scram.Auth{User: "kproxy", Pass: authzKproxyPass}.AsSha256Mechanism())
	b := kadm.NewACLs().Allow("User:carol").AllowHosts().ResourcePatternType(kadm.ACLPatternPrefixed).Groups("carol-").Operations(kadm.OpAlterConfigs)
	if res, err := kadm.NewClient(admin).CreateACLs(ctx, b); err != nil || res[0].Err != nil {
		t.Fatalf("creating carol's ALTER_CONFIGS on her groups: %v %v", err, res)
	}
	time.Sleep(2 * time.Second) // kproxy's ACL cache: 1 s TTL
	carol := e.client(t, []string{e.kproxy.Addr()}, scram.Auth{User: "carol", Pass: authzCarolPass}.AsSha512Mechanism())
	alice := e.client(t, []string{e.kproxy.Addr()}, mechPlain("alice", authzAlicePass))
	earliest := "earliest"
	if msg, err := alterGroupConfig(ctx, t, carol, "carol-g", "share.auto.offset.reset", &earliest); err != nil {
		t.Fatalf("carol altering her group's configs: %v (%s)", err, msg)
	}
	if v, _, err := describeGroupConfig(ctx, t, carol, "carol-g", "share.auto.offset.reset"); err != nil || v != "earliest" {
		t.Fatalf("carol describing her group's configs: %q %v", v, err)
	}
	if _, err := alterGroupConfig(ctx, t, alice, "alice-g", "share.auto.offset.reset", &earliest); err != kerr.GroupAuthorizationFailed {
		t.Errorf("alice (group READ only) altering her group's configs: %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
	if _, _, err := describeGroupConfig(ctx, t, alice, "alice-g", "share.auto.offset.reset"); err != kerr.GroupAuthorizationFailed {
		t.Errorf("alice (group READ only) describing her group's configs: %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
	if _, _, err := describeGroupConfig(ctx, t, carol, "alice-g", "share.auto.offset.reset"); err != kerr.GroupAuthorizationFailed {
		t.Errorf("carol describing alice's group's configs: %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
}

// TestGroupConfigsCarriedOnUpgrade: GROUP configs kproxy kept for a
// cluster without them are handed to the cluster once it has them (an
// upgrade to Kafka 4.0+), at kproxy's next start: a config the cluster
// does not set for the group is set there, one it sets stays the
// cluster's, and kproxy's store keeps none of them afterwards (a later
// start carries nothing, and what is changed on the cluster stays).
func TestGroupConfigsCarriedOnUpgrade(t *testing.T) {
	c, err := kproxy.NewDevCluster(3, 0, testLogger(), noShareCluster()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var hidden atomic.Bool
	hidden.Store(true)
	hideGroupConfigsWhile(c, hidden.Load)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// Before the upgrade: two groups' configs kept by kproxy.
	opts := []stackOpt{func(c *kproxy.Config) { c.Groups.ServeShares = true }}
	before := &stack{t: t, cluster: c, listen: "127.0.0.1:0", opts: opts}
	before.start()
	admin := before.client()
	earliest, lock := "earliest", "20000"
	for _, a := range []struct{ group, name, value string }{
		{"gc-up-a", "share.auto.offset.reset", earliest},
		{"gc-up-a", "share.record.lock.duration.ms", lock},
		{"gc-up-b", "share.auto.offset.reset", earliest},
	} {
		v := a.value
		if msg, err := alterGroupConfig(ctx, t, admin, a.group, a.name, &v); err != nil {
			t.Fatalf("setting %s of %s through kproxy: %v (%s)", a.name, a.group, err, msg)
		}
	}
	before.stop()

	// The upgrade; meanwhile an operator sets gc-up-b's on the cluster.
	hidden.Store(false)
	direct, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	latest := "latest"
	if msg, err := alterGroupConfig(ctx, t, direct, "gc-up-b", "share.auto.offset.reset", &latest); err != nil {
		t.Fatalf("setting gc-up-b's share.auto.offset.reset on the upgraded cluster: %v (%s)", err, msg)
	}

	after := &stack{t: t, cluster: c, listen: "127.0.0.1:0", opts: opts}
	after.start()
	for _, want := range []struct{ group, name, value string }{
		{"gc-up-a", "share.auto.offset.reset", "earliest"},
		{"gc-up-a", "share.record.lock.duration.ms", "20000"},
		{"gc-up-b", "share.auto.offset.reset", "latest"}, // the cluster's own
	} {
		v, src, err := describeGroupConfig(ctx, t, direct, want.group, want.name)
		if err != nil || v != want.value || src != kmsg.ConfigSourceGroupConfig {
			t.Errorf("on the cluster after the upgrade, %s of %s: %q %v %v, want %q GROUP_CONFIG", want.name, want.group, v, src, err, want.value)
		}
		if v, _, err := describeGroupConfig(ctx, t, after.client(), want.group, want.name); err != nil || v != want.value {
			t.Errorf("through kproxy after the upgrade, %s of %s: %q %v, want %q", want.name, want.group, v, err, want.value)
		}
	}

	// kproxy's store holds nothing more to carry.
	st := groupconfig.NewStore(direct, "", func(o ...kgo.Opt) (*kgo.Client, error) {
		return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, o...)...)
	}, nil)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go st.Run(rctx)
	select {
	case <-st.Ready():
	case <-ctx.Done():
		t.Fatal("kproxy's group configs topic was not read")
	}
	if gs := st.Groups(); len(gs) != 0 {
		t.Errorf("kproxy's store still holds the configs of %v after they were carried", gs)
	}
}
