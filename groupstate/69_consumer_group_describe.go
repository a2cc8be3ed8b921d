package groupstate

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ConsumerGroupDescribe (key 69), versions 0-1 (KIP-848).
//
//   - v0: groups with epochs, assignor and members with their current
//     and target assignments.
//   - v1: MemberType per member (1 = consumer; classic members inside a
//     consumer group, type 0, do not exist here: no online migration).
//
// A group the engine does not hold as a KIP-848 group answers
// GROUP_ID_NOT_FOUND, a group it does not own (Config.Owns)
// NOT_COORDINATOR. Authorized operations are not computed (kproxy has
// no ACLs): the field keeps its "not requested" value.

// consumerGroupDescribe fans a ConsumerGroupDescribe out to the loops.
func (e *Engine) consumerGroupDescribe(r *kmsg.ConsumerGroupDescribeRequest, reply func(kmsg.Response)) {
	ga := newGather(len(r.Groups), func(res []kmsg.ConsumerGroupDescribeResponseGroup) {
		resp := kmsg.NewPtrConsumerGroupDescribeResponse()
		resp.Groups = append(resp.Groups, res...)
		reply(resp)
	})
	for i, id := range r.Groups {
		s := e.shardFor(id)
		set := func(v kmsg.ConsumerGroupDescribeResponseGroup) { ga.set(i, v) }
		notFound := func(code int16) {
			dg := kmsg.NewConsumerGroupDescribeResponseGroup()
			dg.Group, dg.ErrorCode = id, code
			set(dg)
		}
		if !s.post(func() {
			if !e.owns(id) {
				notFound(errNotCoordinator)
				return
			}
			s.whenLoaded(id, func() { set(s.describeConsumerGroup(id, r.Version)) }, notFound)
		}) {
			notFound(errCoordinatorNotAvailable)
		}
	}
}

// describeConsumerGroup describes one group on its loop.
func (s *shard) describeConsumerGroup(id string, version int16) kmsg.ConsumerGroupDescribeResponseGroup {
	dg := kmsg.NewConsumerGroupDescribeResponseGroup()
	dg.Group = id
	g, ok := s.consumerGroups[id]
	if !ok {
		dg.ErrorCode = errGroupIDNotFound
		msg := "group " + id + " is not a consumer group"
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
