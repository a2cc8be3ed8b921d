package groupstate

import (
	"context"
	"fmt"
	"maps"
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

// requestTopicRefresh starts an asynchronous refresh unless one is under
// way (a heartbeat named a topic the cache does not know).
func (e *Engine) requestTopicRefresh() {
	if _, ok := e.cfg.Store.(TopicMetadataStore); !ok {
		return
	}
	if !e.topicRefreshing.CompareAndSwap(false, true) {
		return
	}
	// At most one refresh a second, however many heartbeats name a
	// topic that does not exist.
	now := e.clock.Now().UnixNano()
	if last := e.topicLastRefresh.Load(); last != 0 && now-last < int64(time.Second) {
		e.topicRefreshing.Store(false)
		return
	}
	e.topicLastRefresh.Store(now)
	if !e.goStore(func(ctx context.Context) {
		defer e.topicRefreshing.Store(false)
		if err := e.refreshTopics(ctx); err != nil {
			e.log.Warn("groupstate: refreshing topics failed", "err", err)
		}
	}) {
		e.topicRefreshing.Store(false)
	}
}

// startTopicRefresher loads the topic cache now and every
// Config.TopicRefreshInterval until Close.
func (e *Engine) startTopicRefresher() {
	if _, ok := e.cfg.Store.(TopicMetadataStore); !ok {
		return
	}
	e.requestTopicRefresh()
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
		e.requestTopicRefresh()
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
const defaultTopicRefreshInterval = 30 * time.Second

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
