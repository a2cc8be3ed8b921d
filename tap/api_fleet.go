package tap

import (
	"net/http"
	"sort"

	"github.com/kproxy/kproxy/fleet"
)

// FleetView is the body of /api/fleet: one kproxy's view of the fleet it
// belongs to (docs/fleet.md). The admin server serves it; its source
// (internal/kproxy, from the fleet member's snapshot and the store's claims)
// fills every field except Members, which the server derives. The JSON
// keys are a stable API: fields may be added, none renamed or dropped.
// Every list is present (possibly empty), never null.
type FleetView struct {
	// ID is this kproxy's id in the fleet.
	ID string `json:"id"`
	// Peer is the peer address this kproxy advertises (what the others
	// dial to relay group requests to it).
	Peer string `json:"peer"`
	// PeerListen is the address its peer listener is bound to.
	PeerListen string `json:"peer_listen"`
	// Partitions is the groups topic's partition count.
	Partitions int `json:"partitions"`
	// Serving lists the partitions whose groups this kproxy serves now:
	// assigned to it, claimed (fenced and loaded) and inside the lease;
	// ascending.
	Serving []int32 `json:"serving"`
	// Moves counts the ownership changes seen here (claims, releases,
	// losses) since start.
	Moves int64 `json:"ownership_moves"`
	// Fenced counts the partitions this kproxy dropped because a newer
	// owner fenced its transactional writes.
	Fenced int64 `json:"fenced"`
	// LeaseValid reports whether the fleet lease holds now.
	LeaseValid bool `json:"lease_valid"`
	// Member is the state of this kproxy's membership in the fleet group
	// (the fleet member's snapshot).
	Member fleet.Status `json:"member"`
	// Members lists the fleet's members as this kproxy knows them: the
	// owners in Member.Table, itself and the leader, sorted by kproxy id.
	// Derived by the admin server; a value set by the source is replaced.
	Members []FleetMember `json:"members"`
}

// FleetMember is one entry of FleetView.Members.
type FleetMember struct {
	// ID is the kproxy id (empty for a leader that owns nothing, known
	// only by its member id), MemberID its member id, Peer its advertised
	// peer address.
	ID       string `json:"id"`
	MemberID string `json:"member_id"`
	Peer     string `json:"peer"`
	// Owned lists the partitions the table gives it, ascending.
	Owned []int32 `json:"owned"`
	// Leader marks the fleet leader, Self this kproxy.
	Leader bool `json:"leader"`
	Self   bool `json:"self"`
}

// fleet serves /api/fleet.
func (a *httpAPI) fleet(w http.ResponseWriter, _ *http.Request) {
	if a.cfg.Fleet == nil {
		http.Error(w, "groups are not distributed: no fleet", http.StatusNotFound)
		return
	}
	writeJSON(w, normalizeFleet(a.cfg.Fleet()))
}

// normalizeFleet sorts v's lists, replaces nil ones with empty ones and
// derives Members from the table.
func normalizeFleet(v FleetView) FleetView {
	v.Serving = sortedCopy(v.Serving)
	v.Member.Owned = sortedCopy(v.Member.Owned)
	if v.Member.Table == nil {
		v.Member.Table = []fleet.Owner{}
	}
	byMember := map[string]*FleetMember{}
	var members []*FleetMember
	add := func(id, memberID, peer string) *FleetMember {
		key := memberID
		if key == "" {
			key = "id:" + id // not joined yet: known by its kproxy id only
		}
		m := byMember[key]
		if m == nil {
			m = &FleetMember{MemberID: memberID, Owned: []int32{}}
			byMember[key] = m
			members = append(members, m)
		}
		if m.ID == "" {
			m.ID = id
		}
		if m.Peer == "" {
			m.Peer = peer
		}
		return m
	}
	for p, o := range v.Member.Table {
		if o.MemberID == "" {
			continue
		}
		m := add(o.ID, o.MemberID, o.Peer)
		m.Owned = append(m.Owned, int32(p))
	}
	self := add(v.ID, v.Member.MemberID, v.Peer)
	self.Self = true
	if v.Member.LeaderID != "" {
		add("", v.Member.LeaderID, "").Leader = true
	}
	sort.SliceStable(members, func(i, j int) bool {
		if members[i].ID != members[j].ID {
			return members[i].ID < members[j].ID
		}
		return members[i].MemberID < members[j].MemberID
	})
	v.Members = make([]FleetMember, 0, len(members))
	for _, m := range members {
		v.Members = append(v.Members, *m)
	}
	return v
}

// sortedCopy returns s sorted, as a new non-nil slice.
func sortedCopy(s []int32) []int32 {
	out := append([]int32{}, s...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
