package groupstate

import (
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// classicClient mimics a cooperative classic consumer: it owns what its
// last SyncGroup gave it (revoking the rest at once) and reports what it
// owns in its JoinGroup metadata.
type classicClient struct {
	id    string
	gen   int32
	owned []int32 // partitions of topic "t"
}

// coopProtocol is a cooperative-sticky protocol subscribing to "t" and
// reporting owned (consumer protocol v1).
func coopProtocol(owned []int32) []kmsg.JoinGroupRequestProtocol {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 1
	meta.Topics = []string{"t"}
	if len(owned) > 0 {
		meta.OwnedPartitions = []kmsg.ConsumerMemberMetadataOwnedPartition{{Topic: "t", Partitions: append([]int32(nil), owned...)}}
	}
	return []kmsg.JoinGroupRequestProtocol{{Name: "cooperative-sticky", Metadata: meta.AppendTo(nil)}}
}

// partsOf decodes the partitions of topic "t" in a consumer assignment.
func partsOf(t testing.TB, assign []byte) []int32 {
	t.Helper()
	owned := decodeOwned(assign)
	if owned == nil {
		t.Fatalf("assignment %x does not decode", assign)
	}
	var out []int32
	for p := range owned["t"] {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// classicGroupOf builds a Stable classic group whose members speak
// cooperative-sticky, member i holding assign[i] of topic "t".
func (h *consumerHarness) classicGroupOf(group string, assign ...[]int32) []*classicClient {
	h.t.Helper()
	n := len(assign)
	ids := make([]string, n)
	for i := range ids {
		resp := h.do(jr{group: group, version: 9, protocols: coopProtocol(nil)}.req()).(*kmsg.JoinGroupResponse)
		ids[i] = resp.MemberID
	}
	calls := make([]*call, n)
	for i, id := range ids {
		calls[i] = h.send(jr{group: group, member: id, version: 9, protocols: coopProtocol(nil)}.req())
	}
	var leader string
	var gen int32
	for _, c := range calls {
		r := joinResp(h.t, c, errNone)
		leader, gen = r.LeaderID, r.Generation
	}
	ordered := []string{leader}
	for _, id := range ids {
		if id != leader {
			ordered = append(ordered, id)
		}
	}
	given := map[string][]byte{}
	for i, id := range ordered {
		given[id] = assignment("t", assign[i]...)
	}
	got := h.syncAll(group, gen, ordered, given)
	out := make([]*classicClient, n)
	for i, id := range ordered {
		out[i] = &classicClient{id: id, gen: gen, owned: partsOf(h.t, got[id])}
	}
	return out
}

// classicRejoin makes c rejoin (JoinGroup with its owned partitions,
// then SyncGroup) until it gets an assignment.
func (h *consumerHarness) classicRejoin(group string, c *classicClient) {
	h.t.Helper()
	for try := 0; try < 5; try++ {
		jresp := h.do(jr{group: group, member: c.id, version: 9, protocols: coopProtocol(c.owned)}.req()).(*kmsg.JoinGroupResponse)
		if jresp.ErrorCode != errNone {
			h.t.Fatalf("classic rejoin %s: %s", c.id, errName(jresp.ErrorCode))
		}
		if jresp.LeaderID != "" || len(jresp.Members) != 0 || jresp.Protocol == nil || *jresp.Protocol != "cooperative-sticky" {
			h.t.Fatalf("classic join to a consumer group: leader %q, %d members, protocol %v", jresp.LeaderID, len(jresp.Members), jresp.Protocol)
		}
		c.gen = jresp.Generation
		sr := syncReq(group, c.id, c.gen, nil)
		pt, name := "consumer", "cooperative-sticky"
		sr.ProtocolType, sr.Protocol = &pt, &name
		sresp := h.do(sr).(*kmsg.SyncGroupResponse)
		switch sresp.ErrorCode {
		case errNone:
			c.owned = partsOf(h.t, sresp.MemberAssignment)
			return
		case errRebalanceInProgress:
			continue
		default:
			h.t.Fatalf("classic sync %s: %s", c.id, errName(sresp.ErrorCode))
		}
	}
	h.t.Fatalf("classic member %s never got an assignment", c.id)
}

// checkMixedDisjoint fails if two members, of either protocol, own the
// same partition of "t".
func (h *consumerHarness) checkMixedDisjoint(cls []*classicClient, cons []*client) map[int32]string {
	h.t.Helper()
	tid := h.topicID("t")
	seen := map[int32]string{}
	claim := func(p int32, who string) {
		if o, dup := seen[p]; dup {
			h.t.Fatalf("partition %d owned by %s and %s", p, o, who)
		}
		seen[p] = who
	}
	for _, c := range cls {
		for _, p := range c.owned {
			claim(p, c.id)
		}
	}
	for _, c := range cons {
		for p := range c.owned[tid] {
			claim(p, c.id)
		}
	}
	return seen
}

// settleMixed drives every member as its client would (classic ones
// rejoin when a heartbeat says REBALANCE_IN_PROGRESS) until the group is
// Stable with every partition of "t" owned, checking after every step
// that no partition has two owners.
func (h *consumerHarness) settleMixed(group string, partitions int, cls []*classicClient, cons []*client) {
	h.t.Helper()
	for round := 0; round < 30; round++ {
		calm := true
		for _, c := range cls {
			switch code := h.heartbeat(group, c.id, c.gen); code {
			case errNone:
			case errRebalanceInProgress:
				calm = false
				h.classicRejoin(group, c)
			default:
				h.t.Fatalf("classic heartbeat %s gen %d: %s", c.id, c.gen, errName(code))
			}
			h.checkMixedDisjoint(cls, cons)
		}
		for _, c := range cons {
			h.beat(group, c)
			h.checkMixedDisjoint(cls, cons)
		}
		d := h.describe(group)
		if !calm || d.State != "Stable" {
			continue
		}
		at := true
		for _, c := range cls {
			at = at && c.gen == d.AssignmentEpoch
		}
		for _, c := range cons {
			at = at && c.epoch == d.AssignmentEpoch
		}
		if at && len(h.checkMixedDisjoint(cls, cons)) == partitions {
			return
		}
	}
	h.t.Fatalf("group %s did not settle: %+v", group, h.describe(group))
}

// memberTypes counts the members of a ConsumerGroupDescribe by type.
func memberTypes(d kmsg.ConsumerGroupDescribeResponseGroup) (classic, consumer int) {
	for _, m := range d.Members {
		if m.MemberType == 0 {
			classic++
		} else {
			consumer++
		}
	}
	return classic, consumer
}

func TestOnlineUpgradeAndDowngrade(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 4})
	cls := h.classicGroupOf("g", []int32{0, 1}, []int32{2, 3})
	gen := cls[0].gen
	h.takeEvents("g")

	// The first KIP-848 member converts the group; the classic members'
	// partitions are carried over, so it gets none yet.
	x := h.join("g", "x", "t")
	if x.epoch != gen+1 || x.owned.size() != 0 {
		t.Fatalf("joining member: epoch %d owns %v, want epoch %d and nothing", x.epoch, x.owned, gen+1)
	}
	d := h.describe("g")
	if c, k := memberTypes(d); d.ErrorCode != errNone || c != 2 || k != 1 || d.Epoch != gen+1 {
		t.Fatalf("after upgrade: %+v (classic %d, consumer %d)", d, c, k)
	}
	evs := h.takeEvents("g")
	if !slices.ContainsFunc(evs, func(ev Event) bool {
		return ev.Kind == EventGroupConverted && ev.Cause == CauseConvertedToConsumer && ev.Member != nil && ev.Member.MemberID == "x" && len(ev.Members) == 2
	}) {
		t.Fatalf("no group_converted(converted_to_consumer) event: %v", kinds(evs))
	}
	// DescribeGroups answers as Kafka does for a consumer group.
	dg := kmsg.NewPtrDescribeGroupsRequest()
	dg.Groups = []string{"g"}
	if r := h.do(dg).(*kmsg.DescribeGroupsResponse); r.Groups[0].ErrorCode != errGroupIDNotFound {
		t.Fatalf("DescribeGroups of a consumer group: %s", errName(r.Groups[0].ErrorCode))
	}
	// A classic member still at its generation commits; a wrong
	// generation is ILLEGAL_GENERATION.
	if code := commitCode(t, h.do(commitReq(8, "g", cls[0].id, gen, 0, 42))); code != errNone {
		t.Fatalf("classic commit in the upgraded group: %s", errName(code))
	}
	if code := commitCode(t, h.do(commitReq(8, "g", cls[0].id, gen+5, 0, 43))); code != errIllegalGeneration {
		t.Fatalf("classic commit at a wrong generation: %s", errName(code))
	}
	// Heartbeats tell the classic members to rejoin; revoke before
	// assign holds across both protocols.
	if code := h.heartbeat("g", cls[0].id, gen); code != errRebalanceInProgress {
		t.Fatalf("classic heartbeat behind the group epoch: %s", errName(code))
	}
	h.settleMixed("g", 4, cls, []*client{x})
	if x.owned.size() == 0 {
		t.Fatalf("the KIP-848 member got nothing after settling")
	}
	if got := h.storedOffset("g", 0); got != 42 {
		t.Fatalf("committed offset after upgrade: %d", got)
	}
	snap, ok := h.e.Group("g")
	if !ok || snap.ProtocolType != "consumer" {
		t.Fatalf("snapshot: %+v", snap)
	}
	protos := map[string]string{}
	for _, m := range snap.Members {
		protos[m.MemberID] = m.Protocol
	}
	if protos["x"] != MemberProtocolConsumer || protos[cls[0].id] != MemberProtocolClassic || protos[cls[1].id] != MemberProtocolClassic {
		t.Fatalf("member protocols in the snapshot: %v", protos)
	}

	// The last KIP-848 member leaves: the group is classic again, at
	// generation = group epoch, and rebalances.
	h.takeEvents("g")
	h.consumerResp(consumerBeat("g", "x", epochLeave, nil), errNone)
	snap, _ = h.e.Group("g")
	if snap.State != statePreparingRebalance.String() || len(snap.Members) != 2 || snap.Members[0].Protocol != MemberProtocolClassic {
		t.Fatalf("after downgrade: %+v", snap)
	}
	evs = h.takeEvents("g")
	if !slices.ContainsFunc(evs, func(ev Event) bool {
		return ev.Kind == EventGroupConverted && ev.Cause == CauseConvertedToClassic && ev.Member != nil && ev.Member.MemberID == "x"
	}) || !slices.Contains(kinds(evs), "rebalance_started("+CauseConvertedToClassic+")") {
		t.Fatalf("downgrade events: %v", kinds(evs))
	}
	if d := h.describe("g"); d.ErrorCode != errGroupIDNotFound {
		t.Fatalf("ConsumerGroupDescribe after downgrade: %s", errName(d.ErrorCode))
	}
	// The classic members rejoin a classic rebalance and sync as usual.
	calls := make([]*call, len(cls))
	for i, c := range cls {
		calls[i] = h.send(jr{group: "g", member: c.id, version: 9, protocols: coopProtocol(c.owned)}.req())
	}
	var leader string
	var newGen int32
	for _, c := range calls {
		r := joinResp(t, c, errNone)
		leader, newGen = r.LeaderID, r.Generation
	}
	if newGen <= snap.Generation {
		t.Fatalf("generation after the downgrade rebalance %d, converted at %d", newGen, snap.Generation)
	}
	ids := []string{leader}
	for _, c := range cls {
		if c.id != leader {
			ids = append(ids, c.id)
		}
	}
	h.syncAll("g", newGen, ids, map[string][]byte{ids[0]: assignment("t", 0, 1), ids[1]: assignment("t", 2, 3)})
	if snap, _ := h.e.Group("g"); snap.State != stateStable.String() {
		t.Fatalf("classic group after the rebalance: %+v", snap)
	}
	if got := h.storedOffset("g", 0); got != 42 {
		t.Fatalf("committed offset after downgrade: %d", got)
	}
}

func TestClassicMemberSessionExpiresInsideConsumerGroup(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 4})
	cls := h.classicGroupOf("g", []int32{0, 1}, []int32{2, 3})
	x := h.join("g", "x", "t")
	h.settleMixed("g", 4, cls, []*client{x})
	before := h.describe("g").Epoch
	h.takeEvents("g")
	// cls[1] goes silent; its 10 s session expires while x and cls[0]
	// keep heartbeating (x's session is 45 s).
	for i := 0; i < 3; i++ {
		h.advance(4 * time.Second)
		h.beat("g", x)
		if code := h.heartbeat("g", cls[0].id, cls[0].gen); code != errNone && code != errRebalanceInProgress {
			t.Fatalf("heartbeat: %s", errName(code))
		}
	}
	evs := h.takeEvents("g")
	if !slices.ContainsFunc(evs, func(ev Event) bool {
		return ev.Kind == EventMemberExpired && ev.Cause == "session_timeout" && ev.Member.MemberID == cls[1].id && ev.Member.Protocol == MemberProtocolClassic
	}) {
		t.Fatalf("classic member did not expire: %v", kinds(evs))
	}
	d := h.describe("g")
	if len(d.Members) != 2 || d.Epoch <= before {
		t.Fatalf("after expiry: %+v", d)
	}
	if code := h.heartbeat("g", cls[1].id, cls[1].gen); code != errUnknownMemberID {
		t.Fatalf("expired member's heartbeat: %s", errName(code))
	}
	// Its partitions go to the survivors.
	h.settleMixed("g", 4, cls[:1], []*client{x})
}

