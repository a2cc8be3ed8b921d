package share

import (
	"hash/fnv"
	"slices"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TopicView is the cluster's topic metadata as the group needs it; the
// engine implements it over its topic cache.
type TopicView interface {
	// TopicByName returns the topic's ID and partition count.
	TopicByName(name string) (id [16]byte, partitions int32, ok bool)
	// TopicByID returns the name of the topic with this ID.
	TopicByID(id [16]byte) (name string, ok bool)
}

// GroupConfig holds the group settings the membership uses; zero fields
// take Kafka's defaults.
type GroupConfig struct {
	// SessionTimeout is group.share.session.timeout.ms (default 45 s).
	SessionTimeout time.Duration
	// HeartbeatInterval is group.share.heartbeat.interval.ms (default 5 s).
	HeartbeatInterval time.Duration
	// MaxSize is group.share.max.size (default 200).
	MaxSize int
}

// Kafka's defaults for GroupConfig.
const (
	DefaultSessionTimeout    = 45 * time.Second
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultMaxSize           = 200
)

func (c GroupConfig) withDefaults() GroupConfig {
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.MaxSize <= 0 {
		c.MaxSize = DefaultMaxSize
	}
	return c
}

// Group states as ShareGroupDescribe and ListGroups name them.
const (
	StateEmpty  = "Empty"
	StateStable = "Stable"
)

// maxMemberIDLen is the longest member id Kafka accepts (a UUID's text).
const maxMemberIDLen = 36

// member is one share-group member.
type member struct {
	id         string
	rack       *string
	clientID   string
	clientHost string
	epoch      int32
	prevEpoch  int32
	subscribed []string         // sorted, unique
	assigned   []TopicPartition // sorted; what the member was last given
	deadline   time.Time        // session end
}

// Group is one share group's membership, epochs and assignment, as the
// share-group paths of Kafka's GroupMetadataManager keep them. A Group
// is owned by its caller, which must serialise every call on it.
type Group struct {
	id              string
	epoch           int32 // group epoch
	assignmentEpoch int32 // epoch of target
	metadataHash    uint64
	members         map[string]*member
	target          map[string][]TopicPartition
}

// NewGroup returns an empty share group.
func NewGroup(id string) *Group {
	return &Group{id: id, members: map[string]*member{}, target: map[string][]TopicPartition{}}
}

// ID returns the group id.
func (g *Group) ID() string { return g.id }

// Epoch returns the group epoch.
func (g *Group) Epoch() int32 { return g.epoch }

// AssignmentEpoch returns the epoch of the target assignment.
func (g *Group) AssignmentEpoch() int32 { return g.assignmentEpoch }

// State returns "Empty" or "Stable".
func (g *Group) State() string {
	if len(g.members) == 0 {
		return StateEmpty
	}
	return StateStable
}

// Empty reports whether the group has no member.
func (g *Group) Empty() bool { return len(g.members) == 0 }

// Members returns the member ids, sorted.
func (g *Group) Members() []string {
	ids := make([]string, 0, len(g.members))
	for id := range g.members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Assignment returns the partitions member was last given (nil for an
// unknown member). The slice must not be modified.
func (g *Group) Assignment(memberID string) []TopicPartition {
	if m := g.members[memberID]; m != nil {
		return m.assigned
	}
	return nil
}

// Target returns the partitions the target assignment gives member:
// what it moves to at its next heartbeat. The slice must not be
// modified.
func (g *Group) Target(memberID string) []TopicPartition { return g.target[memberID] }

// Subscription returns member's subscribed topic names, sorted (nil for
// an unknown member). The slice must not be modified.
func (g *Group) Subscription(memberID string) []string {
	if m := g.members[memberID]; m != nil {
		return m.subscribed
	}
	return nil
}

// SetClientInfo records the client id and host a member heartbeats from,
// for ShareGroupDescribe; it changes no epoch.
func (g *Group) SetClientInfo(memberID, clientID, clientHost string) {
	if m := g.members[memberID]; m != nil {
		m.clientID, m.clientHost = clientID, clientHost
	}
}

func errResp(code int16, msg string) *kmsg.ShareGroupHeartbeatResponse {
	r := kmsg.NewPtrShareGroupHeartbeatResponse()
	r.ErrorCode = code
	r.ErrorMessage = &msg
	return r
}

// Heartbeat serves one ShareGroupHeartbeat for this group, as Kafka 4.4
// does: request checks (INVALID_REQUEST: empty or over-long member id,
// empty group id or rack, epoch 0 without SubscribedTopicNames, epoch
// below -1), leave at epoch -1 (UNKNOWN_MEMBER_ID if not a member), join
// at epoch 0 (GROUP_MAX_SIZE_REACHED when full), UNKNOWN_MEMBER_ID for
// another epoch of an unknown member, FENCED_MEMBER_EPOCH for an epoch
// above the member's or below it but not its previous one. The group
// epoch is bumped when a member joins or leaves, a subscription changes,
// or the subscribed topics' IDs or partition counts change; then the
// target assignment is recomputed with Assign. The member moves straight
// to the target (no revocation phase). The assignment is in the response
// when the member joined, sent its subscription, or its assignment
// changed. The engine answers GROUP_ID_NOT_FOUND itself for a group it
// does not know and a non-zero epoch.
func (g *Group) Heartbeat(req *kmsg.ShareGroupHeartbeatRequest, topics TopicView, now time.Time, cfg GroupConfig) *kmsg.ShareGroupHeartbeatResponse {
	cfg = cfg.withDefaults()
	switch {
	case req.MemberID == "" || len(req.MemberID) > maxMemberIDLen:
		return errResp(kerr.InvalidRequest.Code, "Invalid member id in the request.")
	case req.GroupID == "":
		return errResp(kerr.InvalidRequest.Code, "GroupId can't be empty.")
	case req.RackID != nil && *req.RackID == "":
		return errResp(kerr.InvalidRequest.Code, "RackId can't be empty.")
	case req.MemberEpoch == 0 && len(req.SubscribedTopicNames) == 0:
		return errResp(kerr.InvalidRequest.Code, "SubscribedTopicNames must be set in first request.")
	case req.MemberEpoch < -1:
		return errResp(kerr.InvalidRequest.Code, "MemberEpoch is invalid.")
	}

	m := g.members[req.MemberID]
	if req.MemberEpoch == -1 {
		if m == nil {
			return errResp(kerr.UnknownMemberID.Code, "Member "+req.MemberID+" is not a member of share group "+g.id+".")
		}
		g.removeMember(m.id)
		r := kmsg.NewPtrShareGroupHeartbeatResponse()
		r.MemberID = &req.MemberID
		r.MemberEpoch = -1
		return r
	}
	if m == nil && len(g.members) >= cfg.MaxSize {
		return errResp(kerr.GroupMaxSizeReached.Code, "The share group has reached its maximum capacity.")
	}
	if m == nil && req.MemberEpoch != 0 {
		return errResp(kerr.UnknownMemberID.Code, "Member "+req.MemberID+" is not a member of share group "+g.id+".")
	}
	if m != nil && req.MemberEpoch != 0 {
		if req.MemberEpoch > m.epoch || (req.MemberEpoch < m.epoch && req.MemberEpoch != m.prevEpoch) {
			return errResp(kerr.FencedMemberEpoch.Code, "The share group member has a stale or future member epoch.")
		}
	}

	bump := false
	if m == nil {
		m = &member{id: req.MemberID}
		g.members[m.id] = m
		bump = true
	}
	if req.RackID != nil {
		r := *req.RackID
		m.rack = &r
	}
	if req.SubscribedTopicNames != nil {
		subs := slices.Clone(req.SubscribedTopicNames)
		sort.Strings(subs)
		subs = slices.Compact(subs)
		if !slices.Equal(subs, m.subscribed) {
			m.subscribed = subs
			bump = true
		}
	}
	if h := g.hashTopics(topics); h != g.metadataHash {
		g.metadataHash = h
		bump = true
	}
	if bump {
		g.epoch++
	}
	g.maybeAssign(topics)

	prev := m.assigned
	if m.epoch != g.assignmentEpoch {
		m.prevEpoch, m.epoch = m.epoch, g.assignmentEpoch
		m.assigned = g.target[m.id]
	} else if bump {
		m.assigned = g.target[m.id]
	}
	m.deadline = now.Add(cfg.SessionTimeout)

	r := kmsg.NewPtrShareGroupHeartbeatResponse()
	r.MemberID = &req.MemberID
	r.MemberEpoch = m.epoch
	r.HeartbeatIntervalMillis = int32(cfg.HeartbeatInterval / time.Millisecond)
	if req.MemberEpoch == 0 || req.SubscribedTopicNames != nil || !slices.Equal(prev, m.assigned) {
		a := kmsg.NewShareGroupHeartbeatResponseAssignment()
		a.TopicPartitions = heartbeatAssignment(m.assigned)
		r.Assignment = &a
	}
	return r
}

// heartbeatAssignment groups sorted partitions by topic ID.
func heartbeatAssignment(tps []TopicPartition) []kmsg.ShareGroupHeartbeatResponseAssignmentTopicPartition {
	out := []kmsg.ShareGroupHeartbeatResponseAssignmentTopicPartition{}
	for _, tp := range tps {
		if n := len(out); n > 0 && out[n-1].TopicID == tp.TopicID {
			out[n-1].Partitions = append(out[n-1].Partitions, tp.Partition)
			continue
		}
		t := kmsg.NewShareGroupHeartbeatResponseAssignmentTopicPartition()
		t.TopicID = tp.TopicID
		t.Partitions = []int32{tp.Partition}
		out = append(out, t)
	}
	return out
}

// hashTopics hashes the ID and partition count of every subscribed topic
// that exists, so that a topic created, deleted, recreated or grown
// bumps the group epoch.
func (g *Group) hashTopics(topics TopicView) uint64 {
	var names []string
	for _, m := range g.members {
		names = append(names, m.subscribed...)
	}
	sort.Strings(names)
	names = slices.Compact(names)
	h := fnv.New64a()
	for _, n := range names {
		id, parts, ok := topics.TopicByName(n)
		if !ok {
			continue
		}
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write(id[:])
		h.Write([]byte{byte(parts >> 24), byte(parts >> 16), byte(parts >> 8), byte(parts)})
	}
	return h.Sum64()
}

// maybeAssign recomputes the target assignment when the group epoch
// moved past it.
func (g *Group) maybeAssign(topics TopicView) {
	if g.assignmentEpoch >= g.epoch {
		return
	}
	ms := make([]Member, 0, len(g.members))
	tm := map[string]Topic{}
	for _, m := range g.members {
		ms = append(ms, Member{ID: m.id, Topics: m.subscribed})
		for _, n := range m.subscribed {
			if _, done := tm[n]; done {
				continue
			}
			if id, parts, ok := topics.TopicByName(n); ok {
				tm[n] = Topic{ID: id, Partitions: parts}
			}
		}
	}
	g.target = Assign(ms, tm, g.target)
	g.assignmentEpoch = g.epoch
}

// removeMember drops a member and bumps the group epoch; the target is
// recomputed at the next heartbeat.
func (g *Group) removeMember(id string) {
	delete(g.members, id)
	delete(g.target, id)
	g.epoch++
}

// Expire removes the members whose session ended at or before now and
// returns their ids, sorted.
func (g *Group) Expire(now time.Time) []string {
	var gone []string
	for id, m := range g.members {
		if !m.deadline.After(now) {
			gone = append(gone, id)
		}
	}
	sort.Strings(gone)
	for _, id := range gone {
		g.removeMember(id)
	}
	return gone
}

// NextDeadline returns the earliest member session end, if any member.
func (g *Group) NextDeadline() (time.Time, bool) {
	var d time.Time
	ok := false
	for _, m := range g.members {
		if !ok || m.deadline.Before(d) {
			d, ok = m.deadline, true
		}
	}
	return d, ok
}

// Describe fills d with the group as ShareGroupDescribe shows it: state,
// epochs, assignor "simple" and the members with their assignments
// (topic names from topics; a topic it no longer knows is shown with an
// empty name). AuthorizedOperations and errors are left to the caller.
func (g *Group) Describe(d *kmsg.ShareGroupDescribeResponseGroup, topics TopicView) {
	d.GroupID = g.id
	d.GroupState = g.State()
	d.GroupEpoch = g.epoch
	d.AssignmentEpoch = g.assignmentEpoch
	d.Assignor = "simple"
	d.Members = d.Members[:0]
	for _, id := range g.Members() {
		m := g.members[id]
		dm := kmsg.NewShareGroupDescribeResponseGroupMember()
		dm.MemberID = m.id
		dm.RackID = m.rack
		dm.MemberEpoch = m.epoch
		dm.ClientID = m.clientID
		dm.ClientHost = m.clientHost
		dm.SubscribedTopicNames = slices.Clone(m.subscribed)
		if dm.SubscribedTopicNames == nil {
			dm.SubscribedTopicNames = []string{}
		}
		dm.Assignment.TopicPartitions = []kmsg.ShareGroupDescribeResponseGroupMemberAssignmentTopicPartition{}
		for _, t := range heartbeatAssignment(m.assigned) {
			dt := kmsg.NewShareGroupDescribeResponseGroupMemberAssignmentTopicPartition()
			dt.TopicID = t.TopicID
			dt.Topic, _ = topics.TopicByID(t.TopicID)
			dt.Partitions = t.Partitions
			dm.Assignment.TopicPartitions = append(dm.Assignment.TopicPartitions, dt)
		}
		d.Members = append(d.Members, dm)
	}
}
