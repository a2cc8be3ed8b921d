package kafkastore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/upstream"
)

// txnCluster is a kfake cluster for the transactional tests, with topic
// "orders" (4 partitions) for offset commits.
type txnCluster struct {
	t testing.TB
	c *kfake.Cluster
	// endTxns counts EndTxn requests (commit) the cluster received.
	endTxns atomic.Int64
}

// testGroupsPartitions is the groups topic size of these tests.
const testGroupsPartitions = 4

func newTxnCluster(t testing.TB) *txnCluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(4, "orders"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	tc := &txnCluster{t: t, c: c}
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if req.(*kmsg.EndTxnRequest).Commit {
			tc.endTxns.Add(1)
		}
		return nil, nil, false
	})
	// The store's transactional requests stay below KIP-890 part 2
	// (kfake implements it, so kgo alone would go higher).
	for key, max := range map[kmsg.Key]int16{
		kmsg.Produce: maxTxnProduceVersion, kmsg.AddPartitionsToTxn: maxAddPartitionsToTxnVersion,
		kmsg.AddOffsetsToTxn: maxAddOffsetsToTxnVersion, kmsg.TxnOffsetCommit: maxTxnOffsetCommitVersion,
		kmsg.EndTxn: maxEndTxnVersion, kmsg.InitProducerID: maxInitProducerIDVersion,
	} {
		c.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			switch r := req.(type) {
			case *kmsg.ProduceRequest:
				if r.TransactionID == nil {
					return nil, nil, false // the test's own plain producer
				}
			case *kmsg.InitProducerIDRequest:
				if r.TransactionalID == nil {
					return nil, nil, false // its idempotent producer id
				}
			}
			if v := req.GetVersion(); v > max {
				t.Errorf("%s v%d, want at most v%d", key.Name(), v, max)
			}
			return nil, nil, false
		})
	}
	return tc
}

// testLogger logs to stderr under -v, nowhere otherwise.
func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}

func (tc *txnCluster) client() *kgo.Client {
	tc.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(tc.c.ListenAddrs()...))
	if err != nil {
		tc.t.Fatalf("kgo: %v", err)
	}
	tc.t.Cleanup(cl.Close)
	return cl
}

// fenceLog records OnFenced calls.
type fenceLog struct {
	mu    sync.Mutex
	calls []int32
}

func (f *fenceLog) on(p int32) {
	f.mu.Lock()
	f.calls = append(f.calls, p)
	f.mu.Unlock()
}

func (f *fenceLog) get() []int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int32(nil), f.calls...)
}

