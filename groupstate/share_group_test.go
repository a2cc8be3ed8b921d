package groupstate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/share"
)

// shareJoin is a first ShareGroupHeartbeat of member subscribing to topics.
func shareJoin(group, member string, topics ...string) *kmsg.ShareGroupHeartbeatRequest {
	r := kmsg.NewPtrShareGroupHeartbeatRequest()
	r.Version = 1
	r.GroupID, r.MemberID, r.MemberEpoch, r.SubscribedTopicNames = group, member, 0, topics
	return r
}

// shareSettingsForTest is a short session and lock, and a delivery limit
// of 3.
func shareSettingsForTest(c *Config) {
	c.ShareSettings = func(string) ShareSettings {
		return ShareSettings{SessionTimeout: 10 * time.Second, HeartbeatInterval: time.Second, LockDuration: 5 * time.Second, DeliveryLimit: 3}
	}
}

// shareFetch runs the engine's side of one ShareFetch for member on
// partition tp of a log of records 0..end-1 in batches of 10: acks, a
// start at 0 if new, then the acquisition.
func shareFetch(t *testing.T, h *harness, group, member string, tp ShareTP, end int64, acks []share.AckBatch) (SharePlan, []share.Acquired) {
	t.Helper()
	ackMap := map[ShareTP][]share.AckBatch{}
	if acks != nil {
		ackMap[tp] = acks
	}
	plans := make(chan SharePlan, 1)
	h.e.SharePrepare(group, member, ackMap, []ShareTP{tp}, func(p SharePlan) { plans <- p })
	plan := <-plans
	if plan.Code != errNone {
		return plan, nil
	}
	if len(plan.Uninitialized) > 0 {
		done := make(chan int16, 1)
		h.e.ShareInitialize(group, map[ShareTP]int64{tp: 0}, func(c int16) { done <- c })
		if c := <-done; c != errNone {
			t.Fatalf("ShareInitialize: %s", errName(c))
		}
		h.e.SharePrepare(group, member, nil, []ShareTP{tp}, func(p SharePlan) { plans <- p })
		plan = <-plans
	}
	from := plan.Offsets[tp]
	var batches []share.Batch
	for b := from - from%10; b < end; b += 10 {
		batches = append(batches, share.Batch{Base: b, Last: min(b+9, end-1)})
	}
	got := make(chan map[ShareTP][]share.Acquired, 1)
	h.e.ShareAcquire(group, member, map[ShareTP]ShareFetched{tp: {FetchOffset: from, Batches: batches}}, 500, share.BatchOptimized, 500,
		func(m map[ShareTP][]share.Acquired, code int16) {
			if code != errNone {
				t.Errorf("ShareAcquire: %s", errName(code))
			}
			got <- m
		})
	return plan, (<-got)[tp]
}

// shareAck applies member's acknowledgements of tp, fetching nothing, and
// returns their code.
func shareAck(t *testing.T, h *harness, group, member string, tp ShareTP, first, last int64, typ share.AckType) int16 {
	t.Helper()
	plans := make(chan SharePlan, 1)
	h.e.SharePrepare(group, member, map[ShareTP][]share.AckBatch{tp: {{First: first, Last: last, Types: []share.AckType{typ}}}}, nil,
		func(p SharePlan) { plans <- p })
	p := <-plans
	if p.Code != errNone {
		return p.Code
	}
	return p.AckCodes[tp]
}

