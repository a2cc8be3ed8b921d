package groupstate

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
)

// saramaHandler records every message it sees and marks it consumed.
type saramaHandler struct {
	mu   *sync.Mutex
	seen map[string]int
}

func (saramaHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h saramaHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.mu.Lock()
		h.seen[string(msg.Value)]++
		h.mu.Unlock()
		sess.MarkMessage(msg, "")
	}
	return nil
}

// TestSaramaAgainstEngine runs sarama consumer groups with each of its
// balance strategies against the engine: scale up, a leave, scale down,
// checking that no record is lost, no partition is owned twice in a
// generation and the final commits reach the end of every partition. The
// round robin and sticky strategies leave members without partitions out
// of their plans when there are more members than partitions, which the
// engine must fill with a valid empty assignment (sarama #2290).
func TestSaramaAgainstEngine(t *testing.T) {
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
				for i := 0; i < n; i++ {
					v := []byte(fmt.Sprint(produced))
					produced++
					if err := prod.ProduceSync(ctx, &kgo.Record{Key: v, Value: v}).FirstErr(); err != nil {
						t.Fatalf("produce: %v", err)
					}
				}
			}
			var mu sync.Mutex
			seen := make(map[string]int)
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
						if err := cg.Consume(mctx, []string{topic}, saramaHandler{&mu, seen}); err != nil && mctx.Err() == nil {
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

			if gens := ec.checkGenerations(t, group); gens < 3 {
				t.Fatalf("only %d generations completed", gens)
			}
			offs, err := ec.store.FetchOffsets(ctx, group, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			total := int64(0)
			for _, tp := range offs {
				for _, p := range tp.Partitions {
					total += p.Offset
				}
			}
			if total != int64(produced) {
				t.Fatalf("committed offsets sum to %d, produced %d", total, produced)
			}
		})
	}
}
