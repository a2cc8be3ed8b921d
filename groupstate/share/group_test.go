package share

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

type fakeTopics map[string]Topic

func (f fakeTopics) TopicByName(n string) ([16]byte, int32, bool) {
	t, ok := f[n]
	return t.ID, t.Partitions, ok
}

func (f fakeTopics) TopicByID(id [16]byte) (string, bool) {
	for n, t := range f {
		if t.ID == id {
			return n, true
		}
	}
	return "", false
}

var gcfg = GroupConfig{SessionTimeout: 45 * time.Second, HeartbeatInterval: 5 * time.Second, MaxSize: 3}

func hb(member string, epoch int32, subs ...string) *kmsg.ShareGroupHeartbeatRequest {
	r := kmsg.NewPtrShareGroupHeartbeatRequest()
	r.GroupID = "g"
	r.MemberID = member
	r.MemberEpoch = epoch
	if subs != nil {
		r.SubscribedTopicNames = subs
	}
	return r
}

func assigned(r *kmsg.ShareGroupHeartbeatResponse) []TopicPartition {
	if r.Assignment == nil {
		return nil
	}
	var out []TopicPartition
	for _, t := range r.Assignment.TopicPartitions {
		for _, p := range t.Partitions {
			out = append(out, TopicPartition{t.TopicID, p})
		}
	}
	return out
}

func TestHeartbeatValidation(t *testing.T) {
	g := NewGroup("g")
	topics := fakeTopics{"a": {ID: tid(1), Partitions: 2}}
	empty := ""
	cases := []struct {
		name string
		req  *kmsg.ShareGroupHeartbeatRequest
		want int16
	}{
		{"empty member", hb("", 0, "a"), kerr.InvalidRequest.Code},
		{"long member", hb(strings.Repeat("x", 37), 0, "a"), kerr.InvalidRequest.Code},
		{"no subscription", hb("m", 0), kerr.InvalidRequest.Code},
		{"empty subscription", hb("m", 0, []string{}...), kerr.InvalidRequest.Code},
		{"bad epoch", hb("m", -2, "a"), kerr.InvalidRequest.Code},
		{"unknown member", hb("m", 3), kerr.UnknownMemberID.Code},
		{"unknown leave", hb("m", -1), kerr.UnknownMemberID.Code},
	}
	bad := hb("m", 0, "a")
	bad.RackID = &empty
	cases = append(cases, struct {
		name string
		req  *kmsg.ShareGroupHeartbeatRequest
		want int16
	}{"empty rack", bad, kerr.InvalidRequest.Code})
	for _, c := range cases {
		if r := g.Heartbeat(c.req, topics, t0, gcfg); r.ErrorCode != c.want {
			t.Errorf("%s: code %d, want %d", c.name, r.ErrorCode, c.want)
		}
	}
	if !g.Empty() || g.Epoch() != 0 {
		t.Fatalf("failed heartbeats changed the group: epoch %d", g.Epoch())
	}
	if r := g.Heartbeat(hb(strings.Repeat("x", 36), 0, "a"), topics, t0, gcfg); r.ErrorCode != 0 {
		t.Fatalf("36-char member id: %d", r.ErrorCode)
	}
}