func TestClassicMemberRebalanceTimeoutDuringConversion(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 4})
	cls := h.classicGroupOf("g", []int32{0, 1}, []int32{2, 3})
	x := h.join("g", "x", "t")
	h.takeEvents("g")
	// cls[0] keeps heartbeating but never rejoins when told to: its
	// rebalance timeout (30 s) fences it, and its partitions are freed.
	for i := 0; i < 6; i++ { // 0 s … 25 s, then 30 s
		if code := h.heartbeat("g", cls[0].id, cls[0].gen); code != errRebalanceInProgress {
			t.Fatalf("heartbeat %d of the member that must rejoin: %s", i, errName(code))
		}
		h.beat("g", x)
		if code := h.heartbeat("g", cls[1].id, cls[1].gen); code == errRebalanceInProgress {
			h.classicRejoin("g", cls[1])
		}
		h.advance(5 * time.Second)
	}
	evs := h.takeEvents("g")
	if !slices.ContainsFunc(evs, func(ev Event) bool {
		return ev.Kind == EventMemberExpired && ev.Cause == "join_timeout" && ev.Member.MemberID == cls[0].id
	}) {
		t.Fatalf("the member that never rejoined was not fenced: %v", kinds(evs))
	}
	if code := h.heartbeat("g", cls[0].id, cls[0].gen); code != errUnknownMemberID {
		t.Fatalf("fenced member's heartbeat: %s", errName(code))
	}
	cls[0].owned = nil // the client learns it was fenced and drops everything
	h.settleMixed("g", 4, cls[1:], []*client{x})
}

