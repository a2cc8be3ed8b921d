package authz

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// TestDecisionsMatchTheCluster: for a principal with allow and deny
// ACLs (literal, prefixed), the decision computed from the ACLs read
// with DescribeAcls equals what the cluster itself answers that
// principal on a direct connection, for group READ (an empty OffsetCommit) and
// group DESCRIBE (OffsetFetch).
func TestDecisionsMatchTheCluster(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("SCRAM-SHA-256", "admin", "admin-pw"),
		kfake.User("SCRAM-SHA-256", "app", "app-pw",
			kfake.ACL{Resource: kmsg.ACLResourceTypeGroup, Name: "ok", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationRead, Allow: true},
			kfake.ACL{Resource: kmsg.ACLResourceTypeGroup, Name: "pre-", Pattern: kmsg.ACLResourcePatternTypePrefixed, Operation: kmsg.ACLOperationRead, Allow: true},
			kfake.ACL{Resource: kmsg.ACLResourceTypeGroup, Name: "pre-no", Pattern: kmsg.ACLResourcePatternTypePrefixed, Operation: kmsg.ACLOperationAll, Allow: false},
			kfake.ACL{Resource: kmsg.ACLResourceTypeGroup, Name: "describe-only", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationDescribe, Allow: true},
		),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	client := func(user, pass string) *kgo.Client {
		// Kafka 3.7: OffsetCommit names topics (v10 carries ids).
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RetryTimeout(time.Second), kgo.MaxVersions(kversion.V3_7_0()),
			kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	admin, app := client("admin", "admin-pw"), client("app", "app-pw")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cache := NewCache(admin, Set{}, time.Minute)

	denied := func(err error, code int16) bool {
		return errors.Is(err, kerr.GroupAuthorizationFailed) || code == kerr.GroupAuthorizationFailed.Code
	}
	outcomes := map[[2]bool]int{}
	for _, group := range []string{"ok", "pre-a", "pre-no-x", "other", "describe-only"} {
		// A simple-group commit: group READ is checked first.
		hb := kmsg.NewPtrOffsetCommitRequest()
		hb.Group, hb.Generation, hb.MemberID = group, -1, ""
		ct := kmsg.NewOffsetCommitRequestTopic()
		ct.Topic = "t"
		cp := kmsg.NewOffsetCommitRequestTopicPartition()
		ct.Partitions = append(ct.Partitions, cp)
		hb.Topics = append(hb.Topics, ct)
		hresp, herr := hb.RequestWith(ctx, app)
		var hcode int16
		if hresp != nil {
			for _, tp := range hresp.Topics {
				for _, p := range tp.Partitions {
					hcode = p.ErrorCode
				}
			}
		}
		if herr != nil && !denied(herr, 0) {
			t.Fatalf("heartbeat %s: %v", group, herr)
		}
		clusterRead := !denied(herr, hcode)

		of := kmsg.NewPtrOffsetFetchRequest()
		of.Group = group
		oresp, oerr := of.RequestWith(ctx, app)
		var ocode int16
		if oresp != nil {
			ocode = oresp.ErrorCode
		}
		if oerr != nil && !denied(oerr, 0) {
			t.Fatalf("offset fetch %s: %v", group, oerr)
		}
		clusterDescribe := !denied(oerr, ocode)

		read := cache.Allowed(ctx, "User:app", "127.0.0.1", kmsg.ACLResourceTypeGroup, group, kmsg.ACLOperationRead)
		describe := cache.Allowed(ctx, "User:app", "127.0.0.1", kmsg.ACLResourceTypeGroup, group, kmsg.ACLOperationDescribe)
		outcomes[[2]bool{clusterRead, clusterDescribe}]++
		if read != clusterRead || describe != clusterDescribe {
			t.Errorf("group %s: kproxy decides read=%v describe=%v, the cluster read=%v describe=%v", group, read, describe, clusterRead, clusterDescribe)
		}
	}
	// Allowed both, denied both, describe only: the cases differ.
	if len(outcomes) < 3 {
		t.Errorf("the cluster's outcomes do not vary: %v", outcomes)
	}
	// The cases must not all agree trivially.
	if !cache.Allowed(ctx, "User:app", "h", kmsg.ACLResourceTypeGroup, "ok", kmsg.ACLOperationRead) ||
		cache.Allowed(ctx, "User:app", "h", kmsg.ACLResourceTypeGroup, "pre-no-x", kmsg.ACLOperationRead) {
		t.Error("the seeded ACLs are not what the decisions show")
	}
}

// TestCacheRevocationAndFailClosed: a changed ACL set is seen after the
// TTL; a cluster that stops answering keeps the last set for three TTLs,
// then every decision is a denial.
func TestCacheRevocationAndFailClosed(t *testing.T) {
	allow := []ACL{{Principal: "User:a", Host: "*", ResourceType: kmsg.ACLResourceTypeGroup, ResourceName: "g",
		Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationRead, Permission: kmsg.ACLPermissionTypeAllow}}
	current, fail := allow, false
	c := newCache(func(context.Context) ([]ACL, error) {
		if fail {
			return nil, fmt.Errorf("down")
		}
		return current, nil
	}, Set{}, 40*time.Millisecond)
	ctx := context.Background()
	ok := func() bool {
		return c.Allowed(ctx, "User:a", "h", kmsg.ACLResourceTypeGroup, "g", kmsg.ACLOperationRead)
	}
	if !ok() {
		t.Fatal("not allowed at first")
	}
	current = nil // revoked
	if !ok() {
		t.Fatal("revocation seen before the TTL")
	}
	time.Sleep(50 * time.Millisecond)
	if ok() {
		t.Fatal("revocation not seen after the TTL")
	}
	current = allow
	time.Sleep(50 * time.Millisecond)
	if !ok() {
		t.Fatal("grant not seen after the TTL")
	}
	fail = true
	time.Sleep(50 * time.Millisecond)
	if !ok() {
		t.Fatal("a failed refresh dropped the last set at once")
	}
	time.Sleep(100 * time.Millisecond)
	if ok() {
		t.Fatal("stale ACLs served beyond three TTLs")
	}
	if _, err := c.Set(ctx); !errors.Is(err, ErrStale) {
		t.Errorf("stale set: %v", err)
	}
}

// TestSetSemantics covers what the cluster comparison does not:
// wildcard principal and host, implied DESCRIBE, DENY over ALLOW,
// super users and allow-if-no-ACL.
func TestSetSemantics(t *testing.T) {
	g := kmsg.ACLResourceTypeGroup
	acl := func(p, h, name string, pat kmsg.ACLResourcePatternType, op kmsg.ACLOperation, perm kmsg.ACLPermissionType) ACL {
		return ACL{Principal: p, Host: h, ResourceType: g, ResourceName: name, Pattern: pat, Operation: op, Permission: perm}
	}
	lit, pre := kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLResourcePatternTypePrefixed
	allow, deny := kmsg.ACLPermissionTypeAllow, kmsg.ACLPermissionTypeDeny
	s := &Set{ACLs: []ACL{
		acl("User:*", "*", "shared", lit, kmsg.ACLOperationRead, allow),
		acl("User:a", "10.0.0.1", "hosted", lit, kmsg.ACLOperationRead, allow),
		acl("User:a", "*", "*", lit, kmsg.ACLOperationDelete, allow),
		acl("User:a", "*", "secret", lit, kmsg.ACLOperationDescribe, deny),
		acl("User:a", "*", "w-", pre, kmsg.ACLOperationWrite, allow),
	}, SuperUsers: map[string]bool{"User:root": true}}
	for _, tc := range []struct {
		p, h, name string
		op         kmsg.ACLOperation
		want       bool
	}{
		{"User:b", "h", "shared", kmsg.ACLOperationRead, true},
		{"User:b", "h", "shared", kmsg.ACLOperationDescribe, true}, // implied by READ
		{"User:b", "h", "shared", kmsg.ACLOperationDelete, false},
		{"User:a", "10.0.0.1", "hosted", kmsg.ACLOperationRead, true},
		{"User:a", "10.0.0.2", "hosted", kmsg.ACLOperationRead, false},
		{"User:a", "h", "anything", kmsg.ACLOperationDelete, true},  // literal "*"
		{"User:a", "h", "secret", kmsg.ACLOperationDescribe, false}, // DENY wins over DELETE's implied DESCRIBE
		{"User:a", "h", "secret", kmsg.ACLOperationDelete, true},
		{"User:a", "h", "w-x", kmsg.ACLOperationDescribe, true},
		{"User:a", "h", "w", kmsg.ACLOperationWrite, false},
		{"User:root", "h", "secret", kmsg.ACLOperationDescribe, true},
	} {
		if got := s.Allowed(tc.p, tc.h, g, tc.name, tc.op); got != tc.want {
			t.Errorf("%s@%s %v %s: %v, want %v", tc.p, tc.h, tc.op, tc.name, got, tc.want)
		}
	}
	anon := &Set{AnonymousCluster: true}
	if !anon.Allowed(Anonymous, "h", g, "any", kmsg.ACLOperationRead) {
		t.Error("anonymous cluster without ACLs: denied, though the cluster would serve the request")
	}
	anon.ACLs = s.ACLs
	if anon.Allowed(Anonymous, "h", g, "secret", kmsg.ACLOperationRead) {
		t.Error("anonymous cluster with ACLs: allowed a group no ACL grants ANONYMOUS")
	}
	open := &Set{AllowIfNoACL: true, ACLs: s.ACLs}
	if !open.Allowed("User:z", "h", kmsg.ACLResourceTypeTopic, "t", kmsg.ACLOperationRead) {
		t.Error("allow-if-no-ACL: an unnamed resource is denied")
	}
	if open.Allowed("User:z", "h", g, "hosted", kmsg.ACLOperationRead) {
		t.Error("allow-if-no-ACL: a named resource is allowed to a principal it does not name")
	}
	var none *Set
	if none.Allowed("User:a", "h", g, "shared", kmsg.ACLOperationRead) {
		t.Error("a nil set allows")
	}
}

func TestSASLUser(t *testing.T) {
	for _, tc := range []struct {
		mech, auth, want string
		ok               bool
	}{
		{"PLAIN", "\x00alice\x00pw", "alice", true},
		{"PLAIN", "alice\x00alice\x00pw", "alice", true},
		{"PLAIN", "bob\x00alice\x00pw", "", false}, // Kafka refuses a different authzid
		{"PLAIN", "alice", "", false},
		{"SCRAM-SHA-256", "n,,n=alice,r=abc", "alice", true},
		{"SCRAM-SHA-512", "n,,n=a=2Cb=3Dc,r=abc", "a,b=c", true},
		{"SCRAM-SHA-256", "p=tls-unique,,n=alice,r=abc", "", false},
		{"SCRAM-SHA-256", "garbage", "", false},
		{"OAUTHBEARER", "n,,\x01auth=Bearer x\x01\x01", "", false},
	} {
		got, ok := SASLUser(tc.mech, []byte(tc.auth))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s %q: %q %v, want %q %v", tc.mech, tc.auth, got, ok, tc.want, tc.ok)
		}
	}
}
