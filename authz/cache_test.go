package authz

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestCacheReadsOutsideTheLock: while a refresh is slow, callers get the
// previous set (still under three TTLs old) at once rather than waiting
// for DescribeAcls; only callers with nothing usable wait, and they give
// up with their context.
func TestCacheReadsOutsideTheLock(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	c := newCache(func(ctx context.Context) ([]ACL, error) {
		if calls.Add(1) == 1 {
			return nil, nil
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	}, Set{}, 50*time.Millisecond)
	if _, err := c.Set(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond) // the set is now past its TTL
	go c.Set(context.Background())    // the slow refresh
	for calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	// The refresh holds until release: a caller that waited for it would
	// end with its context, an error, rather than get the previous set.
	start := time.Now()
	uctx, ucancel := context.WithTimeout(context.Background(), time.Second)
	_, err := c.Set(uctx)
	ucancel()
	if err != nil {
		t.Fatalf("a caller with a usable set waited %v for the refresh: %v", time.Since(start), err)
	}
	time.Sleep(100 * time.Millisecond) // past three TTLs: nothing usable
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := c.Set(ctx); !errors.Is(err, ErrStale) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a caller with nothing usable: %v, want ErrStale after its context", err)
	}
	close(release)
}

// TestCacheNoAuthorizer: a cluster without an authorizer
// (SECURITY_DISABLED) allows everything, as its brokers do; any other
// error denies everything (fail closed).
func TestCacheNoAuthorizer(t *testing.T) {
	for _, c := range []struct {
		err   error
		allow bool
	}{
		{fmt.Errorf("describe acls: %w", kerr.SecurityDisabled), true},
		{fmt.Errorf("describe acls: %w", kerr.ClusterAuthorizationFailed), false},
	} {
		cache := newCache(func(context.Context) ([]ACL, error) { return nil, c.err }, Set{}, time.Minute)
		got := cache.Allowed(context.Background(), "User:x", "h", kmsg.ACLResourceTypeGroup, "g", kmsg.ACLOperationRead)
		if got != c.allow {
			t.Fatalf("%v: allowed %v, want %v", c.err, got, c.allow)
		}
	}
}

// TestIndexedDecisionsMatchTheScan: the index a Cache builds changes no
// decision: over literal, "*", prefixed, ALLOW and DENY entries of
// several resource types, with and without allow.everyone.if.no.acl.found.
func TestIndexedDecisionsMatchTheScan(t *testing.T) {
	lit, pre := kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLResourcePatternTypePrefixed
	allow, deny := kmsg.ACLPermissionTypeAllow, kmsg.ACLPermissionTypeDeny
	g, tp := kmsg.ACLResourceTypeGroup, kmsg.ACLResourceTypeTopic
	acls := []ACL{
		{"User:a", "*", g, "g1", lit, kmsg.ACLOperationRead, allow},
		{"User:*", "*", g, "shared", lit, kmsg.ACLOperationDescribe, allow},
		{"User:a", "*", g, "pre-", pre, kmsg.ACLOperationAll, allow},
		{"User:a", "*", g, "pre-no", pre, kmsg.ACLOperationRead, deny},
		{"User:b", "10.0.0.2", g, "*", lit, kmsg.ACLOperationRead, allow},
		{"User:a", "*", tp, "t", lit, kmsg.ACLOperationWrite, allow},
		{"User:a", "*", tp, "*", lit, kmsg.ACLOperationDescribe, deny},
	}
	for _, ifNone := range []bool{false, true} {
		scan := Set{ACLs: acls, AllowIfNoACL: ifNone}
		idx := scan.indexed()
		for _, p := range []string{"User:a", "User:b", "User:c"} {
			for _, h := range []string{"10.0.0.1", "10.0.0.2"} {
				for _, rt := range []kmsg.ACLResourceType{g, tp, kmsg.ACLResourceTypeCluster} {
					for _, n := range []string{"g1", "shared", "pre-x", "pre-no-x", "t", "other", "*"} {
						for _, op := range []kmsg.ACLOperation{kmsg.ACLOperationRead, kmsg.ACLOperationDescribe, kmsg.ACLOperationDelete, kmsg.ACLOperationWrite} {
							if a, b := scan.Allowed(p, h, rt, n, op), idx.Allowed(p, h, rt, n, op); a != b {
								t.Fatalf("%s@%s %v %s %v (allow if none %v): scan %v, indexed %v", p, h, rt, n, op, ifNone, a, b)
							}
						}
					}
				}
			}
		}
	}
}