func TestClassicMemberSyncTimeoutInsideConsumerGroup(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 2})
	cls := h.classicGroupOf("g", []int32{0, 1})
	x := h.join("g", "x", "t")
	// The classic member rejoins having revoked everything (nothing to
	// wait for), but never syncs: fenced after its rebalance timeout.
	r := h.do(jr{group: "g", member: cls[0].id, version: 9, protocols: coopProtocol(nil)}.req()).(*kmsg.JoinGroupResponse)
	if r.ErrorCode != errNone {
		t.Fatalf("rejoin: %s", errName(r.ErrorCode))
	}
	h.takeEvents("g")
	for i := 0; i < 7; i++ {
		h.advance(5 * time.Second)
		h.heartbeat("g", cls[0].id, r.Generation)
		h.beat("g", x)
	}
	if evs := h.takeEvents("g"); !slices.ContainsFunc(evs, func(ev Event) bool {
		return ev.Kind == EventMemberExpired && ev.Cause == "sync_timeout"
	}) {
		t.Fatalf("no sync timeout: %v", kinds(evs))
	}
}

func TestMigrationPolicyRefusals(t *testing.T) {
	t.Run("downgrade-only refuses the upgrade", func(t *testing.T) {
		h := newConsumerHarness(t, map[string]int32{"t": 2}, func(c *Config) { c.ConsumerMigrationPolicy = MigrationDowngrade })
		h.classicGroupOf("g", []int32{0, 1})
		h.consumerResp(consumerJoin("g", "x", "t"), errGroupIDNotFound)
		if snap, _ := h.e.Group("g"); snap.State != stateStable.String() || snap.Members[0].Protocol != MemberProtocolClassic {
			t.Fatalf("refused upgrade changed the group: %+v", snap)
		}
	})
	t.Run("a non-consumer protocol type is never upgraded", func(t *testing.T) {
		h := newConsumerHarness(t, map[string]int32{"t": 2})
		h.do(jr{group: "g", version: 3, ptype: "connect"}.req())
		h.consumerResp(consumerJoin("g", "x", "t"), errGroupIDNotFound)
	})
	t.Run("upgrade-only keeps the consumer group", func(t *testing.T) {
		h := newConsumerHarness(t, map[string]int32{"t": 2}, func(c *Config) { c.ConsumerMigrationPolicy = MigrationUpgrade })
		cls := h.classicGroupOf("g", []int32{0, 1})
		x := h.join("g", "x", "t")
		h.settleMixed("g", 2, cls, []*client{x})
		h.consumerResp(consumerBeat("g", "x", epochLeave, nil), errNone)
		d := h.describe("g")
		if c, k := memberTypes(d); d.ErrorCode != errNone || c != 1 || k != 0 {
			t.Fatalf("with policy upgrade the group must stay a consumer group: %+v", d)
		}
		h.settleMixed("g", 2, cls, nil)
	})
	t.Run("disabled refuses classic members of consumer groups", func(t *testing.T) {
		h := newConsumerHarness(t, map[string]int32{"t": 2}, func(c *Config) { c.ConsumerMigrationPolicy = MigrationDisabled })
		h.join("g", "x", "t")
		if r := h.do(jr{group: "g", version: 9}.req()).(*kmsg.JoinGroupResponse); r.ErrorCode != errInconsistentGroupProtocol {
			t.Fatalf("classic join with the policy disabled: %s", errName(r.ErrorCode))
		}
	})
	t.Run("bad policy", func(t *testing.T) {
		if _, err := New(Config{Store: NewMemoryStore(), ConsumerMigrationPolicy: "sideways"}); err == nil {
			t.Fatal("New accepted an unknown migration policy")
		}
		if p, err := ParseMigrationPolicy("UPGRADE"); err != nil || p != MigrationUpgrade {
			t.Fatalf("ParseMigrationPolicy(UPGRADE) = %v, %v", p, err)
		}
	})
}

