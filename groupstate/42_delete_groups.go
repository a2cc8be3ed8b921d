package groupstate

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DeleteGroups (key 42), versions 0-3.
//
//   - v2: flexible versions.
//   - v3: ErrorMessage per group.
//
// A group with members answers NON_EMPTY_GROUP. An Empty group is
// forgotten by the engine and its offsets are deleted from the store; a
// group only the store knows (a simple group) has its offsets deleted; a
// group nobody knows answers GROUP_ID_NOT_FOUND; a group the engine does
// not own (Config.Owns), NOT_COORDINATOR.

// deleteGroups fans a DeleteGroups out to the loops owning its groups.
func (e *Engine) deleteGroups(r *kmsg.DeleteGroupsRequest, reply func(kmsg.Response)) {
	ga := newGather(len(r.Groups), func(res []int16) {
		resp := kmsg.NewPtrDeleteGroupsResponse()
		for i, id := range r.Groups {
			dg := kmsg.NewDeleteGroupsResponseGroup()
			dg.Group = id
			dg.ErrorCode = res[i]
			resp.Groups = append(resp.Groups, dg)
		}
		reply(resp)
	})
	for i, id := range r.Groups {
		s := e.shardFor(id)
		set := func(code int16) { ga.set(i, code) }
		if !s.post(func() {
			if !e.owns(id) {
				set(errNotCoordinator)
				return
			}
			s.whenLoaded(id, func() { s.deleteGroup(id, set) }, func(code int16) { set(code) })
		}) {
			set(errCoordinatorNotAvailable)
		}
	}
}

// deleteGroup deletes one group on its loop.
func (s *shard) deleteGroup(id string, set func(int16)) {
	inEngine := false
	if consumer, ok := s.consumerOf(id); ok {
		if len(consumer.members) > 0 {
			set(errNonEmptyGroup)
			return
		}
		inEngine = true
		consumer.cancelAllTimers()
		s.drop(id, consumer)
		s.unanchor(id)
		s.emit(consumer.event(EventGroupDeleted))
		s.tombstone(id)
	}
	if g, ok := s.shareOf(id); ok {
		if !g.g.Empty() {
			set(errNonEmptyGroup)
			return
		}
		// A share group's state (its share-partitions) lives in the
		// engine only; its id may also have offsets in the store.
		inEngine = true
		g.teardown()
		s.drop(id, g)
		s.emit(g.event(EventGroupDeleted))
		s.tombstone(id)
	}
	if g, ok := s.classicOf(id); ok {
		switch g.state {
		case stateDead:
			set(errGroupIDNotFound)
			return
		case stateEmpty:
		default:
			set(errNonEmptyGroup)
			return
		}
		inEngine = true
		g.cancelAllTimers()
		for _, p := range g.pending {
			stopTimer(p.timer)
		}
		g.transitionTo(stateDead)
		s.drop(id, g)
		s.unanchor(id)
		s.emit(g.event(EventGroupDeleted))
		if g.generation > 0 {
			s.tombstone(id)
		}
	}
	e := s.e
	s.enqueue(id, storeOp{
		abort: func(cause error) any { return storeErrorCode(cause) },
		done:  func(v any) { set(v.(int16)) },
		run: func(ctx context.Context) (any, func()) {
			err := e.cfg.Store.DeleteGroup(ctx, id)
			if err == nil {
				return errNone, nil
			}
			if errors.Is(err, kerr.GroupIDNotFound) {
				if inEngine {
					return errNone, nil // the group had no offsets
				}
				return errGroupIDNotFound, nil
			}
			e.log.Warn("groupstate: deleting group offsets failed", "group", id, "err", err)
			return storeErrorCode(err), nil
		},
	})
}
