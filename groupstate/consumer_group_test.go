package groupstate

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// consumerHarness is a harness with KIP-848 topics in its memory store.
type consumerHarness struct {
	*harness
}

// newConsumerHarness builds a harness whose store holds the given topics
// (name → partitions) and whose topic cache is loaded.
func newConsumerHarness(t *testing.T, topics map[string]int32, opts ...harnessConfig) *consumerHarness {
	t.Helper()
	h := &consumerHarness{newHarness(t, opts...)}
	for n, p := range topics {
		h.store.SetTopic(n, p)
	}
	h.refresh()
	return h
}

// refresh reloads the engine's topic cache now.
func (h *consumerHarness) refresh() {
	h.t.Helper()
	if err := h.e.refreshTopics(context.Background()); err != nil {
		h.t.Fatalf("refreshTopics: %v", err)
	}
}

// topicID returns the id the store gave topic.
func (h *consumerHarness) topicID(name string) topicID {
	h.t.Helper()
	ids, _ := h.store.TopicIDs(context.Background(), []string{name})
	id, ok := ids[name]
	if !ok {
		h.t.Fatalf("no id for topic %s", name)
	}
	return id
}

// consumerJoin is a first heartbeat (epoch 0) of member id subscribing to
// topics.
func consumerJoin(group, id string, topics ...string) *kmsg.ConsumerGroupHeartbeatRequest {
	r := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	r.Version = 1
	r.Group, r.MemberID, r.MemberEpoch = group, id, 0
	r.RebalanceTimeoutMillis = 30000
	r.SubscribedTopicNames = append([]string{}, topics...)
	r.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	return r
}

// consumerBeat is a steady heartbeat reporting owned.
func consumerBeat(group, id string, epoch int32, owned partSet) *kmsg.ConsumerGroupHeartbeatRequest {
	r := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	r.Version = 1
	r.Group, r.MemberID, r.MemberEpoch = group, id, epoch
	r.RebalanceTimeoutMillis = -1
	if owned != nil {
		r.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		for _, t := range owned.sortedTopics() {
			r.Topics = append(r.Topics, kmsg.ConsumerGroupHeartbeatRequestTopic{TopicID: t, Partitions: owned.sortedPartitions(t)})
		}
	}
	return r
}

// consumerResp sends r and returns the heartbeat response, checking its code.
func (h *consumerHarness) consumerResp(r *kmsg.ConsumerGroupHeartbeatRequest, want int16) *kmsg.ConsumerGroupHeartbeatResponse {
	h.t.Helper()
	resp := h.do(r).(*kmsg.ConsumerGroupHeartbeatResponse)
	if resp.ErrorCode != want {
		msg := ""
		if resp.ErrorMessage != nil {
			msg = *resp.ErrorMessage
		}
		h.t.Fatalf("heartbeat %s epoch %d: error %s (%s), want %s", r.MemberID, r.MemberEpoch, errName(resp.ErrorCode), msg, errName(want))
	}
	return resp
}

// client mimics a KIP-848 consumer: it owns what the coordinator last
// assigned and revokes at once what was left out.
type client struct {
	id    string
	epoch int32
	owned partSet
}

// applyResp updates the client from a heartbeat response.
func (c *client) applyResp(resp *kmsg.ConsumerGroupHeartbeatResponse) {
	c.epoch = resp.MemberEpoch
	if resp.Assignment != nil {
		c.owned = partSet{}
		for _, t := range resp.Assignment.Topics {
			for _, p := range t.Partitions {
				c.owned.add(t.TopicID, p)
			}
		}
	}
}

// join makes a new client join group.
func (h *consumerHarness) join(group, id string, topics ...string) *client {
	h.t.Helper()
	c := &client{id: id}
	c.applyResp(h.consumerResp(consumerJoin(group, id, topics...), errNone))
	return c
}

// beat heartbeats once for c.
func (h *consumerHarness) beat(group string, c *client) {
	h.t.Helper()
	c.applyResp(h.consumerResp(consumerBeat(group, c.id, c.epoch, c.owned), errNone))
}

// settle heartbeats every client until the group is Stable, checking
// after every heartbeat that no partition is owned by two clients.
func (h *consumerHarness) settle(group string, cs ...*client) {
	h.t.Helper()
	for round := 0; round < 20; round++ {
		for _, c := range cs {
			h.beat(group, c)
			checkDisjoint(h.t, cs)
		}
		if d := h.describe(group); d.State == "Stable" {
			allAt := true
			for _, c := range cs {
				if c.epoch != d.AssignmentEpoch {
					allAt = false
				}
			}
			if allAt {
				return
			}
		}
	}
	h.t.Fatalf("group %s did not settle: %+v", group, h.describe(group))
}

// checkDisjoint fails if two clients own the same partition.
func checkDisjoint(t testing.TB, cs []*client) {
	t.Helper()
	seen := make(map[tp]string)
	for _, c := range cs {
		for topic, parts := range c.owned {
			for p := range parts {
				if o, dup := seen[tp{topic, p}]; dup {
					t.Fatalf("partition %d owned by %s and %s", p, o, c.id)
				}
				seen[tp{topic, p}] = c.id
			}
		}
	}
}

