package proxy

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/authz"
)

// logRecorder is a slog.Handler that keeps every record's level and
// message, so a test can count what was logged.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record // guarded by mu
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r)
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// count is how many records at level contain substr in their message.
func (l *logRecorder) count(level slog.Level, substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level == level && strings.Contains(r.Message, substr) {
			n++
		}
	}
	return n
}

// aclFault answers kfake's DescribeAcls as the test switches it: with
// the ACLs of an authorizer, SECURITY_DISABLED (no authorizer), or an
// error (the ACLs cannot be read: the fault).
type aclFault struct {
	mode atomic.Int32 // aclServe, aclNoAuthorizer or aclFail
	acls []kmsg.DescribeACLsResponseResource
}

const (
	aclServe int32 = iota
	aclNoAuthorizer
	aclFail
)

func (f *aclFault) install(c *kfake.Cluster) {
	c.ControlKey(29, func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := req.(*kmsg.DescribeACLsRequest).ResponseKind().(*kmsg.DescribeACLsResponse)
		switch f.mode.Load() {
		case aclNoAuthorizer:
			resp.ErrorCode = kerr.SecurityDisabled.Code
		case aclFail:
			resp.ErrorCode = kerr.UnknownServerError.Code
		default:
			resp.Resources = f.acls
		}
		return resp, nil, true
	})
}

// authzFixture is an Authorizer over a real authz.Cache reading a kfake
// cluster's ACLs through a kgo client, with the fault switch.
func authzFixture(t *testing.T, requireAuthorizer bool) (*Authorizer, *aclFault, *fakeEngine, *logRecorder) {
	t.Helper()
	c := newCluster(t, kfake.NumBrokers(1))
	fault := &aclFault{acls: []kmsg.DescribeACLsResponseResource{{
		ResourceType: kmsg.ACLResourceTypeGroup, ResourceName: "g", ResourcePatternType: kmsg.ACLResourcePatternTypeLiteral,
		ACLs: []kmsg.DescribeACLsResponseResourceACL{{Principal: "User:ANONYMOUS", Host: "*",
			Operation: kmsg.ACLOperationAll, PermissionType: kmsg.ACLPermissionTypeAllow}},
	}}}
	fault.install(c)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RequestRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	rec := &logRecorder{}
	eng := &fakeEngine{name: "e", prefix: "", marker: markerA}
	a := NewAuthorizer(eng, AuthorizerConfig{
		ACLs:              authz.NewCache(cl, authz.Set{}, 40*time.Millisecond),
		RequireAuthorizer: requireAuthorizer,
		Timeout:           time.Second,
		Logger:            slog.New(rec),
	})
	return a, fault, eng, rec
}

