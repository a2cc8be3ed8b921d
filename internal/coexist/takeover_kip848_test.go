package coexist

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/proxy"
)

// fakeConsumerStore adds the KIP-848 half to fakeTakeoverStore.
type fakeConsumerStore struct {
	*fakeTakeoverStore
	consumer kmsg.ConsumerGroupDescribeResponseGroup
	kip848   map[string][]TakeoverMember
}

func (s *fakeConsumerStore) DescribeConsumerGroup(context.Context, string) (kmsg.ConsumerGroupDescribeResponseGroup, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.consumer, nil
}

func (s *fakeConsumerStore) PrepareConsumerTakeover(group string, rec []byte, members []TakeoverMember) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kip848[group], s.records[group] = members, rec
	return nil
}

var topicT = [16]byte{1}

// beat848 runs a watched ConsumerGroupHeartbeat of member id at epoch
// (0 joins) answered at answerEpoch with assigned (nil: no assignment in
// the answer).
func beat848(w *forwardWatcher, id string, epoch, answerEpoch int32, assigned []int32) {
	q := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	q.Group, q.MemberID, q.MemberEpoch, q.RebalanceTimeoutMillis = "g", id, epoch, -1
	if epoch == 0 {
		q.SubscribedTopicNames, q.RebalanceTimeoutMillis = []string{"t"}, 45000
		a := "uniform"
		q.ServerAssignor = &a
	}
	done := w.Watch(proxy.Client{ID: "client-" + id, Host: "10.0.0.2"}, "g", q)
	r := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	r.MemberID, r.MemberEpoch, r.HeartbeatIntervalMillis = &id, answerEpoch, 1000
	if assigned != nil {
		r.Assignment = &kmsg.ConsumerGroupHeartbeatResponseAssignment{Topics: []kmsg.ConsumerGroupHeartbeatResponseAssignmentTopic{{TopicID: topicT, Partitions: assigned}}}
	}
	done(r)
}

func described848(epoch int32, members map[string][]int32, target map[string][]int32) kmsg.ConsumerGroupDescribeResponseGroup {
	d := kmsg.NewConsumerGroupDescribeResponseGroup()
	d.Group, d.State, d.Epoch, d.AssignmentEpoch, d.AssignorName = "g", "Stable", epoch, epoch, "uniform"
	for id, ps := range members {
		m := kmsg.NewConsumerGroupDescribeResponseGroupMember()
		m.MemberID, m.MemberEpoch, m.MemberType, m.SubscribedTopics = id, epoch, 1, []string{"t"}
		m.ClientHost = "/10.0.0.2"
		m.Assignment.TopicPartitions = []kmsg.AssignmentTopicPartition{{TopicID: topicT, Topic: "t", Partitions: ps}}
		tps := ps
		if target != nil {
			tps = target[id]
		}
		m.TargetAssignment.TopicPartitions = []kmsg.AssignmentTopicPartition{{TopicID: topicT, Topic: "t", Partitions: tps}}
		d.Members = append(d.Members, m)
	}
	return d
}

// TestTakeoverKIP848Local: a KIP-848 group whose members the kproxy
// forwards is taken over at the cluster's epoch with the assignments the
// members were told; not while one is unreconciled, was told another
// epoch or assignment, or the cluster lists a member not watched.
func TestTakeoverKIP848Local(t *testing.T) {
	ctx := context.Background()
	w, base := newTestWatcher(t, nil)
	st := &fakeConsumerStore{fakeTakeoverStore: base, kip848: map[string][]TakeoverMember{}}
	w.store = st
	var got groupstate.ConsumerTakeover
	w.consumerRecord = func(tk groupstate.ConsumerTakeover) ([]byte, error) { got = tk; return []byte("rec"), nil }

	beat848(w, "m1", 0, 5, []int32{0, 1, 2})
	beat848(w, "m2", 0, 6, []int32{})
	beat848(w, "m2", 6, 6, nil) // the epoch's answer without a new assignment
	steps := []struct {
		name string
		d    kmsg.ConsumerGroupDescribeResponseGroup
		prep func()
		want bool
	}{
		{"direct member", described848(6, map[string][]int32{"m1": {0, 1, 2}, "m2": {}, "d": {3}}, nil), nil, false},
		{"m1 told epoch 5", described848(6, map[string][]int32{"m1": {0, 1, 2}, "m2": {}}, nil), nil, false},
		{"m1 revoking", described848(6, map[string][]int32{"m1": {0, 1}, "m2": {2}}, map[string][]int32{"m1": {0, 1}, "m2": {2}}),
			func() { beat848(w, "m1", 5, 6, []int32{0, 1}) }, false},
		{"m2 not reconciled", described848(6, map[string][]int32{"m1": {0, 1}, "m2": {}}, map[string][]int32{"m1": {0, 1}, "m2": {2}}), nil, false},
		{"told just now", described848(7, map[string][]int32{"m1": {0, 1}, "m2": {2}}, nil),
			func() { beat848(w, "m2", 6, 7, []int32{2}); beat848(w, "m1", 6, 7, nil); w.settle = time.Hour }, false},
		{"stable", described848(7, map[string][]int32{"m1": {0, 1}, "m2": {2}}, nil),
			func() { w.settle = 0 }, true},
	}
	for _, s := range steps {
		if s.prep != nil {
			s.prep()
		}
		st.mu.Lock()
		st.consumer = s.d
		st.mu.Unlock()
		if err := w.tryTakeover(ctx, "g"); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if took := len(st.kip848) > 0; took != s.want {
			t.Fatalf("%s: taken over %v, want %v", s.name, took, s.want)
		}
	}
	if got.Epoch != 7 || got.Assignor != "uniform" || len(got.Members) != 2 {
		t.Fatalf("takeover %+v", got)
	}
	for _, m := range got.Members {
		if want := map[string][]int32{"m1": {0, 1}, "m2": {2}}[m.ID]; !slices.Equal(m.Assigned[topicT], want) {
			t.Fatalf("%s assigned %v, want %v", m.ID, m.Assigned[topicT], want)
		}
		if m.ServerAssignor != "uniform" || m.RebalanceTimeout != 45*time.Second || m.ClientID != "client-"+m.ID {
			t.Fatalf("member %+v", m)
		}
	}
	if w.fw.Forwarded("g") {
		t.Fatal("still forwarded after the takeover")
	}
	w.finishReleases()
	if !st.ready["g"] {
		t.Fatal("takeover never ready with nothing in flight")
	}
}