// describe returns the ConsumerGroupDescribe entry of group.
func (h *consumerHarness) describe(group string) kmsg.ConsumerGroupDescribeResponseGroup {
	h.t.Helper()
	r := kmsg.NewPtrConsumerGroupDescribeRequest()
	r.Version = 1
	r.Groups = []string{group}
	resp := h.do(r).(*kmsg.ConsumerGroupDescribeResponse)
	if len(resp.Groups) != 1 {
		h.t.Fatalf("describe: %d groups", len(resp.Groups))
	}
	return resp.Groups[0]
}

func TestConsumerHeartbeatValidation(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 3})
	str := func(s string) *string { return &s }
	cases := []struct {
		name string
		mod  func(r *kmsg.ConsumerGroupHeartbeatRequest)
		want int16
	}{
		{"empty group id", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.Group = "" }, errInvalidRequest},
		{"empty instance id", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.InstanceID = str("") }, errInvalidRequest},
		{"empty rack id", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.RackID = str("") }, errInvalidRequest},
		{"v1 empty member id", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.MemberID = "" }, errInvalidRequest},
		{"epoch below -2", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.MemberEpoch = -3 }, errInvalidRequest},
		{"join without rebalance timeout", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.RebalanceTimeoutMillis = -1 }, errInvalidRequest},
		{"join with null owned", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.Topics = nil }, errInvalidRequest},
		{"join owning partitions", func(r *kmsg.ConsumerGroupHeartbeatRequest) {
			r.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{{Partitions: []int32{0}}}
		}, errInvalidRequest},
		{"join without subscription", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.SubscribedTopicNames = nil }, errInvalidRequest},
		{"static leave without instance", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.MemberEpoch = -2 }, errInvalidRequest},
		{"unknown assignor", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.ServerAssignor = str("sticky") }, errUnsupportedAssignor},
		{"invalid regex", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.SubscribedTopicRegex = str("(") }, errInvalidRegularExpression},
		{"epoch without group", func(r *kmsg.ConsumerGroupHeartbeatRequest) { r.MemberEpoch = 3 }, errGroupIDNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := consumerJoin("g", "m1", "t")
			c.mod(r)
			h.consumerResp(r, c.want)
		})
	}
	// None of the refused heartbeats left a group behind.
	if d := h.describe("g"); d.ErrorCode != errGroupIDNotFound {
		t.Fatalf("a refused heartbeat created the group: %+v", d)
	}
	// v0: the coordinator mints the member id.
	r := consumerJoin("g0", "", "t")
	r.Version = 0
	resp := h.consumerResp(r, errNone)
	if resp.MemberID == nil || *resp.MemberID == "" {
		t.Fatalf("v0 join got no member id")
	}
}

func TestConsumerGroupScaleUpLeaveExpire(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 6})
	tid := h.topicID("t")
	m1 := h.join("g", "m1", "t")
	if m1.epoch != 1 || m1.owned.size() != 6 {
		t.Fatalf("first member: epoch %d owns %d, want epoch 1 owning 6", m1.epoch, m1.owned.size())
	}
	evs := kinds(h.takeEvents("g"))
	want := []string{"group_created", "member_joined", "rebalance_started(member_joined)", "member_reconciling", "assignment_reconciled"}
	if !slices.Equal(evs, want) {
		t.Fatalf("events %v, want %v", evs, want)
	}

	// A second member: it gets nothing until m1 revoked (revoke before
	// assign).
	m2 := h.join("g", "m2", "t")
	if m2.epoch != 2 || m2.owned.size() != 0 {
		t.Fatalf("second member: epoch %d owns %d, want epoch 2 owning nothing yet", m2.epoch, m2.owned.size())
	}
	d := h.describe("g")
	if d.State != "Reconciling" || d.Epoch != 2 || d.AssignmentEpoch != 2 {
		t.Fatalf("describe after scale up: %s epoch %d/%d", d.State, d.Epoch, d.AssignmentEpoch)
	}
	// m1 still owns 6: it is told to keep 3 (the rest pending) and stays
	// at epoch 1.
	resp := h.consumerResp(consumerBeat("g", "m1", 1, m1.owned), errNone)
	if resp.MemberEpoch != 1 || resp.Assignment == nil || len(resp.Assignment.Topics[0].Partitions) != 3 {
		t.Fatalf("revoking member: epoch %d assignment %+v", resp.MemberEpoch, resp.Assignment)
	}
	// m2 must still wait.
	h.beat("g", m2)
	if m2.owned.size() != 0 {
		t.Fatalf("m2 got partitions m1 still owns: %v", m2.owned)
	}
	m1.applyResp(resp)
	h.settle("g", m1, m2)
	if m1.owned.size() != 3 || m2.owned.size() != 3 {
		t.Fatalf("after settling: %d and %d partitions", m1.owned.size(), m2.owned.size())
	}
	if !slices.Contains(kinds(h.takeEvents("g")), "assignment_reconciled") {
		t.Fatalf("no assignment_reconciled event after settling")
	}

	// A third member on two topics, then m3 leaves.
	h.store.SetTopic("u", 2)
	h.refresh()
	m3 := h.join("g", "m3", "t", "u")
	h.settle("g", m1, m2, m3)
	if n := m1.owned.size() + m2.owned.size() + m3.owned.size(); n != 8 || !m3.owned.has(h.topicID("u"), 0) || !m3.owned.has(h.topicID("u"), 1) {
		t.Fatalf("three members own %d partitions (m3 %v), want 8 with u on m3", n, m3.owned)
	}
	h.takeEvents("g")
	leave := consumerBeat("g", "m3", -1, nil)
	if resp := h.consumerResp(leave, errNone); resp.MemberEpoch != -1 {
		t.Fatalf("leave answered epoch %d", resp.MemberEpoch)
	}
	evs = kinds(h.takeEvents("g"))
	if !slices.Contains(evs, "member_left") || !slices.Contains(evs, "rebalance_started(member_left)") {
		t.Fatalf("leave events %v", evs)
	}
	h.settle("g", m1, m2)
	if m1.owned.size()+m2.owned.size() != 6 {
		t.Fatalf("after leave: %d + %d partitions", m1.owned.size(), m2.owned.size())
	}
	if evs := kinds(h.takeEvents("g")); slices.Contains(evs, "rebalance_started(topics_changed)") {
		t.Fatalf("the leave of the only member on u counted as a topics change: %v", evs)
	}
	// An unknown member is refused.
	h.consumerResp(consumerBeat("g", "m3", 5, nil), errUnknownMemberID)

	// m2 stops heartbeating: after 45s it expires and m1 takes all.
	for i := 0; i < 9; i++ {
		h.advance(5 * time.Second)
		h.beat("g", m1)
	}
	h.advance(time.Second)
	evs = kinds(h.takeEvents("g"))
	if !slices.Contains(evs, "member_expired(session_timeout)") {
		t.Fatalf("no expiry: %v", evs)
	}
	h.settle("g", m1)
	if m1.owned.size() != 6 || !m1.owned.has(tid, 5) {
		t.Fatalf("after expiry m1 owns %v", m1.owned)
	}
}

