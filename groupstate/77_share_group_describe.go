package groupstate

import "github.com/twmb/franz-go/pkg/kmsg"

// ShareGroupDescribe (key 77), version 1 (KIP-932).
//
// Each group is described by the loop that holds it: state, group and
// assignment epochs, the assignor ("simple") and each member with its
// subscription and assignment (topic ids and names). A group of
// another kind answers GROUP_ID_NOT_FOUND "Group G is not a share
// group.", a group the engine does not hold "Group G not found.", one it
// does not own NOT_COORDINATOR. Authorized operations are not computed:
// the field keeps its "not requested" value.

// shareGroupDescribe fans a ShareGroupDescribe out to the loops.
func (e *Engine) shareGroupDescribe(r *kmsg.ShareGroupDescribeRequest, reply func(kmsg.Response)) {
	ga := newGather(len(r.GroupIDs), func(res []kmsg.ShareGroupDescribeResponseGroup) {
		resp := kmsg.NewPtrShareGroupDescribeResponse()
		resp.Groups = res
		reply(resp)
	})
	for i, id := range r.GroupIDs {
		s := e.shardFor(id)
		fail := func(code int16) {
			dg := kmsg.NewShareGroupDescribeResponseGroup()
			dg.GroupID, dg.ErrorCode = id, code
			ga.set(i, dg)
		}
		if !s.post(func() {
			if !e.owns(id) {
				fail(errNotCoordinator)
				return
			}
			s.whenLoaded(id, func() { ga.set(i, s.describeShareGroup(id)) }, fail)
		}) {
			fail(errCoordinatorNotAvailable)
		}
	}
}

// describeShareGroup describes group id as the loop holds it.
func (s *shard) describeShareGroup(id string) kmsg.ShareGroupDescribeResponseGroup {
	g, ok := s.shareOf(id)
	if !ok {
		dg := kmsg.NewShareGroupDescribeResponseGroup()
		dg.GroupID, dg.ErrorCode = id, errGroupIDNotFound
		msg := "Group " + id + " not found."
		if _, held := s.kindOf(id); held {
			msg = notKindText(id, KindShare)
		}
		dg.ErrorMessage = &msg
		return dg
	}
	dg := kmsg.NewShareGroupDescribeResponseGroup()
	g.g.Describe(&dg, shareTopics{s.e.topicsNow()})
	return dg
}
