package groupstate

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// OffsetCommit (key 8), versions 0-10.
//
//   - v0: no generation or member id: a simple commit.
//   - v1: Generation, MemberID; per-partition Timestamp (v1 only).
//   - v2-4: RetentionTimeMillis (v5 removes it); the store applies its
//     own retention, so it is accepted and ignored.
//   - v3: ThrottleMillis in the response.
//   - v6: LeaderEpoch per partition.
//   - v7: InstanceID (KIP-345).
//   - v8: flexible versions.
//   - v9: first version for KIP-848 members; a commit to a missing group
//     with a generation is GROUP_ID_NOT_FOUND instead of
//     ILLEGAL_GENERATION.
//   - v10: topics named by TopicID.
//
// KIP-848 groups (consumerGroup.validateCommit): the generation is the member
// epoch; a KIP-848 member below v9 gets UNSUPPORTED_VERSION, a newer epoch
// STALE_MEMBER_EPOCH, an older one is checked per partition (KIP-1251).
//
// The commit is validated on the loop (member, generation, state) and
// stored off the loop, beside the group's other commits of other
// partitions (storeops.go); the client is answered only after the store
// returned.

// maxOffsetMetadata is offset.metadata.max.bytes.
const maxOffsetMetadata = 4096

// offsetCommit serves an OffsetCommit on the owning loop.
func (s *shard) offsetCommit(r *kmsg.OffsetCommitRequest, reply func(kmsg.Response)) {
	gen, memberID, instanceID := r.Generation, r.MemberID, r.InstanceID
	if r.Version == 0 {
		gen, memberID, instanceID = -1, "", nil
	}
	var owned map[string]map[int32]struct{}
	notOwned := errIllegalGeneration
	g, ok := s.classicOf(r.Group)
	if consumer, isConsumer := s.consumerOf(r.Group); isConsumer {
		code, o, no := consumer.validateCommit(r.Version, gen, memberID, false)
		if code != errNone {
			reply(commitError(r, code))
			return
		}
		owned, notOwned = o, no
	} else if !ok {
		if gen >= 0 {
			code := errIllegalGeneration
			if r.Version >= 9 {
				code = errGroupIDNotFound
			}
			reply(commitError(r, code))
			return
		}
	} else {
		code, m := g.validateCommit(gen, memberID, instanceID, false)
		if code != errNone {
			reply(commitError(r, code))
			return
		}
		if m != nil {
			owned = m.owned
			if g.state == stateStable || g.state == statePreparingRebalance {
				g.rearmSession(m)
			}
		}
	}
	topics := make([]kmsg.OffsetCommitRequestTopic, len(r.Topics))
	for i, t := range r.Topics {
		topics[i] = kmsg.OffsetCommitRequestTopic{Topic: t.Topic, TopicID: t.TopicID, Partitions: append([]kmsg.OffsetCommitRequestTopicPartition(nil), t.Partitions...)}
	}
	groupID := r.Group
	e := s.e
	s.enqueue(groupID, storeOp{
		commitKeys: commitKeysOf(topics),
		abort:      func(cause error) any { return commitError(r, storeErrorCode(cause)) },
		done:       func(res any) { reply(res.(kmsg.Response)) },
		run: func(ctx context.Context) (any, func()) {
			resp, stored := e.commit(ctx, groupID, topics, owned, notOwned)
			return resp, func() { s.emitCommitted(groupID, stored) }
		},
	})
}

// validateCommit applies Kafka's offset-commit validation to a classic
// group and returns the committing member when identity was given.
func (g *classicGroup) validateCommit(gen int32, memberID string, instanceID *string, txn bool) (int16, *classicMember) {
	if g.state == stateDead {
		return errCoordinatorNotAvailable, nil
	}
	if gen < 0 && g.state == stateEmpty {
		return errNone, nil
	}
	var m *classicMember
	if gen >= 0 || memberID != "" || instanceID != nil {
		if code := g.validateMember(memberID, instanceID); code != errNone {
			return code, nil
		}
		if gen != g.generation {
			return errIllegalGeneration, nil
		}
		m = g.members[memberID]
	} else if !txn && g.state != stateEmpty {
		return errUnknownMemberID, nil
	}
	if !txn && g.state == stateCompletingRebalance {
		return errRebalanceInProgress, nil
	}
	return errNone, m
}

// emitCommitted emits EventOffsetsCommitted for n stored partitions.
func (s *shard) emitCommitted(groupID string, n int) {
	if n == 0 || s.e.cfg.Events == nil {
		return
	}
	var ev Event
	if g, ok := s.classicOf(groupID); ok {
		ev = g.event(EventOffsetsCommitted)
	} else if consumer, ok := s.consumerOf(groupID); ok {
		ev = consumer.event(EventOffsetsCommitted)
	} else {
		ev = Event{Time: s.e.clock.Now(), Kind: EventOffsetsCommitted, Group: groupID, Generation: -1, State: stateEmpty.String()}
	}
	ev.Offsets = n
	s.emit(ev)
}

