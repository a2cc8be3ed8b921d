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
// The engine's groups are merged with the groups the store has offsets
// for that the engine does not hold; those are loaded first (their
// metadata may be persisted from before a restart), and the ones still
// unknown are simple groups, protocol type "", state Empty. Only groups
// the engine owns (Config.Owns) are listed: in a fleet the router merges
// the lists of every owner.

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
		done := func(stored []string, code int16) {
			var missing []string
			for _, id := range stored {
				if !seen[id] && e.owns(id) {
					seen[id] = true
					missing = append(missing, id)
				}
			}
			if e.meta == nil || len(missing) == 0 {
				extra := make([]kmsg.ListGroupsResponseGroup, len(missing))
				for i, id := range missing {
					extra[i] = simpleListEntry(id)
				}
				complete(extra, code)
				return
			}
			// Groups with offsets that this engine has not loaded since
			// its start may have persisted metadata: load them.
			// A part is nil for a group this engine no longer owns.
			lg := newGather(len(missing), func(parts []*kmsg.ListGroupsResponseGroup) {
				extra := make([]kmsg.ListGroupsResponseGroup, 0, len(parts))
				for _, p := range parts {
					if p != nil {
						extra = append(extra, *p)
					}
				}
				complete(extra, code)
			})
			for i, id := range missing {
				s := e.shardFor(id)
				set := func(v *kmsg.ListGroupsResponseGroup) { lg.set(i, v) }
				if !s.post(func() {
					if !e.owns(id) {
						set(nil)
						return
					}
					s.whenLoaded(id, func() { g := s.listOne(id); set(&g) }, func(int16) { g := simpleListEntry(id); set(&g) })
				}) {
					g := simpleListEntry(id)
					set(&g)
				}
			}
		}
		if !e.goStore(func(ctx context.Context) {
			stored, err := e.cfg.Store.ListGroups(ctx)
			code := errNone
			if err != nil {
				e.log.Warn("groupstate: listing store groups failed", "err", err)
				code = storeErrorCode(err)
			}
			done(stored, code)
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
	out := make([]kmsg.ListGroupsResponseGroup, 0, len(s.classicGroups))
	for _, g := range s.classicGroups {
		if g.state == stateDead || !s.e.owns(g.id) {
			continue
		}
		lg := kmsg.NewListGroupsResponseGroup()
		lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = g.id, g.protocolType, g.state.String(), "classic"
		out = append(out, lg)
	}
	for _, g := range s.consumerGroups {
		if s.e.owns(g.id) {
			out = append(out, g.listEntry())
		}
	}
	return out
}

// listEntry is the ListGroups entry of a KIP-848 group.
func (g *consumerGroup) listEntry() kmsg.ListGroupsResponseGroup {
	lg := kmsg.NewListGroupsResponseGroup()
	lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = g.id, "consumer", g.stateName(), "consumer"
	return lg
}

// listOne returns the ListGroups entry of group id: the engine's group,
// or a simple group if the engine holds none.
func (s *shard) listOne(id string) kmsg.ListGroupsResponseGroup {
	if g, ok := s.consumerGroups[id]; ok {
		return g.listEntry()
	}
	if g, ok := s.classicGroups[id]; ok && g.state != stateDead {
		lg := kmsg.NewListGroupsResponseGroup()
		lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = g.id, g.protocolType, g.state.String(), "classic"
		return lg
	}
	return simpleListEntry(id)
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