// await returns the calls once there are n of them, or what there is
// after two seconds: a fenced write's callers are answered before the
// claim ends and OnFenced runs.
func (f *fenceLog) await(n int) []int32 {
	deadline := time.Now().Add(2 * time.Second)
	for {
		c := f.get()
		if len(c) >= n || time.Now().After(deadline) {
			return c
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// store returns a transactional store over a new client; its OnFenced
// calls go to the returned log.
func (tc *txnCluster) store(linger time.Duration) (*Store, *fenceLog) {
	s := NewWith(tc.client(), Options{GroupsPartitions: testGroupsPartitions, Logger: testLogger()})
	f := &fenceLog{}
	s.EnableTransactions(TxnOptions{Linger: linger, OnFenced: f.on, TransactionTimeout: 10 * time.Second})
	return s, f
}

// groupsIn returns n group ids that live in groups partition p.
func groupsIn(p int32, n int, prefix string) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		g := fmt.Sprintf("%s-%d", prefix, i)
		if GroupPartition(g, testGroupsPartitions) == p {
			out = append(out, g)
		}
	}
	return out
}

// commit builds an offset commit of one partition of "orders".
func commit(partition int32, offset int64) []kmsg.OffsetCommitRequestTopic {
	p := kmsg.NewOffsetCommitRequestTopicPartition()
	p.Partition, p.Offset, p.LeaderEpoch = partition, offset, -1
	return []kmsg.OffsetCommitRequestTopic{{Topic: "orders", Partitions: []kmsg.OffsetCommitRequestTopicPartition{p}}}
}

// commitOK commits through s and fails on any error.
func commitOK(t testing.TB, ctx context.Context, s *Store, group string, partition int32, offset int64) {
	t.Helper()
	res, err := s.CommitOffsets(ctx, group, commit(partition, offset))
	if err != nil {
		t.Fatalf("commit %s: %v", group, err)
	}
	if len(res) != 1 || len(res[0].Partitions) != 1 || res[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("commit %s: %+v", group, res)
	}
}

// committed returns the records of groups partition p visible to a
// read_committed consumer, in order. A plain sentinel record is appended
// first and everything before it is read: the sentinel becomes readable
// only once every transaction before it is resolved.
func (tc *txnCluster) committed(ctx context.Context, p int32) map[string][]string {
	tc.t.Helper()
	cl := tc.client()
	sentinel := fmt.Sprintf("\x00sentinel-%d", time.Now().UnixNano())
	r := &kgo.Record{Topic: DefaultGroupsTopic, Partition: p, Key: []byte(sentinel)}
	pcl, err := kgo.NewClient(append(cl.Opts(), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		tc.t.Fatal(err)
	}
	defer pcl.Close()
	if err := pcl.ProduceSync(ctx, r).FirstErr(); err != nil {
		tc.t.Fatalf("sentinel: %v", err)
	}
	ccl, err := kgo.NewClient(append(cl.Opts(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{DefaultGroupsTopic: {p: kgo.NewOffset().AtStart()}}))...)
	if err != nil {
		tc.t.Fatal(err)
	}
	defer ccl.Close()
	out := map[string][]string{}
	for {
		fs := ccl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			tc.t.Fatalf("reading partition %d read_committed: %v (so far %q)", p, err, out)
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if done {
				return
			}
			if string(r.Key) == sentinel {
				done = true
				return
			}
			v := "<tombstone>"
			if r.Value != nil {
				v = string(r.Value)
			}
			out[string(r.Key)] = append(out[string(r.Key)], v)
		})
		if done {
			return out
		}
	}
}

// offsetOf reads the committed offset of group on orders[partition]
// upstream with RequireStable (retrying UNSTABLE_OFFSET_COMMIT), -1 if
// none.
func (tc *txnCluster) offsetOf(ctx context.Context, group string, partition int32) int64 {
	tc.t.Helper()
	cl := tc.client()
	for {
		req := kmsg.NewPtrOffsetFetchRequest()
		req.Group = group
		req.RequireStable = true
		req.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "orders", Partitions: []int32{partition}}}
		req.Groups = []kmsg.OffsetFetchRequestGroup{{Group: group, Topics: []kmsg.OffsetFetchRequestGroupTopic{{Topic: "orders", Partitions: []int32{partition}}}}}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			tc.t.Fatalf("offset fetch: %v", err)
		}
		g := resp.Groups[0]
		if g.ErrorCode == kerr.GroupIDNotFound.Code {
			return -1
		}
		if g.ErrorCode != 0 {
			tc.t.Fatalf("offset fetch %s: %v", group, kerr.ErrorForCode(g.ErrorCode))
		}
		if len(g.Topics) == 0 || len(g.Topics[0].Partitions) == 0 {
			return -1
		}
		p := g.Topics[0].Partitions[0]
		switch p.ErrorCode {
		case 0:
			return p.Offset
		case kerr.UnstableOffsetCommit.Code:
			if err := upstream.Sleep(ctx, 10*time.Millisecond); err != nil {
				tc.t.Fatalf("offsets of %s never stable", group)
			}
		default:
			tc.t.Fatalf("offset fetch %s: %v", group, kerr.ErrorForCode(p.ErrorCode))
		}
	}
}

func isNotCoordinator(err error) bool { return errors.Is(err, kerr.NotCoordinator) }

