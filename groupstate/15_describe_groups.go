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
// engine does not own (Config.Owns) answers NOT_COORDINATOR in its slot.
//
// A group the engine owns but does not hold (neither a classic nor a
// KIP-848 group once loaded, or refused at its load because the
// cluster's coordinator serves it, ErrGroupLiveOnCluster) is described
// as the cluster describes it when the engine has Config.ClusterGroups:
// a group live on the brokers shows its real members, protocol and state
// in a multi-group request (kafka-consumer-groups --describe
// --all-groups; a single-group request for it is forwarded upstream by
// the proxy before it reaches the engine). The cluster's entry is passed
// on as it is, authorized operations included, but in the shape of the
// request's version: before v6 an unknown group is Dead without an
// error, from v6 GROUP_ID_NOT_FOUND (a cluster older than v6 answers
// Dead). Without ClusterGroups, a group the store has offsets for (a
// simple group) is reported Empty with protocol type "".

// groupOperations is the authorized-operations bit set of a group for a
// proxy that does not authorize: READ (3), DELETE (6), DESCRIBE (8).
const groupOperations int32 = 1<<3 | 1<<6 | 1<<8

// describeGroups fans a DescribeGroups out to the loops owning its groups.
func (e *Engine) describeGroups(r *kmsg.DescribeGroupsRequest, reply func(kmsg.Response)) {
	cg := e.cfg.ClusterGroups
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
		if cg != nil {
			e.describeOnCluster(cg, r, resp, missing, reply)
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
					msg := "Group " + dg.Group + " not found." // Kafka's GroupMetadataManager text
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
				if cg != nil && refusedAsLive(e, id, code) {
					ga.set(i, nil) // described by the cluster
					return
				}
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

// refusedAsLive reports whether a load of group id that failed with code
// refused the group because the cluster's coordinator serves it
// (ErrGroupLiveOnCluster, answered NOT_COORDINATOR to the group's own
// requests): the engine still owns the group, so the NOT_COORDINATOR did
// not come from ownership moving away. The engine does not hold such a
// group, so it is described as the cluster describes it.
func refusedAsLive(e *Engine, id string, code int16) bool {
	return code == errNotCoordinator && e.owns(id)
}

// describeOnCluster fills the slots missing of resp (groups the engine
// owns and does not hold) with the cluster's descriptions, then replies.
func (e *Engine) describeOnCluster(cg ClusterGroups, r *kmsg.DescribeGroupsRequest, resp *kmsg.DescribeGroupsResponse, missing []int, reply func(kmsg.Response)) {
	fromCluster(e, resp.Groups, missing, "groups",
		func(g kmsg.DescribeGroupsResponseGroup) string { return g.Group },
		func(id string, code int16) kmsg.DescribeGroupsResponseGroup {
			g := kmsg.NewDescribeGroupsResponseGroup()
			g.Group, g.ErrorCode = id, code
			return g
		},
		func(g kmsg.DescribeGroupsResponseGroup) kmsg.DescribeGroupsResponseGroup {
			return describedForVersion(g, r.Version)
		},
		func(ctx context.Context, ids []string) ([]kmsg.DescribeGroupsResponseGroup, error) {
			return cg.DescribeClusterGroups(ctx, ids, r.IncludeAuthorizedOperations)
		},
		func() { reply(resp) })
}

// fromCluster replaces slots[i] for every i of missing (groups the engine
// owns and does not hold) with the cluster's entry for that group, asked
// with one ask off the loops (DescribeGroups or ConsumerGroupDescribe),
// put in the request's shape by shape; a group the cluster did not
// answer gets absent(id, COORDINATOR_NOT_AVAILABLE). Then done runs.
func fromCluster[G any](e *Engine, slots []G, missing []int, what string, groupOf func(G) string,
	absent func(id string, code int16) G, shape func(G) G, ask func(ctx context.Context, ids []string) ([]G, error), done func()) {
	ids := make([]string, len(missing))
	for j, i := range missing {
		ids[j] = groupOf(slots[i])
	}
	fill := func(got []G) {
		byID := make(map[string]G, len(got))
		for _, g := range got {
			byID[groupOf(g)] = g
		}
		for j, i := range missing {
			g, ok := byID[ids[j]]
			if !ok {
				g = absent(ids[j], errCoordinatorNotAvailable)
			}
			slots[i] = shape(g)
		}
		done()
	}
	if !e.goStore(func(ctx context.Context) {
		got, err := ask(ctx, ids)
		if err != nil {
			e.log.Warn("groupstate: describing "+what+" on the cluster failed", "err", err)
		}
		fill(got)
	}) {
		fill(nil)
	}
}

// describedForVersion puts the cluster's description g in the shape of
// DescribeGroups version v (the cluster answered in the newest version
// it speaks): KIP-1043 made an unknown group GROUP_ID_NOT_FOUND at v6;
// before, it is Dead without an error.
func describedForVersion(g kmsg.DescribeGroupsResponseGroup, v int16) kmsg.DescribeGroupsResponseGroup {
	switch {
	case v < 6 && g.ErrorCode == errGroupIDNotFound:
		g.ErrorCode, g.ErrorMessage, g.State = errNone, nil, stateDead.String()
	case v >= 6 && g.ErrorCode == errNone && g.State == stateDead.String() && len(g.Members) == 0:
		g.ErrorCode = errGroupIDNotFound
		msg := "Group " + g.Group + " not found." // Kafka's GroupMetadataManager text
		g.ErrorMessage = &msg
	}
	return g
}

// describe returns the description of group id, or nil if the engine does
// not hold it.
func (s *shard) describe(id string) *kmsg.DescribeGroupsResponseGroup {
	if kind, ok := s.kindOf(id); ok && kind != KindClassic {
		// As Kafka 4 answers: a group of another kind is described with
		// its own API (ConsumerGroupDescribe...); DescribeGroups says so
		// in the text of Kafka's GroupMetadataManager.classicGroup.
		dg := kmsg.NewDescribeGroupsResponseGroup()
		dg.Group, dg.State, dg.ErrorCode = id, stateDead.String(), errGroupIDNotFound
		msg := notKindText(id, KindClassic)
		dg.ErrorMessage = &msg
		return &dg
	}
	g, ok := s.classicOf(id)
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
