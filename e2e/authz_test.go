package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// Users of the secured cluster. Passwords are distinct strings the log
// check looks for.
const (
	authzKproxyPass = "kproxy-Secret-pw-1"
	authzAlicePass  = "alice-Secret-pw-2" // PLAIN
	authzBobPass    = "bob-Secret-pw-3"   // SCRAM-SHA-256
	authzCarolPass  = "carol-Secret-pw-4" // SCRAM-SHA-512: group DESCRIBE only
	authzDavePass   = "dave-Secret-pw-5"  // PLAIN: group READ, one topic of two
	authzOpsPass    = "ops-Secret-pw-6"   // PLAIN: CLUSTER DESCRIBE only
)

// lockedBuffer is a log sink safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// authzEnv is a cluster requiring SASL with ACLs enabled (kfake), and
// kproxy in front of it with group authorization on.
type authzEnv struct {
	cluster *kfake.Cluster
	kproxy  *kproxy.Server
	logs    *lockedBuffer
	topics  [2]string
}

func newAuthzEnv(t *testing.T, mode kproxy.GroupsMode) *authzEnv {
	t.Helper()
	return newAuthzEnvWith(t, mode, nil, nil)
}

// newAuthzEnvWith is newAuthzEnv with more cluster options and a change
// to kproxy's configuration.
func newAuthzEnvWith(t *testing.T, mode kproxy.GroupsMode, clusterOpts []kfake.Opt, configure func(*kproxy.Config)) *authzEnv {
	t.Helper()
	return newAuthzEnvOn(t, mode, clusterOpts, nil, configure)
}

// newAuthzEnvOn is newAuthzEnvWith with cluster, when set, called on
// the cluster before kproxy starts.
func newAuthzEnvOn(t *testing.T, mode kproxy.GroupsMode, clusterOpts []kfake.Opt, cluster func(*kfake.Cluster), configure func(*kproxy.Config)) *authzEnv {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.SeedTopics(2, "authz-t1", "authz-t2"), kfake.GroupMinSessionTimeout(500 * time.Millisecond),
		kfake.Superuser("SCRAM-SHA-256", "kproxy", authzKproxyPass),
		kfake.User("PLAIN", "alice", authzAlicePass),
		kfake.User("SCRAM-SHA-256", "bob", authzBobPass),
		kfake.User("SCRAM-SHA-512", "carol", authzCarolPass),
		kfake.User("PLAIN", "dave", authzDavePass),
		kfake.User("PLAIN", "ops", authzOpsPass),
	}, clusterOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e := &authzEnv{cluster: c, logs: &lockedBuffer{}, topics: [2]string{"authz-t1", "authz-t2"}}

	// The ACLs, created with kadm by the superuser.
	admin := e.client(t, c.ListenAddrs(), scram.Auth{User: "kproxy", Pass: authzKproxyPass}.AsSha256Mechanism())
	adm := kadm.NewClient(admin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acls := []*kadm.ACLBuilder{
		// alice and bob: their own groups (prefixed), both topics.
		kadm.NewACLs().Allow("User:alice").AllowHosts().ResourcePatternType(kadm.ACLPatternPrefixed).Groups("alice-").Operations(kadm.OpRead),
		kadm.NewACLs().Allow("User:bob").AllowHosts().ResourcePatternType(kadm.ACLPatternPrefixed).Groups("bob-").Operations(kadm.OpRead),
		kadm.NewACLs().Allow("User:alice", "User:bob", "User:carol", "User:dave").AllowHosts().Topics(e.topics[0]).Operations(kadm.OpRead),
		kadm.NewACLs().Allow("User:alice", "User:bob").AllowHosts().Topics(e.topics[1]).Operations(kadm.OpRead),
		// carol: may find and describe her group, not join or commit.
		kadm.NewACLs().Allow("User:carol").AllowHosts().ResourcePatternType(kadm.ACLPatternPrefixed).Groups("carol-").Operations(kadm.OpDescribe),
		// dave: his group, the first topic only.
		kadm.NewACLs().Allow("User:dave").AllowHosts().ResourcePatternType(kadm.ACLPatternPrefixed).Groups("dave-").Operations(kadm.OpRead),
		// ops: lists every group (KafkaApis: CLUSTER DESCRIBE), nothing else.
		kadm.NewACLs().Allow("User:ops").AllowHosts().Clusters().Operations(kadm.OpDescribe),
	}
	for _, b := range acls {
		res, err := adm.CreateACLs(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatalf("create acl: %v", r.Err)
			}
		}
	}

	if cluster != nil {
		cluster(c)
	}
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := kproxy.Config{
		Upstream:     c.ListenAddrs(),
		UpstreamOpts: []kgo.Opt{kgo.SASL(scram.Auth{User: "kproxy", Pass: authzKproxyPass}.AsSha256Mechanism())},
		Proxy: proxy.Config{
			Listen:             "127.0.0.1:0",
			RequireSASL:        true,
			UpstreamClientOpts: []kgo.Opt{kgo.SASL(scram.Auth{User: "kproxy", Pass: authzKproxyPass}.AsSha256Mechanism())},
		},
		Groups: kproxy.GroupsConfig{
			Mode:   mode,
			Engine: groupstate.Config{InitialRebalanceDelay: -1, MinSessionTimeout: 500 * time.Millisecond},
			Fleet:  kproxy.FleetConfig{SessionTimeout: 3 * time.Second, HeartbeatInterval: 500 * time.Millisecond},
		},
		Authorization: kproxy.AuthorizationConfig{Mode: kproxy.AuthorizationAuto, SuperUsers: []string{"User:kproxy"}, CacheTTL: time.Second},
		Telemetry:     tap.Config{Getenv: func(string) string { return "" }},
		Logger:        log,
	}
	if configure != nil {
		configure(&cfg)
	}
	k, err := kproxy.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		k.Shutdown(ctx)
	})
	e.kproxy = k
	return e
}

