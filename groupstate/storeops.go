package groupstate

import (
	"context"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Store calls never run on a loop. Each group id has a FIFO of store
// operations, owned by the loop of the group's shard, started in the
// order they arrived: an operation starts once every operation before it
// has completed, so commits, fetches and deletes of one group are applied
// in that order. Offset commits are the one exception: a commit starts
// while earlier commits of its group still run when none of them writes
// any of its partitions (storeOp.commitKeys). The members of a group each
// commit the partitions they own, so their commits travel to the cluster
// side by side, each costing one round trip, instead of queueing behind
// each other (with two members committing on a slow link every commit
// took two round trips); the cluster's coordinator applies them as they
// come, as it does directly. Commits of the same partition, and every
// other operation, keep the strict order. The operation runs on its own
// goroutine and posts its completion back to the loop; if the engine has
// closed meanwhile, the completion answers the client directly.
//
// Engine.Unload answers the unstarted operations of an unloaded group
// (abort with errUnloaded) and waits for the ones in flight: a store call
// the engine issued before the unload must not reach the store after the
// partition was claimed again (it would write under the new claim, after
// the new owner's writes). Its FIFO stays in place, marked by a new
// unload count, so that operations queued after the group is claimed
// again still run after them. Their completions still answer the client
// with the store's result (done) but skip the follow-up, and an
// operation that installs state (a load) is given stale instead of done.

// storeOp is one queued store operation.
type storeOp struct {
	// run performs the store calls off the loop and returns the result
	// plus an optional follow-up to run on the loop (events).
	run func(ctx context.Context) (result any, after func())
	// done receives the result exactly once, from the loop or, after
	// Close, from the operation's goroutine.
	done func(result any)
	// abort returns the result given to done if the operation never
	// starts: cause is errEngineClosed (Close) or errUnloaded (Unload).
	abort func(cause error) any
	// stale, if set, receives the result instead of done when the group
	// was unloaded while the operation ran (on the loop); it must not
	// install state.
	stale func(result any)
	// closed, if set, receives the result instead of done when the
	// engine closed while the operation ran: it is then called off the
	// loop and must not touch loop-owned state.
	closed func(result any)
	// commitKeys, set only for an offset commit, names the partitions it
	// writes: it may run beside other commits that write none of them.
	// An operation without commitKeys runs alone.
	commitKeys []partKey
}

// partKey names one partition of a commit: by topic name, or by topic ID
// for a request that carries only IDs (OffsetCommit v10).
type partKey struct {
	topic     string
	id        [16]byte
	partition int32
}

// commitKeysOf returns the partitions topics name.
func commitKeysOf(topics []kmsg.OffsetCommitRequestTopic) []partKey {
	var keys []partKey
	for _, t := range topics {
		for _, p := range t.Partitions {
			k := partKey{topic: t.Topic, partition: p.Partition}
			if t.Topic == "" {
				k.id = t.TopicID
			}
			keys = append(keys, k)
		}
	}
	if keys == nil {
		keys = []partKey{} // a commit of nothing still runs beside others
	}
	return keys
}

// maxCommitsInFlight bounds the commits of one group running at once.
const maxCommitsInFlight = 64

// opQueue is the FIFO of one group id (owned by the loop).
type opQueue struct {
	q []storeOp
	// alone is set while the one in flight must run alone (no
	// commitKeys), and writing counts the partitions of the commits in
	// flight.
	alone   bool
	writing map[partKey]int
	// unloads counts the Unloads of the group since the queue was
	// created: an operation that started at another count is stale.
	unloads uint64
	// running holds, per operation started and not yet completed, what
	// is closed once it returned from the store and its completion was
	// posted (Unload waits for them); its size is the operations in
	// flight.
	running map[chan struct{}]struct{}
}

// enqueue adds op to group's FIFO and starts it if nothing holds it back.
func (s *shard) enqueue(group string, op storeOp) {
	s.push(s.ops, group, op)
}

// push adds op to group's FIFO in ops and starts what may start.
func (s *shard) push(ops map[string]*opQueue, group string, op storeOp) {
	q := ops[group]
	if q == nil {
		q = &opQueue{}
		ops[group] = q
	}
	q.q = append(q.q, op)
	s.startNext(ops, group, q)
}

// mayStart reports whether op, the head of q, may start now.
func (q *opQueue) mayStart(op *storeOp) bool {
	if len(q.running) == 0 {
		return true
	}
	if q.alone || op.commitKeys == nil || len(q.running) >= maxCommitsInFlight {
		return false
	}
	for _, k := range op.commitKeys {
		if q.writing[k] > 0 {
			return false
		}
	}
	return true
}

// startNext starts the operations at the head of q that may start, or
// forgets q (held in ops) when it is empty and idle.
func (s *shard) startNext(ops map[string]*opQueue, group string, q *opQueue) {
	for len(q.q) > 0 && q.mayStart(&q.q[0]) {
		op := q.q[0]
		q.q[0] = storeOp{}
		q.q = q.q[1:]
		s.start(ops, group, q, op)
	}
	if len(q.q) == 0 && len(q.running) == 0 && ops[group] == q {
		delete(ops, group)
	}
}

// start runs op of q off the loop.
func (s *shard) start(ops map[string]*opQueue, group string, q *opQueue, op storeOp) {
	if op.commitKeys == nil {
		q.alone = true
	} else {
		if q.writing == nil {
			q.writing = make(map[partKey]int)
		}
		for _, k := range op.commitKeys {
			q.writing[k]++
		}
	}
	gen := q.unloads
	running := make(chan struct{})
	if q.running == nil {
		q.running = make(map[chan struct{}]struct{})
	}
	q.running[running] = struct{}{}
	// finished, on the loop, takes op out of the operations in flight.
	finished := func() {
		q.alone = false
		for _, k := range op.commitKeys {
			if q.writing[k]--; q.writing[k] == 0 {
				delete(q.writing, k)
			}
		}
		delete(q.running, running)
	}
	started := s.e.goStore(func(ctx context.Context) {
		defer close(running)
		result, after := op.run(ctx)
		if !s.post(func() {
			finished()
			switch {
			case q.unloads != gen && op.stale != nil:
				op.stale(result)
			case q.unloads != gen:
				// The group was unloaded meanwhile: answer the
				// client, touch no state.
				op.done(result)
			default:
				if after != nil {
					after()
				}
				op.done(result)
			}
			s.startNext(ops, group, q)
		}) {
			if op.closed != nil {
				op.closed(result)
			} else {
				op.done(result)
			}
		}
	})
	if !started {
		finished()
		close(running)
		op.done(op.abort(errEngineClosed))
	}
}

// abortOps answers every queued, unstarted operation (engine closing).
func (s *shard) abortOps() {
	for _, ops := range []map[string]*opQueue{s.ops, s.metaOps} {
		for group, q := range ops {
			for _, op := range q.q {
				op.done(op.abort(errEngineClosed))
			}
			q.q = nil
			delete(ops, group)
		}
	}
}

// unloadOps answers the unstarted operations of every group id match
// accepts with errUnloaded and marks their FIFOs, so that the completion
// of the operation in flight touches no state; it returns what signals
// the end of each operation in flight. A FIFO with operations in flight
// stays in place to keep later operations of the id behind them.
func (s *shard) unloadOps(match func(string) bool) []chan struct{} {
	var running []chan struct{}
	for _, ops := range []map[string]*opQueue{s.ops, s.metaOps} {
		for group, q := range ops {
			if !match(group) {
				continue
			}
			q.unloads++
			pending := q.q
			q.q = nil
			for _, op := range pending {
				op.done(op.abort(errUnloaded))
			}
			if len(q.running) > 0 {
				for ch := range q.running {
					running = append(running, ch)
				}
			} else {
				delete(ops, group)
			}
		}
	}
	return running
}

// goStore runs fn on a tracked goroutine with a bounded context; it
// reports false once the engine is closing.
func (e *Engine) goStore(fn func(ctx context.Context)) bool {
	e.storeMu.Lock()
	if e.storeClosed {
		e.storeMu.Unlock()
		return false
	}
	e.storeWG.Add(1)
	e.storeMu.Unlock()
	go func() {
		defer e.storeWG.Done()
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.StoreTimeout)
		defer cancel()
		fn(ctx)
	}()
	return true
}

