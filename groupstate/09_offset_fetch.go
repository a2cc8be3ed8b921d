package groupstate

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// OffsetFetch (key 9), versions 0-10.
//
//   - v0-1: one group; errors only per partition.
//   - v2: top-level ErrorCode; Topics null means every committed
//     partition.
//   - v3: ThrottleMillis.
//   - v5: LeaderEpoch per partition.
//   - v6: flexible versions.
//   - v7: RequireStable (KIP-447): partitions with pending transactional
//     offsets answer UNSTABLE_OFFSET_COMMIT.
//   - v8: many groups per request, errors per group (KIP-709).
//   - v9: MemberID and MemberEpoch (KIP-848); for a classic group they are
//     checked like a commit's identity when given.
//   - v10: topics named by TopicID.
//
// Offsets are always read from the store, even for groups the engine does
// not hold (simple groups, or groups from before a restart): a group
// without offsets answers -1 for every requested partition. A group the
// engine does not own (Config.Owns) answers NOT_COORDINATOR, in its slot
// from v8.

// fetchTopic is one requested topic.
type fetchTopic struct {
	name       string
	id         [16]byte
	partitions []int32
}

// fetchGroup is one group's part of an OffsetFetch.
type fetchGroup struct {
	group    string
	memberID *string
	epoch    int32
	all      bool
	topics   []fetchTopic
}

// fetchResult is one group's answer.
type fetchResult struct {
	code   int16
	topics []kmsg.OffsetFetchResponseTopic
	ids    []([16]byte) // per topic, for v10
}

// offsetFetch fans an OffsetFetch out to the loops owning its groups.
func (e *Engine) offsetFetch(r *kmsg.OffsetFetchRequest, reply func(kmsg.Response)) {
	var parts []fetchGroup
	if r.Version < 8 {
		fg := fetchGroup{group: r.Group, epoch: -1, all: r.Topics == nil && r.Version >= 2}
		for _, t := range r.Topics {
			fg.topics = append(fg.topics, fetchTopic{name: t.Topic, partitions: t.Partitions})
		}
		parts = append(parts, fg)
	} else {
		for _, g := range r.Groups {
			fg := fetchGroup{group: g.Group, memberID: g.MemberID, epoch: g.MemberEpoch, all: g.Topics == nil}
			if r.Version < 9 {
				fg.memberID, fg.epoch = nil, -1
			}
			for _, t := range g.Topics {
				fg.topics = append(fg.topics, fetchTopic{name: t.Topic, id: t.TopicID, partitions: t.Partitions})
			}
			parts = append(parts, fg)
		}
	}
	v10 := r.Version >= 10
	ga := newGather(len(parts), func(res []fetchResult) { reply(buildFetchResponse(r, parts, res)) })
	for i, fg := range parts {
		s := e.shardFor(fg.group)
		set := func(v fetchResult) { ga.set(i, v) }
		if !s.post(func() {
			if !e.owns(fg.group) {
				set(fetchResult{code: errNotCoordinator})
				return
			}
			s.whenLoaded(fg.group, func() { s.fetchOffsets(fg, r.RequireStable, v10, set) },
				func(code int16) {
					// A group the cluster's coordinator serves (its
					// load refused): its offsets as the cluster has
					// them, as an admin reads them (the members'
					// own fetches are forwarded upstream).
					if refusedAsLive(e, fg.group, code) && e.goStore(func(ctx context.Context) {
						set(e.fetch(ctx, fg, r.RequireStable, v10))
					}) {
						return
					}
					set(fetchResult{code: code})
				})
		}) {
			set(fetchResult{code: errCoordinatorNotAvailable})
		}
	}
}

// fetchOffsets validates one group's fetch on its loop and queues the
// store read.
func (s *shard) fetchOffsets(fg fetchGroup, requireStable, v10 bool, set func(fetchResult)) {
	if consumer, ok := s.consumerOf(fg.group); ok {
		// KIP-848: no member id and a negative epoch fetch as an admin
		// would; otherwise the member's epoch must match exactly.
		if (fg.memberID != nil && *fg.memberID != "") || fg.epoch >= 0 {
			id := ""
			if fg.memberID != nil {
				id = *fg.memberID
			}
			m, ok := consumer.members[id]
			if !ok {
				set(fetchResult{code: errUnknownMemberID})
				return
			}
			if fg.epoch != m.Epoch {
				set(fetchResult{code: errStaleMemberEpoch})
				return
			}
		}
	} else if g, ok := s.classicOf(fg.group); ok && g.state != stateDead {
		if (fg.memberID != nil && *fg.memberID != "") || fg.epoch >= 0 {
			id := ""
			if fg.memberID != nil {
				id = *fg.memberID
			}
			if _, ok := g.members[id]; !ok {
				set(fetchResult{code: errUnknownMemberID})
				return
			}
			if fg.epoch != g.generation {
				set(fetchResult{code: errIllegalGeneration})
				return
			}
		}
	}
	e := s.e
	s.enqueue(fg.group, storeOp{
		abort: func(cause error) any { return fetchResult{code: storeErrorCode(cause)} },
		done:  func(v any) { set(v.(fetchResult)) },
		run: func(ctx context.Context) (any, func()) {
			return e.fetch(ctx, fg, requireStable, v10), nil
		},
	})
}

