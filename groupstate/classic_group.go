package groupstate

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// classicGroup is one classic group. Every field is owned by the loop of the
// shard that holds the group; nothing here is touched from another
// goroutine.
type classicGroup struct {
	s  *shard
	id string

	state      classicGroupState
	prevState  classicGroupState
	stateSince time.Time

	protocolType string
	protocol     string // selected protocol, "" until a join completes
	generation   int32
	leader       string // "" when the group has no members

	// upgradeAfterRefresh, when not 0, is the number of the topic
	// refresh an online upgrade waits for: the members hold partitions
	// the topic cache did not know (consumer_migration.go).
	upgradeAfterRefresh uint64

	// members holds the joined members; order keeps insertion order so
	// that leader succession and responses are deterministic.
	members map[string]*classicMember
	order   []string
	// pending holds dynamic members that got MEMBER_ID_REQUIRED and have
	// not joined yet (KIP-394).
	pending map[string]*pendingMember
	// static maps instance id → member id.
	static map[string]string
	// protoCount counts, per protocol name, the members supporting it.
	protoCount map[string]int
	// awaitingJoin counts members with a parked JoinGroup.
	awaitingJoin int
	// pendingSync holds the members that must still send SyncGroup in
	// this generation (KAFKA-12890).
	pendingSync map[string]struct{}

	// joinTimer is the rebalance (or initial delay) timer; syncTimer the
	// pending-sync timer.
	joinTimer timerRef
	syncTimer timerRef
	// anchorSent is the Anchor last handed to the store (anchor.go);
	// nil before the first.
	anchorSent *Anchor
	// emptyTimer forgets the group once it stayed Empty long enough.
	emptyTimer timerRef
	// newMemberAdded records a join during the initial delay.
	newMemberAdded bool
	// savingSync is set while the leader's assignments of generation
	// savingGen are being persisted (the syncs wait for it).
	savingSync bool
	savingGen  int32
	// handingBack is set once the group is being handed back to the
	// cluster's coordinator (classic_handback.go): its JoinGroups are
	// refused with NOT_COORDINATOR.
	handingBack bool
	// joinHold runs from a leave until the rebalance it started may
	// complete (classic_handback.go, holdJoinAfterLeave).
	joinHold timerRef
}

// classicMember is one joined member of a classic group (owned by the loop).
type classicMember struct {
	id         string
	instanceID string // "" for a dynamic member
	clientID   string
	clientHost string

	protocols        []kmsg.JoinGroupRequestProtocol
	sessionTimeout   time.Duration
	rebalanceTimeout time.Duration

	// assignment is this generation's assignment (nil before sync);
	// owned is its decoded partitions for the ownership check, replaced
	// (never mutated) on each sync so that store goroutines may read it.
	assignment []byte
	owned      map[string]map[int32]struct{}

	// joinReply and syncReply are the parked JoinGroup and SyncGroup.
	joinReply func(kmsg.Response)
	syncReply func(kmsg.Response)
	// isNew is set until the member's first join completes.
	isNew bool
	// joinAt is when the member's latest JoinGroup was parked (for
	// EventJoinCompleted).
	joinAt time.Time
	// askedAt is when the member was first told to rejoin in the current
	// rebalance (a Heartbeat or SyncGroup answered REBALANCE_IN_PROGRESS);
	// zero if it was not, or rejoined on its own. Reported and cleared at
	// EventJoinCompleted.
	askedAt time.Time
	// syncAt is when the member's SyncGroup of the current generation
	// arrived (for EventSyncCompleted); cleared when a join completes.
	syncAt time.Time
	timer  timerRef
	// sessionTimer says that timer is the session timer, armed to fire
	// at sessionFireAt; sessionDeadline is when the session really ends,
	// moved on by every heartbeat without re-arming (timers.go).
	sessionTimer                   bool
	sessionFireAt, sessionDeadline time.Time
}

