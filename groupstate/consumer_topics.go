package groupstate

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"
)

// topicSnapshot is an immutable copy of the cluster's topics.
type topicSnapshot struct {
	byName map[string]TopicInfo
	byID   map[topicID]string
}

// topicsNow returns the engine's cached topics (never nil).
func (e *Engine) topicsNow() *topicSnapshot {
	if t := e.topics.Load(); t != nil {
		return t
	}
	return noTopics
}

// topicsKnown reports whether targets may be computed from the topic
// cache: it was loaded at least once, or the store lists no topics at
// all (every subscribed topic then counts as missing).
func (e *Engine) topicsKnown() bool {
	if _, ok := e.cfg.Store.(TopicMetadataStore); !ok {
		return true
	}
	return e.topics.Load() != nil
}

// noTopics is the (immutable) snapshot before the first refresh.
var noTopics = &topicSnapshot{}

// refreshTopics reloads the topic cache from the store; it runs off the
// loops.
func (e *Engine) refreshTopics(ctx context.Context) error {
	tm, ok := e.cfg.Store.(TopicMetadataStore)
	if !ok {
		return nil
	}
	seq := e.topicSeq.Add(1)
	byName, err := tm.TopicMetadata(ctx)
	if err != nil {
		return fmt.Errorf("groupstate: topic metadata: %w", err)
	}
	snap := &topicSnapshot{byName: maps.Clone(byName), byID: make(map[topicID]string, len(byName))}
	for n, ti := range byName {
		snap.byID[ti.ID] = n
	}
	// A slower, older refresh must not overwrite a newer answer.
	e.topicMu.Lock()
	defer e.topicMu.Unlock()
	if seq > e.topicStored {
		e.topicStored = seq
		e.topics.Store(snap)
	}
	return nil
}

// Topic refreshes. A refresh reloads the whole topic cache from the
// store (one Metadata request for kafkastore) off the loops. Three things
// ask for one:
//
//   - the periodic timer, every Config.TopicRefreshInterval, so that a
//     partition increase, a deleted topic or a new regex match reaches
//     the groups within that interval (Kafka's coordinator sees them in
//     its metadata image at once; KIP-848 bumps the group epoch on the
//     next heartbeat);
//   - requestTopicRefresh, asynchronous and at most once a second, when a
//     heartbeat of an unchanged subscription names a topic the cache
//     does not know;
//   - awaitTopics, on demand: a heartbeat that joins or changes its
//     subscription to a topic the cache does not know waits (at most
//     maxTopicWait) for a refresh started after it arrived, so that its
//     answer carries the topic's partitions as Kafka's would.
//
// At most one refresh runs at a time; requests made while one runs are
// served by it or, if it started before they were made, by one more
// right after it.

// maxTopicWait bounds how long a heartbeat waits for a topic refresh
// before it is answered with the topics known. It stays well inside a
// heartbeat's deadline: clients give a request their request timeout
// (the Java client's request.timeout.ms, 30s by default; franz-go's
// RequestTimeoutOverhead, 10s) and heartbeat every 5s by default.
const maxTopicWait = 2 * time.Second

// topicWaiter is one heartbeat waiting for a refresh (awaitTopics).
type topicWaiter struct {
	since time.Time // immutable: the refresh must start at or after it
	fn    func()    // immutable: called once, by fire
	fired atomic.Bool
	timer Timer // set under Engine.topicMu, read by fire's callers
}

// fire calls w.fn unless it was called already.
func (w *topicWaiter) fire() {
	if w.fired.CompareAndSwap(false, true) {
		w.fn()
	}
}

// requestTopicRefresh starts an asynchronous refresh unless one is under
// way or one started less than a second ago (a heartbeat named a topic
// the cache does not know; however many heartbeats do, at most one
// refresh a second).
func (e *Engine) requestTopicRefresh() {
	if _, ok := e.cfg.Store.(TopicMetadataStore); !ok {
		return
	}
	e.topicMu.Lock()
	if e.topicInflight {
		e.topicMu.Unlock()
		return
	}
	now := e.clock.Now()
	if !e.topicLastStart.IsZero() && now.Sub(e.topicLastStart) < time.Second {
		e.topicMu.Unlock()
		return
	}
	e.topicMu.Unlock()
	e.startTopicRefresh()
}