func TestConsumerGroupRebalanceTimeoutFencesStuckRevoker(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 4})
	m1 := h.join("g", "m1", "t")
	m2 := h.join("g", "m2", "t")
	// m1 is told to revoke but never acknowledges (keeps reporting all
	// four partitions).
	r := consumerBeat("g", "m1", m1.epoch, m1.owned)
	if resp := h.consumerResp(r, errNone); resp.MemberEpoch != 1 {
		t.Fatalf("m1 should be held at epoch 1, got %d", resp.MemberEpoch)
	}
	h.takeEvents("g")
	for i := 0; i < 5; i++ {
		h.advance(5 * time.Second)
		h.consumerResp(consumerBeat("g", "m1", 1, m1.owned), errNone)
		h.beat("g", m2)
		if m2.owned.size() != 0 {
			t.Fatalf("m2 got partitions the stuck revoker still owns: %v", m2.owned)
		}
	}
	h.advance(6 * time.Second)
	evs := kinds(h.takeEvents("g"))
	if !slices.Contains(evs, "member_expired(rebalance_timeout)") {
		t.Fatalf("stuck revoker not fenced: %v", evs)
	}
	h.consumerResp(consumerBeat("g", "m1", 1, m1.owned), errUnknownMemberID)
	h.settle("g", m2)
	if m2.owned.size() != 4 {
		t.Fatalf("m2 owns %d after the revoker was fenced", m2.owned.size())
	}
}

func TestConsumerGroupEpochFencing(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 2})
	m1 := h.join("g", "m1", "t")
	m2 := h.join("g", "m2", "t")
	h.settle("g", m1, m2)
	// A newer epoch than the server's is fenced.
	h.consumerResp(consumerBeat("g", "m1", m1.epoch+1, m1.owned), errFencedMemberEpoch)
	// An older epoch: accepted only as the previous epoch with owned a
	// subset of the assignment (a lost response).
	// m1 went from epoch 1 to 2; m2 joined at 2 (previous epoch 0).
	if m1.epoch != 2 || m2.epoch != 2 {
		t.Fatalf("epochs %d and %d, want 2", m1.epoch, m2.epoch)
	}
	h.consumerResp(consumerBeat("g", "m1", 1, nil), errFencedMemberEpoch)
	h.consumerResp(consumerBeat("g", "m1", 1, ps(h.topicID("t"), 0, 1)), errFencedMemberEpoch) // not a subset
	h.consumerResp(consumerBeat("g", "m1", 1, m1.owned), errNone)
	h.consumerResp(consumerBeat("g", "m2", 1, m2.owned), errFencedMemberEpoch) // not its previous epoch
	// KAFKA-19233: a fenced member may rejoin with epoch 0 and its id.
	resp := h.consumerResp(consumerJoin("g", "m1", "t"), errNone)
	if resp.MemberEpoch != m1.epoch {
		t.Fatalf("rejoin at epoch 0: epoch %d, want the unchanged group epoch %d", resp.MemberEpoch, m1.epoch)
	}
	m1.applyResp(resp)
	h.settle("g", m1, m2)
}

