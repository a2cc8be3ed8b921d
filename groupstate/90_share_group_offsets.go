package groupstate

import (
	"context"
	"sort"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/share"
)

// The share groups' offset APIs (KIP-932), what kafka-share-groups
// --describe (offsets), --reset-offsets and --delete-offsets send:
//
//   - DescribeShareGroupOffsets (key 90), v0-1: each share-partition's
//     start offset (SPSO), -1 for a partition with no share state; from
//     v1 its lag (KIP-1226): the records from the SPSO to the log's end
//     not yet delivered to completion, end - SPSO - (acknowledged and
//     archived records in flight), the end asked of the store
//     (EndOffsetStore) after the loops answered; -1 where a term is
//     unknown.
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
	ga := newGather(len(r.Groups), func(res []describedShareOffsets) {
		resp := kmsg.NewPtrDescribeShareGroupOffsetsResponse()
		for _, d := range res {
			resp.Groups = append(resp.Groups, d.group)
		}
		ends, ok := e.cfg.Store.(EndOffsetStore)
		if r.Version < 1 || !ok {
			reply(resp)
			return
		}
		// The loops are done with it; the store call runs on a
		// goroutine of its own, as every store call leaves the loops.
		go func() {
			e.fillShareLag(ends, res, resp)
			reply(resp)
		}()
	})
	for i, rg := range r.Groups {
		s := e.shardFor(rg.GroupID)
		fail := func(code int16) {
			g := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
			g.GroupID, g.ErrorCode = rg.GroupID, code
			ga.set(i, describedShareOffsets{group: g})
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

// describedShareOffsets is one group's answer as its loop made it, with
// what the lag needs besides the log's end: per topic and partition,
// the records in flight that were delivered to completion (acknowledged
// or archived; Kafka's deliveryCompleteCount).
type describedShareOffsets struct {
	group    kmsg.DescribeShareGroupOffsetsResponseGroup
	complete map[string]map[int32]int64
}

// fillShareLag sets the lag of every partition with share state in
// resp, whose groups are res's, from the store's end offsets. A
// failed store call leaves every lag at -1 (unknown), as Kafka answers
// when it cannot read the log's end.
func (e *Engine) fillShareLag(ends EndOffsetStore, res []describedShareOffsets, resp *kmsg.DescribeShareGroupOffsetsResponse) {
	want := map[string][]int32{}
	for _, d := range res {
		for name, ps := range d.complete {
			for p := range ps {
				want[name] = append(want[name], p)
			}
		}
	}
	if len(want) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StoreTimeout)
	defer cancel()
	end, err := ends.EndOffsets(ctx, want)
	if err != nil {
		e.log.Debug("groupstate: share group lag unknown: the log ends could not be read", "err", err)
		return
	}
	for i := range resp.Groups {
		complete := res[i].complete
		for j := range resp.Groups[i].Topics {
			t := &resp.Groups[i].Topics[j]
			for k := range t.Partitions {
				rp := &t.Partitions[k]
				done, held := complete[t.Topic][rp.Partition]
				o, known := end[t.Topic][rp.Partition]
				if held && known && rp.StartOffset >= 0 {
					rp.Lag = max(o-rp.StartOffset-done, 0)
				}
			}
		}
	}
}

// describeShareOffsets answers one group of a DescribeShareGroupOffsets.
func (s *shard) describeShareOffsets(rg kmsg.DescribeShareGroupOffsetsRequestGroup) describedShareOffsets {
	out := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
	out.GroupID = rg.GroupID
	g, ok := s.shareOf(rg.GroupID)
	if !ok {
		msg := "Group " + rg.GroupID + " not found."
		if _, held := s.kindOf(rg.GroupID); held {
			msg = notKindText(rg.GroupID, KindShare)
		}
		out.ErrorCode, out.ErrorMessage = errGroupIDNotFound, &msg
		return describedShareOffsets{group: out}
	}
	complete := map[string]map[int32]int64{}
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
				st := sp.Stats()
				if complete[name] == nil {
					complete[name] = map[int32]int64{}
				}
				complete[name][p] = st.Acknowledged + st.Archived
			}
			t.Partitions = append(t.Partitions, rp)
		}
		out.Topics = append(out.Topics, t)
	}
	return describedShareOffsets{group: out, complete: complete}
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
