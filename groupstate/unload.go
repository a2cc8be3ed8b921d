package groupstate

import (
	"errors"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Ownership in a fleet (docs/fleet.md): Config.Owns gates every request
// on the loop that dispatches it, and Unload drops the groups of a
// partition this kproxy gave up or lost. Dropping writes nothing, so a
// kproxy that lost a partition (its writes may already be fenced) leaves
// the store exactly as the new owner found it; the new owner loads each
// group from its stored record, the path a restarted kproxy takes:
// Stable at the stored generation (or epoch), fresh session timers, no
// rebalance.

// fenced reports whether a store error says that this engine no longer
// owns the group: its writer was fenced by a newer owner (KIP-98), or the
// group was unloaded.
func fenced(err error) bool {
	return errors.Is(err, errUnloaded) || errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidTxnState) || errors.Is(err, kerr.NotCoordinator)
}

// errUnloaded is the result of a store operation that never started
// because its group was unloaded; clients are told NOT_COORDINATOR.
var errUnloaded = errors.New("groupstate: group unloaded")

// Unload drops every group for which match is true and returns once every
// loop has done so and every store call of these groups that was running
// has returned. For each such group: its parked requests (JoinGroup and
// SyncGroup waiting, requests waiting for the group's load, KIP-848
// heartbeats waiting for a write not yet started, store operations
// queued but not started) are answered NOT_COORDINATOR at once; its
// timers are stopped; its members are forgotten; nothing more is written
// (no record, no tombstone, no expiry, no rebalance). A store call
// already running (for offsets one per group id, or several commits of
// distinct partitions; one for group metadata) still answers its client
// with the store's result, but touches no state; Unload waits for it, bounded by Config.StoreTimeout,
// so that no call issued before the unload reaches the store after a
// later claim of the partition. An EventGroupUnloaded (Cause
// CauseUnloaded) is emitted for every group that had state.
//
// The engine keeps no memory of the unload: set Config.Owns to refuse the
// groups first, or requests arriving after Unload load them again. Once
// Owns accepts them again (the partition was claimed back), the next
// request for such a group loads it freshly from the store, behind any
// store call of the group still running.
//
// match is called on the loops and must not block. Unload must not be
// called from a reply callback or the Events sink (it waits for the
// loops), nor from a goroutine the store's calls wait for. After Close
// it does nothing.
func (e *Engine) Unload(match func(group string) bool) {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		running []chan struct{}
	)
	for _, s := range e.shards {
		wg.Add(1)
		if !s.post(func() {
			defer wg.Done()
			r := s.unload(match)
			mu.Lock()
			running = append(running, r...)
			mu.Unlock()
		}) {
			wg.Done()
		}
	}
	wg.Wait()
	for _, ch := range running {
		<-ch
	}
}

// unload drops the loop's groups that match accepts (Engine.Unload) and
// returns what signals the end of their store calls in flight.
func (s *shard) unload(match func(string) bool) []chan struct{} {
	n := 0
	for id, g := range s.groups {
		if match(id) {
			g.unload(errNotCoordinator, CauseUnloaded)
			n++
		}
	}
	for id, parked := range s.loading {
		if !match(id) {
			continue
		}
		delete(s.loading, id)
		for _, p := range parked {
			p.fail(errNotCoordinator)
		}
	}
	for id := range s.known {
		if match(id) {
			delete(s.known, id)
		}
	}
	running := s.unloadOps(match)
	if n > 0 {
		s.e.log.Info("groupstate: groups unloaded", "shard", s.id, "groups", n, "store_calls_in_flight", len(running))
	}
	return running
}

// unloadClassic drops classic group g from the loop without writing
// anything: its parked JoinGroups and SyncGroups are answered code, its
// timers stopped, and the next request for its id loads it from the
// store. The completion of a write in flight finds it no longer live.
func (s *shard) unloadClassic(g *classicGroup, code int16, cause string) {
	g.cancelAllTimers()
	for _, p := range g.pending {
		stopTimer(p.timer)
	}
	for _, id := range g.order {
		m := g.members[id]
		if m.joinReply != nil {
			m.answerJoin(joinError(code, m.id))
		}
		if m.syncReply != nil {
			m.answerSync(syncError(code))
		}
	}
	g.awaitingJoin = 0
	g.savingSync = false
	if s.e.cfg.Events != nil {
		ev := g.event(EventGroupUnloaded)
		ev.Cause = cause
		ev.Members = g.membersList(false)
		s.emit(ev)
	}
	g.transitionTo(stateDead)
	s.drop(g.id, g)
	delete(s.known, g.id)
	s.unanchor(g.id)
	s.e.log.Debug("groupstate: group unloaded", "group", g.id, "generation", g.generation, "cause", cause)
}

// unloadConsumer drops KIP-848 group g from the loop without writing
// anything: heartbeats waiting for a write not yet started are answered
// code (those waiting for the write in flight get its result), its
// timers stopped, and the next request for its id loads it from the
// store.
func (s *shard) unloadConsumer(g *consumerGroup, code int16, cause string) {
	g.cancelAllTimers()
	g.failWaiters(code)
	if s.e.cfg.Events != nil {
		ev := g.event(EventGroupUnloaded)
		ev.Cause = cause
		ev.Members = g.membersList(false)
		s.emit(ev)
	}
	s.drop(g.id, g)
	delete(s.known, g.id)
	s.unanchor(g.id)
	s.e.log.Debug("groupstate: consumer group unloaded", "group", g.id, "epoch", g.epoch, "cause", cause)
}

// gate applies Config.Owns to a request for group on its loop: it
// answers NOT_COORDINATOR and reports false for a group the engine does
// not own. An empty group id that the API rejects as invalid is let
// through to get its own error.
func (e *Engine) gate(group string, req kmsg.Request, reply func(kmsg.Response)) bool {
	if group == "" && rejectsEmptyGroup(req) {
		return true
	}
	if e.owns(group) {
		return true
	}
	reply(errorResponse(req, errNotCoordinator))
	return false
}

// rejectsEmptyGroup reports whether req answers an empty group id with an
// error of its own before anything else, as Kafka's group coordinator
// service checks the group id before it looks for the group's owner.
func rejectsEmptyGroup(req kmsg.Request) bool {
	switch req.(type) {
	case *kmsg.JoinGroupRequest, *kmsg.SyncGroupRequest, *kmsg.HeartbeatRequest, *kmsg.LeaveGroupRequest,
		*kmsg.ConsumerGroupHeartbeatRequest:
		return true
	}
	return false
}