func TestMixedGroupSurvivesRestart(t *testing.T) {
	h1, store := newMetaHarness(t, nil)
	store.SetTopic("t", 4)
	c1 := &consumerHarness{h1}
	c1.refresh()
	cls := c1.classicGroupOf("g", []int32{0, 1}, []int32{2, 3})
	x := c1.join("g", "x", "t")
	c1.settleMixed("g", 4, cls, []*client{x})
	before := c1.describe("g")
	h1.e.Close()

	h2, _ := newMetaHarness(t, store)
	c2 := &consumerHarness{h2}
	c2.refresh()
	// Every member goes on at its generation or epoch: no rebalance.
	for _, c := range cls {
		if code := c2.heartbeat("g", c.id, c.gen); code != errNone {
			t.Fatalf("classic member %s after restart: %s", c.id, errName(code))
		}
	}
	owned := x.owned.clone()
	c2.beat("g", x)
	if !x.owned.equal(owned) || x.epoch != before.Epoch {
		t.Fatalf("KIP-848 member after restart: epoch %d owns %v", x.epoch, x.owned)
	}
	after := c2.describe("g")
	if c, k := memberTypes(after); after.Epoch != before.Epoch || after.State != "Stable" || c != 2 || k != 1 {
		t.Fatalf("loaded mixed group: %+v", after)
	}
	// The classic members' session timeouts came back with them.
	c2.takeEvents("g")
	for i := 0; i < 3; i++ {
		c2.advance(4 * time.Second)
		c2.beat("g", x)
		c2.heartbeat("g", cls[0].id, cls[0].gen)
	}
	if evs := c2.takeEvents("g"); !slices.ContainsFunc(evs, func(ev Event) bool {
		return ev.Kind == EventMemberExpired && ev.Member.MemberID == cls[1].id
	}) {
		t.Fatalf("a loaded classic member kept no session timer: %v", kinds(evs))
	}
}