func TestHeartbeatJoinAssignLeave(t *testing.T) {
	g := NewGroup("g")
	topics := fakeTopics{"a": {ID: tid(1), Partitions: 4}}
	r := g.Heartbeat(hb("m1", 0, "a"), topics, t0, gcfg)
	if r.ErrorCode != 0 || r.MemberEpoch != 1 || r.HeartbeatIntervalMillis != 5000 || len(assigned(r)) != 4 {
		t.Fatalf("join: %+v %v", r, assigned(r))
	}
	if g.State() != StateStable || g.Epoch() != 1 {
		t.Fatalf("state %s epoch %d", g.State(), g.Epoch())
	}
	// Steady heartbeat: no assignment in the response.
	r = g.Heartbeat(hb("m1", 1), topics, t0.Add(time.Second), gcfg)
	if r.ErrorCode != 0 || r.MemberEpoch != 1 || r.Assignment != nil {
		t.Fatalf("steady: %+v", r)
	}
	// m2 joins: epoch 2, m2 gets half at once; m1 moves at its next heartbeat.
	r = g.Heartbeat(hb("m2", 0, "a"), topics, t0.Add(2*time.Second), gcfg)
	if r.MemberEpoch != 2 || len(assigned(r)) != 2 {
		t.Fatalf("m2 join: %+v %v", r, assigned(r))
	}
	if len(g.Assignment("m1")) != 4 {
		t.Fatalf("m1 moved before its heartbeat")
	}
	r = g.Heartbeat(hb("m1", 1), topics, t0.Add(3*time.Second), gcfg)
	if r.MemberEpoch != 2 || len(assigned(r)) != 2 {
		t.Fatalf("m1 reconcile: %+v %v", r, assigned(r))
	}
	// Previous epoch is tolerated (lost response); older or future is fenced.
	if r = g.Heartbeat(hb("m1", 1), topics, t0.Add(4*time.Second), gcfg); r.ErrorCode != 0 || r.MemberEpoch != 2 {
		t.Fatalf("previous epoch: %+v", r)
	}
	if r = g.Heartbeat(hb("m1", 3), topics, t0.Add(4*time.Second), gcfg); r.ErrorCode != kerr.FencedMemberEpoch.Code {
		t.Fatalf("future epoch: %+v", r)
	}
	if r = g.Heartbeat(hb("m2", 1), topics, t0.Add(4*time.Second), gcfg); r.ErrorCode != kerr.FencedMemberEpoch.Code {
		t.Fatalf("m2 old epoch (prev 0): %+v", r)
	}
	// Leave.
	r = g.Heartbeat(hb("m2", -1), topics, t0.Add(5*time.Second), gcfg)
	if r.ErrorCode != 0 || r.MemberEpoch != -1 || *r.MemberID != "m2" {
		t.Fatalf("leave: %+v", r)
	}
	if g.Epoch() != 3 {
		t.Fatalf("epoch after leave %d", g.Epoch())
	}
	r = g.Heartbeat(hb("m1", 2), topics, t0.Add(6*time.Second), gcfg)
	if r.MemberEpoch != 3 || len(assigned(r)) != 4 {
		t.Fatalf("after leave: %+v %v", r, assigned(r))
	}
}

func TestHeartbeatMaxSizeAndMetadataBump(t *testing.T) {
	g := NewGroup("g")
	topics := fakeTopics{"a": {ID: tid(1), Partitions: 1}}
	for _, m := range []string{"a1", "a2", "a3"} {
		if r := g.Heartbeat(hb(m, 0, "a"), topics, t0, gcfg); r.ErrorCode != 0 {
			t.Fatalf("join %s: %d", m, r.ErrorCode)
		}
	}
	if r := g.Heartbeat(hb("a4", 0, "a"), topics, t0, gcfg); r.ErrorCode != kerr.GroupMaxSizeReached.Code {
		t.Fatalf("4th member: %d", r.ErrorCode)
	}
	// Members beyond partitions share the partition (each reconciles at
	// its next heartbeat).
	for _, m := range []string{"a1", "a2", "a3"} {
		g.Heartbeat(hb(m, g.members[m].epoch), topics, t0, gcfg)
		if len(g.Assignment(m)) != 1 {
			t.Fatalf("%s: %v", m, g.Assignment(m))
		}
	}
	e := g.Epoch()
	// The topic grows: the next heartbeat bumps the epoch and reassigns.
	topics["a"] = Topic{ID: tid(1), Partitions: 3}
	r := g.Heartbeat(hb("a1", g.members["a1"].epoch), topics, t0, gcfg)
	if g.Epoch() != e+1 || r.MemberEpoch != e+1 || len(g.Assignment("a1")) != 1 {
		t.Fatalf("grow: epoch %d resp %+v %v", g.Epoch(), r, g.Assignment("a1"))
	}
	// The three members now hold one partition each, none shared.
	seen := map[TopicPartition]bool{}
	for _, m := range []string{"a2", "a3"} {
		g.Heartbeat(hb(m, g.members[m].epoch), topics, t0, gcfg)
	}
	for _, m := range []string{"a1", "a2", "a3"} {
		for _, tp := range g.Assignment(m) {
			if seen[tp] {
				t.Fatalf("%v shared after growth", tp)
			}
			seen[tp] = true
		}
	}
	if len(seen) != 3 {
		t.Fatalf("assigned %v", seen)
	}
	// Subscription change bumps too.
	r = g.Heartbeat(hb("a1", r.MemberEpoch, "a", "b"), topics, t0, gcfg)
	if g.Epoch() != e+2 || r.Assignment == nil {
		t.Fatalf("subscription change: epoch %d %+v", g.Epoch(), r)
	}
}