func (e *authzEnv) client(t *testing.T, seeds []string, m sasl.Mechanism, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	// Kafka 4.0's versions: OffsetCommit and OffsetFetch name their
	// topics (v10 gives ids, which kadm's FetchOffsets does not map
	// back); the consumers add kgo.MaxVersions(nil) for the latest.
	base := []kgo.Opt{kgo.SeedBrokers(seeds...), kgo.RetryTimeout(3 * time.Second), kgo.RequestRetries(2), kgo.MaxVersions(kversion.V4_0_0())}
	if m != nil {
		base = append(base, kgo.SASL(m))
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// authzPath is one way to the cluster: directly, or through kproxy.
type authzPath struct {
	name  string
	seeds func(*authzEnv) []string
}

var authzPaths = []authzPath{
	{"direct", func(e *authzEnv) []string { return e.cluster.ListenAddrs() }},
	{"kproxy", func(e *authzEnv) []string { return []string{e.kproxy.Addr()} }},
}

func mechPlain(user, pass string) sasl.Mechanism {
	return plain.Auth{User: user, Pass: pass}.AsMechanism()
}

// commitCodes commits offset 1 of partition 0 of each topic for group
// as a simple consumer (generation -1) and returns each topic's code;
// err is a request-level error.
func commitCodes(ctx context.Context, cl *kgo.Client, group string, topics ...string) (map[string]int16, error) {
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation = group, -1
	for _, tp := range topics {
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic = tp
		p := kmsg.NewOffsetCommitRequestTopicPartition()
		p.Partition, p.Offset = 0, 1
		rt.Partitions = append(rt.Partitions, p)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := map[string]int16{}
	for _, rt := range resp.Topics {
		for _, p := range rt.Partitions {
			out[rt.Topic] = p.ErrorCode
		}
	}
	return out, nil
}

// joinCode sends one JoinGroup for group and returns its code.
func joinCode(ctx context.Context, cl *kgo.Client, group string) (int16, error) {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group, req.SessionTimeoutMillis, req.RebalanceTimeoutMillis, req.ProtocolType = group, 6000, 6000, "consumer"
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name = "range"
	req.Protocols = append(req.Protocols, p)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, err
	}
	return resp.ErrorCode, nil
}

func isGroupAuthFailed(code int16, err error) bool {
	return errors.Is(err, kerr.GroupAuthorizationFailed) || code == kerr.GroupAuthorizationFailed.Code
}

// TestGroupAuthorization runs every case on both paths, directly against
// the cluster and through kproxy, and asserts the same outcome: what the
// cluster decides for a principal on a direct connection is what kproxy
// decides serving the group itself.
func TestGroupAuthorization(t *testing.T) {
	for _, mode := range []kproxy.GroupsMode{kproxy.GroupsLocal, kproxy.GroupsDistributed} {
		t.Run(string(mode), func(t *testing.T) { testGroupAuthorization(t, mode) })
	}
}

// testGroupAuthorization is TestGroupAuthorization with kproxy serving
// groups in mode: alone (the engine behind the authorizer) or as a
// fleet of one (the router behind it).
func testGroupAuthorization(t *testing.T, mode kproxy.GroupsMode) {
	e := newAuthzEnv(t, mode)
	producer := e.client(t, e.cluster.ListenAddrs(), scram.Auth{User: "kproxy", Pass: authzKproxyPass}.AsSha256Mechanism(), kgo.DefaultProduceTopic(e.topics[0]))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 10
	for i := range n {
		if err := producer.ProduceSync(ctx, &kgo.Record{Partition: 0, Value: fmt.Appendf(nil, "%d", i)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	cases := []struct {
		name string
		run  func(t *testing.T, p authzPath)
	}{
		{"authorized principal consumes as a group, commits, fetches its offsets", func(t *testing.T, p authzPath) {
			for _, who := range []struct {
				user string
				m    sasl.Mechanism
			}{
				{"alice", mechPlain("alice", authzAlicePass)},
				{"bob", scram.Auth{User: "bob", Pass: authzBobPass}.AsSha256Mechanism()},
			} {
				group := who.user + "-consume-" + p.name
				cons := e.client(t, p.seeds(e), who.m, kgo.ConsumeTopics(e.topics[0]), kgo.ConsumerGroup(group),
					kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
					kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(500*time.Millisecond),
					kgo.MaxVersions(kversion.Stable())) // commits by topic id (v10) through kproxy's naming
				got := 0
				for got < n {
					fs := cons.PollFetches(ctx)
					if ctx.Err() != nil {
						t.Fatalf("%s: consumed %d of %d", who.user, got, n)
					}
					fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("%s: fetch: %v", who.user, err) })
					got += fs.NumRecords()
				}
				if err := cons.CommitUncommittedOffsets(ctx); err != nil {
					t.Fatalf("%s: commit: %v", who.user, err)
				}
				fetcher := e.client(t, p.seeds(e), who.m)
				offs, err := kadm.NewClient(fetcher).FetchOffsets(ctx, group)
				if err != nil {
					t.Fatalf("%s: fetch offsets: %v", who.user, err)
				}
				var sum int64
				offs.Each(func(o kadm.OffsetResponse) {
					if o.Err != nil {
						t.Fatalf("%s: offset of %s/%d: %v", who.user, o.Topic, o.Partition, o.Err)
					}
					sum += o.At
				})
				if sum != n {
					t.Fatalf("%s: committed offsets %v sum to %d, want the %d records consumed", who.user, offs, sum, n)
				}
				cons.Close()
			}
		}},
		{"no group READ: join and commit are GROUP_AUTHORIZATION_FAILED", func(t *testing.T, p authzPath) {
			carol := e.client(t, p.seeds(e), scram.Auth{User: "carol", Pass: authzCarolPass}.AsSha512Mechanism())
			group := "carol-" + p.name
			code, err := joinCode(ctx, carol, group)
			if !isGroupAuthFailed(code, err) {
				t.Fatalf("join: code %d err %v, want GROUP_AUTHORIZATION_FAILED", code, err)
			}
			codes, err := commitCodes(ctx, carol, group, e.topics[0])
			if err != nil || codes[e.topics[0]] != kerr.GroupAuthorizationFailed.Code {
				t.Fatalf("commit: %v %v, want GROUP_AUTHORIZATION_FAILED", codes, err)
			}
		}},
		{"no topic READ: that topic's commit is TOPIC_AUTHORIZATION_FAILED, the other's succeeds", func(t *testing.T, p authzPath) {
			dave := e.client(t, p.seeds(e), mechPlain("dave", authzDavePass))
			codes, err := commitCodes(ctx, dave, "dave-"+p.name, e.topics[0], e.topics[1])
			if err != nil {
				t.Fatal(err)
			}
			if codes[e.topics[0]] != 0 || codes[e.topics[1]] != kerr.TopicAuthorizationFailed.Code {
				t.Fatalf("commit codes %v: want %s ok, %s TOPIC_AUTHORIZATION_FAILED", codes, e.topics[0], e.topics[1])
			}
		}},
		{"unauthenticated connection cannot join, commit or fetch offsets", func(t *testing.T, p authzPath) {
			anon := e.client(t, p.seeds(e), nil, kgo.RetryTimeout(time.Second), kgo.RequestRetries(0))
			group := "alice-anon-" + p.name
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			defer scancel()
			seed := anon.SeedBrokers()[0]
			jr := kmsg.NewPtrJoinGroupRequest()
			jr.Group, jr.SessionTimeoutMillis, jr.RebalanceTimeoutMillis, jr.ProtocolType = group, 6000, 6000, "consumer"
			jr.Protocols = append(jr.Protocols, kmsg.JoinGroupRequestProtocol{Name: "range"})
			oc := kmsg.NewPtrOffsetCommitRequest()
			oc.Group, oc.Generation = group, -1
			oc.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: e.topics[0], Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 0, Offset: 1}}}}
			of := kmsg.NewPtrOffsetFetchRequest()
			of.Group = group
			for _, req := range []kmsg.Request{jr, oc, of} {
				resp, err := seed.Request(sctx, req)
				if err == nil {
					t.Fatalf("%s answered on an unauthenticated connection: %+v", kmsg.NameForKey(req.Key()), resp)
				}
			}
			if p.name == "kproxy" {
				if _, ok := e.kproxy.Engine().Group(group); ok {
					t.Fatalf("group %s exists in kproxy's engine after unauthenticated requests", group)
				}
				if !strings.Contains(e.logs.String(), "before completing SASL authentication") {
					t.Fatalf("no log line says why the connection was closed:\n%s", e.logs)
				}
			}
		}},
		{"ListGroups shows a principal only its groups", func(t *testing.T, p authzPath) {
			admin := e.client(t, p.seeds(e), scram.Auth{User: "kproxy", Pass: authzKproxyPass}.AsSha256Mechanism())
			mine, theirs := "alice-list-"+p.name, "bob-list-"+p.name
			for _, g := range []string{mine, theirs} {
				if codes, err := commitCodes(ctx, admin, g, e.topics[0]); err != nil || codes[e.topics[0]] != 0 {
					t.Fatalf("superuser commit for %s: %v %v", g, codes, err)
				}
			}
			alice := e.client(t, p.seeds(e), mechPlain("alice", authzAlicePass))
			listed, err := kadm.NewClient(alice).ListGroups(ctx)
			if err != nil {
				t.Fatal(err)
			}
			names := listed.Groups()
			if !slices.Contains(names, mine) || slices.Contains(names, theirs) {
				t.Fatalf("alice lists %v: want %s and not %s", names, mine, theirs)
			}
			for _, g := range names {
				if !strings.HasPrefix(g, "alice-") {
					t.Fatalf("alice lists %s, a group she may not describe (%v)", g, names)
				}
			}
			all, err := kadm.NewClient(admin).ListGroups(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(all.Groups(), theirs) {
				t.Fatalf("the superuser lists %v, without %s", all.Groups(), theirs)
			}
			// CLUSTER DESCRIBE lists every group on a Kafka broker
			// (KafkaApis.handleListGroupsRequest). kfake gap: its
			// ListGroups filters by group DESCRIBE only, so directly
			// ops sees none of them; kproxy answers as Kafka does.
			ops := e.client(t, p.seeds(e), mechPlain("ops", authzOpsPass))
			opsList, err := kadm.NewClient(ops).ListGroups(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wantAll := p.name == "kproxy"
			if got := slices.Contains(opsList.Groups(), mine) && slices.Contains(opsList.Groups(), theirs); got != wantAll {
				t.Fatalf("ops (CLUSTER DESCRIBE) lists %v: every group listed = %v, want %v", opsList.Groups(), got, wantAll)
			}
		}},
	}
	for _, tc := range cases {
		for _, p := range authzPaths {
			t.Run(tc.name+"/"+p.name, func(t *testing.T) { tc.run(t, p) })
		}
	}
	logs := e.logs.String()
	for _, secret := range []string{authzKproxyPass, authzAlicePass, authzBobPass, authzCarolPass, authzDavePass, authzOpsPass} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a password reached kproxy's log")
		}
	}
	if !strings.Contains(logs, "principal=User:alice") || !strings.Contains(logs, "principal=User:bob") {
		t.Fatalf("kproxy did not learn the SASL principals (no 'client authenticated' lines):\n%s", logs)
	}
}