// staticConsumerJoin is the first heartbeat of a static KIP-848 member.
func staticConsumerJoin(group, id, instance string, topics ...string) *kmsg.ConsumerGroupHeartbeatRequest {
	r := consumerJoin(group, id, topics...)
	r.InstanceID = &instance
	return r
}

// mixedWithStaticConsumer builds a settled consumer group of two classic
// members and one static KIP-848 member x (instance "ix"), and has x
// leave temporarily (epoch -2) as a static member restarting does.
func mixedWithStaticConsumer(h *consumerHarness) ([]*classicClient, *client) {
	h.t.Helper()
	cls := h.classicGroupOf("g", []int32{0, 1}, []int32{2, 3})
	x := &client{id: "x"}
	x.applyResp(h.consumerResp(staticConsumerJoin("g", "x", "ix", "t"), errNone))
	h.settleMixed("g", 4, cls, []*client{x})
	leave := consumerBeat("g", "x", epochStaticLeave, nil)
	inst := "ix"
	leave.InstanceID = &inst
	h.consumerResp(leave, errNone)
	return cls, x
}

// TestStaticReplacementDowngradesWithoutRebalance is Kafka's
// validateOnlineDowngradeWithReplacedMemberId: the last KIP-848 member, a
// static one, restarts speaking the classic protocol under a new member
// id; its JoinGroup converts the group back to a classic group, Stable,
// without a rebalance: the other classic members' heartbeats go on at
// their generation and the new instance gets the replaced member's
// partitions from SyncGroup at the generation its JoinGroup gave.
func TestStaticReplacementDowngradesWithoutRebalance(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 4})
	cls, x := mixedWithStaticConsumer(h)
	epoch := h.describe("g").Epoch
	h.takeEvents("g")

	jresp := h.do(jr{group: "g", instance: "ix", version: 9, protocols: coopProtocol(nil)}.req()).(*kmsg.JoinGroupResponse)
	if jresp.ErrorCode != errNone || jresp.MemberID == "" || jresp.MemberID == "x" {
		t.Fatalf("static classic join in place of x: %s, member %q", errName(jresp.ErrorCode), jresp.MemberID)
	}
	if jresp.Generation != epoch {
		t.Fatalf("the replacing member joined at generation %d, the group was at epoch %d", jresp.Generation, epoch)
	}
	evs := h.takeEvents("g")
	if !slices.ContainsFunc(evs, func(ev Event) bool {
		return ev.Kind == EventGroupConverted && ev.Cause == CauseConvertedToClassic && ev.Member != nil && ev.Member.MemberID == jresp.MemberID
	}) || slices.ContainsFunc(evs, func(ev Event) bool { return ev.Kind == EventRebalanceStarted }) {
		t.Fatalf("want a downgrade by the replacing member and no rebalance: %v", kinds(evs))
	}
	if d := h.describe("g"); d.ErrorCode != errGroupIDNotFound {
		t.Fatalf("ConsumerGroupDescribe after the downgrade: %s", errName(d.ErrorCode))
	}
	dg := kmsg.NewPtrDescribeGroupsRequest()
	dg.Groups = []string{"g"}
	g := h.do(dg).(*kmsg.DescribeGroupsResponse).Groups[0]
	if g.ErrorCode != errNone || g.ProtocolType != "consumer" || g.State != "Stable" || len(g.Members) != 3 {
		t.Fatalf("DescribeGroups after the downgrade: %s %q %q %d members", errName(g.ErrorCode), g.ProtocolType, g.State, len(g.Members))
	}
	instances := 0
	for _, m := range g.Members {
		if m.InstanceID != nil && *m.InstanceID == "ix" {
			instances++
			if m.MemberID != jresp.MemberID {
				t.Fatalf("instance ix is member %s, want %s", m.MemberID, jresp.MemberID)
			}
		}
	}
	if instances != 1 {
		t.Fatalf("instance ix appears %d times", instances)
	}
	// The classic members go on at their generation.
	for _, c := range cls {
		if code := h.heartbeat("g", c.id, c.gen); code != errNone {
			t.Fatalf("classic member %s after the downgrade: %s", c.id, errName(code))
		}
	}
	// The new instance syncs at its generation and gets what x held.
	sr := syncReq("g", jresp.MemberID, jresp.Generation, nil)
	iid := "ix"
	sr.InstanceID = &iid
	sresp := h.do(sr).(*kmsg.SyncGroupResponse)
	if sresp.ErrorCode != errNone {
		t.Fatalf("sync of the replacing member: %s", errName(sresp.ErrorCode))
	}
	got := partsOf(t, sresp.MemberAssignment)
	var want []int32
	for p := range x.owned[h.topicID("t")] {
		want = append(want, p)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the replacing member got %v, x held %v", got, want)
	}
	seen := map[int32]bool{}
	for _, p := range append(append(slices.Clone(got), cls[0].owned...), cls[1].owned...) {
		if seen[p] {
			t.Fatalf("partition %d owned twice after the downgrade", p)
		}
		seen[p] = true
	}
	if len(seen) != 4 {
		t.Fatalf("after the downgrade %d of 4 partitions are owned", len(seen))
	}
	// The old member id is gone.
	if code := h.heartbeat("g", "x", jresp.Generation); code != errUnknownMemberID {
		t.Fatalf("the replaced member's heartbeat: %s", errName(code))
	}
}

