package kafkastore

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// The tests of this package that run the engine over a Store drive it
// through its public API (Engine.Handle), the way the proxy does: a
// package-internal test of groupstate cannot import kafkastore (kafkastore
// imports groupstate), so they live here, next to the store they prove.

// engine drives one groupstate.Engine in real time.
type engine struct {
	t testing.TB
	e *groupstate.Engine

	mu     sync.Mutex // guards events
	events []groupstate.Event
}

// newEngine starts an engine over store (real clock, no initial
// rebalance delay) and closes it at cleanup.
func newEngine(t testing.TB, store groupstate.OffsetStore) *engine {
	t.Helper()
	h := &engine{t: t}
	e, err := groupstate.New(groupstate.Config{
		Store:                 store,
		Shards:                2,
		InitialRebalanceDelay: -1,
		Events: func(ev groupstate.Event) {
			h.mu.Lock()
			h.events = append(h.events, ev)
			h.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatalf("groupstate.New: %v", err)
	}
	t.Cleanup(e.Close)
	h.e = e
	return h
}

// takeEvents returns the events seen so far for group and forgets them.
// Events are emitted on the loop before the reply of the request that
// caused them, so every answered request's events are in.
func (h *engine) takeEvents(group string) []groupstate.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out, rest []groupstate.Event
	for _, ev := range h.events {
		if ev.Group == group {
			out = append(out, ev)
		} else {
			rest = append(rest, ev)
		}
	}
	h.events = rest
	return out
}

// call is an in-flight request.
type call struct {
	t  testing.TB
	ch chan kmsg.Response
}

// send hands req to the engine; it fails the test if the reply is ever
// called twice.
func (h *engine) send(req kmsg.Request) *call {
	c := &call{t: h.t, ch: make(chan kmsg.Response, 2)}
	var once sync.Once
	h.e.Handle(groupstate.RequestContext{ClientID: "client", ClientHost: "10.0.0.1"}, req, func(resp kmsg.Response) {
		called := false
		once.Do(func() { called = true })
		if !called {
			h.t.Errorf("reply called twice for key %d", req.Key())
		}
		c.ch <- resp
	})
	return c
}

// do sends req and waits for its answer.
func (h *engine) do(req kmsg.Request) kmsg.Response {
	h.t.Helper()
	return h.send(req).wait()
}

// wait returns the call's response, failing after 10s.
func (c *call) wait() kmsg.Response {
	c.t.Helper()
	select {
	case r := <-c.ch:
		return r
	case <-time.After(10 * time.Second):
		c.t.Fatalf("no response within 10s")
		return nil
	}
}

// joinReq builds a v9 JoinGroup of a consumer subscribed to "t".
func joinReq(group, member string) *kmsg.JoinGroupRequest {
	r := kmsg.NewPtrJoinGroupRequest()
	r.Version = 9
	r.Group, r.MemberID = group, member
	r.SessionTimeoutMillis, r.RebalanceTimeoutMillis = 10000, 30000
	r.ProtocolType = "consumer"
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{"t"}
	r.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta.AppendTo(nil)}}
	return r
}

// joinedGroup builds a group of n dynamic members in
// CompletingRebalance and returns their ids (leader first) and the
// generation. Every member does its KIP-394 handshake first, so the
// pending ids hold the join open until the last one joins.
func (h *engine) joinedGroup(group string, n int) ([]string, int32) {
	h.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		resp := h.do(joinReq(group, "")).(*kmsg.JoinGroupResponse)
		if resp.ErrorCode != kerr.MemberIDRequired.Code {
			h.t.Fatalf("handshake: %s", errName(resp.ErrorCode))
		}
		ids[i] = resp.MemberID
	}
	calls := make([]*call, n)
	for i, id := range ids {
		calls[i] = h.send(joinReq(group, id))
	}
	var leader string
	var gen int32
	for i, c := range calls {
		r := c.wait().(*kmsg.JoinGroupResponse)
		if r.ErrorCode != 0 {
			h.t.Fatalf("join: %s", errName(r.ErrorCode))
		}
		if i == 0 {
			leader, gen = r.LeaderID, r.Generation
		}
		if r.LeaderID != leader || r.Generation != gen {
			h.t.Fatalf("members disagree: leader %s/%s generation %d/%d", r.LeaderID, leader, r.Generation, gen)
		}
	}
	ordered := []string{leader}
	for _, id := range ids {
		if id != leader {
			ordered = append(ordered, id)
		}
	}
	return ordered, gen
}

// stableGroup is joinedGroup followed by every member's SyncGroup (member
// i gets partition i of "t").
func (h *engine) stableGroup(group string, n int) ([]string, int32) {
	h.t.Helper()
	ids, gen := h.joinedGroup(group, n)
	var calls []*call
	for _, id := range ids[1:] {
		calls = append(calls, h.send(syncReq(group, id, gen, nil)))
	}
	assign := map[string][]byte{}
	for i, id := range ids {
		assign[id] = assignment("t", int32(i))
	}
	calls = append(calls, h.send(syncReq(group, ids[0], gen, assign)))
	for _, c := range calls {
		if r := c.wait().(*kmsg.SyncGroupResponse); r.ErrorCode != 0 {
			h.t.Fatalf("sync: %s", errName(r.ErrorCode))
		}
	}
	return ids, gen
}

// heartbeat sends a Heartbeat and returns its error code.
func (h *engine) heartbeat(group, member string, gen int32) int16 {
	h.t.Helper()
	r := kmsg.NewPtrHeartbeatRequest()
	r.Version = 4
	r.Group, r.MemberID, r.Generation = group, member, gen
	return h.do(r).(*kmsg.HeartbeatResponse).ErrorCode
}

// syncReq builds a v5 SyncGroup.
func syncReq(group, member string, gen int32, assign map[string][]byte) *kmsg.SyncGroupRequest {
	r := kmsg.NewPtrSyncGroupRequest()
	r.Version = 5
	r.Group, r.MemberID, r.Generation = group, member, gen
	ids := make([]string, 0, len(assign))
	for id := range assign {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r.GroupAssignment = append(r.GroupAssignment, kmsg.SyncGroupRequestGroupAssignment{MemberID: id, MemberAssignment: assign[id]})
	}
	return r
}

// assignment encodes a consumer assignment of topic partitions.
func assignment(topic string, partitions ...int32) []byte {
	a := kmsg.NewConsumerMemberAssignment()
	a.Topics = []kmsg.ConsumerMemberAssignmentTopic{{Topic: topic, Partitions: partitions}}
	return a.AppendTo(nil)
}

// commitReq builds an OffsetCommit of one partition of topic "t".
func commitReq(version int16, group, member string, gen int32, partition int32, offset int64) *kmsg.OffsetCommitRequest {
	r := kmsg.NewPtrOffsetCommitRequest()
	r.Version = version
	r.Group, r.MemberID, r.Generation = group, member, gen
	p := kmsg.NewOffsetCommitRequestTopicPartition()
	p.Partition, p.Offset = partition, offset
	r.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "t", Partitions: []kmsg.OffsetCommitRequestTopicPartition{p}}}
	return r
}

// commitCode returns the single partition error of a commit.
func commitCode(t testing.TB, r kmsg.Response) int16 {
	t.Helper()
	resp := r.(*kmsg.OffsetCommitResponse)
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("commit response shape: %#v", resp)
	}
	return resp.Topics[0].Partitions[0].ErrorCode
}

// errName names an error code.
func errName(code int16) string {
	if code == 0 {
		return "NONE"
	}
	return kerr.ErrorForCode(code).Error()
}