func TestConsumerGroupStaticMembers(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 4})
	str := func(s string) *string { return &s }
	join := func(id, inst string) *kmsg.ConsumerGroupHeartbeatRequest {
		r := consumerJoin("g", id, "t")
		r.InstanceID = str(inst)
		return r
	}
	a := &client{id: "a1"}
	a.applyResp(h.consumerResp(join("a1", "A"), errNone))
	b := &client{id: "b1"}
	b.applyResp(h.consumerResp(join("b1", "B"), errNone))
	h.settle("g", a, b)
	epoch := h.describe("g").Epoch
	// Another member cannot take instance A while a1 is active.
	h.consumerResp(join("a2", "A"), errUnreleasedInstanceID)
	// A heartbeat with A's instance under another id is fenced.
	r := consumerBeat("g", "zz", a.epoch, a.owned)
	r.InstanceID = str("A")
	h.consumerResp(r, errFencedInstanceID)
	// a1 leaves temporarily (epoch -2): nothing moves.
	r = consumerBeat("g", "a1", -2, nil)
	r.InstanceID = str("A")
	if resp := h.consumerResp(r, errNone); resp.MemberEpoch != -2 {
		t.Fatalf("static leave answered epoch %d", resp.MemberEpoch)
	}
	if d := h.describe("g"); d.Epoch != epoch {
		t.Fatalf("static leave bumped the epoch %d → %d", epoch, d.Epoch)
	}
	// A new instance a2 takes A's place and assignment, no epoch bump.
	resp := h.consumerResp(join("a2", "A"), errNone)
	got := &client{id: "a2"}
	got.applyResp(resp)
	if !got.owned.equal(a.owned) || resp.MemberEpoch != epoch {
		t.Fatalf("replacement got %v at epoch %d, want %v at %d", got.owned, resp.MemberEpoch, a.owned, epoch)
	}
	if d := h.describe("g"); d.Epoch != epoch || len(d.Members) != 2 {
		t.Fatalf("replacement: epoch %d members %d", d.Epoch, len(d.Members))
	}
	// An unknown instance with a non-zero epoch is unknown.
	r = consumerBeat("g", "c1", 3, nil)
	r.InstanceID = str("C")
	h.consumerResp(r, errUnknownMemberID)
}

func TestConsumerGroupTopicsChangeAndRegex(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"orders": 2, "orders-eu": 2, "payments": 3})
	r := consumerJoin("g", "m1")
	r.SubscribedTopicNames = nil
	re := "orders.*"
	r.SubscribedTopicRegex = &re
	m1 := &client{id: "m1"}
	m1.applyResp(h.consumerResp(r, errNone))
	// The regex is resolved after the first answer (asynchronously, as
	// Kafka does): its matches come on a later heartbeat.
	if m1.owned.size() != 0 {
		t.Fatalf("the first answer assigns %v before the regex was resolved", m1.owned)
	}
	h.flush()
	h.settle("g", m1)
	if m1.owned.size() != 4 || m1.owned.has(h.topicID("payments"), 0) {
		t.Fatalf("regex subscription owns %v", m1.owned)
	}
	// Full-name match: "xorders" does not match "orders.*".
	h.store.SetTopic("xorders", 1)
	h.store.SetTopic("orders", 4) // resized
	h.refresh()
	h.takeEvents("g")
	h.settle("g", m1)
	if m1.owned.size() != 6 {
		t.Fatalf("after resize owns %d, want 6", m1.owned.size())
	}
	if evs := kinds(h.takeEvents("g")); !slices.Contains(evs, "rebalance_started(topics_changed)") {
		t.Fatalf("no topics_changed rebalance: %v", evs)
	}
	// A new topic matching the regex joins the subscription.
	h.store.SetTopic("orders-us", 1)
	h.refresh()
	h.settle("g", m1)
	if !m1.owned.has(h.topicID("orders-us"), 0) {
		t.Fatalf("new matching topic not assigned: %v", m1.owned)
	}
	// Changing the subscription to names bumps the epoch.
	before := h.describe("g").Epoch
	r = consumerBeat("g", "m1", m1.epoch, m1.owned)
	r.SubscribedTopicNames = []string{"payments"}
	empty := ""
	r.SubscribedTopicRegex = &empty
	m1.applyResp(h.consumerResp(r, errNone))
	h.settle("g", m1)
	if d := h.describe("g"); d.Epoch != before+1 || m1.owned.size() != 3 {
		t.Fatalf("subscription change: epoch %d→%d, owns %v", before, d.Epoch, m1.owned)
	}
}