// pendingMember is a member id handed out with MEMBER_ID_REQUIRED.
type pendingMember struct {
	id    string
	timer timerRef
}

// newClassicGroup creates an Empty classic group owned by s.
func newClassicGroup(s *shard, id string) *classicGroup {
	return &classicGroup{
		s:           s,
		id:          id,
		state:       stateEmpty,
		prevState:   stateEmpty,
		stateSince:  s.e.clock.Now(),
		members:     make(map[string]*classicMember),
		pending:     make(map[string]*pendingMember),
		static:      make(map[string]string),
		protoCount:  make(map[string]int),
		pendingSync: make(map[string]struct{}),
	}
}

// transitionTo moves the group to next, refusing (and logging) an illegal
// move. It reports whether the move happened.
func (g *classicGroup) transitionTo(next classicGroupState) bool {
	if !canTransition(g.state, next) {
		g.s.e.illegalTransitions.Add(1)
		g.s.e.log.Error("groupstate: illegal group state transition refused",
			"group", g.id, "from", g.state.String(), "to", next.String())
		return false
	}
	g.prevState = g.state
	g.state = next
	g.stateSince = g.s.e.clock.Now()
	return true
}

// newMemberID mints a member id: prefix, a dash and a random UUID, as
// Kafka does.
func newMemberID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	var buf [36]byte
	hex.Encode(buf[0:8], b[0:4])
	buf[8] = '-'
	hex.Encode(buf[9:13], b[4:6])
	buf[13] = '-'
	hex.Encode(buf[14:18], b[6:8])
	buf[18] = '-'
	hex.Encode(buf[19:23], b[8:10])
	buf[23] = '-'
	hex.Encode(buf[24:], b[10:])
	return prefix + "-" + string(buf[:])
}

// supportsProtocols reports whether a member with these protocols may
// join: an Empty group needs a type and protocols; otherwise the type must
// match and one protocol must be supported by every current member.
func (g *classicGroup) supportsProtocols(protocolType string, protocols []kmsg.JoinGroupRequestProtocol) bool {
	if len(g.members) == 0 {
		return protocolType != "" && len(protocols) > 0
	}
	if protocolType != g.protocolType {
		return false
	}
	for _, p := range protocols {
		if g.protoCount[p.Name] == len(g.members) {
			return true
		}
	}
	return false
}

// countProtocols adds delta to the support count of each of protocols.
func (g *classicGroup) countProtocols(protocols []kmsg.JoinGroupRequestProtocol, delta int) {
	for _, p := range protocols {
		n := g.protoCount[p.Name] + delta
		if n <= 0 {
			delete(g.protoCount, p.Name)
		} else {
			g.protoCount[p.Name] = n
		}
	}
}

// add inserts m; the first member fixes the protocol type and leads.
func (g *classicGroup) add(m *classicMember, protocolType string) {
	if len(g.members) == 0 {
		g.protocolType = protocolType
	}
	g.members[m.id] = m
	g.order = append(g.order, m.id)
	g.countProtocols(m.protocols, 1)
	if m.instanceID != "" {
		g.static[m.instanceID] = m.id
	}
	if m.joinReply != nil {
		g.awaitingJoin++
	}
	if g.leader == "" {
		g.leader = m.id
	}
	g.anchorChanged()
}

// remove deletes member id from the group's books (no rebalance logic).
// Its parked JoinGroup and SyncGroup are answered UNKNOWN_MEMBER_ID so
// that no connection waits forever, and its timer is cancelled.
func (g *classicGroup) remove(id string) *classicMember {
	m, ok := g.members[id]
	if !ok {
		return nil
	}
	if m.joinReply != nil {
		g.awaitingJoin--
		m.answerJoin(joinError(errUnknownMemberID, id))
	}
	if m.syncReply != nil {
		m.answerSync(syncError(errUnknownMemberID))
	}
	stopTimer(m.timer)
	m.timer = timerRef{}
	delete(g.members, id)
	for i, oid := range g.order {
		if oid == id {
			g.order = append(g.order[:i], g.order[i+1:]...)
			break
		}
	}
	g.countProtocols(m.protocols, -1)
	if m.instanceID != "" && g.static[m.instanceID] == id {
		delete(g.static, m.instanceID)
	}
	delete(g.pendingSync, id)
	if g.leader == id {
		g.leader = ""
		if len(g.order) > 0 {
			g.leader = g.order[0]
		}
	}
	g.anchorChanged()
	return m
}

