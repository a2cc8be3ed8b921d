package groupstate

import (
	"context"
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// DescribeGroups (key 15), versions 0-6.
//
//   - v1: ThrottleMillis.
//   - v3: IncludeAuthorizedOperations / AuthorizedOperations (KIP-430).
//   - v4: InstanceID per member.
//   - v5: flexible versions.
//   - v6: a missing group answers GROUP_ID_NOT_FOUND with an ErrorMessage
//     (KIP-1043); older versions answer state "Dead" without error.
//
// A Stable group reports its protocol and each member's metadata and
// assignment; other states report members without them. A group the
// engine does not hold but the store has offsets for (a simple group) is
// reported Empty with protocol type "". A group the engine does not own
// (Config.Owns) answers NOT_COORDINATOR in its slot.

// groupOperations is the authorized-operations bit set of a group for a
// proxy that does not authorize: READ (3), DELETE (6), DESCRIBE (8).
const groupOperations int32 = 1<<3 | 1<<6 | 1<<8

// describeGroups fans a DescribeGroups out to the loops owning its groups.
func (e *Engine) describeGroups(r *kmsg.DescribeGroupsRequest, reply func(kmsg.Response)) {
	finish := func(res []*kmsg.DescribeGroupsResponseGroup) {
		resp := kmsg.NewPtrDescribeGroupsResponse()
		var missing []int
		for i, v := range res {
			dg := v
			if dg == nil {
				missing = append(missing, i)
				nd := kmsg.NewDescribeGroupsResponseGroup()
				dg = &nd
				dg.Group = r.Groups[i]
			}
			if r.IncludeAuthorizedOperations && dg.ErrorCode == errNone {
				dg.AuthorizedOperations = groupOperations
			}
			resp.Groups = append(resp.Groups, *dg)
		}
		if len(missing) == 0 {
			reply(resp)
			return
		}
		dead := func(known []string) {
			for _, i := range missing {
				dg := &resp.Groups[i]
				if slices.Contains(known, dg.Group) {
					dg.State = stateEmpty.String()
					if r.IncludeAuthorizedOperations {
						dg.AuthorizedOperations = groupOperations
					}
					continue
				}
				dg.State = stateDead.String()
				if r.Version >= 6 {
					dg.ErrorCode = errGroupIDNotFound
					msg := "group " + dg.Group + " not found"
					dg.ErrorMessage = &msg
				}
			}
			reply(resp)
		}
		if !e.goStore(func(ctx context.Context) {
			known, err := e.cfg.Store.ListGroups(ctx)
			if err != nil {
				e.log.Warn("groupstate: listing store groups failed", "err", err)
			}
			dead(known)
		}) {
			dead(nil)
		}
	}
	ga := newGather(len(r.Groups), finish)
	for i, id := range r.Groups {
		s := e.shardFor(id)
		if !s.post(func() {
			if !e.owns(id) {
				dg := kmsg.NewDescribeGroupsResponseGroup()
				dg.Group, dg.ErrorCode = id, errNotCoordinator
				ga.set(i, &dg)
				return
			}
			s.whenLoaded(id, func() { ga.set(i, s.describe(id)) }, func(code int16) {
				dg := kmsg.NewDescribeGroupsResponseGroup()
				dg.Group, dg.ErrorCode = id, code
				ga.set(i, &dg)
			})
		}) {
			dg := kmsg.NewDescribeGroupsResponseGroup()
			dg.Group, dg.ErrorCode = id, errCoordinatorNotAvailable
			ga.set(i, &dg)
		}
	}
}

// describe returns the description of group id, or nil if the engine does
// not hold it.
func (s *shard) describe(id string) *kmsg.DescribeGroupsResponseGroup {
	if _, ok := s.consumerGroups[id]; ok {
		// As Kafka 4 answers: a KIP-848 group is described with
		// ConsumerGroupDescribe.
		dg := kmsg.NewDescribeGroupsResponseGroup()
		dg.Group, dg.State, dg.ErrorCode = id, stateDead.String(), errGroupIDNotFound
		msg := "group " + id + " is not a classic group"
		dg.ErrorMessage = &msg
		return &dg
	}
	g, ok := s.classicGroups[id]
	if !ok || g.state == stateDead {
		return nil
	}
	dg := kmsg.NewDescribeGroupsResponseGroup()
	dg.Group = g.id
	dg.State = g.state.String()
	dg.ProtocolType = g.protocolType
	stable := g.state == stateStable
	if stable {
		dg.Protocol = g.protocol
	}
	for _, mid := range g.order {
		m := g.members[mid]
		dm := kmsg.NewDescribeGroupsResponseGroupMember()
		dm.MemberID = m.id
		if m.instanceID != "" {
			iid := m.instanceID
			dm.InstanceID = &iid
		}
		dm.ClientID, dm.ClientHost = m.clientID, m.clientHost
		if stable {
			dm.ProtocolMetadata = m.metadataFor(g.protocol)
			dm.MemberAssignment = m.assignment
		}
		dg.Members = append(dg.Members, dm)
	}
	return &dg
}