// fetch runs off the loop: resolves IDs and reads the store.
func (e *Engine) fetch(ctx context.Context, fg fetchGroup, requireStable, v10 bool) fetchResult {
	var req []kmsg.OffsetFetchRequestTopic
	var unresolved []fetchTopic
	names := e.namesFor(ctx, len(fg.topics), func(i int) (string, [16]byte) { return fg.topics[i].name, fg.topics[i].id })
	if !fg.all {
		req = make([]kmsg.OffsetFetchRequestTopic, 0, len(fg.topics))
		for i, t := range fg.topics {
			if names[i] == "" && t.id != ([16]byte{}) {
				unresolved = append(unresolved, t)
				continue
			}
			req = append(req, kmsg.OffsetFetchRequestTopic{Topic: names[i], Partitions: t.partitions})
		}
	}
	var topics []kmsg.OffsetFetchResponseTopic
	if fg.all || len(req) > 0 {
		var err error
		topics, err = e.cfg.Store.FetchOffsets(ctx, fg.group, req, requireStable)
		if err != nil {
			e.log.Warn("groupstate: fetching offsets failed", "group", fg.group, "err", err)
			return fetchResult{code: storeErrorCode(err)}
		}
	}
	res := fetchResult{topics: topics}
	if v10 {
		// Requested topics carry their own id.
		byName := make(map[string][16]byte)
		for i, t := range fg.topics {
			if names[i] != "" && t.id != ([16]byte{}) {
				byName[names[i]] = t.id
			}
		}
		var missing []string
		for _, t := range topics {
			if _, ok := byName[t.Topic]; !ok {
				missing = append(missing, t.Topic)
			}
		}
		for n, id := range e.resolveIDs(ctx, missing) {
			byName[n] = id
		}
		res.ids = make([][16]byte, len(topics))
		for i, t := range topics {
			res.ids[i] = byName[t.Topic]
		}
	}
	for _, t := range unresolved {
		rt := kmsg.NewOffsetFetchResponseTopic()
		for _, p := range t.partitions {
			rp := kmsg.NewOffsetFetchResponseTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch, rp.ErrorCode = p, -1, -1, errUnknownTopicID
			rt.Partitions = append(rt.Partitions, rp)
		}
		res.topics = append(res.topics, rt)
		res.ids = append(res.ids, t.id)
	}
	return res
}

// buildFetchResponse assembles the per-group results in the request's
// version shape.
func buildFetchResponse(r *kmsg.OffsetFetchRequest, parts []fetchGroup, res []fetchResult) *kmsg.OffsetFetchResponse {
	resp := kmsg.NewPtrOffsetFetchResponse()
	if r.Version < 8 {
		fr := res[0]
		if fr.code != errNone {
			if r.Version >= 2 {
				resp.ErrorCode = fr.code
				return resp
			}
			return errorResponse(r, fr.code).(*kmsg.OffsetFetchResponse)
		}
		resp.Topics = fr.topics
		return resp
	}
	for i, fg := range parts {
		fr := res[i]
		rg := kmsg.NewOffsetFetchResponseGroup()
		rg.Group = fg.group
		rg.ErrorCode = fr.code
		for ti, t := range fr.topics {
			gt := kmsg.NewOffsetFetchResponseGroupTopic()
			gt.Topic = t.Topic
			if ti < len(fr.ids) {
				gt.TopicID = fr.ids[ti]
			}
			for _, p := range t.Partitions {
				gp := kmsg.NewOffsetFetchResponseGroupTopicPartition()
				gp.Partition, gp.Offset, gp.LeaderEpoch, gp.Metadata, gp.ErrorCode = p.Partition, p.Offset, p.LeaderEpoch, p.Metadata, p.ErrorCode
				gt.Partitions = append(gt.Partitions, gp)
			}
			rg.Topics = append(rg.Topics, gt)
		}
		resp.Groups = append(resp.Groups, rg)
	}
	return resp
}