// setProtocols replaces m's protocols, keeping the support counts right.
func (g *classicGroup) setProtocols(m *classicMember, protocols []kmsg.JoinGroupRequestProtocol) {
	g.countProtocols(m.protocols, -1)
	m.protocols = protocols
	g.countProtocols(m.protocols, 1)
}

// parkJoin records reply as m's parked JoinGroup. An older parked JoinGroup of
// the same member (a client retry) is answered REBALANCE_IN_PROGRESS so
// that its connection is not held forever.
func (g *classicGroup) parkJoin(m *classicMember, reply func(kmsg.Response)) {
	if m.joinReply != nil {
		m.answerJoin(joinError(errRebalanceInProgress, m.id))
	} else {
		g.awaitingJoin++
	}
	m.joinReply = reply
	m.joinAt = g.s.e.clock.Now()
}

// allJoined reports whether every member has a parked JoinGroup and no
// KIP-394 member is still pending.
func (g *classicGroup) allJoined() bool {
	return g.awaitingJoin == len(g.members) && len(g.pending) == 0
}

// rebalanceTimeout is the largest rebalance timeout among members (KIP-62).
func (g *classicGroup) rebalanceTimeout() time.Duration {
	var max time.Duration
	for _, m := range g.members {
		if m.rebalanceTimeout > max {
			max = m.rebalanceTimeout
		}
	}
	return max
}

// selectProtocol runs Kafka's vote: among protocols every member
// supports, each member votes for the first one in its own order; most
// votes wins, ties going to the leader's preference order.
func (g *classicGroup) selectProtocol() string {
	votes := make(map[string]int)
	for _, id := range g.order {
		for _, p := range g.members[id].protocols {
			if g.protoCount[p.Name] == len(g.members) {
				votes[p.Name]++
				break
			}
		}
	}
	best, bestVotes := "", -1
	consider := func(name string) {
		if v, ok := votes[name]; ok && v > bestVotes {
			best, bestVotes = name, v
		}
	}
	if l, ok := g.members[g.leader]; ok {
		for _, p := range l.protocols {
			consider(p.Name)
		}
	}
	for _, id := range g.order {
		for _, p := range g.members[id].protocols {
			consider(p.Name)
		}
	}
	return best
}

// metadataFor returns m's metadata for protocol.
func (m *classicMember) metadataFor(protocol string) []byte {
	for _, p := range m.protocols {
		if p.Name == protocol {
			return p.Metadata
		}
	}
	return nil
}

// sameProtocols reports whether protocols equals m's, in order and bytes.
func (m *classicMember) sameProtocols(protocols []kmsg.JoinGroupRequestProtocol) bool {
	if len(protocols) != len(m.protocols) {
		return false
	}
	for i := range protocols {
		if protocols[i].Name != m.protocols[i].Name || !bytes.Equal(protocols[i].Metadata, m.protocols[i].Metadata) {
			return false
		}
	}
	return true
}

// answerJoin completes m's parked JoinGroup.
func (m *classicMember) answerJoin(resp *kmsg.JoinGroupResponse) {
	reply := m.joinReply
	m.joinReply = nil
	if reply != nil {
		reply(resp)
	}
}

// answerSync completes m's parked SyncGroup.
func (m *classicMember) answerSync(resp *kmsg.SyncGroupResponse) {
	reply := m.syncReply
	m.syncReply = nil
	if reply != nil {
		reply(resp)
	}
}

