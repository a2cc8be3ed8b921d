package groupstate

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TxnOffsetCommit (key 28), versions 0-6.
//
//   - v2: LeaderEpoch per partition.
//   - v3: Generation, MemberID, InstanceID (KIP-447) and flexible
//     versions; identity is checked only when given.
//   - v6: topics named by TopicID.
//
// The engine validates the group side; the store forwards the offsets to
// the transaction's real group coordinator with the identity fields
// cleared, so that they become visible when the transaction commits.

// txnOffsetCommit serves a TxnOffsetCommit on the owning loop.
func (s *shard) txnOffsetCommit(r *kmsg.TxnOffsetCommitRequest, reply func(kmsg.Response)) {
	gen, memberID, instanceID := r.Generation, r.MemberID, r.InstanceID
	if r.Version < 3 {
		gen, memberID, instanceID = -1, "", nil
	}
	fail := func(code int16) kmsg.Response { return errorResponse(r, code) }
	var owned map[string]map[int32]struct{}
	if consumer, ok := s.consumerOf(r.Group); ok {
		code, o, _ := consumer.validateCommit(r.Version, gen, memberID, true)
		if code != errNone {
			reply(fail(code))
			return
		}
		owned = o
	} else if g, ok := s.classicOf(r.Group); !ok {
		if gen >= 0 {
			reply(fail(errIllegalGeneration))
			return
		}
	} else {
		code, m := g.validateCommit(gen, memberID, instanceID, true)
		if code != errNone {
			reply(fail(code))
			return
		}
		if m != nil {
			owned = m.owned
		}
	}
	fwd := kmsg.NewPtrTxnOffsetCommitRequest()
	fwd.Version = r.Version
	fwd.TransactionalID = r.TransactionalID
	fwd.Group = r.Group
	fwd.ProducerID = r.ProducerID
	fwd.ProducerEpoch = r.ProducerEpoch
	fwd.Generation, fwd.MemberID, fwd.InstanceID = -1, "", nil
	for _, t := range r.Topics {
		fwd.Topics = append(fwd.Topics, kmsg.TxnOffsetCommitRequestTopic{Topic: t.Topic, TopicID: t.TopicID, Partitions: append([]kmsg.TxnOffsetCommitRequestTopicPartition(nil), t.Partitions...)})
	}
	e := s.e
	s.enqueue(r.Group, storeOp{
		abort: func(cause error) any { return fail(storeErrorCode(cause)) },
		done:  func(res any) { reply(res.(kmsg.Response)) },
		run: func(ctx context.Context) (any, func()) {
			return e.txnCommit(ctx, fwd, owned), nil
		},
	})
}

// txnCommit runs off the loop: resolves IDs, checks metadata size and
// ownership, and forwards what passed to the store.
func (e *Engine) txnCommit(ctx context.Context, req *kmsg.TxnOffsetCommitRequest, owned map[string]map[int32]struct{}) *kmsg.TxnOffsetCommitResponse {
	names := e.namesFor(ctx, len(req.Topics), func(i int) (string, [16]byte) { return req.Topics[i].Topic, req.Topics[i].TopicID })
	f, keep := filterCommit(req.Topics, names, owned, errIllegalGeneration,
		func(t kmsg.TxnOffsetCommitRequestTopic) ([16]byte, []kmsg.TxnOffsetCommitRequestTopicPartition) {
			return t.TopicID, t.Partitions
		},
		func(p kmsg.TxnOffsetCommitRequestTopicPartition) (int32, *string) { return p.Partition, p.Metadata })
	fwd := *req
	fwd.Topics = nil
	for ti, ps := range keep {
		if len(ps) > 0 {
			fwd.Topics = append(fwd.Topics, kmsg.TxnOffsetCommitRequestTopic{Topic: names[ti], TopicID: req.Topics[ti].TopicID, Partitions: ps})
		}
	}
	if len(fwd.Topics) > 0 {
		res, err := e.cfg.Store.TxnCommitOffsets(ctx, &fwd)
		if err != nil {
			e.log.Warn("groupstate: storing transactional offsets failed", "group", req.Group, "err", err)
		} else {
			for _, t := range res.Topics {
				for _, p := range t.Partitions {
					f.answer(t.Topic, p.Partition, p.ErrorCode)
				}
			}
		}
		f.unanswered(err)
	}
	resp := kmsg.NewPtrTxnOffsetCommitResponse()
	for ti, t := range req.Topics {
		rt := kmsg.TxnOffsetCommitResponseTopic{Topic: t.Topic, TopicID: t.TopicID}
		for pi, p := range t.Partitions {
			rt.Partitions = append(rt.Partitions, kmsg.TxnOffsetCommitResponseTopicPartition{Partition: p.Partition, ErrorCode: f.codes[ti][pi]})
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}
