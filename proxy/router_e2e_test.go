package proxy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// engineCoordinator adapts groupstate.Engine to Coordinator, as
// internal/kproxy does.
type engineCoordinator struct{ e *groupstate.Engine }

func (c engineCoordinator) Handle(cl Client, req kmsg.Request, reply func(kmsg.Response)) {
	c.e.Handle(groupstate.RequestContext{ClientID: cl.ID, ClientHost: cl.Host}, req, reply)
}

// TestFranzGroupThroughRouterToRemoteEngine runs a franz-go consumer group
// through a proxy that owns no group: its router relays every group
// request to an engine behind a peer server. Both members consume every
// record once between them, their commits reach the remote engine, and
// the engine knows each member by its own client id and host.
func TestFranzGroupThroughRouterToRemoteEngine(t *testing.T) {
	c := newCluster(t)
	store := groupstate.NewMemoryStore()
	eng, err := groupstate.New(groupstate.Config{Store: store, Shards: 2, InitialRebalanceDelay: -1, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("engine: %v", err)
	}
	t.Cleanup(eng.Close)
	ps := startPeerServer(t, "127.0.0.1:0", engineCoordinator{eng}, nil)
	r := NewRouter(RouterConfig{Locator: newTestLocator("", map[string]string{"": ps.Addr()}), Logger: testLogger(t)})
	t.Cleanup(r.Close)
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) { cfg.Coordinator = r })

	const topic, group, n = "relayed", "relayed-group", 400
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
	defer cancel()
	prod := newClient(t, p.Addr(), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	adm := kadm.NewClient(prod)
	if _, err := adm.CreateTopic(ctx, 4, 1, nil, topic); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	// Clients name topics by id in OffsetCommit/OffsetFetch v10: teach
	// the memory store the cluster's ids.
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	for name, td := range md.Topics {
		store.SetTopicID(name, td.ID)
	}
	for i := range n {
		prod.Produce(ctx, &kgo.Record{Value: []byte(fmt.Sprint(i))}, nil)
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	seen := map[string]int{}
	polled := make([][]*kgo.Record, 2) // by member
	pollCtx, allSeen := context.WithCancel(ctx)
	defer allSeen()
	var wg sync.WaitGroup
	var members []*kgo.Client
	for m := range 2 {
		cl := newClient(t, p.Addr(), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.ClientID(fmt.Sprintf("member-%d", m)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.AutoCommitInterval(100*time.Millisecond), kgo.SessionTimeout(6*time.Second))
		members = append(members, cl)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pollCtx.Err() == nil {
				fs := cl.PollFetches(pollCtx)
				fs.EachRecord(func(r *kgo.Record) {
					mu.Lock()
					seen[string(r.Value)]++
					polled[m] = append(polled[m], r)
					mu.Unlock()
				})
				mu.Lock()
				done := len(seen) == n
				mu.Unlock()
				if done {
					allSeen()
				}
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("consumed %d of %d records before the deadline", len(seen), n)
	}

	// Autocommit commits a poll's offsets at the next poll: commit what
	// was consumed now.
	for m, cl := range members {
		if err := cl.CommitRecords(ctx, polled[m]...); err != nil {
			t.Fatalf("member %d commit: %v", m, err)
		}
	}
	// The commits went through the router to the remote engine.
	waitFor(t, 10*time.Second, "commits at the end offsets", func() bool {
		offs, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return false
		}
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return false
		}
		ok := true
		ends.Each(func(e kadm.ListedOffset) {
			o, found := offs.Lookup(topic, e.Partition)
			ok = ok && e.Offset > 0 && found && o.At == e.Offset
		})
		return ok
	})
	// Both members are known to the engine by their own client id, from
	// the host they connected from.
	described, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("describe: %v", err)
	}
	dg := described[group]
	ids := map[string]bool{}
	for _, m := range dg.Members {
		if !strings.Contains(m.ClientHost, "127.0.0.1") {
			t.Fatalf("member %s from host %q", m.MemberID, m.ClientHost)
		}
		ids[m.ClientID] = true
	}
	if dg.Err != nil || !ids["member-0"] || !ids["member-1"] {
		t.Fatalf("group %+v (err %v): members %v", dg.State, dg.Err, ids)
	}
	for _, cl := range members {
		cl.Close()
	}
	// Leaving went through the router too: the group is empty.
	waitFor(t, 5*time.Second, "the group to empty", func() bool {
		d, err := adm.DescribeGroups(ctx, group)
		return err == nil && d[group].State == "Empty"
	})
}
