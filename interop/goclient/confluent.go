package main

import (
	"context"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// confluentProduce writes o.count records with confluent-kafka-go.
func confluentProduce(o options) error {
	p, err := kafka.NewProducer(&kafka.ConfigMap{
		"bootstrap.servers": o.bootstrap,
		"client.id":         o.member,
		"acks":              "all",
		"linger.ms":         5,
	})
	if err != nil {
		return fmt.Errorf("confluent producer: %w", err)
	}
	defer p.Close()
	deliveries := make(chan kafka.Event, o.count)
	topic := o.topic
	for i := o.start; i < o.start+o.count; i++ {
		id := recordID(i)
		msg := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny}, Key: []byte(id), Value: []byte(id)}
		if err := p.Produce(msg, deliveries); err != nil {
			return fmt.Errorf("confluent produce: %w", err)
		}
	}
	timeout := time.After(60 * time.Second)
	for n := 0; n < o.count; n++ {
		select {
		case ev := <-deliveries:
			if m, ok := ev.(*kafka.Message); ok && m.TopicPartition.Error != nil {
				return fmt.Errorf("confluent delivery: %w", m.TopicPartition.Error)
			}
		case <-timeout:
			return fmt.Errorf("confluent produce: %d of %d deliveries missing after 60s", o.count-n, o.count)
		}
	}
	return nil
}

// confluentConsume runs a librdkafka consumer in the group until ctx is
// cancelled, committing stored offsets after each drained batch.
func confluentConsume(ctx context.Context, o options, em *emitter) error {
	cfg := &kafka.ConfigMap{
		"bootstrap.servers":             o.bootstrap,
		"group.id":                      o.group,
		"client.id":                     o.member,
		"enable.auto.commit":            false,
		"auto.offset.reset":             "earliest",
		"session.timeout.ms":            o.sessionMS,
		"heartbeat.interval.ms":         o.heartbeatMS,
		"max.poll.interval.ms":          20000,
		"partition.assignment.strategy": o.assignor,
		"group.protocol":                "classic",
	}
	if o.instanceID != "" {
		(*cfg)["group.instance.id"] = o.instanceID
	}
	c, err := kafka.NewConsumer(cfg)
	if err != nil {
		return fmt.Errorf("confluent consumer: %w", err)
	}
	var owned ownedSet
	parts := func(tps []kafka.TopicPartition) []int32 {
		out := make([]int32, 0, len(tps))
		for _, tp := range tps {
			out = append(out, tp.Partition)
		}
		return out
	}
	var pending []*kafka.Message
	var flush func()
	rebalance := func(c *kafka.Consumer, ev kafka.Event) error {
		cooperative := c.GetRebalanceProtocol() == "COOPERATIVE"
		switch e := ev.(type) {
		case kafka.AssignedPartitions:
			var err error
			if cooperative {
				err = c.IncrementalAssign(e.Partitions)
			} else {
				err = c.Assign(e.Partitions)
			}
			if err != nil {
				em.errorf("assign: %v", err)
			}
			// librdkafka does not expose the generation id.
			em.emit("assigned", map[string]any{"generation": -1, "partitions": owned.apply(parts(e.Partitions), nil, !cooperative)})
		case kafka.RevokedPartitions:
			// Commit what was consumed before the partitions move.
			flush()
			kind := "revoked"
			if c.AssignmentLost() {
				kind = "lost"
			}
			var err error
			if cooperative {
				err = c.IncrementalUnassign(e.Partitions)
			} else {
				err = c.Unassign()
			}
			if err != nil {
				em.errorf("unassign: %v", err)
			}
			em.emit(kind, map[string]any{"generation": -1, "partitions": owned.apply(nil, parts(e.Partitions), !cooperative)})
		}
		return nil
	}
	if err := c.SubscribeTopics([]string{o.topic}, rebalance); err != nil {
		c.Close()
		return fmt.Errorf("confluent subscribe: %w", err)
	}
	em.emit("ready", nil)
	flush = func() {
		if len(pending) == 0 {
			return
		}
		offsets := map[int32]kafka.TopicPartition{}
		for _, m := range pending {
			tp := m.TopicPartition
			tp.Offset = m.TopicPartition.Offset + 1
			offsets[tp.Partition] = tp
		}
		list := make([]kafka.TopicPartition, 0, len(offsets))
		for _, tp := range offsets {
			list = append(list, tp)
		}
		if _, err := c.CommitOffsets(list); err != nil {
			em.errorf("commit: %v", err)
		} else {
			for _, m := range pending {
				em.emit("record", map[string]any{"p": m.TopicPartition.Partition, "o": int64(m.TopicPartition.Offset), "id": string(m.Value)})
			}
			done := map[string]int64{}
			for p, tp := range offsets {
				done[fmt.Sprint(p)] = int64(tp.Offset)
			}
			em.emit("commit", map[string]any{"offsets": done})
		}
		pending = pending[:0]
	}
	for ctx.Err() == nil {
		ev := c.Poll(200)
		switch e := ev.(type) {
		case nil:
			flush()
		case *kafka.Message:
			if e.TopicPartition.Error != nil {
				em.errorf("message: %v", e.TopicPartition.Error)
				continue
			}
			pending = append(pending, e)
			if len(pending) >= 200 {
				flush()
			}
		case kafka.Error:
			em.errorf("confluent: %v", e)
		}
	}
	flush()
	err = c.Close()
	em.emit("closed", nil)
	if err != nil {
		return fmt.Errorf("confluent close: %w", err)
	}
	return nil
}