// TestTakeoverKIP848Report: a KIP-848 member travels in a fleet report
// with its epoch, assignment and subscription.
func TestTakeoverKIP848Report(t *testing.T) {
	w, _ := newTestWatcher(t, func(string) bool { return false })
	beat848(w, "m1", 0, 3, []int32{4, 1})
	_, reports := w.candidates()
	if len(reports) != 1 {
		t.Fatalf("reports %v", reports)
	}
	b, err := json.Marshal(reports[0])
	if err != nil {
		t.Fatal(err)
	}
	var back memberReport
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	m := back.Members[0].member(time.Now())
	if m.kip848 == nil || m.generation != 3 || !m.synced || !samePartitions(map[[16]byte][]int32{topicT: {1, 4}}, m.kip848.assigned) ||
		len(m.kip848.Subscribed) != 1 || m.kip848.RebalanceMS != 45000 {
		t.Fatalf("reported member %+v (kip848 %+v) from %s", m, m.kip848, b)
	}
}

// fence848 runs a watched ConsumerGroupHeartbeat of member id at epoch
// answered with code by the cluster.
func fence848(w *forwardWatcher, id string, epoch int32, code int16) {
	q := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	q.Group, q.MemberID, q.MemberEpoch, q.RebalanceTimeoutMillis = "g", id, epoch, -1
	done := w.Watch(proxy.Client{ID: "client-" + id, Host: "10.0.0.2"}, "g", q)
	r := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	r.ErrorCode = code
	done(r)
}

// TestHandBackKIP848Fenced: the fencings a KIP-848 hand-back waits for
// (Anchors.handBackConsumer). A member's forwarded heartbeat answered
// UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH counts, here and, through a
// report, at the group's owner, and so does a leave (the member holds
// nothing either), which paces nobody; a join at epoch 0, another error,
// a fencing before since or of another member does not.
func TestHandBackKIP848Fenced(t *testing.T) {
	owner, _ := newTestWatcher(t, func(string) bool { return true })
	relay, _ := newTestWatcher(t, func(string) bool { return false })
	relay.id, relay.send = "relay-1", peerWire(t, owner)
	ids := []string{"a", "b", "c", "d", "e", "old"}

	fence848(owner, "old", 3, 25) // UNKNOWN_MEMBER_ID, before the hand-back
	time.Sleep(5 * time.Millisecond)
	since := time.Now()
	fence848(owner, "a", 3, 25)  // UNKNOWN_MEMBER_ID
	fence848(relay, "b", 3, 110) // FENCED_MEMBER_EPOCH
	fence848(relay, "c", 0, 25)  // a join refused: it held nothing
	fence848(relay, "d", -1, 25) // a leave (the cluster no longer knew d)
	fence848(relay, "e", 3, 27)  // REBALANCE_IN_PROGRESS: not fenced
	fence848(relay, "x", 3, 25)  // not one of ids

	want := map[string]bool{"a": true}
	if got := owner.fencedSince("g", since, ids); !maps.Equal(got, want) {
		t.Fatalf("before the relay reported: fenced %v, want %v", got, want)
	}
	if got := relay.fencedSince("g", since, ids); !maps.Equal(got, map[string]bool{"b": true, "d": true}) {
		t.Fatalf("at the relay: fenced %v, want b and d", got)
	}
	select {
	case <-relay.fencedNow:
	default:
		t.Fatal("a fencing in a group another kproxy owns did not ask for a report at once")
	}
	reps := relay.fencedReports()
	if len(reps) != 1 || len(reps[0].Fenced) != 3 {
		t.Fatalf("fenced reports %+v, want one of group g with b, d and x", reps)
	}
	relay.report(context.Background(), reps[0])
	want["b"], want["d"] = true, true
	if got := owner.fencedSince("g", since, ids); !maps.Equal(got, want) {
		t.Fatalf("after the relay reported: fenced %v, want %v", got, want)
	}
	if got := owner.fencedSince("g", time.Now().Add(time.Second), ids); len(got) != 0 {
		t.Fatalf("fencings before since counted: %v", got)
	}
	if got := owner.fencedSince("other", since, ids); len(got) != 0 {
		t.Fatalf("another group's fencings counted: %v", got)
	}
}