func TestExpireAndDescribe(t *testing.T) {
	g := NewGroup("g")
	topics := fakeTopics{"a": {ID: tid(1), Partitions: 2}}
	g.Heartbeat(hb("m1", 0, "a"), topics, t0, gcfg)
	g.Heartbeat(hb("m2", 0, "a"), topics, t0.Add(10*time.Second), gcfg)
	g.SetClientInfo("m1", "cid", "/10.0.0.1")
	if d, ok := g.NextDeadline(); !ok || !d.Equal(t0.Add(45*time.Second)) {
		t.Fatalf("deadline %v", d)
	}
	if gone := g.Expire(t0.Add(45*time.Second - 1)); len(gone) != 0 {
		t.Fatalf("expired early %v", gone)
	}
	if gone := g.Expire(t0.Add(45 * time.Second)); !reflect.DeepEqual(gone, []string{"m1"}) {
		t.Fatalf("expired %v", gone)
	}
	g.Heartbeat(hb("m2", g.members["m2"].epoch), topics, t0.Add(46*time.Second), gcfg)
	var d kmsg.ShareGroupDescribeResponseGroup
	g.Describe(&d, topics)
	if d.GroupState != "Stable" || d.Assignor != "simple" || len(d.Members) != 1 || d.Members[0].MemberID != "m2" ||
		len(d.Members[0].Assignment.TopicPartitions) != 1 || d.Members[0].Assignment.TopicPartitions[0].Topic != "a" ||
		len(d.Members[0].Assignment.TopicPartitions[0].Partitions) != 2 || d.GroupEpoch != d.AssignmentEpoch {
		t.Fatalf("describe %+v", d)
	}
	g.Expire(t0.Add(time.Hour))
	g.Describe(&d, topics)
	if d.GroupState != "Empty" || len(d.Members) != 0 || !g.Empty() {
		t.Fatalf("describe empty %+v", d)
	}
}

func TestGroupSnapshotRoundTrip(t *testing.T) {
	g := NewGroup("g")
	topics := fakeTopics{"a": {ID: tid(1), Partitions: 3}}
	rack := "r1"
	req := hb("m1", 0, "a")
	req.RackID = &rack
	g.Heartbeat(req, topics, t0, gcfg)
	g.Heartbeat(hb("m2", 0, "a"), topics, t0, gcfg)
	g.SetClientInfo("m2", "c", "h")
	s := g.Snapshot()
	dec, err := UnmarshalGroup(MarshalGroup(s))
	if err != nil || !reflect.DeepEqual(dec, s) {
		t.Fatalf("round trip: %v\n%+v\n%+v", err, dec, s)
	}
	h, err := RestoreGroup(dec, t0.Add(time.Minute), gcfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h.Snapshot(), s) {
		t.Fatalf("restored group differs")
	}
	// The restored group answers the members at their epochs without a bump.
	m1 := s.Members[0]
	r := h.Heartbeat(hb("m1", m1.Epoch), topics, t0.Add(time.Minute), gcfg)
	if r.ErrorCode != 0 || h.Epoch() != s.Epoch {
		t.Fatalf("after restore: %+v epoch %d want %d", r, h.Epoch(), s.Epoch)
	}
	if d, _ := h.NextDeadline(); !d.Equal(t0.Add(time.Minute + 45*time.Second)) {
		t.Fatalf("restored session deadline %v", d)
	}
}

func FuzzUnmarshalGroup(f *testing.F) {
	g := NewGroup("g")
	g.Heartbeat(hb("m1", 0, "a"), fakeTopics{"a": {ID: tid(1), Partitions: 3}}, t0, gcfg)
	f.Add(MarshalGroup(g.Snapshot()))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := UnmarshalGroup(b)
		if err != nil {
			return
		}
		if !reflect.DeepEqual(MarshalGroup(s), b) {
			t.Fatalf("re-encoding differs")
		}
		_, _ = RestoreGroup(s, t0, gcfg)
	})
}
