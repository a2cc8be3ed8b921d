package groupstate

import (
	"errors"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Anchors (docs/anchors.md). A store that implements AnchorStore holds,
// for every group the engine serves with members, one member of its own
// in the cluster's group coordinator for the same group id, so that the
// cluster sees the group live (direct DeleteGroups and OffsetDelete are
// refused as for any live group) and fences a stale owner by
// static-member replacement (KIP-345). The engine tells the store what
// that member must stand for: every time a group's members, protocols,
// subscriptions or assignments may have changed (a member added or
// removed, a record written, a group installed from its record), it
// computes the group's Anchor and hands it over if it differs from the
// last one.

// Anchor is what a group's members stand for in the cluster's
// coordinator.
type Anchor struct {
	// Members is the number of members; 0 means the group is empty (the
	// anchor leaves the cluster's group).
	Members int
	// ProtocolType is the group's protocol type: "consumer" for KIP-848
	// groups and for classic consumers.
	ProtocolType string
	// Protocols are the protocol names every member supports, the
	// selected one first (classic groups); for KIP-848 groups the
	// classic consumer's assignor names.
	Protocols []string
	// Topics is the sorted union of the members' subscribed topics
	// (consumer protocol only; nil for other protocol types).
	Topics []string
	// Owned is the union of the partitions the members are assigned, by
	// topic, partitions sorted; for a KIP-848 group every partition of
	// the subscribed topics the engine knows (consumerGroup.anchorChanged).
	Owned map[string][]int32
	// MemberIDs are the members' ids, sorted (KIP-848 groups only: the
	// store waits for them to reach the cluster when it hands the group
	// back, internal/coexist/anchor_takeover_kip848.go).
	MemberIDs []string
	// InstanceIDs are the static members' group.instance.ids, sorted
	// (classic groups): when it hands the group back the store knows a
	// static member there by its instance id, whichever process holds
	// it (internal/coexist/anchor_handback.go).
	InstanceIDs []string
	// Version numbers the Anchors the engine hands over (KIP-848 groups;
	// one sequence per engine shard, so increasing for each group); the
	// store reports the version of each sync back (Engine.AnchorHeld).
	// Not part of the comparisons.
	Version uint64
	// SessionTimeout is the longest session timeout among the members:
	// how long the cluster would keep them, were they its own, after
	// they went silent. The store bounds the anchor's session by it, so
	// that the cluster keeps the anchor of a kproxy that died no longer
	// than it would keep the members themselves.
	SessionTimeout time.Duration
}

// SameMembership reports whether a and b stand for the same membership
// in the cluster's group: the same protocol type, protocol names, topics
// and owned partitions and session timeout, whatever their member
// counts.
func (a Anchor) SameMembership(b Anchor) bool {
	if a.ProtocolType != b.ProtocolType || a.SessionTimeout != b.SessionTimeout || !slices.Equal(a.Protocols, b.Protocols) ||
		!slices.Equal(a.Topics, b.Topics) || len(a.Owned) != len(b.Owned) {
		return false
	}
	for t, ps := range a.Owned {
		if !slices.Equal(ps, b.Owned[t]) {
			return false
		}
	}
	return true
}

// equal reports whether a and b are the same.
func (a Anchor) equal(b Anchor) bool {
	return a.Members == b.Members && slices.Equal(a.MemberIDs, b.MemberIDs) && slices.Equal(a.InstanceIDs, b.InstanceIDs) &&
		a.SameMembership(b)
}

// AnchorStore is implemented by an OffsetStore that anchors the engine's
// groups in the cluster's coordinator.
type AnchorStore interface {
	// Anchor tells the store what group stands for now. It is called on
	// the engine's loops and must not block; calls for one group come in
	// order.
	Anchor(group string, a Anchor)
	// Unanchor tells the store that the engine dropped group (unloaded:
	// another kproxy serves it now, or will): forget the anchor without
	// leaving the cluster's group, so that the next owner replaces it
	// without a rebalance. It must not block.
	Unanchor(group string)
}

// ErrGroupLiveOnCluster is returned (wrapped) by LoadGroupMetadata for a
// group whose members the cluster's own coordinator serves, without an
// anchor: requests for it are answered NOT_COORDINATOR, so that its
// clients look their coordinator up again and are sent to the cluster's
// (per-group forwarding, docs/anchors.md).
var ErrGroupLiveOnCluster = errors.New("the group is live on the cluster's own coordinator")

// kip848AnchorProtocols are the classic protocol names the anchor of a
// KIP-848 group advertises: the default assignors of the Java consumer
// (range, cooperative-sticky) and of franz-go (cooperative-sticky), so a
// classic member that reaches the cluster directly shares one.
var kip848AnchorProtocols = []string{"range", "cooperative-sticky"}

// anchorChanged hands g's Anchor to the store if it changed.
func (g *classicGroup) anchorChanged() {
	st := g.s.e.anchors
	if st == nil || !g.live() {
		return
	}
	a := g.anchor()
	if g.anchorSent != nil && g.anchorSent.equal(a) {
		return
	}
	g.anchorSent = &a
	st.Anchor(g.id, a)
}

// anchor computes g's Anchor.
func (g *classicGroup) anchor() Anchor {
	a := Anchor{Members: len(g.members), ProtocolType: g.protocolType}
	if len(g.members) == 0 {
		return a
	}
	for id := range g.static {
		a.InstanceIDs = append(a.InstanceIDs, id)
	}
	for _, m := range g.members {
		a.SessionTimeout = max(a.SessionTimeout, m.sessionTimeout)
	}
	slices.Sort(a.InstanceIDs)
	first := g.members[g.order[0]]
	if g.protocol != "" {
		a.Protocols = append(a.Protocols, g.protocol)
	}
	for _, p := range first.protocols {
		if p.Name != g.protocol && g.protoCount[p.Name] == len(g.members) {
			a.Protocols = append(a.Protocols, p.Name)
		}
	}
	if g.protocolType != "consumer" {
		return a
	}
	topics := make(map[string]struct{})
	owned := make(map[string]map[int32]struct{})
	for _, id := range g.order {
		m := g.members[id]
		proto := g.protocol
		if proto == "" && len(a.Protocols) > 0 {
			proto = a.Protocols[0]
		}
		var sub kmsg.ConsumerMemberMetadata
		if err := sub.ReadFrom(m.metadataFor(proto)); err == nil {
			for _, t := range sub.Topics {
				topics[t] = struct{}{}
			}
		}
		for t, ps := range decodeOwned(m.assignment) {
			addOwned(owned, t, ps)
		}
	}
	a.Topics = sortedKeys(topics)
	a.Owned = sortedOwned(owned)
	return a
}

// anchorChanged hands g's Anchor to the store if it changed.
func (g *consumerGroup) anchorChanged() {
	st := g.s.e.anchors
	if st == nil || !g.live() {
		return
	}
	a := Anchor{Members: len(g.members), ProtocolType: "consumer"}
	if len(g.members) > 0 {
		a.Protocols = kip848AnchorProtocols
		topics := make(map[string]struct{})
		owned := make(map[string]map[int32]struct{})
		snap := g.s.e.topicsNow()
		for _, m := range g.members {
			a.SessionTimeout = max(a.SessionTimeout, g.sessionTimeout(m))
			for _, t := range m.topics {
				topics[t] = struct{}{}
			}
			for _, set := range []partSet{m.Assigned, m.Pending} {
				for id, ps := range set {
					name, ok := snap.byID[id]
					if !ok && g.snap != nil {
						name, ok = g.snap.byID[id]
					}
					if ok {
						addOwned(owned, name, ps)
					}
				}
			}
		}
		// The anchor also holds every partition of the subscribed topics
		// no member holds: the engine hands such a partition to a member
		// at that member's next heartbeat, without asking the cluster,
		// and a member moved back to the cluster in between would get it
		// there too, once its join converted the cluster's group into a
		// consumer group (Kafka's online upgrade keeps a classic member's
		// assignment as what it owns and assigns the rest). All but
		// those withheld from every member for a member moved back
		// (consumer_withhold.go).
		for t := range topics {
			info, ok := snap.byName[t]
			if !ok && g.snap != nil {
				info, ok = g.snap.byName[t]
			}
			if ok && info.Partitions > 0 {
				all := make(map[int32]struct{}, info.Partitions)
				for p := range info.Partitions {
					if !g.releasedToCluster(tp{info.ID, p}) {
						all[p] = struct{}{}
					}
				}
				addOwned(owned, t, all)
			}
		}
		a.Topics = sortedKeys(topics)
		a.Owned = sortedOwned(owned)
		a.MemberIDs = g.sortedIDs()
	}
	if g.anchorSent != nil && g.anchorSent.equal(a) {
		return
	}
	g.s.anchorVersion++
	a.Version = g.s.anchorVersion
	g.anchorSent = &a
	st.Anchor(g.id, a)
}

// unanchor tells the store that the engine no longer holds group id.
func (s *shard) unanchor(id string) {
	if s.e.anchors != nil {
		s.e.anchors.Unanchor(id)
	}
}

// addOwned adds partitions ps of topic t to owned.
func addOwned(owned map[string]map[int32]struct{}, t string, ps map[int32]struct{}) {
	if owned[t] == nil {
		owned[t] = make(map[int32]struct{}, len(ps))
	}
	for p := range ps {
		owned[t][p] = struct{}{}
	}
}

// sortedKeys returns m's keys sorted.
func sortedKeys(m map[string]struct{}) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// sortedOwned turns a partition set into sorted slices.
func sortedOwned(m map[string]map[int32]struct{}) map[string][]int32 {
	out := make(map[string][]int32, len(m))
	for t, ps := range m {
		l := make([]int32, 0, len(ps))
		for p := range ps {
			l = append(l, p)
		}
		slices.Sort(l)
		out[t] = l
	}
	return out
}
