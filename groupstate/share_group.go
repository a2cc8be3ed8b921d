package groupstate

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/share"
)

// Share groups (KIP-932), the engine's third kind of group. Membership
// and assignment (share.Group) and the state of each share-partition
// the group's members fetched (share.Partition) live on the loop that
// owns the group, like every other group; the share package holds the
// rules, this file the loop's timers and the engine's entry points. The
// records themselves never pass through the engine: the share service
// of the data path (package shares) fetches them from the brokers and
// asks the engine which offsets each member acquires (share_ops.go).

// KindShare is a share group (ListGroups type "share", KIP-932).
const KindShare GroupKind = "share"

// ShareSettings are a share group's settings: Kafka's share.* GROUP
// configs and group.share.* broker configs. A zero field means Kafka's
// default.
type ShareSettings struct {
	SessionTimeout    time.Duration // share.session.timeout.ms, 45s
	HeartbeatInterval time.Duration // share.heartbeat.interval.ms, 5s
	LockDuration      time.Duration // share.record.lock.duration.ms, 30s
	DeliveryLimit     int           // share.delivery.count.limit, 5
	MaxRecordLocks    int           // share.partition.max.record.locks, 2000
	MaxSize           int           // group.share.max.size, 200
	// AutoOffsetReset is share.auto.offset.reset, where a
	// share-partition starts: "latest" (the default), "earliest" or
	// "by_duration:<ISO-8601 duration>" (ShareResetDuration).
	AutoOffsetReset string
	// ReadCommitted is share.isolation.level=read_committed.
	ReadCommitted bool
	// RenewDisabled is share.renew.acknowledge.enable=false: a Renew
	// acknowledgement (KIP-1222) is answered INVALID_RECORD_STATE.
	RenewDisabled bool
}

// kafkaShareDefaults are Kafka's defaults of a share group's settings
// (GroupConfig, ShareGroupConfig).
var kafkaShareDefaults = ShareSettings{
	SessionTimeout:    45 * time.Second,
	HeartbeatInterval: 5 * time.Second,
	LockDuration:      30 * time.Second,
	DeliveryLimit:     5,
	MaxRecordLocks:    2000,
	MaxSize:           200,
	AutoOffsetReset:   "latest",
}

// withDefaults fills Kafka's defaults.
func (c ShareSettings) withDefaults() ShareSettings { return c.over(kafkaShareDefaults) }

// limits are the share-partition limits of c.
func (c ShareSettings) limits() share.Limits {
	return share.Limits{LockDuration: c.LockDuration, DeliveryLimit: c.DeliveryLimit, MaxLocks: c.MaxRecordLocks}
}

// shareSettings returns group's settings.
func (e *Engine) shareSettings(group string) ShareSettings {
	var c ShareSettings
	switch {
	case e.cfg.ShareSettings != nil:
		c = e.cfg.ShareSettings(group)
	case e.cfg.GroupSettings != nil:
		c = e.cfg.GroupSettings(group).Share
	}
	return c.over(e.cfg.ShareDefaults).withDefaults()
}

// over fills the zero durations, limits and offset reset of c from d (a
// group's own configs over the cluster's broker settings, over Kafka's
// defaults).
func (c ShareSettings) over(d ShareSettings) ShareSettings {
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = d.SessionTimeout
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = d.HeartbeatInterval
	}
	if c.LockDuration <= 0 {
		c.LockDuration = d.LockDuration
	}
	if c.DeliveryLimit <= 0 {
		c.DeliveryLimit = d.DeliveryLimit
	}
	if c.MaxRecordLocks <= 0 {
		c.MaxRecordLocks = d.MaxRecordLocks
	}
	if c.MaxSize <= 0 {
		c.MaxSize = d.MaxSize
	}
	if c.AutoOffsetReset == "" {
		c.AutoOffsetReset = d.AutoOffsetReset
	}
	return c
}

// ShareTP names one share-partition of a group: a topic by id and a
// partition.
type ShareTP = share.TopicPartition

// shareGroup is a share group held by a shard. Every field is owned by
// the shard's loop.
type shareGroup struct {
	s  *shard
	id string
	g  *share.Group
	// parts holds the share-partitions fetched so far; a partition is
	// added when a member first fetches it and the share service has
	// resolved its start offset (ShareInitialize).
	parts map[ShareTP]*share.Partition
	// sessionTimer fires at the earliest member session deadline,
	// lockTimer at the earliest acquisition-lock deadline.
	sessionTimer timerRef
	lockTimer    timerRef
	lockAt       time.Time // when lockTimer fires; zero when unarmed
	since        time.Time // when the group entered its state
	lastState    string
	// recordWriter writes the group's record, coalescing its writes
	// (record_writer.go, share_persist.go).
	recordWriter
}