// TestTxnClaimWriteCommit: after Claim, group records, tombstones and
// offset commits of the claimed partition are answered once committed
// and are then visible read_committed (records, with the owner record)
// and in the cluster's group offsets; loads answer from the index;
// partitions not claimed refuse writes and loads with NOT_COORDINATOR.
func TestTxnClaimWriteCommit(t *testing.T) {
	tc := newTxnCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	s, fences := tc.store(0)
	if n, err := s.Partitions(ctx); err != nil || n != testGroupsPartitions {
		t.Fatalf("partitions: %d %v", n, err)
	}
	const p = 1
	if err := s.Claim(ctx, p, []byte("kproxy-a")); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if !s.Claimed(p) || s.Claimed(0) {
		t.Fatalf("claimed: p=%v 0=%v", s.Claimed(p), s.Claimed(0))
	}
	if err := s.Claim(ctx, p, []byte("again")); err == nil {
		t.Fatal("a second claim of a claimed partition succeeded")
	}
	gs := groupsIn(p, 3, "g")
	for i, g := range gs {
		if err := s.SaveGroupMetadata(ctx, g, []byte("rec-"+g)); err != nil {
			t.Fatalf("save %s: %v", g, err)
		}
		commitOK(t, ctx, s, g, int32(i), int64(100+i))
	}
	if err := s.DeleteGroupMetadata(ctx, gs[2]); err != nil {
		t.Fatalf("delete: %v", err)
	}
	for i, g := range gs {
		rec, found, err := s.LoadGroupMetadata(ctx, g)
		if err != nil || found != (i != 2) || (found && string(rec) != "rec-"+g) {
			t.Fatalf("load %s: %q %v %v", g, rec, found, err)
		}
		if o := tc.offsetOf(ctx, g, int32(i)); o != int64(100+i) {
			t.Fatalf("offset of %s upstream: %d", g, o)
		}
		res, err := s.FetchOffsets(ctx, g, []kmsg.OffsetFetchRequestTopic{{Topic: "orders", Partitions: []int32{int32(i)}}}, false)
		if err != nil || len(res) != 1 || res[0].Partitions[0].Offset != int64(100+i) {
			t.Fatalf("fetch offsets of %s: %+v %v", g, res, err)
		}
	}
	recs := tc.committed(ctx, p)
	if got := recs[ownerKey]; len(got) != 1 || got[0] != "kproxy-a" {
		t.Fatalf("owner records: %q", got)
	}
	if got := recs[gs[0]]; len(got) != 1 || got[0] != "rec-"+gs[0] {
		t.Fatalf("records of %s: %q", gs[0], got)
	}
	if got := recs[gs[2]]; len(got) != 2 || got[1] != "<tombstone>" {
		t.Fatalf("records of %s: %q", gs[2], got)
	}

	other := groupsIn(0, 1, "other")[0]
	if err := s.SaveGroupMetadata(ctx, other, []byte("x")); !isNotCoordinator(err) {
		t.Fatalf("save to an unclaimed partition: %v", err)
	}
	if _, err := s.CommitOffsets(ctx, other, commit(0, 1)); !isNotCoordinator(err) {
		t.Fatalf("commit to an unclaimed partition: %v", err)
	}
	if _, _, err := s.LoadGroupMetadata(ctx, other); !isNotCoordinator(err) {
		t.Fatalf("load of an unclaimed partition: %v", err)
	}
	if f := fences.get(); len(f) != 0 {
		t.Fatalf("OnFenced called: %v", f)
	}
}

// TestTxnSecondOwnerFencesFirst: a second store claiming the same
// partition fences the first. The first's next writes fail with
// NOT_COORDINATOR, it drops the partition and reports it once; nothing
// it wrote after the fence is visible read_committed; the offsets in the
// cluster are the new owner's; and the new owner loaded what the first
// had committed.
func TestTxnSecondOwnerFencesFirst(t *testing.T) {
	tc := newTxnCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const p = 2
	g := groupsIn(p, 1, "g")[0]
	a, aFences := tc.store(0)
	if err := a.Claim(ctx, p, []byte("a")); err != nil {
		t.Fatalf("claim a: %v", err)
	}
	if err := a.SaveGroupMetadata(ctx, g, []byte("from-a")); err != nil {
		t.Fatal(err)
	}
	commitOK(t, ctx, a, g, 0, 10)

	b, bFences := tc.store(0)
	if err := b.Claim(ctx, p, []byte("b")); err != nil {
		t.Fatalf("claim b: %v", err)
	}
	if rec, found, err := b.LoadGroupMetadata(ctx, g); err != nil || !found || string(rec) != "from-a" {
		t.Fatalf("b loads: %q %v %v", rec, found, err)
	}

	if err := a.SaveGroupMetadata(ctx, g, []byte("zombie")); !isNotCoordinator(err) {
		t.Fatalf("fenced save: %v", err)
	}
	if a.Claimed(p) {
		t.Fatal("the fenced store still claims the partition")
	}
	if _, err := a.CommitOffsets(ctx, g, commit(0, 666)); !isNotCoordinator(err) {
		t.Fatalf("commit after the fence: %v", err)
	}
	if f := aFences.await(1); len(f) != 1 || f[0] != p {
		t.Fatalf("OnFenced of a: %v", f)
	}
	commitOK(t, ctx, b, g, 0, 20)
	if err := b.SaveGroupMetadata(ctx, g, []byte("from-b")); err != nil {
		t.Fatal(err)
	}
	if o := tc.offsetOf(ctx, g, 0); o != 20 {
		t.Fatalf("offset upstream: %d, want b's 20", o)
	}
	recs := tc.committed(ctx, p)
	for _, v := range recs[g] {
		if v == "zombie" {
			t.Fatalf("a fenced write is visible: %q", recs[g])
		}
	}
	if got := recs[g]; len(got) != 2 || got[0] != "from-a" || got[1] != "from-b" {
		t.Fatalf("records of %s: %q", g, got)
	}
	if got := recs[ownerKey]; len(got) != 2 || got[1] != "b" {
		t.Fatalf("owner records: %q", got)
	}
	if f := bFences.get(); len(f) != 0 {
		t.Fatalf("OnFenced of b: %v", f)
	}
}

