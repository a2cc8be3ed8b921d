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
	start := time.Now()
	if _, err := c.Set(context.Background()); err != nil || time.Since(start) > 20*time.Millisecond {
		t.Fatalf("a caller with a usable set waited %v for the refresh (err %v)", time.Since(start), err)
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
