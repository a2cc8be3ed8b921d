package groupstate

import (
	"errors"
	"sync"
	"time"
)

// recordWriter writes one group's record to the GroupMetadataStore for
// the kinds whose answers wait for it (KIP-848 groups, share groups; a
// classic group writes in the background, classicGroup.persist).
//
// persistThen answers once every change made to the group before it is
// durable: at once when nothing is to be written, else after the write
// that holds the change. Writes are coalesced: while one is in flight,
// further changes only mark the group dirty and wait for the next write,
// which holds the latest state, so a busy group costs one write at a time.
// A failed write answers its waiters with the store error's code
// (storeErrorCode: NOT_COORDINATOR for a fenced writer) and drops the
// group (EventGroupUnloaded, CauseStoreError), so that memory is again
// what the store holds and the next request reloads it; partitions or
// records a failed write would have granted are never granted from
// memory, and a fenced (zombie) owner holds no state a write cannot back.
//
// A group embeds a recordWriter and sets it up with initWriter. Its
// state is owned by the loop of the shard holding the group, but for the
// batch of the write in flight (saveBatch), which the write's completion
// may finish off the loop once the engine closed.
type recordWriter struct {
	// s, id and owner are set once by initWriter: the group's shard, its
	// id and the group itself.
	s     *shard
	id    string
	owner recorded
	// dirty says the record changed since the last write started, saving
	// that a write is in flight; cur holds the answers waiting for the
	// write in flight, waitNext those waiting for the next one.
	dirty    bool
	saving   bool
	cur      *saveBatch
	waitNext []func(code int16)
}

// recorded is what a group gives its recordWriter.
type recorded interface {
	group
	// live reports whether the group is still the one its shard holds
	// under its id.
	live() bool
	// record encodes the group's record; nil when it cannot be encoded
	// (nothing is written).
	record() []byte
	// saveStarting runs whenever a write may start, before it does.
	saveStarting()
	// saveDone runs on the loop with every write's result and how long
	// it took.
	saveDone(err error, took time.Duration)
}

// initWriter sets w up for owner, the group of id held by s.
func (w *recordWriter) initWriter(s *shard, id string, owner recorded) {
	w.s, w.id, w.owner = s, id, owner
}

// markDirty notes that the group changed in a way its record holds.
func (w *recordWriter) markDirty() { w.dirty = true }

// persistThen calls answer once every change made to the group so far
// is durable. answer gets errNone; the store error's code when the write
// failed (the group is then dropped, to be reloaded); NOT_COORDINATOR
// when the group was unloaded before its write started;
// COORDINATOR_NOT_AVAILABLE when the engine closed first. Without a
// store, or once the group is no longer held, it answers errNone at
// once. A nil answer just starts the write.
func (w *recordWriter) persistThen(answer func(code int16)) {
	if answer == nil {
		answer = func(int16) {}
	}
	if w.s.e.meta == nil || !w.owner.live() {
		w.dirty = false
		answer(errNone)
		return
	}
	switch {
	case w.dirty:
		w.waitNext = append(w.waitNext, answer)
		w.startSave()
	case w.saving:
		w.cur.add(answer)
	default:
		answer(errNone)
	}
}

// startSave writes the current state unless a write is in flight (its
// completion starts the next one).
func (w *recordWriter) startSave() {
	w.owner.saveStarting()
	if w.saving || !w.dirty {
		return
	}
	rec := w.owner.record()
	if rec == nil {
		w.dirty = false
		return
	}
	w.dirty, w.saving = false, true
	batch := &saveBatch{ws: w.waitNext}
	w.cur, w.waitNext = batch, nil
	start := time.Now()
	w.s.saveMeta(w.id, rec, func(err error) {
		w.owner.saveDone(err, time.Since(start))
		if errors.Is(err, errEngineClosed) || errors.Is(err, errUnloaded) {
			// Closed or unloaded before the write started: the group
			// was already dropped; answer here.
			batch.finish(storeErrorCode(err))
			return
		}
		w.saving = false
		w.cur = nil
		if err != nil {
			// Nothing of this write is durable: answer its waiters with
			// the error and drop the group.
			code := storeErrorCode(err)
			w.s.e.log.Warn("groupstate: persisting a group failed; dropping its state", "group", w.id, "kind", w.owner.groupKind(), "err", err)
			batch.finish(code)
			if w.owner.live() {
				w.owner.unload(code, CauseStoreError)
			}
			return
		}
		batch.finish(errNone)
		if w.owner.live() {
			w.startSave()
			return
		}
		// The group was dropped meanwhile (deleted or replaced, and
		// tombstoned after this write): nothing more to write.
		w.failWaiters(errNone)
	}, func() {
		// The engine closed while the write ran (off the loop).
		batch.finish(errCoordinatorNotAvailable)
	})
}

// failWaiters answers code to every request waiting for a write that
// will not happen (teardown, the group unloaded or dropped).
func (w *recordWriter) failWaiters(code int16) {
	for _, ans := range w.takeWaiters() {
		ans(code)
	}
}

// takeWaiters returns the answers waiting for the next write and forgets
// them and the change they wait for.
func (w *recordWriter) takeWaiters() []func(code int16) {
	ws := w.waitNext
	w.waitNext, w.dirty = nil, false
	return ws
}

// saveBatch holds the answers waiting for one write. The loop adds to it
// while the write runs; the write's completion finishes it, on the loop
// or, once the engine closed, off it: hence mu.
type saveBatch struct {
	mu   sync.Mutex
	ws   []func(code int16) // guarded by mu
	code int16              // guarded by mu: the answer once done
	done bool               // guarded by mu
}

// add queues answer, or calls it at once if the batch is finished.
func (b *saveBatch) add(answer func(code int16)) {
	b.mu.Lock()
	if b.done {
		code := b.code
		b.mu.Unlock()
		answer(code)
		return
	}
	b.ws = append(b.ws, answer)
	b.mu.Unlock()
}

// finish answers every queued answer with code, once.
func (b *saveBatch) finish(code int16) {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return
	}
	b.done, b.code = true, code
	ws := b.ws
	b.ws = nil
	b.mu.Unlock()
	for _, w := range ws {
		w(code)
	}
}