// TestShareGroupIsAKind: a share group is one group among the others: an
// id held by a group of another kind gets Kafka's "is not a ... group"
// answers from each kind's APIs, ListGroups lists it with type "share",
// ShareGroupDescribe describes it, and DeleteGroups refuses it while it
// has members.
func TestShareGroupIsAKind(t *testing.T) {
	h := &consumerHarness{newHarness(t, shareSettingsForTest)}
	h.store.SetTopic("t", 2)
	h.refresh()

	resp := h.do(shareJoin("sg", "m1", "t")).(*kmsg.ShareGroupHeartbeatResponse)
	if resp.ErrorCode != errNone || resp.MemberEpoch != 1 || resp.Assignment == nil || len(resp.Assignment.TopicPartitions) != 1 || len(resp.Assignment.TopicPartitions[0].Partitions) != 2 {
		t.Fatalf("join: %s epoch %d assignment %+v", errName(resp.ErrorCode), resp.MemberEpoch, resp.Assignment)
	}

	// A consumer group's APIs on the share group.
	c := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	c.Group, c.MemberID, c.MemberEpoch = "sg", "x", 1
	cr := h.do(c).(*kmsg.ConsumerGroupHeartbeatResponse)
	if cr.ErrorCode != errGroupIDNotFound || cr.ErrorMessage == nil || *cr.ErrorMessage != "Group sg is not a consumer group." {
		t.Errorf("ConsumerGroupHeartbeat on a share group: %s %v", errName(cr.ErrorCode), cr.ErrorMessage)
	}
	d := kmsg.NewPtrDescribeGroupsRequest()
	d.Groups = []string{"sg"}
	dr := h.do(d).(*kmsg.DescribeGroupsResponse)
	if g := dr.Groups[0]; g.ErrorCode != errGroupIDNotFound || g.ErrorMessage == nil || !strings.Contains(*g.ErrorMessage, "is not a classic group") {
		t.Errorf("DescribeGroups of a share group: %s %v", errName(g.ErrorCode), g.ErrorMessage)
	}

	// A share heartbeat on a classic group.
	h.joinNew(jr{group: "cg", member: ""})
	h.flush()
	sr := h.do(shareJoin("cg", "m2", "t")).(*kmsg.ShareGroupHeartbeatResponse)
	if sr.ErrorCode != errGroupIDNotFound || sr.ErrorMessage == nil || *sr.ErrorMessage != "Group cg is not a share group." {
		t.Errorf("ShareGroupHeartbeat on a classic group: %s %v", errName(sr.ErrorCode), sr.ErrorMessage)
	}

	l := kmsg.NewPtrListGroupsRequest()
	l.Version = 5
	lr := h.do(l).(*kmsg.ListGroupsResponse)
	found := false
	for _, g := range lr.Groups {
		if g.Group == "sg" {
			found = g.GroupType == "share" && g.ProtocolType == "share" && g.GroupState == "Stable"
		}
	}
	if !found {
		t.Errorf("ListGroups: %+v, want sg as a Stable share group", lr.Groups)
	}
	sd := kmsg.NewPtrShareGroupDescribeRequest()
	sd.Version, sd.GroupIDs = 1, []string{"sg", "cg", "none"}
	sdr := h.do(sd).(*kmsg.ShareGroupDescribeResponse)
	if g := sdr.Groups[0]; g.ErrorCode != errNone || len(g.Members) != 1 || g.Members[0].MemberID != "m1" || g.Assignor != "simple" {
		t.Errorf("ShareGroupDescribe sg: %+v", g)
	}
	if g := sdr.Groups[1]; g.ErrorCode != errGroupIDNotFound || *g.ErrorMessage != "Group cg is not a share group." {
		t.Errorf("ShareGroupDescribe cg: %s %v", errName(g.ErrorCode), g.ErrorMessage)
	}
	if g := sdr.Groups[2]; g.ErrorCode != errGroupIDNotFound || *g.ErrorMessage != "Group none not found." {
		t.Errorf("ShareGroupDescribe none: %s %v", errName(g.ErrorCode), g.ErrorMessage)
	}

	del := kmsg.NewPtrDeleteGroupsRequest()
	del.Groups = []string{"sg"}
	if code := h.do(del).(*kmsg.DeleteGroupsResponse).Groups[0].ErrorCode; code != errNonEmptyGroup {
		t.Errorf("DeleteGroups of a share group with a member: %s", errName(code))
	}
	leave := shareJoin("sg", "m1")
	leave.MemberEpoch, leave.SubscribedTopicNames = -1, nil
	if lr := h.do(leave).(*kmsg.ShareGroupHeartbeatResponse); lr.ErrorCode != errNone {
		t.Fatalf("leave: %s", errName(lr.ErrorCode))
	}
	if code := h.do(del).(*kmsg.DeleteGroupsResponse).Groups[0].ErrorCode; code != errNone {
		t.Errorf("DeleteGroups of an empty share group: %s", errName(code))
	}
}

