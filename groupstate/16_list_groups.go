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
//   - v5: TypesFilter and GroupType (KIP-848); every group here is
//     "classic".
//
// The engine's groups are merged with the groups the store has offsets
// for that the engine does not hold: simple groups, protocol type "",
// state Empty.

// listGroups gathers the groups of every loop and of the store.
func (e *Engine) listGroups(r *kmsg.ListGroupsRequest, reply func(kmsg.Response)) {
	finish := func(res []any) {
		seen := make(map[string]bool)
		var all []kmsg.ListGroupsResponseGroup
		for _, v := range res {
			gs, _ := v.([]kmsg.ListGroupsResponseGroup)
			for _, g := range gs {
				seen[g.Group] = true
				all = append(all, g)
			}
		}
		done := func(stored []string, code int16) {
			for _, id := range stored {
				if seen[id] {
					continue
				}
				seen[id] = true
				lg := kmsg.NewListGroupsResponseGroup()
				lg.Group, lg.GroupState, lg.GroupType = id, stateEmpty.String(), "classic"
				all = append(all, lg)
			}
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
	out := make([]kmsg.ListGroupsResponseGroup, 0, len(s.groups))
	for _, g := range s.groups {
		if g.state == stateDead {
			continue
		}
		lg := kmsg.NewListGroupsResponseGroup()
		lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = g.id, g.protocolType, g.state.String(), "classic"
		out = append(out, lg)
	}
	return out
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
