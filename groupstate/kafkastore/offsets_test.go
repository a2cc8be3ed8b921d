package kafkastore

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

// TestStoreRoundTrip proves that offsets committed through the engine
// land in the upstream cluster's own group offsets (read back with kadm,
// as a lag tool would) and come back through OffsetFetch, and that the
// group's delete reaches the cluster.
func TestStoreRoundTrip(t *testing.T) {
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
	store := New(cl)
	h := newEngine(t, store)
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
	if code := commitCode(t, h.do(stale)); code != kerr.IllegalGeneration.Code {
		t.Fatalf("stale commit: %s", errName(code))
	}

	adm := kadm.NewClient(cl)
	offs, err := adm.FetchOffsets(ctx, "app")
	if err != nil {
		t.Fatalf("kadm fetch: %v", err)
	}
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

	// OffsetDelete of a simple group reaches the cluster.
	sc := commitReq(8, "simple-x", "", -1, 1, 11)
	sc.Topics[0].Topic = "orders"
	if code := commitCode(t, h.do(sc)); code != 0 {
		t.Fatalf("simple commit: %s", errName(code))
	}
	od := kmsg.NewPtrOffsetDeleteRequest()
	od.Group = "simple-x"
	od.Topics = []kmsg.OffsetDeleteRequestTopic{{Topic: "orders", Partitions: []kmsg.OffsetDeleteRequestTopicPartition{{Partition: 1}}}}
	if r := h.do(od).(*kmsg.OffsetDeleteResponse); r.ErrorCode != 0 || r.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("offset delete: %+v", r)
	}
	if offs, err := adm.FetchOffsets(ctx, "simple-x"); err == nil {
		if _, ok := offs.Lookup("orders", 1); ok {
			t.Fatal("deleted offset still upstream")
		}
	}

	// A transactional offset commit, validated by the engine, is
	// forwarded to the transaction's group coordinator and becomes
	// visible when the transaction commits.
	ip := kmsg.NewPtrInitProducerIDRequest()
	txID := "tx-1"
	ip.TransactionalID = &txID
	ip.TransactionTimeoutMillis = 10000
	ipr, err := ip.RequestWith(ctx, cl)
	if err != nil || ipr.ErrorCode != 0 {
		t.Fatalf("init producer id: %v %v", err, kerr.ErrorForCode(ipr.ErrorCode))
	}
	ao := kmsg.NewPtrAddOffsetsToTxnRequest()
	ao.TransactionalID, ao.ProducerID, ao.ProducerEpoch, ao.Group = txID, ipr.ProducerID, ipr.ProducerEpoch, "app"
	if aor, err := ao.RequestWith(ctx, cl); err != nil || aor.ErrorCode != 0 {
		t.Fatalf("add offsets to txn: %v %+v", err, aor)
	}
	tc := kmsg.NewPtrTxnOffsetCommitRequest()
	tc.Version = 3
	tc.TransactionalID, tc.Group, tc.ProducerID, tc.ProducerEpoch = txID, "app", ipr.ProducerID, ipr.ProducerEpoch
	tc.MemberID, tc.Generation = ids[0], gen
	tp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	tp.Partition, tp.Offset = 1, 77
	tc.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "orders", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{tp}}}
	if r := h.do(tc).(*kmsg.TxnOffsetCommitResponse); r.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("txn offset commit: %s", errName(r.Topics[0].Partitions[0].ErrorCode))
	}
	et := kmsg.NewPtrEndTxnRequest()
	et.TransactionalID, et.ProducerID, et.ProducerEpoch, et.Commit = txID, ipr.ProducerID, ipr.ProducerEpoch, true
	if etr, err := et.RequestWith(ctx, cl); err != nil || etr.ErrorCode != 0 {
		t.Fatalf("end txn: %v %+v", err, etr)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		offs, err := adm.FetchOffsets(ctx, "app")
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := offs.Lookup("orders", 1); ok && o.At == 77 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("transactional offset never visible upstream: %+v", offs)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A group the cluster never heard of has no offsets, whatever the
	// version (kfake answers GROUP_ID_NOT_FOUND, Kafka -1 offsets).
	for _, v := range []int16{7, 8} {
		f := kmsg.NewPtrOffsetFetchRequest()
		f.Version = v
		f.Group = "nobody"
		f.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "orders", Partitions: []int32{0}}}
		f.Groups = []kmsg.OffsetFetchRequestGroup{{Group: "nobody", MemberEpoch: -1, Topics: []kmsg.OffsetFetchRequestGroupTopic{{Topic: "orders", Partitions: []int32{0}}}}}
		fr := h.do(f).(*kmsg.OffsetFetchResponse)
		code, n, off := fr.ErrorCode, 0, int64(0)
		if v >= 8 {
			code = fr.Groups[0].ErrorCode
			for _, t := range fr.Groups[0].Topics {
				for _, p := range t.Partitions {
					n, off = n+1, p.Offset
				}
			}
		} else {
			for _, t := range fr.Topics {
				for _, p := range t.Partitions {
					n, off = n+1, p.Offset
				}
			}
		}
		if code != 0 || n != 1 || off != -1 {
			t.Fatalf("fetch v%d of an unknown group: %s, %d partitions, offset %d", v, errName(code), n, off)
		}
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
	if dr.Groups[0].ErrorCode != 0 || dr.Groups[1].ErrorCode != kerr.GroupIDNotFound.Code {
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