// TestShareLocksMembersAndReload: records acquired by a member come back
// when their lock times out (with a raised delivery count) and when the
// member's session expires; a record released at the delivery limit is
// archived; the share state is written before the answers, so an engine
// restarted over the same store resumes it: accepted records stay
// accepted and delivery counts are kept.
func TestShareLocksMembersAndReload(t *testing.T) {
	h := &consumerHarness{newHarness(t, shareSettingsForTest)}
	h.store.SetTopic("t", 1)
	h.refresh()
	tp := ShareTP{TopicID: h.topicID("t"), Partition: 0}
	for _, m := range []string{"a", "b"} {
		if r := h.do(shareJoin("g", m, "t")).(*kmsg.ShareGroupHeartbeatResponse); r.ErrorCode != errNone {
			t.Fatalf("join %s: %s", m, errName(r.ErrorCode))
		}
	}

	_, got := shareFetch(t, h.harness, "g", "a", tp, 20, nil)
	if len(got) != 1 || got[0].First != 0 || got[0].Last != 19 || got[0].DeliveryCount != 1 {
		t.Fatalf("a's first fetch acquired %+v, want 0-19 once", got)
	}
	// a accepts 0-9; 10-19 stay locked until their lock times out.
	if code := shareAck(t, h.harness, "g", "a", tp, 0, 9, share.AckAccept); code != errNone {
		t.Fatalf("accept: %s", errName(code))
	}
	if code := shareAck(t, h.harness, "g", "b", tp, 10, 10, share.AckAccept); code != errInvalidRecordState {
		t.Fatalf("b accepting a record a holds: %s, want INVALID_RECORD_STATE", errName(code))
	}
	if _, got := shareFetch(t, h.harness, "g", "b", tp, 20, nil); len(got) != 0 {
		t.Fatalf("b acquired %+v while a holds them", got)
	}
	h.advance(6 * time.Second) // the lock (5 s) times out; the sessions (10 s) do not
	if _, got := shareFetch(t, h.harness, "g", "b", tp, 20, nil); len(got) != 1 || got[0].First != 10 || got[0].DeliveryCount != 2 {
		t.Fatalf("after the lock timeout b acquired %+v, want 10-19 a second time", got)
	}
	// b releases them; a acquires them a third time (Kafka hands out
	// records on their last delivery a few at a time), then releases
	// them at the limit of 3: they are archived.
	if code := shareAck(t, h.harness, "g", "b", tp, 10, 19, share.AckRelease); code != errNone {
		t.Fatalf("b's release: %s", errName(code))
	}
	for i := 0; ; i++ {
		_, got := shareFetch(t, h.harness, "g", "a", tp, 20, nil)
		if len(got) == 0 {
			break
		}
		if i > 10 {
			t.Fatalf("records at their last delivery keep coming: %+v", got)
		}
		for _, r := range got {
			if r.DeliveryCount != 3 {
				t.Fatalf("a's third delivery: %+v", got)
			}
			if code := shareAck(t, h.harness, "g", "a", tp, r.First, r.Last, share.AckRelease); code != errNone {
				t.Fatalf("release at the limit: %s", errName(code))
			}
		}
	}
	states, _ := h.e.ShareStates("g")
	if len(states) != 1 || states[0].StartOffset != 20 {
		t.Fatalf("after the last delivery was released the start is %+v, want 20 (10-19 archived)", states)
	}

	// New records 20-29: a takes them and its session expires; b gets
	// them with their count raised.
	if _, got := shareFetch(t, h.harness, "g", "a", tp, 30, nil); len(got) != 1 || got[0].First != 20 {
		t.Fatalf("a's fetch of 20-29: %+v", got)
	}
	for range 4 { // b heartbeats through a's session
		h.advance(3 * time.Second)
		hbr := kmsg.NewPtrShareGroupHeartbeatRequest()
		hbr.Version, hbr.GroupID, hbr.MemberID = 1, "g", "b"
		hbr.MemberEpoch = memberEpochOf(t, h.harness, "g", "b")
		if r := h.do(hbr).(*kmsg.ShareGroupHeartbeatResponse); r.ErrorCode != errNone {
			t.Fatalf("b's heartbeat: %s", errName(r.ErrorCode))
		}
	}
	if snap, _ := h.e.Group("g"); len(snap.Members) != 1 || snap.Members[0].MemberID != "b" {
		t.Fatalf("after a's session: members %+v", snap.Members)
	}
	_, got = shareFetch(t, h.harness, "g", "b", tp, 30, nil)
	if len(got) != 1 || got[0].First != 20 || got[0].DeliveryCount != 2 {
		t.Fatalf("b after a expired: %+v", got)
	}
	// Delivered: 0-19, 10-19 twice more, 20-29 twice (60, 30 of them
	// again); 10-19 archived at
	// the limit, 20-29 released by the expiry (not at the limit).
	c := h.e.ShareCounters()
	if c.LockTimeouts < 10 || c.Writes == 0 {
		t.Errorf("counters %+v", c)
	}
	if c.Acquired != 60 || c.Redeliveries != 30 || c.ArchivedAtLimit != 10 ||
		c.Acknowledged[share.AckAccept] != 10 || c.Acknowledged[share.AckRelease] != 20 {
		t.Errorf("counters %+v, want 60 acquired, 30 redelivered, 10 archived at the limit, 10 accepted, 20 released", c)
	}
	if gs := h.e.ShareGroupStats(); len(gs) != 1 || gs[0].Group != "g" || gs[0].Partitions != 1 || gs[0].Acquired != 10 {
		t.Errorf("group stats %+v, want g with 1 share-partition and 10 records locked", gs)
	}

	// A new engine over the same store: b's acquired records are
	// available again with their count, accepted ones stay accepted.
	h.flush()
	h2 := &consumerHarness{newHarness(t, shareSettingsForTest, func(c *Config) { c.Store = h.store })}
	h2.refresh()
	_, got = shareFetch(t, h2.harness, "g", "b", tp, 30, nil)
	// (Records on their last delivery come a few at a time.)
	if len(got) == 0 || got[0].First != 20 || got[0].DeliveryCount != 3 {
		t.Fatalf("after the reload b acquired %+v, want records from 20 a third time", got)
	}
	states, _ = h2.e.ShareStates("g")
	if len(states) != 1 || states[0].StartOffset != 20 {
		t.Fatalf("reloaded start %+v, want 20", states)
	}
}