// awaitTopics calls fn, from any goroutine (it must only post), once a
// refresh that started at or after since has completed (or failed), or
// after maxTopicWait, whichever comes first; at once if the store lists
// no topics. fn is called exactly once; Close calls it too if it is
// still waiting, so a posting fn answers COORDINATOR_NOT_AVAILABLE. It is
// called on the loops only, so none is added after Close stopped them
// and released the waiters.
func (e *Engine) awaitTopics(since time.Time, fn func()) {
	w := &topicWaiter{since: since, fn: fn}
	if _, ok := e.cfg.Store.(TopicMetadataStore); !ok || e.closed.Load() {
		w.fire()
		return
	}
	e.topicMu.Lock()
	e.topicWaiters = append(e.topicWaiters, w)
	// The timer only calls fn, which posts to the waiter's loop: it
	// changes no group state (timers never do).
	w.timer = e.clock.AfterFunc(maxTopicWait, func() {
		e.dropTopicWaiter(w)
		w.fire()
	})
	start := !e.topicInflight
	if e.topicInflight && e.topicInflightStart.Before(since) {
		e.topicAgain = true
	}
	e.topicMu.Unlock()
	if start {
		e.startTopicRefresh()
	}
}

// dropTopicWaiter forgets w (its wait timed out).
func (e *Engine) dropTopicWaiter(w *topicWaiter) {
	e.topicMu.Lock()
	defer e.topicMu.Unlock()
	for i, o := range e.topicWaiters {
		if o == w {
			e.topicWaiters = slices.Delete(e.topicWaiters, i, i+1)
			return
		}
	}
}

// startTopicRefresh starts a refresh unless one runs; when it completes,
// it answers the waiters it serves and starts the next one if a waiter
// or a request came after it started.
func (e *Engine) startTopicRefresh() {
	e.topicMu.Lock()
	if e.topicInflight {
		e.topicMu.Unlock()
		return
	}
	start := e.clock.Now()
	e.topicInflight, e.topicInflightStart, e.topicLastStart, e.topicAgain = true, start, start, false
	e.topicMu.Unlock()
	if !e.goStore(func(ctx context.Context) {
		err := e.refreshTopics(ctx)
		if err != nil {
			e.log.Warn("groupstate: refreshing topics failed", "err", err)
		}
		e.topicRefreshDone(start, false)
	}) {
		// Closed: nothing will refresh again.
		e.topicRefreshDone(start, true)
	}
}

// topicRefreshDone ends the refresh that started at start: it answers
// every waiter that arrived before it started (a failed refresh answers
// them too, with the topics known: a heartbeat never waits for more than
// one refresh) and starts the next refresh if anyone asked for one since.
// With all, every waiter is answered (the refresh could not start).
func (e *Engine) topicRefreshDone(start time.Time, all bool) {
	e.topicMu.Lock()
	e.topicInflight = false
	var served []*topicWaiter
	keep := e.topicWaiters[:0]
	for _, w := range e.topicWaiters {
		if !all && w.since.After(start) {
			keep = append(keep, w)
		} else {
			served = append(served, w)
		}
	}
	clear(e.topicWaiters[len(keep):])
	e.topicWaiters = keep
	again := (e.topicAgain || len(keep) > 0) && !e.closed.Load()
	e.topicMu.Unlock()
	for _, w := range served {
		w.timer.Stop()
		w.fire()
	}
	if again {
		e.startTopicRefresh()
	}
}

// releaseTopicWaiters answers every heartbeat still waiting for topics
// (Close, after the last refresh ended).
func (e *Engine) releaseTopicWaiters() {
	e.topicMu.Lock()
	waiters := e.topicWaiters
	e.topicWaiters = nil
	e.topicMu.Unlock()
	for _, w := range waiters {
		w.timer.Stop()
		w.fire()
	}
}

