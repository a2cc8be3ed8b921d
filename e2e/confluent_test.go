package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// confluentMember is one confluent-kafka-go (librdkafka) group member.
type confluentMember struct {
	name string
	c    *kafka.Consumer
	stop chan struct{}
	done chan struct{}
}

func (s *stack) startConfluent(name, assignor string, mc memberCfg, extra kafka.ConfigMap) *confluentMember {
	s.t.Helper()
	cfg := kafka.ConfigMap{
		"bootstrap.servers":                  s.addr(),
		"group.id":                           mc.group,
		"client.id":                          name,
		"auto.offset.reset":                  "earliest",
		"enable.auto.commit":                 false,
		"session.timeout.ms":                 6000,
		"heartbeat.interval.ms":              300,
		"partition.assignment.strategy":      assignor,
		"fetch.wait.max.ms":                  100,
		"topic.metadata.refresh.interval.ms": 1000,
	}
	for k, v := range extra {
		cfg[k] = v
	}
	c, err := kafka.NewConsumer(&cfg)
	if err != nil {
		s.t.Fatalf("confluent consumer: %v", err)
	}
	m := &confluentMember{name: name, c: c, stop: make(chan struct{}), done: make(chan struct{})}
	cooperative := assignor == "cooperative-sticky"
	rebalance := func(c *kafka.Consumer, ev kafka.Event) error {
		switch e := ev.(type) {
		case kafka.AssignedPartitions:
			mc.own.assigned(name, partitionsOf(e.Partitions))
			if cooperative {
				return c.IncrementalAssign(e.Partitions)
			}
			return c.Assign(e.Partitions)
		case kafka.RevokedPartitions:
			c.Commit() // nothing to commit is not a failure
			mc.own.released(name, partitionsOf(e.Partitions))
			if cooperative {
				return c.IncrementalUnassign(e.Partitions)
			}
			return c.Unassign()
		}
		return nil
	}
	if err := c.SubscribeTopics([]string{mc.topic}, rebalance); err != nil {
		s.t.Fatalf("subscribe: %v", err)
	}
	go func() {
		defer close(m.done)
		for {
			select {
			case <-m.stop:
				return
			default:
			}
			ev := c.Poll(50)
			switch e := ev.(type) {
			case *kafka.Message:
				mc.recs.add(string(e.Value))
				if _, err := c.CommitMessage(e); err != nil {
					s.t.Logf("%s: commit: %v", name, err)
				}
			case kafka.Error:
				if e.IsFatal() {
					s.t.Errorf("%s: fatal: %v", name, e)
					return
				}
			}
		}
	}()
	return m
}

func partitionsOf(tps []kafka.TopicPartition) []int32 {
	out := make([]int32, 0, len(tps))
	for _, tp := range tps {
		out = append(out, tp.Partition)
	}
	return out
}

func (m *confluentMember) leave() {
	close(m.stop)
	<-m.done
	m.c.Close()
}

// TestConfluentGroupLifecycle runs librdkafka groups (range and
// cooperative-sticky) through scale up and a clean leave, served by
// kproxy's engine.
func TestConfluentGroupLifecycle(t *testing.T) {
	for _, assignor := range []string{"range", "cooperative-sticky"} {
		t.Run(assignor, func(t *testing.T) {
			s := newStack(t)
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			const topic, group, parts = "confluent", "confluent-group", 6
			s.produce(ctx, topic, parts, 300)
			own, recs := newOwnership(t), newRecords()
			mc := memberCfg{group: group, topic: topic, own: own, recs: recs}
			a := s.startConfluent("a", assignor, mc, nil)
			b := s.startConfluent("b", assignor, mc, nil)
			waitOwners(t, own, parts, "a", "b")
			waitConsumed(t, recs, 300)
			c := s.startConfluent("c", assignor, mc, nil)
			waitOwners(t, own, parts, "a", "b", "c")
			a.leave()
			waitOwners(t, own, parts, "b", "c")
			s.produceRange(ctx, topic, 300, 600)
			waitConsumed(t, recs, 600)
			own.check()
			s.assertCommittedAtEnd(ctx, group, topic)
			b.leave()
			c.leave()
			s.assertBrokersSawNoGroupTraffic()
		})
	}
}