func TestConsumerGroupRangeAssignorAndDescribe(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 5})
	rangeName := "range"
	r := consumerJoin("g", "m1", "t")
	r.ServerAssignor = &rangeName
	m1 := &client{id: "m1"}
	m1.applyResp(h.consumerResp(r, errNone))
	r = consumerJoin("g", "m2", "t")
	r.ServerAssignor = &rangeName
	m2 := &client{id: "m2"}
	m2.applyResp(h.consumerResp(r, errNone))
	h.settle("g", m1, m2)
	tid := h.topicID("t")
	if !m1.owned.equal(ps(tid, 0, 1, 2)) || !m2.owned.equal(ps(tid, 3, 4)) {
		t.Fatalf("range: m1 %v m2 %v", m1.owned, m2.owned)
	}
	d := h.describe("g")
	if d.ErrorCode != errNone || d.AssignorName != "range" || d.State != "Stable" || len(d.Members) != 2 {
		t.Fatalf("describe: %+v", d)
	}
	dm := d.Members[0]
	if dm.MemberID != "m1" || dm.ClientID != "client" || dm.ClientHost != "10.0.0.1" || dm.MemberType != 1 ||
		!slices.Equal(dm.SubscribedTopics, []string{"t"}) || len(dm.Assignment.TopicPartitions) != 1 ||
		dm.Assignment.TopicPartitions[0].Topic != "t" || len(dm.TargetAssignment.TopicPartitions[0].Partitions) != 3 {
		t.Fatalf("describe member: %+v", dm)
	}
	if d := h.describe("nope"); d.ErrorCode != errGroupIDNotFound {
		t.Fatalf("describe of a missing group: %s", errName(d.ErrorCode))
	}
}

func TestConsumerGroupMaxSize(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 2}, func(c *Config) { c.ConsumerMaxGroupSize = 1 })
	h.join("g", "m1", "t")
	h.consumerResp(consumerJoin("g", "m2", "t"), errGroupMaxSizeReached)
}

func TestConsumerAndClassicGroupsShareIDs(t *testing.T) {
	// With the migration policy disabled groups of the two kinds only
	// replace each other when empty (consumer_migration_test.go covers
	// the online conversions).
	h := newConsumerHarness(t, map[string]int32{"t": 2}, func(c *Config) { c.ConsumerMigrationPolicy = MigrationDisabled })
	// A non-empty classic group refuses a consumer heartbeat.
	ids, _ := h.stableGroup("classic", 1)
	h.consumerResp(consumerJoin("classic", "x", "t"), errGroupIDNotFound)
	// Once empty, the consumer group replaces it.
	leave := kmsg.NewPtrLeaveGroupRequest()
	leave.Version = 3
	leave.Group = "classic"
	leave.Members = []kmsg.LeaveGroupRequestMember{{MemberID: ids[0]}}
	h.do(leave)
	h.join("classic", "x", "t")
	if d := h.describe("classic"); d.ErrorCode != errNone || len(d.Members) != 1 {
		t.Fatalf("consumer group did not replace the empty classic group: %+v", d)
	}
	// A classic JoinGroup to a non-empty consumer group is refused.
	if resp := h.do(jr{group: "classic", version: 9}.req()).(*kmsg.JoinGroupResponse); resp.ErrorCode != errInconsistentGroupProtocol {
		t.Fatalf("classic join to a consumer group: %s", errName(resp.ErrorCode))
	}
	// Once the consumer group is empty a classic join replaces it.
	h.consumerResp(consumerBeat("classic", "x", -1, nil), errNone)
	h.stableGroup("classic", 1)
	if d := h.describe("classic"); d.ErrorCode != errGroupIDNotFound {
		t.Fatalf("classic group did not replace the empty consumer group")
	}
}

func TestConsumerGroupOffsets(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 1})
	m1 := h.join("g", "m1", "t")
	commit := func(version int16, member string, epoch int32) int16 {
		return commitCode(t, h.do(commitReq(version, "g", member, epoch, 0, 42)))
	}
	if code := commit(9, "m1", m1.epoch); code != errNone {
		t.Fatalf("commit at the member epoch: %s", errName(code))
	}
	if code := commit(9, "m1", m1.epoch+1); code != errStaleMemberEpoch {
		t.Fatalf("commit at a newer epoch: %s", errName(code))
	}
	if code := commit(8, "m1", m1.epoch); code != errUnsupportedVersion {
		t.Fatalf("v8 commit of a KIP-848 member: %s", errName(code))
	}
	if code := commit(9, "nobody", 1); code != errUnknownMemberID {
		t.Fatalf("commit of an unknown member: %s", errName(code))
	}
	if code := commit(9, "", -1); code != errUnknownMemberID {
		t.Fatalf("simple commit to a non-empty consumer group: %s", errName(code))
	}
	if got := h.storedOffset("g", 0); got != 42 {
		t.Fatalf("stored offset %d", got)
	}
	fetch := func(member *string, epoch int32) int16 {
		r := kmsg.NewPtrOffsetFetchRequest()
		r.Version = 9
		g := kmsg.NewOffsetFetchRequestGroup()
		g.Group, g.MemberID, g.MemberEpoch = "g", member, epoch
		r.Groups = []kmsg.OffsetFetchRequestGroup{g}
		resp := h.do(r).(*kmsg.OffsetFetchResponse)
		return resp.Groups[0].ErrorCode
	}
	id := "m1"
	if code := fetch(&id, m1.epoch); code != errNone {
		t.Fatalf("fetch at the member epoch: %s", errName(code))
	}
	if code := fetch(&id, m1.epoch-1); code != errStaleMemberEpoch {
		t.Fatalf("fetch at an old epoch: %s", errName(code))
	}
	if code := fetch(nil, -1); code != errNone {
		t.Fatalf("admin fetch: %s", errName(code))
	}
	other := "nobody"
	if code := fetch(&other, 1); code != errUnknownMemberID {
		t.Fatalf("fetch by an unknown member: %s", errName(code))
	}
	// Once empty, a simple commit is accepted again.
	h.consumerResp(consumerBeat("g", "m1", -1, nil), errNone)
	if code := commit(9, "", -1); code != errNone {
		t.Fatalf("simple commit to an empty consumer group: %s", errName(code))
	}
}