// TestTxnFencedCommitFirst: the first write a fenced owner attempts is an
// offset commit; it fails with NOT_COORDINATOR and the offset upstream
// stays the new owner's.
func TestTxnFencedCommitFirst(t *testing.T) {
	tc := newTxnCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const p = 0
	g := groupsIn(p, 1, "g")[0]
	a, aFences := tc.store(0)
	if err := a.Claim(ctx, p, []byte("a")); err != nil {
		t.Fatal(err)
	}
	commitOK(t, ctx, a, g, 1, 5)
	b, _ := tc.store(0)
	if err := b.Claim(ctx, p, []byte("b")); err != nil {
		t.Fatal(err)
	}
	commitOK(t, ctx, b, g, 1, 7)
	if _, err := a.CommitOffsets(ctx, g, commit(1, 999)); !isNotCoordinator(err) {
		t.Fatalf("fenced commit: %v", err)
	}
	if o := tc.offsetOf(ctx, g, 1); o != 7 {
		t.Fatalf("offset upstream: %d, want 7", o)
	}
	if f := aFences.await(1); len(f) != 1 {
		t.Fatalf("OnFenced of a: %v", f)
	}
}

// TestTxnZombieEndTxn: the first owner's EndTxn is held at the broker
// until a second owner has claimed the partition (InitProducerId and
// all). When it arrives it must fail: the write is refused with
// NOT_COORDINATOR and is not visible.
func TestTxnZombieEndTxn(t *testing.T) {
	tc := newTxnCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const p = 3
	g := groupsIn(p, 1, "g")[0]
	a, aFences := tc.store(0)
	if err := a.Claim(ctx, p, []byte("a")); err != nil {
		t.Fatal(err)
	}
	held, bClaimed := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	tc.c.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		if !once.CompareAndSwap(false, true) {
			tc.c.DropControl()
			return nil, nil, false
		}
		close(held)
		tc.c.SleepControl(func() {
			select {
			case <-bClaimed:
			case <-ctx.Done():
			}
		})
		return nil, nil, false
	})
	saved := make(chan error, 1)
	go func() { saved <- a.SaveGroupMetadata(ctx, g, []byte("zombie")) }()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the first owner's EndTxn never came")
	}
	b, _ := tc.store(0)
	err := b.Claim(ctx, p, []byte("b"))
	close(bClaimed)
	if err != nil {
		t.Fatalf("claim b: %v", err)
	}
	if err := <-saved; !isNotCoordinator(err) {
		t.Fatalf("the zombie's save: %v", err)
	}
	if f := aFences.await(1); len(f) != 1 || f[0] != p {
		t.Fatalf("OnFenced of a: %v", f)
	}
	if _, found, err := b.LoadGroupMetadata(ctx, g); err != nil || found {
		t.Fatalf("b loads the zombie's record: %v %v", found, err)
	}
	if recs := tc.committed(ctx, p); len(recs[g]) != 0 {
		t.Fatalf("the zombie's record is visible: %q", recs[g])
	}
}