// TestStaticReplacementDowngradeRefused: the static replacement keeps
// the consumer group when the policy refuses downgrades or when another
// KIP-848 member remains.
func TestStaticReplacementDowngradeRefused(t *testing.T) {
	t.Run("policy upgrade", func(t *testing.T) {
		h := newConsumerHarness(t, map[string]int32{"t": 4}, func(c *Config) { c.ConsumerMigrationPolicy = MigrationUpgrade })
		mixedWithStaticConsumer(h)
		jresp := h.do(jr{group: "g", instance: "ix", version: 9, protocols: coopProtocol(nil)}.req()).(*kmsg.JoinGroupResponse)
		if jresp.ErrorCode != errNone {
			t.Fatalf("static classic join: %s", errName(jresp.ErrorCode))
		}
		if d := h.describe("g"); d.ErrorCode != errNone {
			t.Fatalf("with policy upgrade the group must stay a consumer group: %s", errName(d.ErrorCode))
		} else if c, k := memberTypes(d); c != 3 || k != 0 {
			t.Fatalf("members: classic %d, consumer %d", c, k)
		}
	})
	t.Run("another KIP-848 member remains", func(t *testing.T) {
		h := newConsumerHarness(t, map[string]int32{"t": 4})
		cls, _ := mixedWithStaticConsumer(h)
		y := h.join("g", "y", "t")
		jresp := h.do(jr{group: "g", instance: "ix", version: 9, protocols: coopProtocol(nil)}.req()).(*kmsg.JoinGroupResponse)
		if jresp.ErrorCode != errNone {
			t.Fatalf("static classic join: %s", errName(jresp.ErrorCode))
		}
		d := h.describe("g")
		if c, k := memberTypes(d); d.ErrorCode != errNone || c != 3 || k != 1 {
			t.Fatalf("the group must stay a consumer group of 3 classic and 1 KIP-848 members: %+v", d)
		}
		// The new instance and the others settle inside the consumer
		// group, with no partition owned twice.
		nx := &classicClient{id: jresp.MemberID, gen: jresp.Generation}
		sr := syncReq("g", nx.id, nx.gen, nil)
		if sresp := h.do(sr).(*kmsg.SyncGroupResponse); sresp.ErrorCode == errNone {
			nx.owned = partsOf(t, sresp.MemberAssignment)
		} else if sresp.ErrorCode != errRebalanceInProgress {
			t.Fatalf("sync of the replacing member: %s", errName(sresp.ErrorCode))
		}
		h.settleMixed("g", 4, append(cls, nx), []*client{y})
	})
}