// failingTopics is a memory store whose topic listing can be made to
// fail, as a cluster that is not reachable yet.
type failingTopics struct {
	*MemoryStore
	fail atomic.Bool
}

// TopicMetadata fails while fail is set.
func (f *failingTopics) TopicMetadata(ctx context.Context) (map[string]TopicInfo, error) {
	if f.fail.Load() {
		return nil, errors.New("cluster unreachable")
	}
	return f.MemoryStore.TopicMetadata(ctx)
}

func TestConsumerGroupWaitsForTopicMetadata(t *testing.T) {
	store := &failingTopics{MemoryStore: NewMemoryStore()}
	store.fail.Store(true)
	store.SetTopic("t", 2)
	h := &consumerHarness{newHarness(t, func(c *Config) { c.Store = store })}
	h.store = store.MemoryStore
	m1 := h.join("g", "m1", "t")
	if m1.owned.size() != 0 || m1.epoch != 1 {
		t.Fatalf("assigned %v at epoch %d before the topics were known", m1.owned, m1.epoch)
	}
	h.beat("g", m1)
	if m1.owned.size() != 0 {
		t.Fatalf("assigned %v before the topics were known", m1.owned)
	}
	store.fail.Store(false)
	h.refresh()
	h.settle("g", m1)
	if m1.owned.size() != 2 {
		t.Fatalf("after the topics became known m1 owns %v", m1.owned)
	}
}

func TestConsumerGroupClassicAPIs(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 2, "u": 1})
	m1 := h.join("g", "m1", "t")
	if code := commitCode(t, h.do(commitReq(9, "g", "m1", m1.epoch, 0, 7))); code != errNone {
		t.Fatalf("commit: %s", errName(code))
	}
	// DescribeGroups points at ConsumerGroupDescribe, as Kafka 4 does.
	dr := kmsg.NewPtrDescribeGroupsRequest()
	dr.Version = 5
	dr.Groups = []string{"g"}
	if resp := h.do(dr).(*kmsg.DescribeGroupsResponse); resp.Groups[0].ErrorCode != errGroupIDNotFound {
		t.Fatalf("DescribeGroups of a consumer group: %s", errName(resp.Groups[0].ErrorCode))
	}
	// ListGroups shows it as a consumer group.
	lr := kmsg.NewPtrListGroupsRequest()
	lr.Version = 5
	found := false
	for _, g := range h.do(lr).(*kmsg.ListGroupsResponse).Groups {
		if g.Group == "g" {
			found = g.GroupType == "consumer" && g.ProtocolType == "consumer" && g.GroupState == "Stable"
		}
	}
	if !found {
		t.Fatalf("ListGroups does not list the consumer group")
	}
	// OffsetDelete refuses subscribed topics only.
	od := kmsg.NewPtrOffsetDeleteRequest()
	od.Group = "g"
	od.Topics = []kmsg.OffsetDeleteRequestTopic{
		{Topic: "t", Partitions: []kmsg.OffsetDeleteRequestTopicPartition{{Partition: 0}}},
		{Topic: "u", Partitions: []kmsg.OffsetDeleteRequestTopicPartition{{Partition: 0}}},
	}
	resp := h.do(od).(*kmsg.OffsetDeleteResponse)
	if resp.ErrorCode != errNone || len(resp.Topics) != 2 {
		t.Fatalf("OffsetDelete: %s, %d topics", errName(resp.ErrorCode), len(resp.Topics))
	}
	if resp.Topics[0].Partitions[0].ErrorCode != errGroupSubscribedToTopic {
		t.Fatalf("OffsetDelete of a subscribed topic: %s", errName(resp.Topics[0].Partitions[0].ErrorCode))
	}
	if resp.Topics[1].Partitions[0].ErrorCode == errGroupSubscribedToTopic {
		t.Fatalf("OffsetDelete of an unsubscribed topic refused")
	}
	// DeleteGroups refuses a non-empty group and deletes an empty one.
	del := kmsg.NewPtrDeleteGroupsRequest()
	del.Groups = []string{"g"}
	if code := h.do(del).(*kmsg.DeleteGroupsResponse).Groups[0].ErrorCode; code != errNonEmptyGroup {
		t.Fatalf("DeleteGroups of a non-empty consumer group: %s", errName(code))
	}
	h.consumerResp(consumerBeat("g", "m1", -1, nil), errNone)
	if code := h.do(del).(*kmsg.DeleteGroupsResponse).Groups[0].ErrorCode; code != errNone {
		t.Fatalf("DeleteGroups of an empty consumer group: %s", errName(code))
	}
	if d := h.describe("g"); d.ErrorCode != errGroupIDNotFound {
		t.Fatalf("deleted consumer group still described")
	}
}