// gather collects n partial results from any goroutines and calls finish
// once with all of them.
type gather[T any] struct {
	mu     sync.Mutex // guards left and parts
	left   int
	parts  []T
	finish func(parts []T)
}

// newGather returns a gather for n parts; with n == 0 finish runs now.
func newGather[T any](n int, finish func(parts []T)) *gather[T] {
	g := &gather[T]{left: n, parts: make([]T, n), finish: finish}
	if n == 0 {
		finish(g.parts)
	}
	return g
}

// set records part i.
func (g *gather[T]) set(i int, v T) {
	g.mu.Lock()
	g.parts[i] = v
	g.left--
	last := g.left == 0
	g.mu.Unlock()
	if last {
		g.finish(g.parts)
	}
}

// resolveNames maps topic IDs to names through the store, if it can.
func (e *Engine) resolveNames(ctx context.Context, ids [][16]byte) map[[16]byte]string {
	if len(ids) == 0 {
		return nil
	}
	r, ok := e.cfg.Store.(TopicResolver)
	if !ok {
		return nil
	}
	names, err := r.TopicNames(ctx, ids)
	if err != nil {
		e.log.Warn("groupstate: resolving topic ids failed", "err", err)
		return nil
	}
	return names
}

// resolveIDs maps topic names to IDs through the store, if it can.
func (e *Engine) resolveIDs(ctx context.Context, names []string) map[string][16]byte {
	if len(names) == 0 {
		return nil
	}
	r, ok := e.cfg.Store.(TopicResolver)
	if !ok {
		return nil
	}
	ids, err := r.TopicIDs(ctx, names)
	if err != nil {
		e.log.Warn("groupstate: resolving topic names failed", "err", err)
		return nil
	}
	return ids
}
