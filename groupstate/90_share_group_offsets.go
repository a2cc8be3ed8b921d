package groupstate

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/share"
)

// The share groups' offset APIs (KIP-932), what kafka-share-groups
// --describe (offsets), --reset-offsets and --delete-offsets send:
//
//   - DescribeShareGroupOffsets (key 90), v0: each share-partition's
//     start offset (SPSO), -1 for a partition with no share state; v1's
//     lag (KIP-1226) is not served, as it needs the log's end.
//   - AlterShareGroupOffsets (key 91), v0: moves the start of the given
//     partitions, creating the group when it does not exist; the group
//     must have no members (NON_EMPTY_GROUP).
//   - DeleteShareGroupOffsets (key 92), v0: forgets the share state of
//     the given topics (their next fetch starts at
//     share.auto.offset.reset); the group must have no members.
//
// Topics are named by name; the engine's topic cache gives their ids.

// describeShareGroupOffsets fans a DescribeShareGroupOffsets out to the
// loops.
func (e *Engine) describeShareGroupOffsets(r *kmsg.DescribeShareGroupOffsetsRequest, reply func(kmsg.Response)) {
	ga := newGather(len(r.Groups), func(res []kmsg.DescribeShareGroupOffsetsResponseGroup) {
		resp := kmsg.NewPtrDescribeShareGroupOffsetsResponse()
		resp.Groups = res
		reply(resp)
	})
	for i, rg := range r.Groups {
		s := e.shardFor(rg.GroupID)
		fail := func(code int16) {
			g := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
			g.GroupID, g.ErrorCode = rg.GroupID, code
			ga.set(i, g)
		}
		if !s.post(func() {
			if !e.owns(rg.GroupID) {
				fail(errNotCoordinator)
				return
			}
			s.whenLoaded(rg.GroupID, func() { ga.set(i, s.describeShareOffsets(rg)) }, fail)
		}) {
			fail(errCoordinatorNotAvailable)
		}
	}
}

// describeShareOffsets answers one group of a DescribeShareGroupOffsets.
func (s *shard) describeShareOffsets(rg kmsg.DescribeShareGroupOffsetsRequestGroup) kmsg.DescribeShareGroupOffsetsResponseGroup {
	out := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
	out.GroupID = rg.GroupID
	g, ok := s.shareOf(rg.GroupID)
	if !ok {
		msg := "Group " + rg.GroupID + " not found."
		if _, held := s.kindOf(rg.GroupID); held {
			msg = notKindText(rg.GroupID, KindShare)
		}
		out.ErrorCode, out.ErrorMessage = errGroupIDNotFound, &msg
		return out
	}
	topics := s.e.topicsNow()
	byName := map[string][]int32{}
	if rg.Topics == nil {
		for tp := range g.parts {
			if name, ok := topics.byID[tp.TopicID]; ok {
				byName[name] = append(byName[name], tp.Partition)
			}
		}
	} else {
		for _, t := range rg.Topics {
			byName[t.Topic] = append(byName[t.Topic], t.Partitions...)
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		t := kmsg.NewDescribeShareGroupOffsetsResponseGroupTopic()
		t.Topic = name
		info, known := topics.byName[name]
		t.TopicID = info.ID
		ps := byName[name]
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
		for _, p := range ps {
			rp := kmsg.NewDescribeShareGroupOffsetsResponseGroupTopicPartition()
			rp.Partition, rp.StartOffset, rp.LeaderEpoch, rp.Lag = p, -1, -1, -1
			if !known {
				rp.ErrorCode = errUnknownTopicOrPartition
			} else if sp := g.parts[ShareTP{TopicID: info.ID, Partition: p}]; sp != nil {
				rp.StartOffset = sp.StartOffset()
			}
			t.Partitions = append(t.Partitions, rp)
		}
		out.Topics = append(out.Topics, t)
	}
	return out
}

// alterShareGroupOffsets serves an AlterShareGroupOffsets on the loop.
func (s *shard) alterShareGroupOffsets(r *kmsg.AlterShareGroupOffsetsRequest, reply func(kmsg.Response)) {
	resp := kmsg.NewPtrAlterShareGroupOffsetsResponse()
	fail := func(code int16, msg string) {
		resp.ErrorCode = code
		if msg != "" {
			resp.ErrorMessage = &msg
		}
		reply(resp)
	}
	if kind, held := s.kindOf(r.GroupID); held && kind != KindShare {
		fail(errGroupIDNotFound, notKindText(r.GroupID, KindShare))
		return
	}
	g, ok := s.shareOf(r.GroupID)
	if ok && !g.g.Empty() {
		fail(errNonEmptyGroup, "")
		return
	}
	if !ok {
		g = newShareGroup(s, r.GroupID)
		s.groups[r.GroupID] = g
		s.emit(g.event(EventGroupCreated))
	}
	topics := s.e.topicsNow()
	for _, t := range r.Topics {
		rt := kmsg.NewAlterShareGroupOffsetsResponseTopic()
		rt.Topic = t.Topic
		info, known := topics.byName[t.Topic]
		rt.TopicID = info.ID
		for _, p := range t.Partitions {
			rp := kmsg.NewAlterShareGroupOffsetsResponseTopicPartition()
			rp.Partition = p.Partition
			switch {
			case !known || p.Partition < 0 || p.Partition >= info.Partitions:
				rp.ErrorCode = errUnknownTopicOrPartition
			case p.StartOffset < 0:
				rp.ErrorCode = errInvalidRequest
			default:
				tp := ShareTP{TopicID: info.ID, Partition: p.Partition}
				if sp := g.parts[tp]; sp != nil {
					sp.Reset(p.StartOffset)
				} else {
					g.parts[tp] = share.NewPartition(p.StartOffset)
				}
				g.markDirty()
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	g.markDirty()
	g.persistThen(func(code int16) {
		if code != errNone {
			fail(code, "")
			return
		}
		reply(resp)
	})
}

// deleteShareGroupOffsets serves a DeleteShareGroupOffsets on the loop.
func (s *shard) deleteShareGroupOffsets(r *kmsg.DeleteShareGroupOffsetsRequest, reply func(kmsg.Response)) {
	resp := kmsg.NewPtrDeleteShareGroupOffsetsResponse()
	fail := func(code int16, msg string) {
		resp.ErrorCode = code
		if msg != "" {
			resp.ErrorMessage = &msg
		}
		reply(resp)
	}
	g, ok := s.shareOf(r.GroupID)
	if !ok {
		msg := "Group " + r.GroupID + " not found."
		if _, held := s.kindOf(r.GroupID); held {
			msg = notKindText(r.GroupID, KindShare)
		}
		fail(errGroupIDNotFound, msg)
		return
	}
	if !g.g.Empty() {
		fail(errNonEmptyGroup, "")
		return
	}
	topics := s.e.topicsNow()
	for _, t := range r.Topics {
		rt := kmsg.NewDeleteShareGroupOffsetsResponseTopic()
		rt.Topic = t.Topic
		info, known := topics.byName[t.Topic]
		rt.TopicID = info.ID
		if !known {
			rt.ErrorCode = errUnknownTopicOrPartition
		}
		for tp := range g.parts {
			if known && tp.TopicID == info.ID {
				delete(g.parts, tp)
				g.markDirty()
			}
		}
		resp.Topics = append(resp.Topics, rt)
	}
	g.persistThen(func(code int16) {
		if code != errNone {
			fail(code, "")
			return
		}
		reply(resp)
	})
}
