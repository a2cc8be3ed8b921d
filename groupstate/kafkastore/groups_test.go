package kafkastore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// newKfakeClient starts a one-broker kfake cluster and returns a client
// factory for it (each call is a new client, as after a restart).
func newKfakeClient(t testing.TB) func() *kgo.Client {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	return func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
		if err != nil {
			t.Fatalf("kgo: %v", err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
}

// TestStoreGroupMetadata proves that group records round-trip
// through the compacted topic: created on first use with
// cleanup.policy=compact, last value per key wins, tombstones delete, and
// a new store (a restarted kproxy) reads the same.
func TestStoreGroupMetadata(t *testing.T) {
	newClient := newKfakeClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient()
	store := NewWith(cl, Options{GroupsPartitions: 4})

	if _, found, err := store.LoadGroupMetadata(ctx, "nobody"); err != nil || found {
		t.Fatalf("load before any write: found %v err %v", found, err)
	}
	cfgs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, DefaultGroupsTopic)
	if err != nil {
		t.Fatalf("describe configs: %v", err)
	}
	rc, err := cfgs.On(DefaultGroupsTopic, nil)
	if err != nil || rc.Err != nil {
		t.Fatalf("configs of %s: %v %v", DefaultGroupsTopic, err, rc.Err)
	}
	compact, maxBytes := false, false
	for _, c := range rc.Configs {
		compact = compact || (c.Key == "cleanup.policy" && c.Value != nil && *c.Value == "compact")
		maxBytes = maxBytes || (c.Key == "max.message.bytes" && c.Value != nil && *c.Value == "8388608")
	}
	if !compact || !maxBytes {
		t.Fatalf("%s is not compacted with 8 MiB records: %+v", DefaultGroupsTopic, rc.Configs)
	}
	td, err := kadm.NewClient(cl).ListTopics(ctx, DefaultGroupsTopic)
	if err != nil || len(td[DefaultGroupsTopic].Partitions) != 4 {
		t.Fatalf("topic: %+v %v", td, err)
	}

	// Many groups over every partition, each written twice.
	const n = 40
	used := map[int32]bool{}
	for i := range n {
		g := fmt.Sprintf("group-%d", i)
		used[GroupPartition(g, 4)] = true
		for round := range 2 {
			if err := store.SaveGroupMetadata(ctx, g, fmt.Appendf(nil, "%s/%d", g, round)); err != nil {
				t.Fatalf("save %s: %v", g, err)
			}
		}
	}
	if len(used) != 4 {
		t.Fatalf("groups hashed to %d of 4 partitions", len(used))
	}
	if err := store.DeleteGroupMetadata(ctx, "group-3"); err != nil {
		t.Fatalf("tombstone: %v", err)
	}

	// A new store over a new client, as after a restart.
	// Every group loads at once (as after a restart), twice per group:
	// the loads share partition scans and each gets its own key's value.
	again := New(newClient())
	var wg sync.WaitGroup
	for i := range 2 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := fmt.Sprintf("group-%d", i%n)
			rec, found, err := again.LoadGroupMetadata(ctx, g)
			switch {
			case err != nil:
				t.Errorf("load %s: %v", g, err)
			case i%n == 3 && found:
				t.Errorf("tombstoned %s found: %q", g, rec)
			case i%n != 3 && (!found || string(rec) != g+"/1"):
				t.Errorf("load %s: %q %v", g, rec, found)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// Written again after its tombstone, it is back.
	if err := again.SaveGroupMetadata(ctx, "group-3", []byte("back")); err != nil {
		t.Fatal(err)
	}
	if rec, found, err := store.LoadGroupMetadata(ctx, "group-3"); err != nil || !found || string(rec) != "back" {
		t.Fatalf("after the rewrite: %q %v %v", rec, found, err)
	}
	// The records are plain keyed records: any consumer reads them.
	direct := newClient()
	direct.AddConsumePartitions(map[string]map[int32]kgo.Offset{DefaultGroupsTopic: {
		0: kgo.NewOffset().AtStart(), 1: kgo.NewOffset().AtStart(), 2: kgo.NewOffset().AtStart(), 3: kgo.NewOffset().AtStart(),
	}})
	seen := 0
	for seen < 2*n+2 {
		fs := direct.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("consume: %v", err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			seen++
			if want := GroupPartition(string(r.Key), 4); r.Partition != want {
				t.Errorf("record of %s in partition %d, want %d", r.Key, r.Partition, want)
			}
		})
	}
}

// TestStoreWarnsOnUncompactedTopic: a groups topic made by someone
// else without compaction works but is reported loudly.
func TestStoreWarnsOnUncompactedTopic(t *testing.T) {
	newClient := newKfakeClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := newClient()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 2, -1, nil, "plain-groups"); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	store := NewWith(cl, Options{GroupsTopic: "plain-groups", Logger: logger})
	if err := store.SaveGroupMetadata(ctx, "g", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if rec, ok, err := store.LoadGroupMetadata(ctx, "g"); err != nil || !ok || string(rec) != "x" {
		t.Fatalf("load: %q %v %v", rec, ok, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "not compacted") {
		t.Fatalf("no warning about the uncompacted topic; logs: %s", logs.String())
	}
}

// TestStoreCreatesWithExplicitReplication: a broker older than 2.4
// refuses replication factor -1; the store asks again with
// min(3, brokers).
func TestStoreCreatesWithExplicitReplication(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	var mu sync.Mutex
	var asked []int16
	cluster.ControlKey(19, func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.CreateTopicsRequest)
		rf := req.Topics[0].ReplicationFactor
		mu.Lock()
		asked = append(asked, rf)
		mu.Unlock()
		if rf != -1 {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		rt := kmsg.NewCreateTopicsResponseTopic()
		rt.Topic, rt.ErrorCode = req.Topics[0].Topic, kerr.InvalidReplicationFactor.Code
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := New(cl)
	if err := store.SaveGroupMetadata(ctx, "g", []byte("v")); err != nil {
		t.Fatalf("save: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || asked[0] != -1 || asked[1] != 1 {
		t.Fatalf("replication factors asked: %v, want [-1 1]", asked)
	}
}

// writerFunc adapts a function to io.Writer.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestStoreEngineRestart runs a group on an engine over Store,
// replaces the engine and its client (a kproxy restart), and the group
// goes on at the same generation.
func TestStoreEngineRestart(t *testing.T) {
	newClient := newKfakeClient(t)
	h1 := newEngine(t, New(newClient()))
	ids, gen := h1.stableGroup("app", 2)
	h1.e.Close()

	h2 := newEngine(t, New(newClient()))
	r := h2.do(syncReq("app", ids[1], gen, nil)).(*kmsg.SyncGroupResponse)
	if r.ErrorCode != 0 || string(r.MemberAssignment) != string(assignment("t", 1)) {
		t.Fatalf("sync after restart: %s %x", errName(r.ErrorCode), r.MemberAssignment)
	}
	for _, id := range ids {
		if code := h2.heartbeat("app", id, gen); code != 0 {
			t.Fatalf("heartbeat after restart: %s", errName(code))
		}
	}
	snap, ok := h2.e.Group("app")
	if !ok || snap.State != "Stable" || snap.Generation != gen || snap.Leader != ids[0] {
		t.Fatalf("after restart: %+v", snap)
	}
	for _, ev := range h2.takeEvents("app") {
		if ev.Kind == groupstate.EventRebalanceStarted {
			t.Fatalf("rebalance after restart: %+v", ev)
		}
	}
}

// benchGroupSeq numbers benchmark groups (benchmarks run sequentially).
var benchGroupSeq int

// BenchmarkLeaderSyncPersist measures the latency of the leader's
// SyncGroup (followers already parked) over a Store on an
// in-process kfake broker, with the group metadata write (persist) and
// without it (offsets only), for groups of 1 and 10 members.
func BenchmarkLeaderSyncPersist(b *testing.B) {
	newClient := newKfakeClient(b)
	for _, mode := range []string{"offsets-only", "persist"} {
		for _, n := range []int{1, 10} {
			b.Run(fmt.Sprintf("%s/members=%d", mode, n), func(b *testing.B) {
				var store groupstate.OffsetStore = New(newClient())
				if mode == "offsets-only" {
					store = groupstate.WithoutGroupMetadata(store)
				}
				h := newEngine(b, store)
				for b.Loop() {
					b.StopTimer()
					// Unique over every run: the records of earlier
					// groups stay in the cluster.
					benchGroupSeq++
					group := fmt.Sprintf("bench-%d", benchGroupSeq)
					ids, gen := h.joinedGroup(group, n)
					var follow []*call
					for _, id := range ids[1:] {
						follow = append(follow, h.send(syncReq(group, id, gen, nil)))
					}
					assign := map[string][]byte{}
					for k, id := range ids {
						assign[id] = assignment("t", int32(k))
					}
					b.StartTimer()
					r := h.send(syncReq(group, ids[0], gen, assign)).wait().(*kmsg.SyncGroupResponse)
					b.StopTimer()
					if r.ErrorCode != 0 {
						b.Fatalf("leader sync: %s", errName(r.ErrorCode))
					}
					for _, c := range follow {
						c.wait()
					}
					b.StartTimer()
				}
			})
		}
	}
}

// BenchmarkStoreLoad measures loads (scans of a partition to the
// high watermark) with 1000 groups of 10 members stored in the default
// 16 partitions, each written twice: one group alone, and all of them at
// once.
func BenchmarkStoreLoad(b *testing.B) {
	newClient := newKfakeClient(b)
	ctx := context.Background()
	store := New(newClient())
	mem := groupstate.NewMemoryStore()
	h := newEngine(b, mem)
	h.stableGroup("template", 10)
	rec, _, err := mem.LoadGroupMetadata(ctx, "template")
	if err != nil || len(rec) == 0 {
		b.Fatalf("template record: %v", err)
	}
	const groups = 1000
	for i := range 2 * groups {
		if err := store.SaveGroupMetadata(ctx, fmt.Sprintf("load-%d", i%groups), rec); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("one", func(b *testing.B) {
		i := 0
		for b.Loop() {
			got, found, err := store.LoadGroupMetadata(ctx, fmt.Sprintf("load-%d", i%groups))
			if err != nil || !found || len(got) != len(rec) {
				b.Fatalf("load: %v %v", found, err)
			}
			i++
		}
		b.ReportMetric(float64(len(rec)), "record-bytes")
	})
	// All 1000 groups at once, as when every group comes back after a
	// restart; one op is the whole storm.
	b.Run("all-at-once", func(b *testing.B) {
		for b.Loop() {
			var wg sync.WaitGroup
			for i := range groups {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, found, err := store.LoadGroupMetadata(ctx, fmt.Sprintf("load-%d", i)); err != nil || !found {
						b.Errorf("load: %v %v", found, err)
					}
				}()
			}
			wg.Wait()
		}
	})
}
