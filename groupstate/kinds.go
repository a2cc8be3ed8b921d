package groupstate

import "github.com/twmb/franz-go/pkg/kmsg"

// A group id names one group whatever its kind (Kafka's
// GroupMetadataManager keeps one map of groups by id): a shard holds its
// groups in one registry, shard.groups, and every kind of group
// implements group. Requests that are the same for every kind (list,
// describe, delete, unload, teardown, the snapshots of the admin API)
// iterate the registry through this interface; requests of one kind
// look their group up with classicOf or consumerOf, and a request for an
// id held by a group of another kind gets Kafka's cross-kind answer from
// kindOf.
//
// A new kind of group implements group, adds its accessor below and its
// GroupKind, and registers its request keys in codec/apis.go and in
// Engine.Handle.

// GroupKind is the kind of a group, as ListGroups v5+ reports it
// (GroupType, KIP-848).
type GroupKind string

const (
	// KindClassic is a JoinGroup/SyncGroup group (ListGroups type
	// "classic").
	KindClassic GroupKind = "classic"
	// KindConsumer is a KIP-848 consumer group (type "consumer").
	KindConsumer GroupKind = "consumer"
)

// group is what the engine holds of one group of any kind. Its methods
// run on the loop of the shard that holds the group.
type group interface {
	// groupKind is the group's kind.
	groupKind() GroupKind
	// held reports whether the group answers as a group: false for a
	// classic group that went Dead but is still referenced.
	held() bool
	// snapshot is the group as the admin API shows it.
	snapshot() GroupSnapshot
	// listEntry is the group's ListGroups entry.
	listEntry() kmsg.ListGroupsResponseGroup
	// unload drops the group from its shard without writing anything,
	// answering parked requests code (unload.go).
	unload(code int16, cause string)
	// teardown stops the group's timers and answers its parked requests
	// COORDINATOR_NOT_AVAILABLE; the engine is closing.
	teardown()
}

// classicOf returns the classic group held under id.
func (s *shard) classicOf(id string) (*classicGroup, bool) {
	g, ok := s.groups[id].(*classicGroup)
	return g, ok
}

// consumerOf returns the KIP-848 group held under id.
func (s *shard) consumerOf(id string) (*consumerGroup, bool) {
	g, ok := s.groups[id].(*consumerGroup)
	return g, ok
}

// kindOf returns the kind of the group held under id, and false if the
// shard holds no group there (or only a Dead classic group).
func (s *shard) kindOf(id string) (GroupKind, bool) {
	g, ok := s.groups[id]
	if !ok || !g.held() {
		return "", false
	}
	return g.groupKind(), true
}

// holds reports whether the loop holds group id: a KIP-848 group, or a
// classic group that is not Dead.
func (s *shard) holds(id string) bool {
	_, ok := s.kindOf(id)
	return ok
}

// drop removes g from the registry if it is still the group held under
// its id.
func (s *shard) drop(id string, g group) {
	if s.groups[id] == g {
		delete(s.groups, id)
	}
}

// notKindText is Kafka's text for a request of one kind's API on a group
// of another kind (GroupMetadataManager: "Group G is not a consumer
// group.").
func notKindText(id string, want GroupKind) string {
	return "Group " + id + " is not a " + string(want) + " group."
}

func (g *classicGroup) groupKind() GroupKind { return KindClassic }
func (g *classicGroup) held() bool           { return g.state != stateDead }
func (g *classicGroup) listEntry() kmsg.ListGroupsResponseGroup {
	lg := kmsg.NewListGroupsResponseGroup()
	lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = g.id, g.protocolType, g.state.String(), string(KindClassic)
	return lg
}
func (g *classicGroup) unload(code int16, cause string) { g.s.unloadClassic(g, code, cause) }
func (g *classicGroup) teardown() {
	g.cancelAllTimers()
	for _, m := range g.members {
		if m.joinReply != nil {
			m.answerJoin(joinError(errCoordinatorNotAvailable, m.id))
		}
		if m.syncReply != nil {
			m.answerSync(syncError(errCoordinatorNotAvailable))
		}
	}
	for _, p := range g.pending {
		stopTimer(p.timer)
	}
}

func (g *consumerGroup) groupKind() GroupKind { return KindConsumer }
func (g *consumerGroup) held() bool           { return true }
func (g *consumerGroup) listEntry() kmsg.ListGroupsResponseGroup {
	lg := kmsg.NewListGroupsResponseGroup()
	lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = g.id, "consumer", g.stateName(), string(KindConsumer)
	return lg
}
func (g *consumerGroup) unload(code int16, cause string) { g.s.unloadConsumer(g, code, cause) }
func (g *consumerGroup) teardown() {
	g.cancelAllTimers()
	g.failWaiters(errCoordinatorNotAvailable)
}