// memberEpochOf returns member's epoch from ShareGroupDescribe.
func memberEpochOf(t *testing.T, h *harness, group, member string) int32 {
	t.Helper()
	d := kmsg.NewPtrShareGroupDescribeRequest()
	d.Version, d.GroupIDs = 1, []string{group}
	for _, m := range h.do(d).(*kmsg.ShareGroupDescribeResponse).Groups[0].Members {
		if m.MemberID == member {
			return m.MemberEpoch
		}
	}
	t.Fatalf("%s is not a member of %s", member, group)
	return 0
}

// FuzzShareRecord: a share group record read back from the store decodes
// without a panic, and what encodes decodes to the same record.
func FuzzShareRecord(f *testing.F) {
	h := &consumerHarness{newHarness(f, shareSettingsForTest)}
	h.store.SetTopic("t", 2)
	h.refresh()
	h.do(shareJoin("g", "m", "t"))
	h.flush()
	rec, found, err := h.store.LoadGroupMetadata(context.Background(), "g")
	if err != nil || !found {
		f.Fatalf("no share group record: %v", err)
	}
	f.Add(rec)
	f.Add([]byte{0x4b, 0x53, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		gs, parts, err := decodeShareRecord(b)
		if err != nil {
			return
		}
		g := &shareGroup{parts: map[ShareTP]*share.Partition{}}
		sg, err := share.RestoreGroup(gs, time.Unix(0, 0), share.GroupConfig{})
		if err != nil {
			return
		}
		g.g = sg
		for tp, st := range parts {
			p := share.NewPartition(st.StartOffset)
			if p.Restore(st) != nil {
				return
			}
			g.parts[tp] = p
		}
		if _, _, err := decodeShareRecord(g.record()); err != nil {
			t.Fatalf("a decoded record encodes to one that does not decode: %v", err)
		}
	})
}