// TestHandBackKIP848Paced: once a member of a KIP-848 group was fenced
// on a heartbeat forwarded here, the answers to the group's members
// forwarded here carry handBackPace as their heartbeat interval (not a
// longer one), and the watched member's session is still counted from
// the cluster's interval; not in a group without a fencing, nor once the
// fencing is older than fencedKeep.
func TestHandBackKIP848Paced(t *testing.T) {
	w, _ := newTestWatcher(t, func(string) bool { return false })
	beat := func(id string, interval int32) int32 {
		q := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		q.Group, q.MemberID, q.MemberEpoch, q.RebalanceTimeoutMillis = "g", id, 0, 45000
		q.SubscribedTopicNames = []string{"t"}
		done := w.Watch(proxy.Client{ID: "client-" + id, Host: "10.0.0.2"}, "g", q)
		r := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		r.MemberID, r.MemberEpoch, r.HeartbeatIntervalMillis = &id, 4, interval
		done(r)
		return r.HeartbeatIntervalMillis
	}
	if got := beat("a", 5000); got != 5000 {
		t.Fatalf("paced to %d ms without a fencing", got)
	}
	fence848(w, "old", 3, 25)
	if got := beat("a2", 5000); got != handBackPace {
		t.Fatalf("after a fencing the interval is %d ms, want %d", got, handBackPace)
	}
	if got := beat("a3", 300); got != 300 {
		t.Fatalf("a shorter interval was changed to %d ms", got)
	}
	w.mu.Lock()
	if s := w.groups["g"].members["a2"].sessionMS; s != 15000 {
		t.Errorf("watched session %d ms, want 3 cluster intervals (15000)", s)
	}
	w.groups["g"].lastFenced = time.Now().Add(-fencedKeep - time.Second)
	w.mu.Unlock()
	if got := beat("a4", 5000); got != 5000 {
		t.Fatalf("paced to %d ms after fencedKeep", got)
	}
}

// TestHandBackKIP848PacedWhileHoldingNone: a member is paced only while it
// holds no partition (given one, it heartbeats at the cluster's
// interval, as directly, and a later fencing does not pace it; one that
// holds nothing is paced again); a leave paces nobody.
func TestHandBackKIP848PacedWhileHoldingNone(t *testing.T) {
	w, _ := newTestWatcher(t, func(string) bool { return false })
	topic := [16]byte{1}
	beat := func(id string, epoch int32, partitions []int32) int32 {
		q := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		q.Group, q.MemberID, q.MemberEpoch, q.RebalanceTimeoutMillis = "g", id, epoch, 45000
		if epoch == 0 {
			q.SubscribedTopicNames = []string{"t"}
		}
		done := w.Watch(proxy.Client{ID: "client-" + id, Host: "10.0.0.2"}, "g", q)
		r := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		r.MemberID, r.MemberEpoch, r.HeartbeatIntervalMillis = &id, epoch+1, 5000
		if partitions != nil {
			r.Assignment = &kmsg.ConsumerGroupHeartbeatResponseAssignment{
				Topics: []kmsg.ConsumerGroupHeartbeatResponseAssignmentTopic{{TopicID: topic, Partitions: partitions}}}
		}
		done(r)
		return r.HeartbeatIntervalMillis
	}
	fence848(w, "gone", -1, 25) // a leave
	if got := beat("a", 0, nil); got != 5000 {
		t.Fatalf("paced to %d ms after a leave alone", got)
	}
	fence848(w, "old", 3, 25)
	if got := beat("a", 1, nil); got != handBackPace {
		t.Fatalf("after a fencing the interval is %d ms, want %d", got, handBackPace)
	}
	if got := beat("a", 2, []int32{}); got != handBackPace {
		t.Fatalf("an empty assignment ended the pacing (%d ms)", got)
	}
	if got := beat("a", 3, []int32{0, 1}); got != 5000 {
		t.Fatalf("the answer that gives partitions paced to %d ms", got)
	}
	if got := beat("a", 4, nil); got != 5000 {
		t.Fatalf("a member given its partitions is still paced (%d ms)", got)
	}
	time.Sleep(time.Millisecond)
	fence848(w, "old2", 3, 25)
	if got := beat("a", 5, nil); got != 5000 {
		t.Fatalf("a later fencing paced a member holding partitions (%d ms)", got)
	}
	if got := beat("a", 6, []int32{}); got != handBackPace {
		t.Fatalf("a member whose partitions were all revoked is not paced (%d ms)", got)
	}
}