// TestGroupAuthorizationRevocation: an ACL deleted on the cluster stops
// being honoured through kproxy within the ACL cache TTL (1s here),
// immediately on a direct connection.
func TestGroupAuthorizationRevocation(t *testing.T) {
	e := newAuthzEnv(t, kproxy.GroupsLocal)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := kadm.NewClient(e.client(t, e.cluster.ListenAddrs(), scram.Auth{User: "kproxy", Pass: authzKproxyPass}.AsSha256Mechanism()))
	dave := e.client(t, []string{e.kproxy.Addr()}, mechPlain("dave", authzDavePass))
	if codes, err := commitCodes(ctx, dave, "dave-revoked", e.topics[0]); err != nil || codes[e.topics[0]] != 0 {
		t.Fatalf("commit before revocation: %v %v", codes, err)
	}
	res, err := admin.DeleteACLs(ctx, kadm.NewACLs().Allow("User:dave").AllowHosts().ResourcePatternType(kadm.ACLPatternPrefixed).Groups("dave-").Operations(kadm.OpRead))
	if err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("delete acl: %v %+v", err, res)
	}
	revoked := time.Now()
	for {
		codes, err := commitCodes(ctx, dave, "dave-revoked", e.topics[0])
		if err == nil && codes[e.topics[0]] == kerr.GroupAuthorizationFailed.Code {
			break
		}
		if time.Since(revoked) > 3*time.Second {
			t.Fatalf("commit still %v %v %v after the ACL was deleted (TTL 1s)", codes, err, time.Since(revoked))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("revocation honoured through kproxy after %v", time.Since(revoked).Round(time.Millisecond))
}

// TestGroupAuthorizationNeedsDescribeAcls: a kproxy whose own principal
// may not read the cluster's ACLs refuses to start, saying why, rather
// than denying every group request.
func TestGroupAuthorizationNeedsDescribeAcls(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("SCRAM-SHA-256", "root", "root-pw"), kfake.User("PLAIN", "weak", "weak-pw"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := kgo.SASL(plain.Auth{User: "weak", Pass: "weak-pw"}.AsMechanism())
	k, err := kproxy.Start(context.Background(), kproxy.Config{
		Upstream:      c.ListenAddrs(),
		UpstreamOpts:  []kgo.Opt{m},
		Proxy:         proxy.Config{Listen: "127.0.0.1:0", RequireSASL: true, UpstreamClientOpts: []kgo.Opt{m}},
		Groups:        kproxy.GroupsConfig{Mode: kproxy.GroupsLocal},
		Authorization: kproxy.AuthorizationConfig{Mode: kproxy.AuthorizationAuto},
		Telemetry:     tap.Config{Getenv: func(string) string { return "" }},
	})
	if err == nil {
		k.Shutdown(context.Background())
		t.Fatal("kproxy started without the right to read the cluster's ACLs")
	}
	if !errors.Is(err, kerr.ClusterAuthorizationFailed) || !strings.Contains(err.Error(), "DESCRIBE on the CLUSTER resource") {
		t.Fatalf("start: %v", err)
	}
}
