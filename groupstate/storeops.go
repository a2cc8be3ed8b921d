package groupstate

import (
	"context"
	"sync"
)

// Store calls never run on a loop. Each group id has a FIFO of store
// operations, owned by the loop of the group's shard: one operation per
// group is in flight at a time, so commits and fetches of one group are
// applied in the order they arrived. The operation runs on its own
// goroutine and posts its completion back to the loop; if the engine has
// closed meanwhile, the completion answers the client directly.
//
// Engine.Unload answers the unstarted operations of an unloaded group
// (abort with errUnloaded) and waits for the one in flight: a store call
// the engine issued before the unload must not reach the store after the
// partition was claimed again (it would write under the new claim, after
// the new owner's writes). Its FIFO stays in place, marked by a new
// unload count, so that operations queued after the group is claimed
// again still run after it. Its completion still answers the client with
// the store's result (done) but skips the follow-up, and an operation
// that installs state (a load) is given stale instead of done.

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
}

// opQueue is the FIFO of one group id (owned by the loop).
type opQueue struct {
	busy bool
	q    []storeOp
	// unloads counts the Unloads of the group since the queue was
	// created: an operation that started at another count is stale.
	unloads uint64
	// running is closed once the operation in flight returned from the
	// store and its completion was posted (Unload waits for it).
	running chan struct{}
}

// enqueue adds op to group's FIFO and starts it if the FIFO was idle.
func (s *shard) enqueue(group string, op storeOp) {
	q := s.ops[group]
	if q == nil {
		q = &opQueue{}
		s.ops[group] = q
	}
	q.q = append(q.q, op)
	if !q.busy {
		s.startNext(s.ops, group, q)
	}
}

// startNext starts the next operation of q, or forgets q (held in ops)
// when empty.
func (s *shard) startNext(ops map[string]*opQueue, group string, q *opQueue) {
	if len(q.q) == 0 {
		q.busy = false
		if ops[group] == q {
			delete(ops, group)
		}
		return
	}
	op := q.q[0]
	q.q[0] = storeOp{}
	q.q = q.q[1:]
	q.busy = true
	gen := q.unloads
	running := make(chan struct{})
	q.running = running
	started := s.e.goStore(func(ctx context.Context) {
		defer close(running)
		result, after := op.run(ctx)
		if !s.post(func() {
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
		close(running)
		op.done(op.abort(errEngineClosed))
		s.startNext(ops, group, q)
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
// the end of each operation in flight. A busy FIFO stays in place to keep
// later operations of the id behind the one in flight.
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
			if q.busy {
				running = append(running, q.running)
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