// TestUpgradeWaitsForUnknownTopics: the classic members hold partitions
// of a topic created after the last topic refresh. The upgrade waits
// (COORDINATOR_LOAD_IN_PROGRESS, a refresh requested) instead of
// converting without those partitions, which would give them to the
// joining member while the classic members still hold them; once the
// cache knows the topic the conversion carries every partition over.
func TestUpgradeWaitsForUnknownTopics(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"other": 1})
	h.e.storeWG.Wait()       // the engine's first, asynchronous, refresh is over
	h.store.SetTopic("t", 4) // not in the cache yet
	h.classicGroupOf("g", []int32{0, 1}, []int32{2, 3})
	// x subscribes to a known topic only, so that its heartbeat does
	// not refresh the cache itself.
	h.consumerResp(consumerJoin("g", "x", "other"), errCoordinatorLoadInProgress)
	if snap, _ := h.e.Group("g"); snap.State != stateStable.String() || len(snap.Members) != 2 || snap.Members[0].Protocol != MemberProtocolClassic {
		t.Fatalf("the refused upgrade changed the group: %+v", snap)
	}
	h.refresh()
	x := h.join("g", "x", "other")
	if len(x.owned[h.topicID("t")]) != 0 {
		t.Fatalf("the joining member got %v while the classic members hold every partition", x.owned)
	}
	d := h.describe("g")
	held := 0
	for _, m := range d.Members {
		if m.MemberType != 0 {
			continue
		}
		for _, tp := range m.Assignment.TopicPartitions {
			if tp.Topic == "t" {
				held += len(tp.Partitions)
			}
		}
	}
	if c, k := memberTypes(d); c != 2 || k != 1 || held != 4 {
		t.Fatalf("after the upgrade: %d classic, %d consumer members, the classic ones holding %d partitions of t, want 2, 1 and 4", c, k, held)
	}
}