func TestConsumerConfigDefaultsAndBounds(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"session below the minimum", Config{ConsumerSessionTimeout: 30 * time.Second}},
		{"session above the maximum", Config{ConsumerSessionTimeout: 61 * time.Second}},
		{"interval not below the session", Config{ConsumerHeartbeatInterval: 45 * time.Second}},
		{"unknown assignor", Config{ConsumerAssignors: []string{"sticky"}}},
		{"negative size", Config{ConsumerMaxGroupSize: -1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.Store = NewMemoryStore()
			if e, err := New(c.cfg); err == nil {
				e.Close()
				t.Fatalf("New accepted %+v", c.cfg)
			}
		})
	}
	h := newConsumerHarness(t, map[string]int32{"t": 1})
	resp := h.consumerResp(consumerJoin("g", "m1", "t"), errNone)
	if resp.HeartbeatIntervalMillis != 5000 {
		t.Fatalf("heartbeat interval %dms, want the 5s default", resp.HeartbeatIntervalMillis)
	}
	// The default session timeout is 45s: 44s of silence keep the
	// member, 45s expire it.
	h.advance(44 * time.Second)
	if d := h.describe("g"); len(d.Members) != 1 {
		t.Fatalf("member gone before 45s")
	}
	h.advance(time.Second)
	if d := h.describe("g"); len(d.Members) != 0 {
		t.Fatalf("member still there after 45s")
	}
}

// TestConsumerGroupOwnSettings: a group's own GROUP configs
// (consumer.session.timeout.ms, consumer.heartbeat.interval.ms) replace
// the engine's at its next heartbeat, as Kafka reads them at each one;
// values outside the engine's bounds are not used, and other groups keep
// the engine's.
func TestConsumerGroupOwnSettings(t *testing.T) {
	var mu sync.Mutex
	own := map[string]GroupSettings{}
	set := func(group string, gs GroupSettings) {
		mu.Lock()
		defer mu.Unlock()
		own[group] = gs
	}
	h := newConsumerHarness(t, map[string]int32{"t": 1}, func(c *Config) {
		c.GroupSettings = func(group string) GroupSettings {
			mu.Lock()
			defer mu.Unlock()
			return own[group]
		}
	})
	set("g", GroupSettings{ConsumerSessionTimeout: 50 * time.Second, ConsumerHeartbeatInterval: 2 * time.Second})
	resp := h.consumerResp(consumerJoin("g", "m1", "t"), errNone)
	if resp.HeartbeatIntervalMillis != 2000 {
		t.Fatalf("heartbeat interval %dms, want the group's 2s", resp.HeartbeatIntervalMillis)
	}
	other := h.consumerResp(consumerJoin("other", "o1", "t"), errNone)
	if other.HeartbeatIntervalMillis != 5000 {
		t.Fatalf("another group's heartbeat interval %dms, want the engine's 5s", other.HeartbeatIntervalMillis)
	}
	// The group's 50s session: 49s of silence keep the member (the
	// engine's 45s would have expired it), 50s expire it.
	h.advance(49 * time.Second)
	if d := h.describe("g"); len(d.Members) != 1 {
		t.Fatalf("member gone before the group's 50s session")
	}
	if d := h.describe("other"); len(d.Members) != 0 {
		t.Fatalf("the other group's member outlived the engine's 45s session")
	}
	h.advance(time.Second)
	if d := h.describe("g"); len(d.Members) != 0 {
		t.Fatalf("member still there after the group's 50s session")
	}

	// Out of the engine's bounds ([45s, 60s]): the engine's session, and
	// the group's interval still.
	set("g", GroupSettings{ConsumerSessionTimeout: 10 * time.Second, ConsumerHeartbeatInterval: 3 * time.Second})
	resp = h.consumerResp(consumerJoin("g", "m2", "t"), errNone)
	if resp.HeartbeatIntervalMillis != 3000 {
		t.Fatalf("heartbeat interval %dms, want the group's 3s", resp.HeartbeatIntervalMillis)
	}
	h.advance(44 * time.Second)
	if d := h.describe("g"); len(d.Members) != 1 {
		t.Fatalf("member expired before the engine's 45s: a session below the minimum was used")
	}
	h.advance(time.Second)
	if d := h.describe("g"); len(d.Members) != 0 {
		t.Fatalf("member still there after the engine's 45s")
	}
}