// startTopicRefresher loads the topic cache now and every
// Config.TopicRefreshInterval until Close.
func (e *Engine) startTopicRefresher() {
	if _, ok := e.cfg.Store.(TopicMetadataStore); !ok {
		return
	}
	e.startTopicRefresh()
	e.armTopicTimer()
}

// armTopicTimer arms the next periodic refresh.
func (e *Engine) armTopicTimer() {
	e.storeMu.Lock()
	defer e.storeMu.Unlock()
	if e.storeClosed || e.closed.Load() {
		return
	}
	e.topicTimer = e.clock.AfterFunc(e.cfg.TopicRefreshInterval, func() {
		e.startTopicRefresh()
		e.armTopicTimer()
	})
}

// stopTopicTimer stops the periodic refresh (Close).
func (e *Engine) stopTopicTimer() {
	e.storeMu.Lock()
	defer e.storeMu.Unlock()
	if e.topicTimer != nil {
		e.topicTimer.Stop()
		e.topicTimer = nil
	}
}

// defaultTopicRefreshInterval is Config.TopicRefreshInterval's default.
const defaultTopicRefreshInterval = 2 * time.Second

// defaultConsumerConfig fills the KIP-848 defaults of cfg and returns
// every problem found.
func defaultConsumerConfig(cfg *Config) []error {
	var problems []error
	if cfg.ConsumerSessionTimeout < 0 || cfg.ConsumerMinSessionTimeout < 0 || cfg.ConsumerMaxSessionTimeout < 0 ||
		cfg.ConsumerHeartbeatInterval < 0 || cfg.TopicRefreshInterval < 0 {
		problems = append(problems, fmt.Errorf("groupstate: consumer group timeouts must not be negative"))
	}
	if cfg.ConsumerMaxGroupSize < 0 {
		problems = append(problems, fmt.Errorf("groupstate: Config.ConsumerMaxGroupSize %d is negative", cfg.ConsumerMaxGroupSize))
	}
	if cfg.ConsumerMinSessionTimeout == 0 {
		cfg.ConsumerMinSessionTimeout = 45 * time.Second
	}
	if cfg.ConsumerMaxSessionTimeout == 0 {
		cfg.ConsumerMaxSessionTimeout = 60 * time.Second
	}
	if cfg.ConsumerSessionTimeout == 0 {
		cfg.ConsumerSessionTimeout = 45 * time.Second
	}
	if cfg.ConsumerHeartbeatInterval == 0 {
		cfg.ConsumerHeartbeatInterval = 5 * time.Second
	}
	if cfg.TopicRefreshInterval == 0 {
		cfg.TopicRefreshInterval = defaultTopicRefreshInterval
	}
	if cfg.ConsumerSessionTimeout < cfg.ConsumerMinSessionTimeout || cfg.ConsumerSessionTimeout > cfg.ConsumerMaxSessionTimeout {
		problems = append(problems, fmt.Errorf("groupstate: ConsumerSessionTimeout %v is outside [%v, %v]",
			cfg.ConsumerSessionTimeout, cfg.ConsumerMinSessionTimeout, cfg.ConsumerMaxSessionTimeout))
	}
	if cfg.ConsumerHeartbeatInterval >= cfg.ConsumerSessionTimeout {
		problems = append(problems, fmt.Errorf("groupstate: ConsumerHeartbeatInterval %v must be shorter than ConsumerSessionTimeout %v",
			cfg.ConsumerHeartbeatInterval, cfg.ConsumerSessionTimeout))
	}
	if cfg.ConsumerAssignors == nil {
		cfg.ConsumerAssignors = []string{AssignorUniform, AssignorRange}
	}
	if len(cfg.ConsumerAssignors) == 0 {
		problems = append(problems, fmt.Errorf("groupstate: Config.ConsumerAssignors is empty"))
	}
	for _, a := range cfg.ConsumerAssignors {
		if _, ok := assignors[a]; !ok {
			problems = append(problems, fmt.Errorf("groupstate: unknown consumer assignor %q", a))
		}
	}
	return problems
}
