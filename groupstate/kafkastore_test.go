package groupstate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestKafkaStoreRoundTrip proves that offsets committed through the engine
// land in the upstream cluster's own group offsets (read back with kadm,
// as a lag tool would) and come back through OffsetFetch, and that the
// group's delete reaches the cluster.
func TestKafkaStoreRoundTrip(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatalf("kgo: %v", err)
	}
	t.Cleanup(cl.Close)
	store := NewKafkaStore(cl)
	h := newHarness(t, func(c *Config) { c.Store = store; c.Clock = nil })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A member of an engine-run group commits (generation checked by the
	// engine, stored upstream as a simple commit).
	ids, gen := h.stableGroup("app", 1)
	req := commitReq(8, "app", ids[0], gen, 0, 42)
	req.Topics[0].Topic = "orders"
	md := "meta"
	req.Topics[0].Partitions[0].Metadata = &md
	p := kmsg.NewOffsetCommitRequestTopicPartition()
	p.Partition, p.Offset = 2, 7
	req.Topics[0].Partitions = append(req.Topics[0].Partitions, p)
	resp := h.do(req).(*kmsg.OffsetCommitResponse)
	for _, rp := range resp.Topics[0].Partitions {
		if rp.ErrorCode != 0 {
			t.Fatalf("commit partition %d: %s", rp.Partition, errName(rp.ErrorCode))
		}
	}
	// A stale generation never reaches the cluster.
	stale := commitReq(8, "app", ids[0], gen+5, 1, 99)
	stale.Topics[0].Topic = "orders"
	if code := commitCode(t, h.do(stale)); code != errIllegalGeneration {
		t.Fatalf("stale commit: %s", errName(code))
	}

	adm := kadm.NewClient(cl)
	offs, err := adm.FetchOffsets(ctx, "app")
	if err != nil {
		t.Fatalf("kadm fetch: %v", err)
	}
	t.Logf("upstream offsets: %+v", offs)
	if o, ok := offs.Lookup("orders", 0); !ok || o.At != 42 || o.Metadata != "meta" {
		t.Fatalf("upstream partition 0: %+v %v", o, ok)
	}
	if o, ok := offs.Lookup("orders", 2); !ok || o.At != 7 {
		t.Fatalf("upstream partition 2: %+v %v", o, ok)
	}
	if _, ok := offs.Lookup("orders", 1); ok {
		t.Fatal("the rejected commit reached the cluster")
	}

	// Back through the engine: by name (v7), fetch-all (v8) and by topic
	// id (v10).
	f := kmsg.NewPtrOffsetFetchRequest()
	f.Version = 7
	f.Group = "app"
	f.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "orders", Partitions: []int32{0, 1, 2}}}
	fr := h.do(f).(*kmsg.OffsetFetchResponse)
	if fr.ErrorCode != 0 || len(fr.Topics) != 1 || fr.Topics[0].Partitions[0].Offset != 42 || fr.Topics[0].Partitions[1].Offset != -1 || fr.Topics[0].Partitions[2].Offset != 7 {
		t.Fatalf("fetch v7: %+v", fr)
	}
	ids2, err := store.TopicIDs(ctx, []string{"orders"})
	if err != nil || ids2["orders"] == ([16]byte{}) {
		t.Fatalf("topic id: %v %v", ids2, err)
	}
	f10 := kmsg.NewPtrOffsetFetchRequest()
	f10.Version = 10
	f10.Groups = []kmsg.OffsetFetchRequestGroup{{Group: "app", MemberEpoch: -1, Topics: []kmsg.OffsetFetchRequestGroupTopic{{TopicID: ids2["orders"], Partitions: []int32{0}}}}, {Group: "app", MemberEpoch: -1}}
	fr = h.do(f10).(*kmsg.OffsetFetchResponse)
	if g := fr.Groups[0]; g.ErrorCode != 0 || g.Topics[0].TopicID != ids2["orders"] || g.Topics[0].Partitions[0].Offset != 42 {
		t.Fatalf("fetch v10 by id: %+v", fr.Groups[0])
	}
	if g := fr.Groups[1]; g.ErrorCode != 0 || len(g.Topics) != 1 || len(g.Topics[0].Partitions) != 2 || g.Topics[0].TopicID != ids2["orders"] {
		t.Fatalf("fetch v10 all: %+v", fr.Groups[1])
	}

	// Simple groups upstream appear in ListGroups; deleting the emptied
	// group deletes its offsets upstream.
	l := kmsg.NewPtrListGroupsRequest()
	l.Version = 4
	lr := h.do(l).(*kmsg.ListGroupsResponse)
	found := false
	for _, g := range lr.Groups {
		found = found || g.Group == "app"
	}
	if lr.ErrorCode != 0 || !found {
		t.Fatalf("list groups: %+v", lr)
	}
	lv := kmsg.NewPtrLeaveGroupRequest()
	lv.Group, lv.MemberID = "app", ids[0]
	h.do(lv)
	d := kmsg.NewPtrDeleteGroupsRequest()
	d.Groups = []string{"app", "never-existed"}
	dr := h.do(d).(*kmsg.DeleteGroupsResponse)
	if dr.Groups[0].ErrorCode != 0 || dr.Groups[1].ErrorCode != errGroupIDNotFound {
		t.Fatalf("delete groups: %s %s", errName(dr.Groups[0].ErrorCode), errName(dr.Groups[1].ErrorCode))
	}
	offs, err = adm.FetchOffsets(ctx, "app")
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		t.Fatalf("kadm fetch after delete: %v", err)
	}
	if _, ok := offs.Lookup("orders", 0); ok {
		t.Fatal("offsets survived the group delete upstream")
	}
	if err := store.DeleteGroup(ctx, "never-existed"); !errors.Is(err, kerr.GroupIDNotFound) {
		t.Fatalf("store delete of unknown group: %v", err)
	}
}