// commit runs off the loop: it resolves topic IDs, applies the per
// partition checks (metadata size, ownership), stores what passed and
// returns the response and the number of partitions stored.
//
// A partition outside owned (when owned is non-nil) answers notOwned.
func (e *Engine) commit(ctx context.Context, group string, topics []kmsg.OffsetCommitRequestTopic, owned map[string]map[int32]struct{}, notOwned int16) (*kmsg.OffsetCommitResponse, int) {
	names := e.namesFor(ctx, len(topics), func(i int) (string, [16]byte) { return topics[i].Topic, topics[i].TopicID })
	f, keep := filterCommit(topics, names, owned, notOwned,
		func(t kmsg.OffsetCommitRequestTopic) ([16]byte, []kmsg.OffsetCommitRequestTopicPartition) {
			return t.TopicID, t.Partitions
		},
		func(p kmsg.OffsetCommitRequestTopicPartition) (int32, *string) { return p.Partition, p.Metadata })
	var toStore []kmsg.OffsetCommitRequestTopic
	for ti, ps := range keep {
		if len(ps) > 0 {
			toStore = append(toStore, kmsg.OffsetCommitRequestTopic{Topic: names[ti], TopicID: topics[ti].TopicID, Partitions: ps})
		}
	}
	stored := 0
	if len(toStore) > 0 {
		res, err := e.cfg.Store.CommitOffsets(ctx, group, toStore)
		if err != nil {
			e.log.Warn("groupstate: storing offsets failed", "group", group, "err", err)
		} else {
			for _, t := range res {
				for _, p := range t.Partitions {
					if f.answer(t.Topic, p.Partition, p.ErrorCode) && p.ErrorCode == errNone {
						stored++
					}
				}
			}
		}
		f.unanswered(err)
	}
	resp := kmsg.NewPtrOffsetCommitResponse()
	for ti, t := range topics {
		rt := kmsg.OffsetCommitResponseTopic{Topic: t.Topic, TopicID: t.TopicID}
		for pi, p := range t.Partitions {
			rt.Partitions = append(rt.Partitions, kmsg.OffsetCommitResponseTopicPartition{Partition: p.Partition, ErrorCode: f.codes[ti][pi]})
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp, stored
}

// commitLoc is where a partition stands in a commit request and in its
// response: its topic's index and its own index within that topic.
type commitLoc struct{ t, p int }

// commitFilter is the partition filter of OffsetCommit and
// TxnOffsetCommit. Every partition of the request gets an answer: the
// code partitionCommitError refuses it with, or, for one kept for the
// store, the store's. It is owned by the commit that made it (one store
// goroutine) and never shared.
type commitFilter struct {
	codes [][]int16                      // codes[t][p]: the answer to partition p of request topic t
	kept  map[string]map[int32]commitLoc // the partitions kept, by resolved topic name
	heard map[commitLoc]bool             // the kept partitions the store answered
}

// filterCommit runs the filter over a request's topics, whose resolved
// names are names (namesFor); parts gives a topic's ID and partitions, at
// a partition's number and metadata. It returns the filter and, per
// topic, the partitions kept for the store.
func filterCommit[T, P any](topics []T, names []string, owned map[string]map[int32]struct{}, notOwned int16, parts func(T) ([16]byte, []P), at func(P) (int32, *string)) (*commitFilter, [][]P) {
	f := &commitFilter{codes: make([][]int16, len(topics)), kept: make(map[string]map[int32]commitLoc), heard: make(map[commitLoc]bool)}
	keep := make([][]P, len(topics))
	for ti, t := range topics {
		id, ps := parts(t)
		name := names[ti]
		f.codes[ti] = make([]int16, len(ps))
		for pi, p := range ps {
			partition, metadata := at(p)
			if f.codes[ti][pi] = partitionCommitError(name, id, partition, metadata, owned, notOwned); f.codes[ti][pi] != errNone {
				continue
			}
			keep[ti] = append(keep[ti], p)
			if f.kept[name] == nil {
				f.kept[name] = make(map[int32]commitLoc)
			}
			f.kept[name][partition] = commitLoc{ti, pi}
		}
	}
	return f, keep
}

// answer sets the store's code for topic/partition and reports whether
// that is a partition the filter kept.
func (f *commitFilter) answer(topic string, partition int32, code int16) bool {
	l, ok := f.kept[topic][partition]
	if ok {
		f.codes[l.t][l.p] = code
		f.heard[l] = true
	}
	return ok
}

// unanswered answers every kept partition the store did not: with the
// code of err, the store's failure, or, when the store succeeded without
// a word on it, UNKNOWN_SERVER_ERROR, so that no durability is claimed.
func (f *commitFilter) unanswered(err error) {
	code := errUnknownServer
	if err != nil {
		code = storeErrorCode(err)
	}
	for _, locs := range f.kept {
		for _, l := range locs {
			if !f.heard[l] {
				f.codes[l.t][l.p] = code
			}
		}
	}
}

// ownsPartition reports whether owned holds topic/partition.
func ownsPartition(owned map[string]map[int32]struct{}, topic string, partition int32) bool {
	_, ok := owned[topic][partition]
	return ok
}

// namesFor returns the topic name for each of n topics, resolving IDs of
// topics that carry no name; "" marks an unresolvable topic.
func (e *Engine) namesFor(ctx context.Context, n int, at func(int) (string, [16]byte)) []string {
	names := make([]string, n)
	var ids [][16]byte
	for i := range n {
		name, id := at(i)
		names[i] = name
		if name == "" && id != ([16]byte{}) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return names
	}
	resolved := e.resolveNames(ctx, ids)
	for i := range n {
		if names[i] == "" {
			_, id := at(i)
			names[i] = resolved[id]
		}
	}
	return names
}

// validateCommit applies the KIP-848 offset-commit rules to a
// consumer group. It returns the partitions the member may commit (nil:
// not checked) and the code for the others. At the member's epoch the
// partitions are checked only with Config.CheckCommitOwnership; at an
// older epoch (KIP-1251: a commit sent before the member's epoch moved on)
// only partitions the member still holds, assigned at or before that
// epoch, are accepted, the rest answer STALE_MEMBER_EPOCH. txn applies the
// TxnOffsetCommit variant: identity only checked when given, and an epoch
// mismatch is ILLEGAL_GENERATION.
func (g *consumerGroup) validateCommit(version int16, epoch int32, memberID string, txn bool) (int16, map[string]map[int32]struct{}, int16) {
	if epoch < 0 && (len(g.members) == 0 || txn && memberID == "") {
		return errNone, nil, errNone
	}
	m, ok := g.members[memberID]
	if !ok {
		return errUnknownMemberID, nil, errNone
	}
	if m.classic != nil && !txn {
		// A classic member of an upgraded group commits with its
		// generation (its member epoch) at any version; a mismatch
		// is ILLEGAL_GENERATION (Kafka's ConsumerGroup.validateOffsetCommit).
		if epoch != m.Epoch {
			return errIllegalGeneration, nil, errNone
		}
		if !g.s.e.cfg.CheckCommitOwnership {
			return errNone, nil, errNone
		}
		return errNone, g.ownedNames(m, m.Epoch), errIllegalGeneration
	}
	if !txn && version < 9 {
		return errUnsupportedVersion, nil, errNone
	}
	switch {
	case epoch == m.Epoch:
		if !g.s.e.cfg.CheckCommitOwnership {
			return errNone, nil, errNone
		}
		return errNone, g.ownedNames(m, m.Epoch), errIllegalGeneration
	case txn:
		return errIllegalGeneration, nil, errNone
	case epoch > m.Epoch || epoch < 0:
		return errStaleMemberEpoch, nil, errNone
	}
	return errNone, g.ownedNames(m, epoch), errStaleMemberEpoch
}

// ownedNames returns, by topic name, the partitions m holds (assigned or
// pending revocation) that were assigned to it at or before epoch.
func (g *consumerGroup) ownedNames(m *consumerMember, epoch int32) map[string]map[int32]struct{} {
	snap := g.s.e.topicsNow()
	owned := make(map[string]map[int32]struct{})
	for _, ps := range []partSet{m.Assigned, m.Pending} {
		for t, parts := range ps {
			name, ok := snap.byID[t]
			if !ok {
				continue
			}
			for p := range parts {
				if m.partEpochs[tp{t, p}] > epoch {
					continue
				}
				if owned[name] == nil {
					owned[name] = make(map[int32]struct{})
				}
				owned[name][p] = struct{}{}
			}
		}
	}
	return owned
}

// partitionCommitError is the error, if any, that one partition of an
// offset commit (plain or transactional) gets before anything is stored:
// an unknown topic, metadata over the limit, or (with the ownership check
// on) a partition the member does not own, which gets notOwned.
func partitionCommitError(name string, topicID [16]byte, partition int32, metadata *string, owned map[string]map[int32]struct{}, notOwned int16) int16 {
	switch {
	case name == "" && topicID == [16]byte{}:
		return errUnknownTopicOrPartition
	case name == "":
		return errUnknownTopicID
	case metadata != nil && len(*metadata) > maxOffsetMetadata:
		return errOffsetMetadataTooLarge
	case owned != nil && !ownsPartition(owned, name, partition):
		return notOwned
	}
	return errNone
}
