package groupstate

import (
	"context"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// ConsumerGroupDescribe (key 69), versions 0-1 (KIP-848).
//
//   - v0: groups with epochs, assignor and members with their current
//     and target assignments.
//   - v1: MemberType per member (1 = consumer; classic members inside a
//     consumer group, type 0, do not exist here: no online migration).
//
// A group the engine holds as a classic group answers GROUP_ID_NOT_FOUND
// "Group <id> is not a consumer group.", a group that does not exist
// GROUP_ID_NOT_FOUND "Group <id> not found." (the texts of Kafka's
// GroupMetadataManager), a group it does not own (Config.Owns)
// NOT_COORDINATOR. Authorized operations are not computed
// for the engine's groups (kproxy has no ACLs): the field keeps its "not
// requested" value.
//
// A group the engine owns but does not hold at all (neither a classic
// nor a KIP-848 group once loaded, or refused at its load because the
// cluster's coordinator serves it) is described as the cluster describes
// it when the engine has Config.ClusterGroups, entry as it is (a KIP-848
// group live on the brokers shows its members and assignments); without
// it, such a group answers GROUP_ID_NOT_FOUND.

// cgDescribed is one group's part of a ConsumerGroupDescribe: the
// engine's answer, and whether the cluster is to answer instead.
type cgDescribed struct {
	dg      kmsg.ConsumerGroupDescribeResponseGroup
	cluster bool
}

// consumerGroupDescribe fans a ConsumerGroupDescribe out to the loops.
func (e *Engine) consumerGroupDescribe(r *kmsg.ConsumerGroupDescribeRequest, reply func(kmsg.Response)) {
	cg := e.cfg.ClusterGroups
	ga := newGather(len(r.Groups), func(res []cgDescribed) {
		resp := kmsg.NewPtrConsumerGroupDescribeResponse()
		var missing []int
		for i, p := range res {
			resp.Groups = append(resp.Groups, p.dg)
			if p.cluster {
				missing = append(missing, i)
			}
		}
		if len(missing) == 0 {
			reply(resp)
			return
		}
		e.consumerDescribeOnCluster(cg, r, resp, missing, reply)
	})
	for i, id := range r.Groups {
		s := e.shardFor(id)
		set := func(v kmsg.ConsumerGroupDescribeResponseGroup) { ga.set(i, cgDescribed{dg: v}) }
		notFound := func(code int16) {
			// (Possibly off the loop: only the group id is read.)
			dg := kmsg.NewConsumerGroupDescribeResponseGroup()
			dg.Group, dg.ErrorCode = id, code
			if cg != nil && refusedAsLive(e, id, code) {
				ga.set(i, cgDescribed{dg: dg, cluster: true})
				return
			}
			set(dg)
		}
		if !s.post(func() {
			if !e.owns(id) {
				notFound(errNotCoordinator)
				return
			}
			s.whenLoaded(id, func() {
				ga.set(i, cgDescribed{dg: s.describeConsumerGroup(id, r.Version), cluster: cg != nil && !s.holds(id)})
			}, notFound)
		}) {
			notFound(errCoordinatorNotAvailable)
		}
	}
}

// consumerDescribeOnCluster replaces the slots missing of resp (groups
// the engine owns and does not hold) with the cluster's descriptions,
// then replies. The cluster's entries need no version shaping: v1 only
// adds MemberType, which encoding leaves out of v0.
func (e *Engine) consumerDescribeOnCluster(cg ClusterGroups, r *kmsg.ConsumerGroupDescribeRequest, resp *kmsg.ConsumerGroupDescribeResponse, missing []int, reply func(kmsg.Response)) {
	fromCluster(e, resp.Groups, missing, "consumer groups",
		func(g kmsg.ConsumerGroupDescribeResponseGroup) string { return g.Group },
		func(id string, code int16) kmsg.ConsumerGroupDescribeResponseGroup {
			g := kmsg.NewConsumerGroupDescribeResponseGroup()
			g.Group, g.ErrorCode = id, code
			return g
		},
		func(g kmsg.ConsumerGroupDescribeResponseGroup) kmsg.ConsumerGroupDescribeResponseGroup { return g },
		func(ctx context.Context, ids []string) ([]kmsg.ConsumerGroupDescribeResponseGroup, error) {
			return cg.DescribeClusterConsumerGroups(ctx, ids, r.IncludeAuthorizedOperations)
		},
		func() { reply(resp) })
}

// describeConsumerGroup describes one group on its loop.
func (s *shard) describeConsumerGroup(id string, version int16) kmsg.ConsumerGroupDescribeResponseGroup {
	dg := kmsg.NewConsumerGroupDescribeResponseGroup()
	dg.Group = id
	g, ok := s.consumerOf(id)
	if !ok {
		// Kafka's texts (GroupMetadataManager.group and consumerGroup):
		// a group that does not exist is not found; "not a consumer
		// group" is kept for a group of another type.
		dg.ErrorCode = errGroupIDNotFound
		msg := "Group " + id + " not found."
		if _, held := s.kindOf(id); held {
			msg = notKindText(id, KindConsumer)
		}
		dg.ErrorMessage = &msg
		return dg
	}
	dg.State, dg.Epoch, dg.AssignmentEpoch, dg.AssignorName = g.stateName(), g.epoch, g.assignmentEpoch, g.assignor
	if dg.AssignorName == "" {
		dg.AssignorName = g.preferredAssignor()
	}
	snap := s.e.topicsNow()
	for _, mid := range g.sortedIDs() {
		m := g.members[mid]
		dm := kmsg.NewConsumerGroupDescribeResponseGroupMember()
		dm.MemberID, dm.MemberEpoch, dm.ClientID, dm.ClientHost = m.id, m.Epoch, m.clientID, m.clientHost
		if m.instanceID != "" {
			inst := m.instanceID
			dm.InstanceID = &inst
		}
		if m.rackID != "" {
			rack := m.rackID
			dm.RackID = &rack
		}
		dm.SubscribedTopics = append([]string{}, m.subscribedNames...)
		if m.regex != "" {
			re := m.regex
			dm.SubscribedTopicRegex = &re
		}
		current := m.Assigned.clone()
		for t, ps := range m.Pending {
			for p := range ps {
				current.add(t, p)
			}
		}
		dm.Assignment = describeAssignment(current, snap)
		dm.TargetAssignment = describeAssignment(g.targets[m.id], snap)
		if version >= 1 {
			// v1 (KIP-1099): 0 for a classic member of an upgraded
			// group, 1 for a KIP-848 member.
			dm.MemberType = 1
			if m.classic != nil {
				dm.MemberType = 0
			}
		}
		dg.Members = append(dg.Members, dm)
	}
	return dg
}

// describeAssignment converts a partition set, naming topics the cache
// knows.
func describeAssignment(ps partSet, snap *topicSnapshot) kmsg.Assignment {
	var a kmsg.Assignment
	for _, t := range ps.sortedTopics() {
		at := kmsg.AssignmentTopicPartition{TopicID: t, Topic: snap.byID[t], Partitions: ps.sortedPartitions(t)}
		a.TopicPartitions = append(a.TopicPartitions, at)
	}
	return a
}
