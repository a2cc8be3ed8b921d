// Package upstream is kproxy as a client of the cluster's coordinators:
// requests to the coordinator of a group or a transactional id, retried
// while the coordinator moves or loads, each on a client lent to it
// alone; the cache of who coordinates what; and which API keys the
// cluster answers.
//
// The store (groupstate/kafkastore) sends its commits and transactions
// this way, and coexistence (internal/coexist) its anchors' requests and
// the cluster's own groups; both share one Cluster, so one coordinator
// cache and one pool of lent clients serve every request of a kproxy.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/clientpool"
)

// Coordinator types of FindCoordinator.
const (
	CoordinatorGroup int8 = 0
	CoordinatorTxn   int8 = 1
)

// maxCoordinatorAttempts bounds the retries of one coordinator request
// (with Backoff up to 500ms, about 10s in all) within its context.
const maxCoordinatorAttempts = 25

// Cluster sends kproxy's own requests to the cluster's coordinators. It
// is safe for concurrent use.
type Cluster struct {
	cl *kgo.Client // immutable
	// reqs lends a client to each coordinator request (Lend); nil sends
	// them on cl. Set once by LendFrom before the Cluster is shared.
	reqs *clientpool.Pool

	mu sync.Mutex // guards coords and keys
	// coords caches the coordinators of groups and transactional ids.
	coords map[coordKey]int32
	// keys caches the API keys the cluster answers (SupportsKey), each
	// with its highest version; nil until read.
	keys map[int16]int16
}

// coordKey names one coordinator in the cache.
type coordKey struct {
	typ int8
	key string
}

// New returns a Cluster over cl, sending every request on cl until
// LendFrom gives it a pool.
func New(cl *kgo.Client) *Cluster {
	return &Cluster{cl: cl, coords: make(map[coordKey]int32)}
}

// LendFrom makes every later coordinator request borrow a client of
// reqs for itself, so that one the cluster holds (a join waiting for a
// rebalance) holds up no other. Call it once, before the Cluster is
// shared.
func (c *Cluster) LendFrom(reqs *clientpool.Pool) { c.reqs = reqs }

// Client is the Cluster's own client: metadata, produce and fetch go on
// it directly.
func (c *Cluster) Client() *kgo.Client { return c.cl }

// Coordinator returns the node of the coordinator of key (typ is
// CoordinatorGroup or CoordinatorTxn), from the cache or FindCoordinator.
func (c *Cluster) Coordinator(ctx context.Context, typ int8, key string) (int32, error) {
	k := coordKey{typ, key}
	c.mu.Lock()
	node, ok := c.coords[k]
	c.mu.Unlock()
	if ok {
		return node, nil
	}
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorType = typ
	req.CoordinatorKey = key
	req.CoordinatorKeys = []string{key}
	resp, err := req.RequestWith(ctx, c.cl)
	if err != nil {
		return 0, fmt.Errorf("find coordinator of %q: %w", key, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return 0, fmt.Errorf("find coordinator of %q: %w", key, err)
	}
	c.mu.Lock()
	c.coords[k] = resp.NodeID
	c.mu.Unlock()
	return resp.NodeID, nil
}

// FreshCoordinator asks the cluster for the coordinator of key again,
// dropping what the cache held: for an answer handed to a client that
// must follow the coordinator where it is now.
func (c *Cluster) FreshCoordinator(ctx context.Context, typ int8, key string) (int32, error) {
	c.ForgetCoordinator(typ, key)
	return c.Coordinator(ctx, typ, key)
}

// ForgetCoordinator drops a cached coordinator after an error.
func (c *Cluster) ForgetCoordinator(typ int8, key string) {
	c.mu.Lock()
	delete(c.coords, coordKey{typ, key})
	c.mu.Unlock()
}

// RetriableCoordinatorCode reports whether code means: find the
// coordinator again (or wait for it) and retry. CONCURRENT_TRANSACTIONS
// means the coordinator is still completing the previous transaction of
// the id (or aborting a fenced one).
func RetriableCoordinatorCode(code int16) bool {
	switch code {
	case kerr.NotCoordinator.Code, kerr.CoordinatorNotAvailable.Code, kerr.CoordinatorLoadInProgress.Code,
		kerr.ConcurrentTransactions.Code:
		return true
	}
	return false
}

// Request sends req, capped at maxVersion, to the coordinator of key on
// a lent client and returns the response. code extracts the error code
// that decides a retry: a coordinator that moved, is loading or still
// completing a transaction (RetriableCoordinatorCode), and a failed
// connection, are retried with Backoff until ctx ends or 25 attempts.
// Every request sent this way must be safe to repeat.
func (c *Cluster) Request(ctx context.Context, typ int8, key string, req kmsg.Request, maxVersion int16, code func(kmsg.Response) int16) (kmsg.Response, error) {
	cl, put, err := c.Lend(ctx)
	if err != nil {
		return nil, err
	}
	defer put()
	return c.RequestOn(ctx, cl, typ, key, req, maxVersion, code)
}

// RequestOn is Request sending on cl (the coordinator is still looked
// up through the Cluster's client).
func (c *Cluster) RequestOn(ctx context.Context, cl *kgo.Client, typ int8, key string, req kmsg.Request, maxVersion int16, code func(kmsg.Response) int16) (kmsg.Response, error) {
	var last error
	for attempt := 0; attempt < maxCoordinatorAttempts; attempt++ {
		if attempt > 0 {
			if err := Sleep(ctx, Backoff(attempt-1)); err != nil {
				return nil, fmt.Errorf("%w (last: %v)", err, last)
			}
		}
		node, err := c.Coordinator(ctx, typ, key)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			last = err
			continue
		}
		resp, err := cl.Broker(int(node)).Request(ctx, Capped(req, maxVersion))
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			c.ForgetCoordinator(typ, key)
			last = err
			continue
		}
		rc := code(resp)
		if !RetriableCoordinatorCode(rc) {
			return resp, nil
		}
		if rc != kerr.ConcurrentTransactions.Code {
			c.ForgetCoordinator(typ, key)
		}
		last = kerr.ErrorForCode(rc)
	}
	if last == nil {
		last = errors.New("no attempt made")
	}
	return nil, last
}