// TestUpgradeKeepsPartitionsBeingRevoked converts a cooperative classic
// group in the middle of its two-round rebalance (KIP-429): the leader
// synced a generation that takes a partition from a follower (given to
// nobody until the follower revokes it), but the follower has not synced
// it yet and still owns that partition. The KIP-848 member that converts
// the group must not get it before the follower gave it up: the
// conversion counts what each member reported owning at its last
// JoinGroup, not only its last assignment.
func TestUpgradeKeepsPartitionsBeingRevoked(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 4})
	cls := h.classicGroupOf("g", []int32{0, 1}, []int32{2, 3})
	a, b := cls[0], cls[1] // a leads
	// A third classic member joins: a rebalance. Every member rejoins
	// reporting what it owns.
	newID := h.do(jr{group: "g", version: 9, protocols: coopProtocol(nil)}.req()).(*kmsg.JoinGroupResponse).MemberID
	cJoin := h.send(jr{group: "g", member: newID, version: 9, protocols: coopProtocol(nil)}.req())
	aJoin := h.send(jr{group: "g", member: a.id, version: 9, protocols: coopProtocol(a.owned)}.req())
	bJoin := h.send(jr{group: "g", member: b.id, version: 9, protocols: coopProtocol(b.owned)}.req())
	var gen int32
	for _, c := range []*call{aJoin, bJoin, cJoin} {
		r := joinResp(t, c, errNone)
		gen = r.Generation
		if r.LeaderID != a.id {
			t.Fatalf("leader %s, want %s", r.LeaderID, a.id)
		}
	}
	// The leader's cooperative assignment: 1 and 3 leave their owners
	// and go to nobody this round. Only the leader syncs.
	sr := syncReq("g", a.id, gen, map[string][]byte{a.id: assignment("t", 0), b.id: assignment("t", 2), newID: assignment("t")})
	if r := h.do(sr).(*kmsg.SyncGroupResponse); r.ErrorCode != errNone {
		t.Fatalf("leader sync: %s", errName(r.ErrorCode))
	} else {
		a.owned, a.gen = partsOf(t, r.MemberAssignment), gen // revokes 1 at once
	}
	// b still owns 2 and 3: its SyncGroup has not been sent. A KIP-848
	// member converts the group now.
	x := h.join("g", "x", "t")
	if x.owned.has(h.topicID("t"), 3) || x.owned.has(h.topicID("t"), 2) {
		t.Fatalf("the KIP-848 member got %v while %s still owns [2 3]", x.owned, b.id)
	}
	// b and the new member joined gen and never synced it: their
	// SyncGroup now gets REBALANCE_IN_PROGRESS, and they rejoin.
	b.gen = gen
	c := &classicClient{id: newID, gen: gen}
	sr = syncReq("g", b.id, gen, nil)
	if r := h.do(sr).(*kmsg.SyncGroupResponse); r.ErrorCode != errRebalanceInProgress {
		t.Fatalf("b's sync of the generation the conversion ended: %s", errName(r.ErrorCode))
	}
	h.settleMixed("g", 4, []*classicClient{a, b, c}, []*client{x})
}

// TestStaticReplacementDowngradeRebalancesUnreconciledGroup: a classic
// member of a consumer group waits for partitions its target holds and a
// static KIP-848 member still owns; that member restarts speaking the
// classic protocol (it owns nothing now) and its JoinGroup downgrades the
// group. The classic group takes the targets as assignments, so the
// waiting member is listed with partitions its client never got: unless
// it is made to rejoin, its heartbeats go on succeeding and those
// partitions have no owner. The downgrade must start a rebalance then.
func TestStaticReplacementDowngradeRebalancesUnreconciledGroup(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 4})
	s := &client{id: "s"}
	s.applyResp(h.consumerResp(staticConsumerJoin("g", "s", "is", "t"), errNone))
	if s.owned.size() != 4 {
		t.Fatalf("the only member owns %v", s.owned)
	}
	// A classic member joins (KIP-394 round trip first); its target
	// is held by s, so it gets nothing yet.
	id := h.do(jr{group: "g", version: 9, protocols: coopProtocol(nil)}.req()).(*kmsg.JoinGroupResponse).MemberID
	jresp := h.do(jr{group: "g", member: id, version: 9, protocols: coopProtocol(nil)}.req()).(*kmsg.JoinGroupResponse)
	if jresp.ErrorCode != errNone {
		t.Fatalf("classic join: %s", errName(jresp.ErrorCode))
	}
	u := &classicClient{id: id, gen: jresp.Generation}
	sr := syncReq("g", u.id, u.gen, nil)
	pt, name := "consumer", "cooperative-sticky"
	sr.ProtocolType, sr.Protocol = &pt, &name
	if r := h.do(sr).(*kmsg.SyncGroupResponse); r.ErrorCode != errNone || len(partsOf(t, r.MemberAssignment)) != 0 {
		t.Fatalf("classic sync: %s %v", errName(r.ErrorCode), r.MemberAssignment)
	}
	if code := h.heartbeat("g", u.id, u.gen); code != errNone {
		t.Fatalf("heartbeat of the waiting classic member: %s", errName(code))
	}
	// s restarts as a classic static member: the group downgrades.
	h.takeEvents("g")
	rj := h.do(jr{group: "g", instance: "is", version: 9, protocols: coopProtocol(nil)}.req()).(*kmsg.JoinGroupResponse)
	if rj.ErrorCode != errNone {
		t.Fatalf("static classic join in place of s: %s", errName(rj.ErrorCode))
	}
	evs := h.takeEvents("g")
	if !slices.ContainsFunc(evs, func(ev Event) bool { return ev.Kind == EventGroupConverted && ev.Cause == CauseConvertedToClassic }) {
		t.Fatalf("no downgrade: %v", kinds(evs))
	}
	// The waiting member must learn that it is to rejoin.
	if code := h.heartbeat("g", u.id, u.gen); code != errRebalanceInProgress {
		t.Fatalf("heartbeat of the classic member whose partitions nobody owns after the downgrade: %s, want REBALANCE_IN_PROGRESS", errName(code))
	}
}
