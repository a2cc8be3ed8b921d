package groupstate

import (
	"context"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// ListGroups (key 16), versions 0-5.
//
//   - v1: ThrottleMillis.
//   - v3: flexible versions.
//   - v4: StatesFilter and GroupState (KIP-518), matched case-insensitively.
//   - v5: TypesFilter and GroupType (KIP-848): "classic", or "consumer"
//     for KIP-848 groups.
//
// The engine's groups are merged with the groups it knows of that it
// does not hold; those without members on the cluster are loaded first
// (their metadata may be persisted from before a restart), and the ones
// still not held are listed as they are known. With Config.ClusterGroups
// those are every group of the cluster, with the cluster's protocol
// type, state and type, so a group the cluster's coordinator serves is
// listed as the brokers list it; a group the engine holds is listed
// once, as the engine sees it (its anchor on the cluster is a member of
// it, not a group). Without it they are the groups the store has offsets
// for, as simple groups, protocol type "", state Empty. Only groups the
// engine owns (Config.Owns) are listed: in a fleet the router merges the
// lists of every owner, and each group of the cluster has one owner.

// listGroups gathers the groups of every loop and of the store.
func (e *Engine) listGroups(r *kmsg.ListGroupsRequest, reply func(kmsg.Response)) {
	finish := func(res [][]kmsg.ListGroupsResponseGroup) {
		seen := make(map[string]bool)
		var all []kmsg.ListGroupsResponseGroup
		for _, gs := range res {
			for _, g := range gs {
				seen[g.Group] = true
				all = append(all, g)
			}
		}
		complete := func(extra []kmsg.ListGroupsResponseGroup, code int16) {
			all = append(all, extra...)
			resp := kmsg.NewPtrListGroupsResponse()
			resp.ErrorCode = code
			for _, g := range all {
				if r.Version >= 4 && !matchFilter(r.StatesFilter, g.GroupState) {
					continue
				}
				if r.Version >= 5 && !matchFilter(r.TypesFilter, g.GroupType) {
					continue
				}
				resp.Groups = append(resp.Groups, g)
			}
			sort.Slice(resp.Groups, func(i, j int) bool { return resp.Groups[i].Group < resp.Groups[j].Group })
			reply(resp)
		}
		// done completes the list with stored, the known groups the
		// engine did not list (the cluster's, or the store's), each as
		// known: a group the engine holds once loaded is listed as the
		// engine sees it.
		done := func(stored []kmsg.ListGroupsResponseGroup, code int16) {
			// Groups with offsets that this engine has not loaded since
			// its start may have persisted metadata: they are loaded
			// first. Not a group live on the cluster (members there,
			// in any state but Empty and Dead): either the cluster's
			// coordinator serves it, and its load would only be
			// refused (ErrGroupLiveOnCluster, after one DescribeGroups
			// per group and per ListGroups), or it is a group of this
			// engine's that a kproxy's anchor keeps live while no
			// request has loaded it yet (just after a failover; its
			// members' next request loads it), listed meanwhile as
			// the cluster sees it.
			var listed, missing []kmsg.ListGroupsResponseGroup
			for _, sg := range stored {
				if seen[sg.Group] || !e.owns(sg.Group) {
					continue
				}
				seen[sg.Group] = true
				if e.meta == nil || liveOnCluster(sg.GroupState) {
					listed = append(listed, sg)
				} else {
					missing = append(missing, sg)
				}
			}
			if len(missing) == 0 {
				complete(listed, code)
				return
			}
			// A part is nil for a group this engine no longer owns.
			// A group whose load fails is listed as the store knows
			// it.
			lg := newGather(len(missing), func(parts []*kmsg.ListGroupsResponseGroup) {
				extra := listed
				for _, p := range parts {
					if p != nil {
						extra = append(extra, *p)
					}
				}
				complete(extra, code)
			})
			for i, sg := range missing {
				id := sg.Group
				s := e.shardFor(id)
				set := func(v *kmsg.ListGroupsResponseGroup) { lg.set(i, v) }
				if !s.post(func() {
					if !e.owns(id) {
						set(nil)
						return
					}
					s.whenLoaded(id, func() {
						if g, ok := s.heldListEntry(id); ok {
							set(&g)
							return
						}
						set(&sg)
					}, func(int16) {
						if !e.owns(id) {
							set(nil) // ownership moved during the load
							return
						}
						set(&sg)
					})
				}) {
					set(&sg)
				}
			}
		}
		if cg := e.cfg.ClusterGroups; cg != nil {
			if !e.goStore(func(ctx context.Context) {
				groups, err := cg.ListClusterGroups(ctx)
				code := errNone
				if err != nil {
					e.log.Warn("groupstate: listing the cluster's groups failed", "err", err)
					code = storeErrorCode(err)
				}
				done(groups, code)
			}) {
				done(nil, errCoordinatorNotAvailable)
			}
			return
		}
		if !e.goStore(func(ctx context.Context) {
			stored, err := e.cfg.Store.ListGroups(ctx)
			code := errNone
			if err != nil {
				e.log.Warn("groupstate: listing store groups failed", "err", err)
				code = storeErrorCode(err)
			}
			simple := make([]kmsg.ListGroupsResponseGroup, len(stored))
			for i, id := range stored {
				simple[i] = simpleListEntry(id)
			}
			done(simple, code)
		}) {
			done(nil, errCoordinatorNotAvailable)
		}
	}
	ga := newGather(len(e.shards), finish)
	for i, s := range e.shards {
		if !s.post(func() { ga.set(i, s.list()) }) {
			ga.set(i, nil)
		}
	}
}

// list returns the loop's groups as ListGroups entries.
func (s *shard) list() []kmsg.ListGroupsResponseGroup {
	out := make([]kmsg.ListGroupsResponseGroup, 0, len(s.groups))
	for id, g := range s.groups {
		if g.held() && s.e.owns(id) {
			out = append(out, g.listEntry())
		}
	}
	return out
}

// heldListEntry returns the ListGroups entry of group id if the engine
// holds it.
func (s *shard) heldListEntry(id string) (kmsg.ListGroupsResponseGroup, bool) {
	if g, ok := s.groups[id]; ok && g.held() {
		return g.listEntry(), true
	}
	return kmsg.ListGroupsResponseGroup{}, false
}

// liveOnCluster reports whether a group the cluster lists in state has
// members there. A state the cluster does not report (ListGroups before
// v4) counts as not live: the group is loaded, as before.
func liveOnCluster(state string) bool {
	return state != "" && !strings.EqualFold(state, stateEmpty.String()) && !strings.EqualFold(state, stateDead.String())
}

// simpleListEntry is the ListGroups entry of a group only the store
// knows: protocol type "", Empty.
func simpleListEntry(id string) kmsg.ListGroupsResponseGroup {
	lg := kmsg.NewListGroupsResponseGroup()
	lg.Group, lg.GroupState, lg.GroupType = id, stateEmpty.String(), "classic"
	return lg
}

// matchFilter reports whether v passes filter (empty = everything),
// case-insensitively.
func matchFilter(filter []string, v string) bool {
	if len(filter) == 0 {
		return true
	}
	for _, f := range filter {
		if strings.EqualFold(f, v) {
			return true
		}
	}
	return false
}