// Lend returns a client for one request, on a connection no other
// request waits on (internal/clientpool), and the function that gives
// it back: one of the pool's clients, or the Cluster's own client when
// it has no pool or its pool closed (kproxy stopping).
func (c *Cluster) Lend(ctx context.Context) (*kgo.Client, func(), error) {
	if c.reqs == nil {
		return c.cl, func() {}, nil
	}
	cl, err := c.reqs.Get(ctx)
	if errors.Is(err, clientpool.ErrClosed) {
		return c.cl, func() {}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return cl, func() { c.reqs.Put(cl) }, nil
}

// Lent is a kmsg.Requestor sending each request (kgo routes it, to a
// group's coordinator for a group request) on a client lent to it alone.
func (c *Cluster) Lent() kmsg.Requestor { return lent{c} }

type lent struct{ c *Cluster }

func (l lent) Request(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	cl, put, err := l.c.Lend(ctx)
	if err != nil {
		return nil, err
	}
	defer put()
	return cl.Request(ctx, req)
}

// Keys asks the cluster, with ApiVersions on cl, which API keys it
// answers, each with its highest version.
func Keys(ctx context.Context, cl kmsg.Requestor) (map[int16]int16, error) {
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName, req.ClientSoftwareVersion = "kproxy", "1"
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		return nil, fmt.Errorf("ApiVersions: %w", err)
	}
	keys := make(map[int16]int16, len(resp.ApiKeys))
	for _, k := range resp.ApiKeys {
		keys[k.ApiKey] = k.MaxVersion
	}
	return keys, nil
}

// SupportsKey reports whether the cluster answers requests of key (asked
// once, with ApiVersions, and remembered once read).
func (c *Cluster) SupportsKey(ctx context.Context, key int16) bool {
	c.mu.Lock()
	keys := c.keys
	c.mu.Unlock()
	if keys == nil {
		var err error
		if keys, err = Keys(ctx, c.cl); err != nil {
			return false
		}
		c.mu.Lock()
		c.keys = keys
		c.mu.Unlock()
	}
	_, ok := keys[key]
	return ok
}

// LacksKey reports whether the cluster is known not to answer requests
// of key: its ApiVersions was read and does not list it (a failed
// ApiVersions proves nothing).
func (c *Cluster) LacksKey(ctx context.Context, key int16) bool {
	if c.SupportsKey(ctx, key) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys != nil
}

// capped is a request whose version kgo negotiates no higher than max.
type capped struct {
	kmsg.Request
	max int16
}

// MaxVersion implements kmsg.Request.
func (c capped) MaxVersion() int16 { return min(c.max, c.Request.MaxVersion()) }

// Capped returns req for kgo to send at most at version max: kgo sends
// the highest version both sides know, and Client.Request ignores a
// version set on the request, so a request that must stay below a
// version goes to one broker (Broker.Request) wrapped this way.
func Capped(req kmsg.Request, max int16) kmsg.Request { return capped{req, max} }

// Backoff is the wait before retry attempt+1: 20ms, 40ms, ... capped at
// 500ms.
func Backoff(attempt int) time.Duration {
	return min(time.Duration(20*(attempt+1))*time.Millisecond, 500*time.Millisecond)
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
