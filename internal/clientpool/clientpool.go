// Package clientpool lends kgo clients of the cluster to exchanges that
// must not wait behind each other on one connection: the store's
// requests to group coordinators (groupstate/kafkastore) and the
// anchors' joins (internal/coexist).
package clientpool

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A kgo client sends every JoinGroup and SyncGroup to a broker on one
// connection (its group connection), and every other request but
// produce and fetch on another (its normal connection), writing them one
// after the other without waiting; a Kafka broker reads the next request
// of a connection only once it answered the one before (its
// SocketServer mutes a connection while a request of it is in flight).
//
// A JoinGroup the cluster holds (the first join of an empty group waits
// group.initial.rebalance.delay.ms, 3 s by default; a join into a group
// the cluster rebalances waits for its other members) then holds every
// join and sync queued behind it on that connection: 20 new groups
// anchored at once through one client waited 60 s for their first
// commit where directly each waited 3 s (BenchmarkAnchorFirstCommit).
// And every OffsetCommit waits out the one before it: Kafka 4's
// coordinator answers a commit once its batch of writes is appended
// (group.coordinator.append.linger.ms, 5 ms by default, plus the
// replication of acks=all), so 64 groups committing at once through one
// connection made 164 commits/s where their members directly, each on a
// connection of its own, made 6,670 (BenchmarkManyGroupsCommit).
//
// So an anchor's join and sync, and each request kproxy sends a group
// coordinator for a group, go on a client lent to that exchange alone,
// from a pool: as many exchanges in flight as clients, none queued
// behind another. Joins and the short requests have pools of their own,
// so that joins the cluster holds never use up the clients commits need.

// Pool lends kgo clients to exchanges with the cluster, one
// exchange per client at a time. Clients are made on demand, up to the
// pool's size, and kept: an idle one costs a metadata refresh every few
// minutes, its connections close by themselves when idle.
type Pool struct {
	what      string                      // immutable: what the clients are for, in errors
	newClient func() (*kgo.Client, error) // immutable
	// slots bounds the clients lent at once; a lease holds one slot.
	slots chan struct{}

	mu     sync.Mutex    // guards free, all and closed
	free   []*kgo.Client // made and not lent
	all    []*kgo.Client // every client made, for close
	closed bool
}

// New makes a pool of at most size clients from newClient, for what
// (in errors).
func New(what string, size int, newClient func() (*kgo.Client, error)) *Pool {
	return &Pool{what: what, newClient: newClient, slots: make(chan struct{}, size)}
}

// ErrClosed is Get's error once the pool closed.
var ErrClosed = errors.New("the pooled clients are closed")

// Get lends a client until Put: a free one, else a new one; it waits
// while every slot is lent.
func (p *Pool) Get(ctx context.Context) (*kgo.Client, error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.slots
		return nil, ErrClosed
	}
	if n := len(p.free); n > 0 {
		cl := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return cl, nil
	}
	p.mu.Unlock()
	cl, err := p.newClient()
	if err != nil {
		<-p.slots
		return nil, fmt.Errorf("a client for %s: %w", p.what, err)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		cl.Close()
		<-p.slots
		return nil, ErrClosed
	}
	p.all = append(p.all, cl)
	p.mu.Unlock()
	return cl, nil
}

// Put gives back a client Get lent.
func (p *Pool) Put(cl *kgo.Client) {
	p.mu.Lock()
	if !p.closed {
		p.free = append(p.free, cl)
	}
	p.mu.Unlock()
	<-p.slots
}

// Made is how many clients the pool made.
func (p *Pool) Made() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.all)
}

// Close closes every client made; later Gets fail. Exchanges on a lent
// client fail with it.
func (p *Pool) Close() {
	p.mu.Lock()
	all := p.all
	p.all, p.free, p.closed = nil, nil, true
	p.mu.Unlock()
	for _, cl := range all {
		cl.Close()
	}
}