// TestShareEpochEvents: each group epoch bump of a share group emits
// EventRebalanceStarted with its cause, and the target computed for it
// EventAssignmentReconciled with every member's target; a leave's target
// comes with the next heartbeat, and the last member's expiry empties
// the group.
func TestShareEpochEvents(t *testing.T) {
	h := &consumerHarness{newHarness(t, shareSettingsForTest)}
	h.store.SetTopic("t", 2)
	h.refresh()
	type step struct {
		kind    EventKind
		cause   string
		epoch   int32
		members int
	}
	check := func(what string, want ...step) []Event {
		t.Helper()
		var got []Event
		for _, ev := range h.takeEvents("g") {
			if ev.Kind == EventRebalanceStarted || ev.Kind == EventAssignmentReconciled || ev.Kind == EventGroupEmpty {
				got = append(got, ev)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%s: events %+v, want %+v", what, got, want)
		}
		for i, w := range want {
			ev := got[i]
			if ev.Kind != w.kind || ev.Cause != w.cause || ev.Generation != w.epoch || len(ev.Members) != w.members || ev.GroupType != GroupTypeShare {
				t.Fatalf("%s: event %d %s cause %q epoch %d members %d type %q, want %+v", what, i, ev.Kind, ev.Cause, ev.Generation, len(ev.Members), ev.GroupType, w)
			}
		}
		return got
	}
	hb := func(member string, epoch int32, topics ...string) {
		t.Helper()
		r := shareJoin("g", member, topics...)
		r.MemberEpoch = epoch
		if len(topics) == 0 {
			r.SubscribedTopicNames = nil
		}
		if resp := h.do(r).(*kmsg.ShareGroupHeartbeatResponse); resp.ErrorCode != errNone {
			t.Fatalf("heartbeat of %s: %s", member, errName(resp.ErrorCode))
		}
	}

	hb("a", 0, "t")
	check("a joins", step{EventRebalanceStarted, CauseMemberJoined, 1, 0}, step{EventAssignmentReconciled, "", 1, 1})
	hb("b", 0, "t")
	got := check("b joins", step{EventRebalanceStarted, CauseMemberJoined, 2, 0}, step{EventAssignmentReconciled, "", 2, 2})
	if got[0].Member == nil || got[0].Member.MemberID != "b" {
		t.Errorf("b's join caused by %+v", got[0].Member)
	}
	var parts int
	for _, m := range got[1].Members {
		var a kmsg.ConsumerMemberAssignment
		if err := a.ReadFrom(m.Assignment); err != nil || len(a.Topics) != 1 || a.Topics[0].Topic != "t" {
			t.Fatalf("%s's target %+v: %v", m.MemberID, a.Topics, err)
		}
		parts += len(a.Topics[0].Partitions)
	}
	if parts != 2 {
		t.Errorf("targets hold %d partitions, want 2", parts)
	}
	hb("a", 1, "t", "u") // a new subscription
	check("a subscribes to u", step{EventRebalanceStarted, CauseSubscriptionChanged, 3, 0}, step{EventAssignmentReconciled, "", 3, 2})
	hb("b", -1)
	check("b leaves", step{EventRebalanceStarted, CauseMemberLeft, 4, 0})
	hb("a", 3)
	check("a heartbeats", step{EventAssignmentReconciled, "", 4, 1})
	h.store.SetTopic("t", 3)
	h.refresh()
	hb("a", 4)
	check("t grows", step{EventRebalanceStarted, CauseTopicsChanged, 5, 0}, step{EventAssignmentReconciled, "", 5, 1})
	h.advance(11 * time.Second)
	h.e.Group("g")
	got = check("a expires", step{EventRebalanceStarted, CauseMemberExpired, 6, 0}, step{EventGroupEmpty, "", 6, 0})
	if m := got[0].Member; m == nil || m.MemberID != "a" || m.ClientID == "" {
		t.Errorf("the expiry was caused by %+v, want a with its client id", m)
	}
}

// TestShareLeaveKeepsRecords: a member's leave heartbeat does not release
// the records it acquired. Kafka's group coordinator does not touch
// share-partitions; the broker releases them when the member's share
// session closes (a ShareFetch or ShareAcknowledge at epoch -1, or its
// connection: SharePartitionManager.releaseSession) or their locks run
// out, so a client that leaves first and acknowledges on close after
// still has its acknowledgements applied (librdkafka's 0178).
func TestShareLeaveKeepsRecords(t *testing.T) {
	h := &consumerHarness{newHarness(t, shareSettingsForTest)}
	h.store.SetTopic("t", 1)
	h.refresh()
	tp := ShareTP{TopicID: h.topicID("t"), Partition: 0}
	for _, m := range []string{"a", "b"} {
		if r := h.do(shareJoin("g", m, "t")).(*kmsg.ShareGroupHeartbeatResponse); r.ErrorCode != errNone {
			t.Fatalf("join %s: %s", m, errName(r.ErrorCode))
		}
	}
	if _, got := shareFetch(t, h.harness, "g", "a", tp, 20, nil); len(got) != 1 || got[0].First != 0 || got[0].Last != 19 {
		t.Fatalf("a's fetch acquired %+v, want 0-19", got)
	}
	leave := shareJoin("g", "a")
	leave.MemberEpoch, leave.SubscribedTopicNames = -1, nil
	if lr := h.do(leave).(*kmsg.ShareGroupHeartbeatResponse); lr.ErrorCode != errNone {
		t.Fatalf("a's leave: %s", errName(lr.ErrorCode))
	}
	if _, got := shareFetch(t, h.harness, "g", "b", tp, 20, nil); len(got) != 0 {
		t.Fatalf("after a's leave heartbeat b acquired %+v, want nothing (a still holds 0-19)", got)
	}
	if code := shareAck(t, h.harness, "g", "a", tp, 0, 19, share.AckAccept); code != errNone {
		t.Fatalf("a's accept after its leave heartbeat: %s, want NO_ERROR", errName(code))
	}
	if states, _ := h.e.ShareStates("g"); len(states) != 1 || states[0].StartOffset != 20 {
		t.Fatalf("share state %+v, want the start at 20 (0-19 accepted)", states)
	}
}
