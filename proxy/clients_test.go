package proxy

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSaramaThroughProxy produces with sarama's sync producer and consumes
// with a sarama consumer group through the proxy, groups forwarded to the
// brokers: every record arrives once per partition offset and the group's
// commits reach the cluster.
func TestSaramaThroughProxy(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), nil)
	const topic, group, n = "sarama", "sarama-group", 300
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	adm := kadm.NewClient(newClient(t, p.Addr()))
	if _, err := adm.CreateTopic(ctx, 4, 1, nil, topic); err != nil {
		t.Fatalf("create topic: %v", err)
	}

	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	prod, err := sarama.NewSyncProducer([]string{p.Addr()}, cfg)
	if err != nil {
		t.Fatalf("sarama producer: %v", err)
	}
	defer prod.Close()
	for i := range n {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(strconv.Itoa(i))}); err != nil {
			t.Fatalf("sarama produce %d: %v", i, err)
		}
	}

	cg, err := sarama.NewConsumerGroup([]string{p.Addr()}, group, cfg)
	if err != nil {
		t.Fatalf("sarama group: %v", err)
	}
	h := &collect{seen: map[string]int{}, want: n, done: make(chan struct{})}
	consumeCtx, stopConsuming := context.WithCancel(ctx)
	go func() {
		for consumeCtx.Err() == nil {
			if err := cg.Consume(consumeCtx, []string{topic}, h); err != nil && consumeCtx.Err() == nil {
				t.Errorf("consume: %v", err)
				return
			}
		}
	}()
	select {
	case <-h.done:
	case <-ctx.Done():
		t.Fatalf("consumed %d of %d distinct records", h.count(), n)
	}
	stopConsuming()
	if err := cg.Close(); err != nil {
		t.Fatalf("closing the group: %v", err)
	}
	for v, k := range h.seen {
		if k != 1 {
			t.Fatalf("record %s consumed %d times", v, k)
		}
	}
	// The commits went through the proxy to the cluster.
	waitFor(t, 10*time.Second, "committed offsets at the end offsets", func() bool {
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
			ok = ok && found && o.At == e.Offset
		})
		return ok
	})
}

type collect struct {
	mu   sync.Mutex
	seen map[string]int
	want int
	done chan struct{}
	once sync.Once
}

func (c *collect) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func (*collect) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (*collect) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (c *collect) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		c.mu.Lock()
		c.seen[string(m.Value)]++
		if len(c.seen) == c.want {
			c.once.Do(func() { close(c.done) })
		}
		c.mu.Unlock()
		s.MarkMessage(m, "")
	}
	return nil
}

// TestFranzGroupForwarded runs a franz-go consumer group through the proxy
// with groups forwarded to the brokers (no coordinator engine): the
// FindCoordinator answer is rewritten and the group works.
func TestFranzGroupForwarded(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), nil)
	const topic, group, n = "franz-group", "franz", 500
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prod := newClient(t, p.Addr(), kgo.DefaultProduceTopic(topic))
	if _, err := kadm.NewClient(prod).CreateTopic(ctx, 6, 1, nil, topic); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	for i := range n {
		prod.Produce(ctx, &kgo.Record{Value: []byte(fmt.Sprint(i))}, nil)
	}
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var mu sync.Mutex
	pollCtx, allSeen := context.WithCancel(ctx)
	defer allSeen()
	var wg sync.WaitGroup
	for m := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := newClient(t, p.Addr(), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
				kgo.ClientID(fmt.Sprintf("member-%d", m)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			for pollCtx.Err() == nil {
				fs := cl.PollFetches(pollCtx)
				fs.EachRecord(func(r *kgo.Record) {
					mu.Lock()
					seen[string(r.Value)] = true
					mu.Unlock()
				})
				mu.Lock()
				done := len(seen) == n
				mu.Unlock()
				if done {
					allSeen()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("consumed %d of %d records", len(seen), n)
	}
}