// TestCacheFresh: Fresh gives the set only while it is within the TTL
// and never reads; past it the caller must go through Set.
func TestCacheFresh(t *testing.T) {
	var calls atomic.Int32
	c := newCache(func(context.Context) ([]ACL, error) {
		calls.Add(1)
		return nil, nil
	}, Set{}, 50*time.Millisecond)
	if s := c.Fresh(); s != nil {
		t.Fatal("Fresh before the first read returned a set")
	}
	read, err := c.Set(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Fresh(); s != read {
		t.Fatalf("Fresh within the TTL = %p, want the set just read %p", s, read)
	}
	time.Sleep(60 * time.Millisecond)
	if s := c.Fresh(); s != nil {
		t.Fatal("Fresh past the TTL returned the old set")
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d reads, want 1: Fresh must not read", n)
	}
}

// TestCacheStaleNoAuthorizer: a cluster last read without an authorizer
// (SECURITY_DISABLED) is still one when reads fail past three TTLs: Set
// returns that set beside ErrStale, at once even while a read is
// running; stale ACLs of a cluster with an authorizer are never returned.
func TestCacheStaleNoAuthorizer(t *testing.T) {
	for _, noAuthz := range []bool{true, false} {
		var fail atomic.Bool
		release := make(chan struct{})
		c := newCache(func(ctx context.Context) ([]ACL, error) {
			if fail.Load() {
				select { // a slow failing read: nobody may wait for it
				case <-release:
				case <-ctx.Done():
				}
				return nil, errors.New("describe acls: broker unreachable")
			}
			if noAuthz {
				return nil, fmt.Errorf("describe acls: %w", kerr.SecurityDisabled)
			}
			return []ACL{{Principal: "User:a", Host: "*", ResourceType: kmsg.ACLResourceTypeGroup, ResourceName: "g",
				Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationRead, Permission: kmsg.ACLPermissionTypeAllow}}, nil
		}, Set{}, 20*time.Millisecond)
		if _, err := c.Set(context.Background()); err != nil {
			t.Fatal(err)
		}
		fail.Store(true)
		time.Sleep(80 * time.Millisecond) // past three TTLs
		go c.Set(context.Background())    // a read that hangs
		time.Sleep(5 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		s, err := c.Set(ctx)
		cancel()
		if !errors.Is(err, ErrStale) {
			t.Fatalf("no authorizer %v: err %v, want ErrStale", noAuthz, err)
		}
		switch {
		case noAuthz && (s == nil || !s.NoAuthorizer):
			t.Fatalf("the stale no-authorizer set was dropped: %+v", s)
		case noAuthz && time.Since(start) > 200*time.Millisecond:
			t.Fatalf("a no-authorizer caller waited %v for the hanging read", time.Since(start))
		case !noAuthz && s != nil:
			t.Fatal("stale ACLs returned past three TTLs")
		}
		actx, acancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		allowed := c.Allowed(actx, "User:x", "h", kmsg.ACLResourceTypeGroup, "g", kmsg.ACLOperationRead)
		acancel()
		if allowed != noAuthz {
			t.Fatalf("no authorizer %v: Allowed = %v", noAuthz, allowed)
		}
		close(release)
	}
}

// TestCacheRefreshAhead: with RefreshAhead running, a steady stream of
// callers, asking as proxy.Authorizer does (Fresh, then Set), never
// waits for a read of the ACLs. Refreshing by calling Set every half TTL
// did not: the set is timed from the end of its read, so the tick one
// TTL later came a round trip early, found it fresh, and the first
// group request after the expiry read the ACLs itself (interop row
// fault-owner-upstream-slow: with 200ms per round trip, one commit per
// TTL took two).
func TestCacheRefreshAhead(t *testing.T) {
	const ttl, rtt = 200 * time.Millisecond, 40 * time.Millisecond
	var reads atomic.Int32
	c := newCache(func(ctx context.Context) ([]ACL, error) {
		reads.Add(1)
		select {
		case <-time.After(rtt):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return nil, nil
	}, Set{}, ttl)
	if _, err := c.Set(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.RefreshAhead(ctx)
	for end := time.Now().Add(6 * ttl); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		start := time.Now()
		if c.Fresh() == nil {
			if _, err := c.Set(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if took := time.Since(start); took >= rtt/2 {
			t.Fatalf("a caller waited %v for a read of the ACLs (%d reads)", took, reads.Load())
		}
	}
	if n := reads.Load(); n < 6 {
		t.Fatalf("%d reads in 6 TTLs, want one every half TTL", n)
	}
}