// TestConsumerGroupOlderEpochCommit checks KIP-1251: a commit at an older
// member epoch is accepted for partitions the member still holds that
// were assigned at or before that epoch, STALE_MEMBER_EPOCH otherwise.
func TestConsumerGroupOlderEpochCommit(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 4})
	m1 := h.join("g", "m1", "t")
	m2 := h.join("g", "m2", "t")
	h.settle("g", m1, m2)
	if m1.epoch != 2 || m2.epoch != 2 {
		t.Fatalf("epochs %d/%d, want 2/2", m1.epoch, m2.epoch)
	}
	tid := h.topicID("t")
	var kept, moved int32 = -1, -1
	for p := int32(0); p < 4; p++ {
		if m1.owned.has(tid, p) {
			kept = p
		} else {
			moved = p
		}
	}
	commit := func(member string, epoch, partition int32) int16 {
		return commitCode(t, h.do(commitReq(9, "g", member, epoch, partition, 1)))
	}
	if code := commit("m1", 1, kept); code != errNone {
		t.Fatalf("epoch-1 commit of a partition m1 kept since epoch 1: %s", errName(code))
	}
	if code := commit("m1", 1, moved); code != errStaleMemberEpoch {
		t.Fatalf("epoch-1 commit of a partition m1 gave up: %s", errName(code))
	}
	if code := commit("m2", 1, moved); code != errStaleMemberEpoch {
		t.Fatalf("epoch-1 commit of a partition m2 got at epoch 2: %s", errName(code))
	}
	if code := commit("m2", 2, moved); code != errNone {
		t.Fatalf("commit at m2's epoch: %s", errName(code))
	}
}

// TestConsumerGroupNotFoundTexts guards the error messages of a missing
// group and of a classic group, as Kafka's GroupMetadataManager words
// them (kafka-consumer-groups --describe shows them to the user).
func TestConsumerGroupNotFoundTexts(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 2})
	h.stableGroup("classic", 1)
	msgOf := func(p *string) string {
		if p == nil {
			return "<nil>"
		}
		return *p
	}
	for _, tc := range []struct{ group, want string }{
		{"nope", "Group nope not found."},
		{"classic", "Group classic is not a consumer group."},
	} {
		d := h.describe(tc.group)
		if d.ErrorCode != errGroupIDNotFound || msgOf(d.ErrorMessage) != tc.want {
			t.Errorf("describe %s: %s %q, want GROUP_ID_NOT_FOUND %q", tc.group, errName(d.ErrorCode), msgOf(d.ErrorMessage), tc.want)
		}
	}
	for _, tc := range []struct{ group, want string }{
		{"nope", "Consumer group nope not found."},
		{"classic", "Group classic is not a consumer group."},
	} {
		resp := h.consumerResp(consumerBeat(tc.group, "m1", 3, nil), errGroupIDNotFound)
		if msgOf(resp.ErrorMessage) != tc.want {
			t.Errorf("heartbeat to %s: %q, want %q", tc.group, msgOf(resp.ErrorMessage), tc.want)
		}
	}
}

// TestConsumerRegexResolvedAfterLiteralTopics guards Kafka's order for a
// member subscribed to a literal topic and a regex (KIP-848; librdkafka's
// 0045_resubscribe_with_regex relies on it): the first answer carries the
// literal topic's partitions, the regex's matches come on a later
// heartbeat after the group epoch bump their resolution causes; a second
// member with the same regex uses the group's resolution at once.
func TestConsumerRegexResolvedAfterLiteralTopics(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"orders": 2, "orders-eu": 2, "payments": 3})
	re := "orders.*"
	r := consumerJoin("g", "m1", "payments")
	r.SubscribedTopicRegex = &re
	m1 := &client{id: "m1"}
	m1.applyResp(h.consumerResp(r, errNone))
	pay := h.topicID("payments")
	if !m1.owned.equal(ps(pay, 0, 1, 2)) || m1.epoch != 1 {
		t.Fatalf("first answer: epoch %d owns %v, want epoch 1 with payments 0-2 only", m1.epoch, m1.owned)
	}
	h.flush()
	if d := h.describe("g"); d.Epoch != 2 || len(d.Members) != 1 || len(d.Members[0].SubscribedTopics) != 1 {
		t.Fatalf("after the regex was resolved: group epoch %d, members %+v; want epoch 2", d.Epoch, d.Members)
	}
	h.beat("g", m1)
	if m1.owned.size() != 7 || m1.epoch != 2 {
		t.Fatalf("the heartbeat after the resolution: epoch %d owns %v, want all 7 partitions at epoch 2", m1.epoch, m1.owned)
	}
	// A second member with the same regex: resolved already, so its
	// first answer counts the matches (the assignor shares them out).
	r = consumerJoin("g", "m2")
	r.SubscribedTopicNames = nil
	r.SubscribedTopicRegex = &re
	m2 := &client{id: "m2"}
	m2.applyResp(h.consumerResp(r, errNone))
	before := h.describe("g").Epoch
	h.flush()
	if d := h.describe("g"); d.Epoch != before {
		t.Fatalf("a resolved regex was resolved again: epoch %d -> %d", before, d.Epoch)
	}
	h.settle("g", m1, m2)
	if n := m1.owned.size() + m2.owned.size(); n != 7 || m2.owned.size() == 0 {
		t.Fatalf("m1 %v m2 %v, want the 7 partitions shared", m1.owned, m2.owned)
	}
}
