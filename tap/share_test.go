package tap

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/share"
)

// shareHeartbeat sends a ShareGroupHeartbeat of member (epoch 0 with
// topics joins, -1 leaves) and returns the response.
func shareHeartbeat(t *testing.T, e *groupstate.Engine, group, member, client string, epoch int32, topics ...string) *kmsg.ShareGroupHeartbeatResponse {
	t.Helper()
	r := kmsg.NewPtrShareGroupHeartbeatRequest()
	r.Version = 1
	r.GroupID, r.MemberID, r.MemberEpoch = group, member, epoch
	if len(topics) > 0 {
		r.SubscribedTopicNames = topics
	}
	ch := make(chan kmsg.Response, 1)
	e.Handle(groupstate.RequestContext{ClientID: client, ClientHost: "127.0.0.1"}, r, func(resp kmsg.Response) { ch <- resp })
	select {
	case resp := <-ch:
		hr := resp.(*kmsg.ShareGroupHeartbeatResponse)
		if hr.ErrorCode != 0 {
			t.Fatalf("share heartbeat of %s: error %d", member, hr.ErrorCode)
		}
		return hr
	case <-time.After(10 * time.Second):
		t.Fatalf("share heartbeat of %s: no answer", member)
		return nil
	}
}

// shareTopicID returns the id the store gave topic.
func shareTopicID(t *testing.T, store *groupstate.MemoryStore, topic string) [16]byte {
	t.Helper()
	ids, err := store.TopicIDs(context.Background(), []string{topic})
	if err != nil || ids[topic] == ([16]byte{}) {
		t.Fatalf("no id for %s: %v", topic, err)
	}
	return ids[topic]
}

// shareDeliver runs the engine's side of one ShareFetch for member on tp
// of a log of records 0..end-1 in one batch, with acks applied first,
// and returns what it acquired.
func shareDeliver(t *testing.T, e *groupstate.Engine, group, member string, tp groupstate.ShareTP, end int64, acks []share.AckBatch) []share.Acquired {
	t.Helper()
	ackMap := map[groupstate.ShareTP][]share.AckBatch{}
	if acks != nil {
		ackMap[tp] = acks
	}
	plans := make(chan groupstate.SharePlan, 1)
	e.SharePrepare(group, member, ackMap, []groupstate.ShareTP{tp}, func(p groupstate.SharePlan) { plans <- p })
	plan := <-plans
	if plan.Code != 0 {
		t.Fatalf("SharePrepare: %d", plan.Code)
	}
	for tp, c := range plan.AckCodes {
		if c != 0 {
			t.Fatalf("acknowledging %v: %d", tp, c)
		}
	}
	if len(plan.Uninitialized) > 0 {
		done := make(chan int16, 1)
		e.ShareInitialize(group, map[groupstate.ShareTP]int64{tp: 0}, func(c int16) { done <- c })
		if c := <-done; c != 0 {
			t.Fatalf("ShareInitialize: %d", c)
		}
		e.SharePrepare(group, member, nil, []groupstate.ShareTP{tp}, func(p groupstate.SharePlan) { plans <- p })
		plan = <-plans
	}
	from := plan.Offsets[tp]
	if from >= end {
		return nil
	}
	got := make(chan map[groupstate.ShareTP][]share.Acquired, 1)
	e.ShareAcquire(group, member, map[groupstate.ShareTP]groupstate.ShareFetched{tp: {FetchOffset: from, Batches: []share.Batch{{Base: from, Last: end - 1}}}},
		500, share.BatchOptimized, 500, func(m map[groupstate.ShareTP][]share.Acquired, code int16) {
			if code != 0 {
				t.Errorf("ShareAcquire: %d", code)
			}
			got <- m
		})
	return (<-got)[tp]
}

// shareEngineTap starts an engine on a manual clock, with topic "jobs"
// of 2 partitions, a lock of 5 s and a delivery limit of 2, feeding a
// test Tap.
func shareEngineTap(t *testing.T) (*groupstate.Engine, *Tap, *groupstate.MemoryStore, *manualClock) {
	t.Helper()
	tp, _ := newTestTap(t, Config{})
	clk := newManualClock()
	store := groupstate.NewMemoryStore()
	store.SetTopic("jobs", 2)
	e, err := groupstate.New(groupstate.Config{
		Store:  store,
		Events: tp.OnEvent,
		Shards: 1,
		Clock:  clk,
		ShareSettings: func(string) groupstate.ShareSettings {
			return groupstate.ShareSettings{LockDuration: 5 * time.Second, DeliveryLimit: 2}
		},
	})
	if err != nil {
		t.Fatalf("groupstate.New: %v", err)
	}
	t.Cleanup(e.Close)
	tp.SetGroupSource(e)
	return e, tp, store, clk
}

