package groupstate

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// These tests put the engine inside an in-process kfake cluster: every
// group request reaching any broker is answered by the engine (kfake's own
// coordinator never sees one), so real franz-go consumer groups run
// against it. The proxy's own end-to-end tests cover the same through
// kproxy's listeners; these pin the engine's behaviour with a real client
// early and cheaply.

// engineCluster is a kfake cluster whose group APIs the engine serves.
type engineCluster struct {
	c     *kfake.Cluster
	e     *Engine
	store *MemoryStore

	mu     sync.Mutex // guards events
	events []Event
}

func newEngineCluster(t testing.TB, partitions int32, topic string, opts ...harnessConfig) *engineCluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	ec := &engineCluster{c: c, store: NewMemoryStore()}
	cfg := Config{
		Store:                 ec.store,
		Shards:                2,
		MinSessionTimeout:     time.Second,
		InitialRebalanceDelay: 200 * time.Millisecond,
		Events: func(ev Event) {
			ec.mu.Lock()
			ec.events = append(ec.events, ev)
			ec.mu.Unlock()
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	ec.e, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Clients name topics by id from OffsetFetch v10 / OffsetCommit v10
	// on: teach the memory store kfake's ids.
	meta, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	mreq := kmsg.NewPtrMetadataRequest()
	mresp, err := mreq.RequestWith(context.Background(), meta)
	meta.Close()
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	for _, mt := range mresp.Topics {
		if mt.Topic != nil {
			ec.store.SetTopicID(*mt.Topic, mt.TopicID)
		}
	}
	served := make(map[int16]bool)
	for _, k := range codec.GroupKeys() {
		served[k] = true
	}
	c.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !served[req.Key()] {
			return nil, nil, false
		}
		ch := make(chan kmsg.Response, 1)
		ec.e.Handle(RequestContext{ClientID: "kfake-client", ClientHost: "127.0.0.1"}, req, func(r kmsg.Response) { ch <- r })
		var resp kmsg.Response
		select {
		case resp = <-ch:
		default:
			// Parked (JoinGroup, SyncGroup) or waiting for the store:
			// let kfake serve other connections meanwhile.
			c.SleepControl(func() { resp = <-ch })
		}
		return resp, nil, true
	})
	t.Cleanup(func() {
		c.Close()
		ec.e.Close()
	})
	return ec
}

// checkGenerations asserts that within every generation no partition was
// assigned to two members, and returns the number of generations seen.
func (ec *engineCluster) checkGenerations(t *testing.T, group string) int {
	t.Helper()
	ec.mu.Lock()
	defer ec.mu.Unlock()
	gens := 0
	for _, ev := range ec.events {
		if ev.Group != group || ev.Kind != EventSyncCompleted {
			continue
		}
		gens++
		owner := make(map[string]string)
		for _, m := range ev.Members {
			var a kmsg.ConsumerMemberAssignment
			if len(m.Assignment) == 0 {
				continue
			}
			if err := a.ReadFrom(m.Assignment); err != nil {
				t.Fatalf("generation %d: assignment of %s does not decode: %v", ev.Generation, m.MemberID, err)
			}
			for _, tp := range a.Topics {
				for _, p := range tp.Partitions {
					k := fmt.Sprintf("%s/%d", tp.Topic, p)
					if o, dup := owner[k]; dup {
						t.Fatalf("generation %d: %s owned by %s and %s", ev.Generation, k, o, m.MemberID)
					}
					owner[k] = m.MemberID
				}
			}
		}
	}
	return gens
}

func TestRealClientsAgainstEngine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		balancer kgo.GroupBalancer
	}{
		{"eager-range", kgo.RangeBalancer()},
		{"cooperative-sticky", kgo.CooperativeStickyBalancer()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runConsumerScenario(t, tc.balancer)
		})
	}
}

