package groupstate

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// OffsetDelete (key 47), version 0 (KIP-496).
//
// A group with members whose protocol type is not "consumer" answers
// NON_EMPTY_GROUP (its subscriptions cannot be known). For a consumer
// group, partitions of topics its members subscribe to answer
// GROUP_SUBSCRIBED_TO_TOPIC; the rest are deleted from the store. A group
// the engine does not hold is passed to the store, which answers
// GROUP_ID_NOT_FOUND if it has no offsets for it.

// offsetDelete serves an OffsetDelete on the owning loop.
func (s *shard) offsetDelete(r *kmsg.OffsetDeleteRequest, reply func(kmsg.Response)) {
	var subscribed func(topic string) bool
	if consumer, ok := s.consumerOf(r.Group); ok {
		subscribed = consumer.subscribed
	} else if g, ok := s.classicOf(r.Group); ok {
		if g.state == stateDead {
			reply(errorResponse(r, errGroupIDNotFound))
			return
		}
		if g.state != stateEmpty {
			if g.protocolType != "consumer" {
				reply(errorResponse(r, errNonEmptyGroup))
				return
			}
			subscribed = g.subscriptions()
		}
	}
	resp := kmsg.NewPtrOffsetDeleteResponse()
	var toDelete []kmsg.OffsetDeleteRequestTopic
	type loc struct{ t, p int }
	where := make(map[string]map[int32]loc)
	for ti, t := range r.Topics {
		rt := kmsg.NewOffsetDeleteResponseTopic()
		rt.Topic = t.Topic
		sub := subscribed != nil && subscribed(t.Topic)
		for pi, p := range t.Partitions {
			rp := kmsg.NewOffsetDeleteResponseTopicPartition()
			rp.Partition = p.Partition
			if sub {
				rp.ErrorCode = errGroupSubscribedToTopic
			} else {
				if where[t.Topic] == nil {
					where[t.Topic] = make(map[int32]loc)
				}
				where[t.Topic][p.Partition] = loc{ti, pi}
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		if !sub {
			toDelete = append(toDelete, kmsg.OffsetDeleteRequestTopic{Topic: t.Topic, Partitions: append([]kmsg.OffsetDeleteRequestTopicPartition(nil), t.Partitions...)})
		}
		resp.Topics = append(resp.Topics, rt)
	}
	if len(toDelete) == 0 {
		reply(resp)
		return
	}
	e := s.e
	group := r.Group
	s.enqueue(group, storeOp{
		abort: func(cause error) any { return errorResponse(r, storeErrorCode(cause)) },
		done:  func(res any) { reply(res.(kmsg.Response)) },
		run: func(ctx context.Context) (any, func()) {
			res, err := e.cfg.Store.DeleteOffsets(ctx, group, toDelete)
			if err != nil {
				code := storeErrorCode(err)
				if code != errGroupIDNotFound {
					e.log.Warn("groupstate: deleting offsets failed", "group", group, "err", err)
				}
				out := kmsg.NewPtrOffsetDeleteResponse()
				out.ErrorCode = code
				return out, nil
			}
			for _, t := range res {
				for _, p := range t.Partitions {
					if l, ok := where[t.Topic][p.Partition]; ok {
						resp.Topics[l.t].Partitions[l.p].ErrorCode = p.ErrorCode
					}
				}
			}
			return resp, nil
		},
	})
}

// subscriptions returns the topic test for a non-empty consumer group:
// the union of the topics in its members' consumer metadata for the
// selected protocol (every protocol before one is selected). Metadata that
// does not parse means the group may read anything.
func (g *classicGroup) subscriptions() func(string) bool {
	topics := make(map[string]bool)
	for _, m := range g.members {
		for _, p := range m.protocols {
			if g.protocol != "" && p.Name != g.protocol {
				continue
			}
			var meta kmsg.ConsumerMemberMetadata
			if err := meta.ReadFrom(p.Metadata); err != nil {
				return func(string) bool { return true }
			}
			for _, t := range meta.Topics {
				topics[t] = true
			}
		}
	}
	return func(t string) bool { return topics[t] }
}