// TestTxnReleaseWaitsForInFlight: Release refuses new writes at once,
// waits for the transaction under way, whose write then succeeds and is
// visible, and forgets the partition.
func TestTxnReleaseWaitsForInFlight(t *testing.T) {
	tc := newTxnCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const p = 1
	gs := groupsIn(p, 2, "g")
	s, fences := tc.store(0)
	if err := s.Claim(ctx, p, []byte("a")); err != nil {
		t.Fatal(err)
	}
	held, wake := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	tc.c.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		if !once.CompareAndSwap(false, true) {
			tc.c.DropControl()
			return nil, nil, false
		}
		close(held)
		tc.c.SleepControl(func() {
			select {
			case <-wake:
			case <-ctx.Done():
			}
		})
		return nil, nil, false
	})
	saved := make(chan error, 1)
	go func() { saved <- s.SaveGroupMetadata(ctx, gs[0], []byte("in-flight")) }()
	<-held
	released := make(chan struct{})
	go func() { s.Release(ctx, p); close(released) }()
	// Release refuses new work as soon as it starts.
	for s.Claimed(p) {
		if err := upstream.Sleep(ctx, time.Millisecond); err != nil {
			t.Fatal("Release never started")
		}
	}
	if err := s.SaveGroupMetadata(ctx, gs[1], []byte("late")); !isNotCoordinator(err) {
		t.Fatalf("a write during Release: %v", err)
	}
	select {
	case <-released:
		t.Fatal("Release returned while a transaction was in flight")
	case err := <-saved:
		t.Fatalf("the in-flight write returned before its EndTxn: %v", err)
	default:
	}
	close(wake)
	if err := <-saved; err != nil {
		t.Fatalf("the in-flight write: %v", err)
	}
	<-released
	if _, _, err := s.LoadGroupMetadata(ctx, gs[0]); !isNotCoordinator(err) {
		t.Fatalf("load after Release: %v", err)
	}
	if got := tc.committed(ctx, p); len(got[gs[0]]) != 1 || len(got[gs[1]]) != 0 {
		t.Fatalf("records after Release: %q", got)
	}
	if f := fences.get(); len(f) != 0 {
		t.Fatalf("OnFenced called: %v", f)
	}
	// The partition can be claimed again, here or elsewhere.
	if err := s.Claim(ctx, p, []byte("a2")); err != nil {
		t.Fatalf("claim after release: %v", err)
	}
}

// TestTxnGroupCommit: many concurrent writes of one partition ride in few
// transactions. The first transaction is held at EndTxn until every
// other write is queued; they must then all go in the next one.
func TestTxnGroupCommit(t *testing.T) {
	tc := newTxnCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const p, n = 2, 200
	gs := groupsIn(p, n, "g")
	s, _ := tc.store(0)
	if err := s.Claim(ctx, p, []byte("a")); err != nil {
		t.Fatal(err)
	}
	tp := s.part(p)
	queued := func() int {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		return len(tp.pending)
	}
	before := tc.endTxns.Load()
	held := make(chan struct{})
	var once atomic.Bool
	tc.c.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		if !once.CompareAndSwap(false, true) {
			tc.c.DropControl()
			return nil, nil, false
		}
		close(held)
		tc.c.SleepControl(func() {
			for queued() < n-1 && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
		})
		return nil, nil, false
	})
	errs := make(chan error, n)
	go func() { errs <- s.SaveGroupMetadata(ctx, gs[0], []byte("first")) }()
	<-held
	var wg sync.WaitGroup
	for i, g := range gs[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				errs <- s.SaveGroupMetadata(ctx, g, []byte("v-"+g))
				return
			}
			_, err := s.CommitOffsets(ctx, g, commit(int32(i%4), int64(i)))
			errs <- err
		}()
	}
	wg.Wait()
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	if got := tc.endTxns.Load() - before; got != 2 {
		t.Fatalf("%d writes committed in %d transactions, want 2", n, got)
	}
	for i, g := range gs[1:] {
		if i%2 == 0 {
			if rec, found, err := s.LoadGroupMetadata(ctx, g); err != nil || !found || string(rec) != "v-"+g {
				t.Fatalf("load %s: %q %v %v", g, rec, found, err)
			}
		} else if o := tc.offsetOf(ctx, g, int32(i%4)); o != int64(i) {
			t.Fatalf("offset of %s: %d", g, o)
		}
	}
}