// TestAuthorizerUnreadableACLsAreRetriable injects the fault (DescribeAcls
// failing) on a cluster with an authorizer: within three TTLs the last
// ACLs decide; past them every group API and FindCoordinator is answered
// COORDINATOR_NOT_AVAILABLE, never GROUP_AUTHORIZATION_FAILED, and
// nothing reaches the coordinator (fail closed); the episode is logged
// once at WARN however many requests see it, and its end once at INFO.
func TestAuthorizerUnreadableACLsAreRetriable(t *testing.T) {
	a, fault, eng, rec := authzFixture(t, false)
	anon := Client{ID: "c", Host: "127.0.0.1"}
	checkCodes(t, "heartbeat for an allowed group", handle(t, a, anon, heartbeatFor("g", "m")), markerA)
	checkCodes(t, "heartbeat for a group without ACLs", handle(t, a, anon, heartbeatFor("other", "m")), int16(kerr.GroupAuthorizationFailed.Code))

	fault.mode.Store(aclFail)
	checkCodes(t, "heartbeat within three TTLs of the last read", handle(t, a, anon, heartbeatFor("g", "m")), markerA)
	waitFor(t, 5*time.Second, "stale ACLs to be unavailable", func() bool {
		return codesOf(t, handle(t, a, anon, heartbeatFor("g", "m")))[0] == codeUnavailable
	})
	before := len(eng.calls())
	for range 3 {
		for _, req := range singleGroupRequests("g") {
			checkCodes(t, kmsg.NameForKey(req.Key())+" with unreadable ACLs", handle(t, a, anon, req), codeUnavailable)
		}
		checkCodes(t, "a group without ACLs, ACLs unreadable", handle(t, a, anon, heartbeatFor("other", "m")), codeUnavailable)
		if code := a.AuthorizeFindCoordinator(anon, "g"); code != codeUnavailable {
			t.Fatalf("FindCoordinator with unreadable ACLs: code %d, want %d", code, codeUnavailable)
		}
	}
	if n := len(eng.calls()); n != before {
		t.Fatalf("%d requests reached the coordinator while the ACLs were unreadable", n-before)
	}
	if n := rec.count(slog.LevelWarn, "cannot be read"); n != 1 {
		t.Fatalf("%d WARN lines for one episode, want 1", n)
	}

	fault.mode.Store(aclServe)
	waitFor(t, 5*time.Second, "ACLs readable again", func() bool {
		return codesOf(t, handle(t, a, anon, heartbeatFor("g", "m")))[0] == markerA
	})
	checkCodes(t, "a group without ACLs after recovery", handle(t, a, anon, heartbeatFor("other", "m")), int16(kerr.GroupAuthorizationFailed.Code))
	if n := rec.count(slog.LevelInfo, "readable again"); n != 1 {
		t.Fatalf("%d INFO lines for the recovery, want 1", n)
	}
	if n := rec.count(slog.LevelWarn, "cannot be read"); n != 1 {
		t.Fatalf("%d WARN lines after recovery, want still 1", n)
	}
}

// TestAuthorizerNoAuthorizerSurvivesUnreadableACLs: a cluster last seen
// without an authorizer keeps being treated as one while DescribeAcls
// fails (the fault), past three TTLs: its group requests stay served,
// without waiting for a read, and the episode is logged once. With
// RequireAuthorizer (cluster-acls) the same cluster stays refused,
// GROUP_AUTHORIZATION_FAILED: that is the verdict of the last read, not
// the fault.
func TestAuthorizerNoAuthorizerSurvivesUnreadableACLs(t *testing.T) {
	for _, require := range []bool{false, true} {
		want := markerA
		if require {
			want = int16(kerr.GroupAuthorizationFailed.Code)
		}
		a, fault, _, rec := authzFixture(t, require)
		fault.mode.Store(aclNoAuthorizer)
		anon := Client{ID: "c", Host: "127.0.0.1"}
		checkCodes(t, "no authorizer", handle(t, a, anon, heartbeatFor("any", "m")), want)
		fault.mode.Store(aclFail)
		time.Sleep(200 * time.Millisecond) // five TTLs of failed reads
		for _, req := range singleGroupRequests("any") {
			start := time.Now()
			w := want
			if _, txn := req.(*kmsg.TxnOffsetCommitRequest); txn && require {
				w = int16(kerr.TransactionalIDAuthorizationFailed.Code) // checked before the group
			}
			checkCodes(t, kmsg.NameForKey(req.Key())+", last seen without an authorizer, ACLs unreadable", handle(t, a, anon, req), w)
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Fatalf("%s waited %v for a read of the ACLs", kmsg.NameForKey(req.Key()), d)
			}
		}
		if code := a.AuthorizeFindCoordinator(anon, "any"); require && code != int16(kerr.GroupAuthorizationFailed.Code) || !require && code != 0 {
			t.Fatalf("FindCoordinator (require authorizer %v): code %d", require, code)
		}
		if n := rec.count(slog.LevelWarn, "last seen without an authorizer"); n != 1 {
			t.Fatalf("require authorizer %v: %d WARN lines, want 1", require, n)
		}
		if n := rec.count(slog.LevelWarn, "COORDINATOR_NOT_AVAILABLE"); n != 0 {
			t.Fatalf("require authorizer %v: logged as unavailable", require)
		}
	}
}
