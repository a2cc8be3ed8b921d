package fleetrun

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/kafkastore"
)

// stuckStore is a memory store whose offset commits of one group block
// until release is closed (a commit stuck upstream, as one waiting on a
// FindCoordinator that never answers).
type stuckStore struct {
	*groupstate.MemoryStore
	group   string
	release chan struct{}
	entered chan struct{} // closed when the stuck commit started
	once    sync.Once
}

func (s *stuckStore) CommitOffsets(ctx context.Context, group string, topics []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error) {
	if group == s.group {
		s.once.Do(func() { close(s.entered) })
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.MemoryStore.CommitOffsets(ctx, group, topics)
}

// unloadRuntime is a fleet runtime of an engine over store, serving
// every partition, without a fleet member (onRevoked and onLost need
// none).
func unloadRuntime(t *testing.T, store groupstate.OffsetStore) *Runtime {
	t.Helper()
	const parts = 8
	f := &Runtime{partitions: parts, log: slog.New(slog.DiscardHandler), changed: make(chan struct{}),
		store: kafkastore.New(nil), serving: make([]atomic.Bool, parts), locks: make([]sync.Mutex, parts)}
	for p := range f.serving {
		f.serving[p].Store(true)
	}
	if err := f.registerMetrics(nil); err != nil {
		t.Fatal(err)
	}
	eng, err := groupstate.New(groupstate.Config{
		Store:        store,
		Owns:         func(g string) bool { return f.serving[f.partitionOf(g)].Load() },
		StoreTimeout: 30 * time.Second,
		// A first JoinGroup parks for a minute: Unload answers it.
		InitialRebalanceDelay: time.Minute,
		Logger:                slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	f.engine = eng
	return f
}

// groupsOnDistinctPartitions returns two group ids of distinct
// groups-topic partitions.
func groupsOnDistinctPartitions(f *Runtime) (a, b string) {
	a = "stuck-group"
	for i := 0; ; i++ {
		b = "free-group-" + strconv.Itoa(i)
		if f.partitionOf(b) != f.partitionOf(a) {
			return a, b
		}
	}
}

// commitTo sends a simple group's OffsetCommit to f's engine and returns
// a channel that receives its answer.
func commitTo(f *Runtime, group string) <-chan kmsg.Response {
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Version = 8
	req.Group, req.Generation, req.MemberID = group, -1, ""
	tp := kmsg.NewOffsetCommitRequestTopic()
	tp.Topic = "t"
	pp := kmsg.NewOffsetCommitRequestTopicPartition()
	pp.Partition, pp.Offset = 0, 1
	tp.Partitions = append(tp.Partitions, pp)
	req.Topics = append(req.Topics, tp)
	out := make(chan kmsg.Response, 1)
	f.engine.Handle(groupstate.RequestContext{}, req, func(r kmsg.Response) { out <- r })
	return out
}

// joinTo sends a JoinGroup for group to f's engine and returns a channel
// that receives its answer.
func joinTo(f *Runtime, group string) <-chan kmsg.Response {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Version = 3 // no KIP-394 member id round trip
	req.Group, req.ProtocolType = group, "consumer"
	req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = 10000, 10000
	proto := kmsg.NewJoinGroupRequestProtocol()
	proto.Name, proto.Metadata = "range", []byte{0, 0, 0, 0, 0, 0, 0, 0}
	req.Protocols = append(req.Protocols, proto)
	out := make(chan kmsg.Response, 1)
	f.engine.Handle(groupstate.RequestContext{}, req, func(r kmsg.Response) { out <- r })
	return out
}

// TestFleetUnloadWaitsOnlyForItsPartition: a commit of one group stuck in
// the store holds up the unload of that group's groups-topic partition,
// and of no other. Lost (lease ran out) or revoked together with the
// stuck one, another partition's groups are unloaded and its lock free
// at once; a claim of the stuck partition waits until the stuck call
// returned.
func TestFleetUnloadWaitsOnlyForItsPartition(t *testing.T) {
	for _, how := range []string{"lost", "revoked"} {
		t.Run(how, func(t *testing.T) {
			store := &stuckStore{MemoryStore: groupstate.NewMemoryStore(), release: make(chan struct{}), entered: make(chan struct{})}
			f := unloadRuntime(t, store)
			stuck, free := groupsOnDistinctPartitions(f)
			store.group = stuck
			pStuck, pFree := f.partitionOf(stuck), f.partitionOf(free)
			parked := joinTo(f, free) // waits out the initial rebalance delay
			deadline := time.Now().Add(5 * time.Second)
			for {
				if snap, ok := f.engine.Group(free); ok && len(snap.Members) == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the JoinGroup of %s never parked", free)
				}
				time.Sleep(5 * time.Millisecond)
			}
			stuckAnswer := commitTo(f, stuck)
			select {
			case <-store.entered:
			case <-time.After(5 * time.Second):
				t.Fatal("the commit of the stuck group never reached the store")
			}

			start := time.Now()
			done := make(chan struct{})
			go func() {
				defer close(done)
				switch how {
				case "lost":
					f.onLost([]int32{pStuck, pFree})
				case "revoked":
					f.onRevoked(context.Background(), []int32{pStuck, pFree})
				}
			}()
			// The free partition is unloaded (its parked JoinGroup
			// answered NOT_COORDINATOR) while the stuck call still runs.
			select {
			case r := <-parked:
				if code := r.(*kmsg.JoinGroupResponse).ErrorCode; code != 16 { // NOT_COORDINATOR
					t.Fatalf("parked JoinGroup of %s answered %d, want NOT_COORDINATOR", free, code)
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("partition %d (%s) not unloaded %v after the %s, while a call of partition %d was stuck", pFree, free, time.Since(start), how, pStuck)
			}
			if _, loaded := f.engine.Group(free); loaded {
				t.Fatalf("group %s still loaded after its partition's unload", free)
			}
			freed := time.Since(start)
			if how == "lost" {
				select {
				case <-done:
				case <-time.After(time.Second):
					t.Fatal("onLost waited for a stuck store call")
				}
			}
			// The stuck partition stays locked (a claim of it waits)
			// until its call returns.
			time.Sleep(50 * time.Millisecond)
			if f.locks[pStuck].TryLock() {
				t.Fatalf("partition %d's lock was free while its store call was stuck", pStuck)
			}
			close(store.release)
			if r := (<-stuckAnswer).(*kmsg.OffsetCommitResponse); r.Topics[0].Partitions[0].ErrorCode != 0 {
				t.Fatalf("the stuck commit answered %+v once it returned", r)
			}
			// A claim of it gets the lock now.
			deadline = time.Now().Add(5 * time.Second)
			for !f.locks[pStuck].TryLock() {
				if time.Now().After(deadline) {
					t.Fatalf("partition %d's lock still held after its store call returned", pStuck)
				}
				time.Sleep(5 * time.Millisecond)
			}
			f.locks[pStuck].Unlock()
			<-done
			t.Logf("%s: the other partition was unloaded after %v", how, freed.Round(time.Millisecond))
		})
	}
}