// TestTxnRestartLoadsCommitted: a new store claiming a partition (a
// restart, or a takeover) loads exactly what was committed: last values,
// not tombstoned groups, not a fenced owner's writes, and not records of
// other partitions.
func TestTxnRestartLoadsCommitted(t *testing.T) {
	tc := newTxnCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const p = 0
	gs := groupsIn(p, 4, "g")
	a, _ := tc.store(-1)
	if err := a.Claim(ctx, p, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := a.Claim(ctx, 1, []byte("a")); err != nil {
		t.Fatal(err)
	}
	elsewhere := groupsIn(1, 1, "e")[0]
	want := map[string]string{}
	for round := range 3 {
		for _, g := range gs {
			v := fmt.Sprintf("%s/%d", g, round)
			if err := a.SaveGroupMetadata(ctx, g, []byte(v)); err != nil {
				t.Fatal(err)
			}
			want[g] = v
		}
	}
	if err := a.SaveGroupMetadata(ctx, elsewhere, []byte("p1")); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteGroupMetadata(ctx, gs[1]); err != nil {
		t.Fatal(err)
	}
	delete(want, gs[1])
	a.Drop(p)
	if a.Claimed(p) || !a.Claimed(1) {
		t.Fatalf("after Drop: p=%v 1=%v", a.Claimed(p), a.Claimed(1))
	}
	if err := a.SaveGroupMetadata(ctx, gs[0], []byte("after-drop")); !isNotCoordinator(err) {
		t.Fatalf("save after Drop: %v", err)
	}

	b, _ := tc.store(0)
	if err := b.Claim(ctx, p, []byte("b")); err != nil {
		t.Fatal(err)
	}
	tp := b.part(p)
	tp.mu.Lock()
	got := map[string]string{}
	for k, v := range tp.index {
		got[k] = string(v)
	}
	tp.mu.Unlock()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("index after restart:\n got %q\nwant %q", got, want)
	}
	for _, g := range gs {
		rec, found, err := b.LoadGroupMetadata(ctx, g)
		if err != nil || found != (want[g] != "") || string(rec) != want[g] {
			t.Fatalf("load %s: %q %v %v", g, rec, found, err)
		}
	}
}

// TestTxnClaimedGroups: a claim's index answers which of its groups a
// record filter accepts, as the next owner finds them after a handover;
// a partition not claimed here has none.
func TestTxnClaimedGroups(t *testing.T) {
	tc := newTxnCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const p = 2
	first, _ := tc.store(0)
	if err := first.Claim(ctx, p, []byte("kproxy-a")); err != nil {
		t.Fatalf("claim: %v", err)
	}
	gs := groupsIn(p, 4, "g")
	for i, g := range gs {
		rec := "empty"
		if i%2 == 0 {
			rec = "members"
		}
		if err := first.SaveGroupMetadata(ctx, g, []byte(rec)); err != nil {
			t.Fatalf("save %s: %v", g, err)
		}
	}
	if err := first.DeleteGroupMetadata(ctx, gs[2]); err != nil {
		t.Fatalf("delete: %v", err)
	}
	withMembers := func(rec []byte) bool { return string(rec) == "members" }
	if got, want := first.ClaimedGroups(p, withMembers), []string{gs[0]}; !slices.Equal(got, want) {
		t.Fatalf("groups with members, first owner: %v, want %v", got, want)
	}
	first.Release(ctx, p)
	if got := first.ClaimedGroups(p, withMembers); got != nil {
		t.Fatalf("groups of a released partition: %v", got)
	}

	next, _ := tc.store(0)
	if err := next.Claim(ctx, p, []byte("kproxy-b")); err != nil {
		t.Fatalf("claim by the next owner: %v", err)
	}
	if got, want := next.ClaimedGroups(p, withMembers), []string{gs[0]}; !slices.Equal(got, want) {
		t.Fatalf("groups with members, next owner: %v, want %v", got, want)
	}
	if got := next.ClaimedGroups(p, func([]byte) bool { return true }); len(got) != 3 {
		t.Fatalf("every group of the claim: %v, want 3 (one tombstoned)", got)
	}
	if got := next.ClaimedGroups(p+1, withMembers); got != nil {
		t.Fatalf("groups of a partition not claimed: %v", got)
	}
}