func newShareGroup(s *shard, id string) *shareGroup {
	now := s.e.clock.Now()
	g := &shareGroup{s: s, id: id, g: share.NewGroup(id), parts: make(map[ShareTP]*share.Partition), since: now, lastState: "Empty"}
	g.initWriter(s, id, g)
	return g
}

// shareOf returns the share group held under id.
func (s *shard) shareOf(id string) (*shareGroup, bool) {
	g, ok := s.groups[id].(*shareGroup)
	return g, ok
}

func (g *shareGroup) live() bool              { return g.s.groups[g.id] == group(g) }
func (g *shareGroup) groupKind() GroupKind    { return KindShare }
func (g *shareGroup) held() bool              { return true }
func (g *shareGroup) settings() ShareSettings { return g.s.e.shareSettings(g.id) }

func (g *shareGroup) listEntry() kmsg.ListGroupsResponseGroup {
	lg := kmsg.NewListGroupsResponseGroup()
	lg.Group, lg.ProtocolType, lg.GroupState, lg.GroupType = g.id, "share", g.g.State(), string(KindShare)
	return lg
}

// snapshot describes the group with its members' client ids, hosts,
// epochs and assignments (encoded as a consumer-protocol assignment with
// topic names, as consumer groups' are; a topic the cache no longer
// knows is named by its id in hex).
func (g *shareGroup) snapshot() GroupSnapshot {
	snap := GroupSnapshot{Group: g.id, State: g.g.State(), ProtocolType: "share", Protocol: "simple", Generation: g.g.Epoch(), StateSince: g.since}
	snap.Members = g.members()
	return snap
}

// members lists the members as Describe shows them, sorted by id.
func (g *shareGroup) members() []Member {
	d := kmsg.NewShareGroupDescribeResponseGroup()
	g.g.Describe(&d, shareTopics{g.s.e.topicsNow()})
	out := make([]Member, 0, len(d.Members))
	for _, dm := range d.Members {
		a := kmsg.NewConsumerMemberAssignment()
		for _, t := range dm.Assignment.TopicPartitions {
			name := t.Topic
			if name == "" {
				name = fmt.Sprintf("%x", t.TopicID[:])
			}
			a.Topics = append(a.Topics, kmsg.ConsumerMemberAssignmentTopic{Topic: name, Partitions: t.Partitions})
		}
		out = append(out, Member{MemberID: dm.MemberID, ClientID: dm.ClientID, ClientHost: dm.ClientHost, Protocol: "share",
			Epoch: dm.MemberEpoch, Assignment: a.AppendTo(nil)})
	}
	return out
}

func (g *shareGroup) unload(code int16, cause string) {
	g.teardown()
	g.failWaiters(code)
	if g.s.e.cfg.Events != nil {
		ev := g.event(EventGroupUnloaded)
		ev.Cause = cause
		g.s.emit(ev)
	}
	g.s.drop(g.id, g)
	delete(g.s.known, g.id)
}

func (g *shareGroup) teardown() {
	g.failWaiters(errCoordinatorNotAvailable)
	stopTimer(g.sessionTimer)
	stopTimer(g.lockTimer)
	g.sessionTimer, g.lockTimer, g.lockAt = timerRef{}, timerRef{}, time.Time{}
}

// event returns an event about the group of kind k.
func (g *shareGroup) event(k EventKind) Event {
	return Event{Time: g.s.e.clock.Now(), Kind: k, Group: g.id, GroupType: GroupTypeShare, Generation: g.g.Epoch(), State: g.g.State(), ProtocolType: "share", Protocol: "simple"}
}

// emitEpoch emits the events of an assignment change, which tap traces
// as it traces a KIP-848 reconciliation: EventRebalanceStarted when the
// group epoch moved past prevEpoch (with cause and the member that
// caused it), then EventGroupEmpty when no member is left, or
// EventAssignmentReconciled (every member with its target) once the
// target assignment moved past prevAssigned and caught up with the
// epoch. A member joining or changing its subscription gets both at once;
// after a member left or expired the target is recomputed at the next
// heartbeat of another member (share.Group), which emits the second.
// Runs on the loop after the group changed.
func (g *shareGroup) emitEpoch(cause string, by *Member, prevEpoch, prevAssigned int32) {
	if g.s.e.cfg.Events == nil {
		return
	}
	if g.g.Epoch() > prevEpoch {
		ev := g.event(EventRebalanceStarted)
		ev.Cause, ev.Member = cause, by
		g.s.emit(ev)
		if g.g.Empty() {
			g.s.emit(g.event(EventGroupEmpty))
			return
		}
	}
	if a := g.g.AssignmentEpoch(); a > prevAssigned && a == g.g.Epoch() && !g.g.Empty() {
		ev := g.event(EventAssignmentReconciled)
		topics := g.s.e.topicsNow()
		ev.Members = g.members()
		for i := range ev.Members {
			ev.Members[i].Assignment = encodeShareAssignment(g.g.Target(ev.Members[i].MemberID), topics)
		}
		g.s.emit(ev)
	}
}