// runConsumerScenario drives one group through scale up, a clean leave, a
// static member that dies (session expiry) and scale down, while records
// keep arriving, then checks the invariants: no record lost, no partition
// owned twice in one generation, committed offsets at the end of every
// partition.
func runConsumerScenario(t *testing.T, balancer kgo.GroupBalancer) {
	const topic, group, partitions = "events", "g", 6
	ec := newEngineCluster(t, partitions, topic)
	addrs := ec.c.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	prod, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produced := 0
	produce := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			r := &kgo.Record{Key: []byte(fmt.Sprint(produced)), Value: []byte(fmt.Sprint(produced))}
			produced++
			if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}
		}
	}

	var mu sync.Mutex // guards seen
	seen := make(map[string]int)
	type consumer struct {
		cl   *kgo.Client
		done chan struct{}
	}
	start := func(instance string) *consumer {
		t.Helper()
		opts := []kgo.Opt{
			kgo.SeedBrokers(addrs...),
			kgo.ConsumerGroup(group),
			kgo.ConsumeTopics(topic),
			kgo.Balancers(balancer),
			kgo.SessionTimeout(1500 * time.Millisecond),
			kgo.HeartbeatInterval(200 * time.Millisecond),
			kgo.RebalanceTimeout(3 * time.Second),
			kgo.AutoCommitInterval(100 * time.Millisecond),
			kgo.FetchMaxWait(100 * time.Millisecond),
		}
		if instance != "" {
			opts = append(opts, kgo.InstanceID(instance))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		c := &consumer{cl: cl, done: make(chan struct{})}
		go func() {
			defer close(c.done)
			for {
				fs := cl.PollFetches(ctx)
				if fs.IsClientClosed() || ctx.Err() != nil {
					return
				}
				fs.EachRecord(func(r *kgo.Record) {
					mu.Lock()
					seen[string(r.Value)]++
					mu.Unlock()
				})
			}
		}()
		return c
	}
	waitAll := func(what string) {
		t.Helper()
		for {
			mu.Lock()
			missing := 0
			for i := 0; i < produced; i++ {
				if seen[fmt.Sprint(i)] == 0 {
					missing++
				}
			}
			mu.Unlock()
			if missing == 0 {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: %d of %d records never consumed", what, missing, produced)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	stop := func(c *consumer) {
		c.cl.Close()
		<-c.done
	}

	produce(300)
	a := start("")
	b := start("")
	waitAll("two members")
	c := start("") // scale up
	s := start("static-1")
	produce(300)
	waitAll("four members")
	stop(b) // clean leave
	produce(300)
	waitAll("after a leave")
	stop(s) // a static member that closes does not leave: session expiry
	time.Sleep(2 * time.Second)
	produce(300)
	waitAll("after a session expiry")
	stop(c) // scale down to one
	produce(300)
	waitAll("one member")
	if err := a.cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("final commit: %v", err)
	}

	gens := ec.checkGenerations(t, group)
	if gens < 4 {
		t.Fatalf("only %d generations completed; the scenario rebalances at least 4 times", gens)
	}
	ec.mu.Lock()
	expired := false
	for _, ev := range ec.events {
		expired = expired || (ev.Kind == EventMemberExpired && ev.Cause == "session_timeout")
	}
	ec.mu.Unlock()
	if !expired {
		t.Fatal("the killed static member was never expired by its session timeout")
	}
	// Every partition's committed offset is its end: nothing consumed is
	// left uncommitted, nothing is committed past the log.
	total := int64(0)
	offs, err := ec.store.FetchOffsets(ctx, group, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range offs {
		for _, p := range tp.Partitions {
			total += p.Offset
		}
	}
	if total != int64(produced) {
		t.Fatalf("committed offsets sum to %d, produced %d", total, produced)
	}
	stop(a)
	snap, ok := ec.e.Group(group)
	if !ok || snap.State != "Empty" {
		t.Fatalf("group after everyone left: %+v", snap)
	}
}
