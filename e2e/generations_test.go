package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// These tests drive one group of real clients (franz-go, sarama) through
// scale up, a clean leave, a static member that dies and scale down while
// records keep arriving, and check the engine's own record of it: within
// every generation (each sync_completed event) no partition is assigned
// twice, the dead static member expires by its session timeout, the
// committed offsets reach the end of every partition and the group ends
// Empty. The engine runs two shards and a short initial rebalance delay.

// keyedProducer returns produce, which writes the next n records "i"
// (keyed "i", so they spread over the partitions) to topic through the
// proxy, and the count written so far. Both are for the test's goroutine.
func (s *stack) keyedProducer(ctx context.Context, topic string) (produce func(n int), produced *int) {
	s.t.Helper()
	cl := s.client(kgo.DefaultProduceTopic(topic))
	produced = new(int)
	return func(n int) {
		s.t.Helper()
		for range n {
			v := []byte(itoa(*produced))
			*produced++
			if err := cl.ProduceSync(ctx, &kgo.Record{Key: v, Value: v}).FirstErr(); err != nil {
				s.t.Fatalf("produce: %v", err)
			}
		}
	}, produced
}

// newEngineStack is the stack of these tests: two engine shards, a 200ms
// initial rebalance delay.
func newEngineStack(t *testing.T) *stack {
	t.Helper()
	return newStack(t, engineOpt(func(c *groupstate.Config) {
		c.Shards = 2
		c.InitialRebalanceDelay = 200 * time.Millisecond
	}))
}

// checkGenerations asserts that within every generation no partition was
// assigned to two members, and returns the number of generations seen.
func (s *stack) checkGenerations(t *testing.T, group string) int {
	t.Helper()
	gens := 0
	for _, ev := range s.eventsOf(groupstate.EventSyncCompleted) {
		if ev.Group != group {
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

func TestFranzGenerations(t *testing.T) {
	t.Parallel()
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
	s := newEngineStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s.produce(ctx, topic, partitions, 0)
	addrs := []string{s.addr()}

	produce, produced := s.keyedProducer(ctx, topic)

	recs := newRecords()
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
					recs.add(string(r.Value))
				})
			}
		}()
		return c
	}
	waitAll := func(what string) {
		t.Helper()
		t.Logf("waiting for every record: %s", what)
		waitConsumed(t, recs, *produced)
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
	static := start("static-1")
	produce(300)
	waitAll("four members")
	stop(b) // clean leave
	produce(300)
	waitAll("after a leave")
	stop(static) // a static member that closes does not leave: session expiry
	time.Sleep(2 * time.Second)
	produce(300)
	waitAll("after a session expiry")
	stop(c) // scale down to one
	produce(300)
	waitAll("one member")
	if err := a.cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("final commit: %v", err)
	}

	gens := s.checkGenerations(t, group)
	if gens < 4 {
		t.Fatalf("only %d generations completed; the scenario rebalances at least 4 times", gens)
	}
	expired := false
	for _, ev := range s.eventsOf(groupstate.EventMemberExpired) {
		expired = expired || ev.Cause == "session_timeout"
	}
	if !expired {
		t.Fatal("the killed static member was never expired by its session timeout")
	}
	// Every partition's committed offset is its end: nothing consumed is
	// left uncommitted, nothing is committed past the log.
	s.assertCommittedAtEnd(ctx, group, topic)
	stop(a)
	snap, ok := s.engine.Group(group)
	if !ok || snap.State != "Empty" {
		t.Fatalf("group after everyone left: %+v", snap)
	}
}

// seenHandler records every message it sees and marks it consumed.
type seenHandler struct{ recs *records }

func (seenHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (seenHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h seenHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.recs.add(string(msg.Value))
		sess.MarkMessage(msg, "")
	}
	return nil
}

// TestSaramaGenerations runs sarama consumer groups with each of its
// balance strategies against the engine: scale up, a leave, scale down,
// checking that no record is lost, no partition is owned twice in a
// generation and the final commits reach the end of every partition. The
// round robin and sticky strategies leave members without partitions out
// of their plans when there are more members than partitions, which the
// engine must fill with a valid empty assignment (sarama #2290).
func TestSaramaGenerations(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		strategy sarama.BalanceStrategy
	}{
		{"range", sarama.NewBalanceStrategyRange()},
		{"roundrobin", sarama.NewBalanceStrategyRoundRobin()},
		{"sticky", sarama.NewBalanceStrategySticky()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const topic, group, partitions = "events", "sg", 2
			s := newEngineStack(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s.produce(ctx, topic, partitions, 0)
			addrs := []string{s.addr()}
			produce, produced := s.keyedProducer(ctx, topic)
			recs := newRecords()
			type member struct {
				cg     sarama.ConsumerGroup
				cancel context.CancelFunc
				done   chan struct{}
			}
			start := func() *member {
				cfg := sarama.NewConfig()
				cfg.Version = sarama.V2_8_0_0
				cfg.ClientID = "sarama-test"
				cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
				cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
				cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{tc.strategy}
				cfg.Consumer.Group.Session.Timeout = 2 * time.Second
				cfg.Consumer.Group.Heartbeat.Interval = 200 * time.Millisecond
				cfg.Consumer.Group.Rebalance.Timeout = 3 * time.Second
				cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
				cg, err := sarama.NewConsumerGroup(addrs, group, cfg)
				if err != nil {
					t.Fatalf("sarama: %v", err)
				}
				mctx, mcancel := context.WithCancel(ctx)
				m := &member{cg: cg, cancel: mcancel, done: make(chan struct{})}
				go func() {
					defer close(m.done)
					for mctx.Err() == nil {
						if err := cg.Consume(mctx, []string{topic}, seenHandler{recs}); err != nil && mctx.Err() == nil {
							t.Logf("consume: %v", err)
							time.Sleep(50 * time.Millisecond)
						}
					}
				}()
				return m
			}
			stop := func(m *member) {
				m.cancel()
				<-m.done
				if err := m.cg.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			}
			waitAll := func(what string) {
				t.Helper()
				t.Logf("waiting for every record: %s", what)
				waitConsumed(t, recs, *produced)
			}
			produce(100)
			a, b := start(), start()
			waitAll("two members")
			c := start() // three members, two partitions: one idles
			produce(100)
			waitAll("three members")
			stop(b)
			produce(100)
			waitAll("after a leave")
			stop(c)
			produce(100)
			waitAll("one member")
			stop(a)

			if gens := s.checkGenerations(t, group); gens < 3 {
				t.Fatalf("only %d generations completed", gens)
			}
			s.assertCommittedAtEnd(ctx, group, topic)
		})
	}
}