// validateMember checks a member's identity as Kafka's validateMember
// does: a given instance id must map to exactly this member id.
func (g *classicGroup) validateMember(memberID string, instanceID *string) int16 {
	if instanceID != nil {
		existing, ok := g.static[*instanceID]
		if !ok {
			return errUnknownMemberID
		}
		if existing != memberID {
			return errFencedInstanceID
		}
		return errNone
	}
	if _, ok := g.members[memberID]; !ok {
		return errUnknownMemberID
	}
	return errNone
}

// public converts m for events and snapshots.
func (m *classicMember) public(withAssignment bool) Member {
	pm := Member{MemberID: m.id, InstanceID: m.instanceID, ClientID: m.clientID, ClientHost: m.clientHost, Protocol: MemberProtocolClassic}
	if withAssignment {
		pm.Assignment = m.assignment
	}
	return pm
}

// membersList lists the members in join order.
func (g *classicGroup) membersList(withAssignment bool) []Member {
	out := make([]Member, 0, len(g.order))
	for _, id := range g.order {
		out = append(out, g.members[id].public(withAssignment))
	}
	return out
}

// snapshot copies the group's state.
func (g *classicGroup) snapshot() GroupSnapshot {
	return GroupSnapshot{
		Group:        g.id,
		State:        g.state.String(),
		ProtocolType: g.protocolType,
		Protocol:     g.protocol,
		Generation:   g.generation,
		Leader:       g.leader,
		Members:      g.membersList(true),
		StateSince:   g.stateSince,
	}
}

// event returns an Event of kind stamped with the group's current state.
func (g *classicGroup) event(kind EventKind) Event {
	return Event{
		Time:         g.s.e.clock.Now(),
		Kind:         kind,
		Group:        g.id,
		GroupType:    GroupTypeClassic,
		Generation:   g.generation,
		State:        g.state.String(),
		ProtocolType: g.protocolType,
		Protocol:     g.protocol,
		Leader:       g.leader,
	}
}

// emitMember emits an event about one member.
func (g *classicGroup) emitMember(kind EventKind, m *classicMember, cause string) {
	if g.s.e.cfg.Events == nil {
		return
	}
	ev := g.event(kind)
	pm := m.public(false)
	ev.Member = &pm
	ev.Cause = cause
	g.s.emit(ev)
}

// emptyConsumerAssignment is a serialized empty consumer-protocol
// assignment (version 0, no topics, no user data).
var emptyConsumerAssignment = func() []byte {
	a := kmsg.NewConsumerMemberAssignment()
	return a.AppendTo(nil)
}()

// assignmentFor returns the bytes to send m in SyncGroup: its assignment,
// or a valid empty consumer assignment when it has none and the protocol
// type is "consumer" (some clients fail to decode zero bytes).
func (g *classicGroup) assignmentFor(m *classicMember) []byte {
	if len(m.assignment) == 0 && g.protocolType == "consumer" {
		return emptyConsumerAssignment
	}
	if m.assignment == nil {
		return []byte{}
	}
	return m.assignment
}

// decodeOwned decodes a consumer-protocol assignment into a partition set;
// it returns nil when the bytes do not decode.
func decodeOwned(assignment []byte) map[string]map[int32]struct{} {
	if len(assignment) == 0 {
		return map[string]map[int32]struct{}{}
	}
	var a kmsg.ConsumerMemberAssignment
	if err := a.ReadFrom(assignment); err != nil {
		return nil
	}
	owned := make(map[string]map[int32]struct{}, len(a.Topics))
	for _, t := range a.Topics {
		ps := owned[t.Topic]
		if ps == nil {
			ps = make(map[int32]struct{}, len(t.Partitions))
			owned[t.Topic] = ps
		}
		for _, p := range t.Partitions {
			ps[p] = struct{}{}
		}
	}
	return owned
}