// encodeShareAssignment encodes tps (sorted by topic id) as a
// consumer-protocol assignment with topic names, a topic the cache does
// not know named by its id in hex.
func encodeShareAssignment(tps []share.TopicPartition, topics *topicSnapshot) []byte {
	a := kmsg.NewConsumerMemberAssignment()
	for _, tp := range tps {
		if n := len(a.Topics); n > 0 && a.Topics[n-1].Topic == topicName(topics, tp.TopicID) {
			a.Topics[n-1].Partitions = append(a.Topics[n-1].Partitions, tp.Partition)
			continue
		}
		a.Topics = append(a.Topics, kmsg.ConsumerMemberAssignmentTopic{Topic: topicName(topics, tp.TopicID), Partitions: []int32{tp.Partition}})
	}
	return a.AppendTo(nil)
}

// topicName names id from the topic cache, or by its id in hex.
func topicName(topics *topicSnapshot, id [16]byte) string {
	if n := topics.byID[id]; n != "" {
		return n
	}
	return fmt.Sprintf("%x", id[:])
}

// noteState records when the group's state changed.
func (g *shareGroup) noteState() {
	if st := g.g.State(); st != g.lastState {
		g.lastState, g.since = st, g.s.e.clock.Now()
	}
}

// armSessionTimer arms the group's session timer at the earliest member
// deadline; when it fires the expired members are removed and their
// acquired records released.
func (g *shareGroup) armSessionTimer() {
	stopTimer(g.sessionTimer)
	g.sessionTimer = timerRef{}
	at, ok := g.g.NextDeadline()
	if !ok {
		return
	}
	d := max(at.Sub(g.s.e.clock.Now()), 0)
	g.sessionTimer = g.s.arm(d, func(id uint64) {
		if !g.live() || g.sessionTimer.id != id {
			return
		}
		g.sessionTimer = timerRef{}
		prevEpoch, prevAssigned := g.g.Epoch(), g.g.AssignmentEpoch()
		// The members' client ids and hosts, for the events: they are
		// gone from the group once expired. The timer fires at a
		// session deadline, seldom.
		who := map[string]Member{}
		if g.s.e.cfg.Events != nil {
			for _, m := range g.members() {
				who[m.MemberID] = Member{MemberID: m.MemberID, ClientID: m.ClientID, ClientHost: m.ClientHost}
			}
		}
		expired := g.g.Expire(g.s.e.clock.Now())
		if len(expired) > 0 {
			g.markDirty()
		}
		for _, m := range expired {
			g.s.e.log.Info("groupstate: share group member expired", "group", g.id, "member", m)
			g.releaseMember(m)
			if g.s.e.cfg.Events != nil {
				ev := g.event(EventMemberExpired)
				gone := who[m]
				gone.MemberID = m
				ev.Member, ev.Cause = &gone, "session_timeout"
				g.s.emit(ev)
			}
		}
		if len(expired) > 0 {
			first := who[expired[0]]
			first.MemberID = expired[0]
			g.emitEpoch(CauseMemberExpired, &first, prevEpoch, prevAssigned)
		}
		g.noteState()
		g.armSessionTimer()
		g.persistThen(nil)
	})
}

// releaseMember makes the records member acquired available again.
func (g *shareGroup) releaseMember(member string) {
	l := g.settings().limits()
	for _, p := range g.parts {
		before := p.ArchivedAtLimit()
		if p.ReleaseMember(member, l) > 0 {
			g.markDirty()
		}
		g.s.e.shareMetrics.countArchived(p, before)
	}
}

// armLockTimer arms the lock timer at the earliest acquisition-lock
// deadline of any share-partition, if it is earlier than the armed one.
func (g *shareGroup) armLockTimer() {
	var next time.Time
	for _, p := range g.parts {
		if at, ok := p.NextDeadline(); ok && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	if next.IsZero() || (!g.lockAt.IsZero() && !next.Before(g.lockAt)) {
		return
	}
	stopTimer(g.lockTimer)
	g.lockAt = next
	d := max(next.Sub(g.s.e.clock.Now()), 0)
	g.lockTimer = g.s.arm(d, func(id uint64) {
		if !g.live() || g.lockTimer.id != id {
			return
		}
		g.lockTimer, g.lockAt = timerRef{}, time.Time{}
		now, l := g.s.e.clock.Now(), g.settings().limits()
		released := 0
		for _, p := range g.parts {
			before := p.ArchivedAtLimit()
			released += p.ExpireLocks(now, l)
			g.s.e.shareMetrics.countArchived(p, before)
		}
		if released > 0 {
			g.markDirty()
			g.persistThen(nil)
			g.s.e.shareMetrics.lockTimeouts.Add(int64(released))
			g.s.e.log.Debug("groupstate: share acquisition locks timed out", "group", g.id, "records", released)
		}
		g.armLockTimer()
	})
}