// TestShareMetrics: a share group's deliveries, acknowledgements, lock
// timeouts, redeliveries and archiving at the limit show in /metrics,
// with its share-partitions and locked records per group.
func TestShareMetrics(t *testing.T) {
	e, tp, store, clk := shareEngineTap(t)
	const g = "queue"
	shareHeartbeat(t, e, g, "member-a", "client-a", 0, "jobs")
	part := groupstate.ShareTP{TopicID: shareTopicID(t, store, "jobs"), Partition: 0}

	// 0-9 delivered; 0-3 accepted, 4 rejected, 5-9 time out.
	if got := shareDeliver(t, e, g, "member-a", part, 10, nil); len(got) != 1 || got[0].Last != 9 {
		t.Fatalf("first delivery %+v", got)
	}
	acks := []share.AckBatch{{First: 0, Last: 3, Types: []share.AckType{share.AckAccept}}, {First: 4, Last: 4, Types: []share.AckType{share.AckReject}}}
	shareDeliver(t, e, g, "member-a", part, 10, acks) // 5-9 still locked: nothing new
	clk.Advance(6 * time.Second)
	e.Group(g) // the lock timer ran on the loop
	// 5-9 delivered again (count 2 = the limit) and released: archived.
	if got := shareDeliver(t, e, g, "member-a", part, 12, nil); len(got) == 0 || got[0].First != 5 || got[0].DeliveryCount != 2 {
		t.Fatalf("redelivery %+v", got)
	}
	flush(t, tp)

	body := metricsText(t, tp)
	for _, want := range []string{
		`kproxy_share_records_acknowledged_total{kproxy_share_ack_type="accept"} 4`,
		`kproxy_share_records_acknowledged_total{kproxy_share_ack_type="reject"} 1`,
		`kproxy_share_records_acknowledged_total{kproxy_share_ack_type="release"} 0`,
		`kproxy_share_records_lock_timeouts_total 5`,
		`kproxy_share_records_redelivered_total 5`,
		`kproxy_share_partitions{messaging_consumer_group_name="queue"} 1`,
		`kproxy_share_records_archived_at_limit_total 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q\n%s", want, grepLines(body, "kproxy_share"))
		}
	}
	locked := attrLine(body, `kproxy_share_records_locked{messaging_consumer_group_name="queue"}`)
	if locked != "7" { // 5-9 again and 10-11
		t.Errorf("records locked in /metrics: %q, want 7\n%s", locked, grepLines(body, "kproxy_share"))
	}

	// Releasing what it holds at the limit archives it.
	rel := []share.AckBatch{{First: 5, Last: 9, Types: []share.AckType{share.AckRelease}}}
	plans := make(chan groupstate.SharePlan, 1)
	e.SharePrepare(g, "member-a", map[groupstate.ShareTP][]share.AckBatch{part: rel}, nil, func(p groupstate.SharePlan) { plans <- p })
	if p := <-plans; p.AckCodes[part] != 0 {
		t.Fatalf("release: %d", p.AckCodes[part])
	}
	body = metricsText(t, tp)
	for _, want := range []string{
		`kproxy_share_records_archived_at_limit_total 5`,
		`kproxy_share_records_acknowledged_total{kproxy_share_ack_type="release"} 5`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q\n%s", want, grepLines(body, "kproxy_share"))
		}
	}
	if !strings.Contains(body, "kproxy_share_records_acquired_total ") || !strings.Contains(body, "kproxy_share_state_writes_total ") ||
		!strings.Contains(body, "kproxy_share_state_write_time_seconds_total ") {
		t.Errorf("/metrics lacks the acquired or write counters\n%s", grepLines(body, "kproxy_share"))
	}
}

// attrLine returns the value of the metric line starting with prefix.
func attrLine(body, prefix string) string {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix+" ") {
			return strings.TrimPrefix(l, prefix+" ")
		}
	}
	return ""
}
