package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// saramaConfig returns the settings shared by the sarama producer and consumer.
func saramaConfig(o options) *sarama.Config {
	cfg := sarama.NewConfig()
	// Kafka 4 removed the oldest protocol versions (KIP-896); sarama picks
	// request versions from this setting, so it must be recent.
	cfg.Version = sarama.V3_9_0_0
	cfg.ClientID = o.member
	return cfg
}

// saramaProduce writes o.count records with a sarama SyncProducer.
func saramaProduce(o options) error {
	cfg := saramaConfig(o)
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewHashPartitioner
	p, err := sarama.NewSyncProducer([]string{o.bootstrap}, cfg)
	if err != nil {
		return fmt.Errorf("sarama producer: %w", err)
	}
	msgs := make([]*sarama.ProducerMessage, 0, o.count)
	for i := o.start; i < o.start+o.count; i++ {
		id := recordID(i)
		msgs = append(msgs, &sarama.ProducerMessage{Topic: o.topic, Key: sarama.StringEncoder(id), Value: sarama.StringEncoder(id)})
	}
	if err := p.SendMessages(msgs); err != nil {
		p.Close()
		return fmt.Errorf("sarama produce: %w", err)
	}
	if err := p.Close(); err != nil {
		return fmt.Errorf("sarama close: %w", err)
	}
	return nil
}

// saramaHandler is the sarama.ConsumerGroupHandler; sarama calls Setup and
// Cleanup once per generation and ConsumeClaim on one goroutine per partition.
type saramaHandler struct {
	em    *emitter
	owned *ownedSet
	topic string
}

// Setup reports the partitions of the new generation.
func (h *saramaHandler) Setup(s sarama.ConsumerGroupSession) error {
	parts := h.owned.apply(s.Claims()[h.topic], nil, true)
	h.em.emit("assigned", map[string]any{"generation": s.GenerationID(), "partitions": parts})
	return nil
}

// Cleanup reports that every partition of the ending generation is released.
func (h *saramaHandler) Cleanup(s sarama.ConsumerGroupSession) error {
	// Commit what is marked before the partitions go to another member.
	s.Commit()
	parts := h.owned.apply(nil, nil, true)
	h.em.emit("revoked", map[string]any{"generation": s.GenerationID(), "partitions": parts})
	return nil
}

// ConsumeClaim emits and commits records of one partition, committing
// whenever the buffered batch is drained.
func (h *saramaHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	var pending []*sarama.ConsumerMessage
	flush := func() {
		if len(pending) == 0 {
			return
		}
		last := pending[len(pending)-1]
		s.MarkMessage(last, "")
		s.Commit()
		for _, m := range pending {
			h.em.emit("record", map[string]any{"p": m.Partition, "o": m.Offset, "id": string(m.Value)})
		}
		h.em.emit("commit", map[string]any{"offsets": map[string]int64{fmt.Sprint(last.Partition): last.Offset + 1}})
		pending = pending[:0]
	}
	for {
		select {
		case m, ok := <-c.Messages():
			if !ok {
				flush()
				return nil
			}
			pending = append(pending, m)
			if len(c.Messages()) == 0 || len(pending) >= 200 {
				flush()
			}
		case <-s.Context().Done():
			flush()
			return nil
		}
	}
}

// saramaConsume runs a sarama consumer group until ctx is cancelled.
func saramaConsume(ctx context.Context, o options, em *emitter) error {
	cfg := saramaConfig(o)
	switch o.assignor {
	case "range":
		cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	default:
		return fmt.Errorf("sarama supports only eager assignors here, not %q", o.assignor)
	}
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = false
	cfg.Consumer.Group.Session.Timeout = time.Duration(o.sessionMS) * time.Millisecond
	cfg.Consumer.Group.Heartbeat.Interval = time.Duration(o.heartbeatMS) * time.Millisecond
	cfg.Consumer.Group.Rebalance.Timeout = 20 * time.Second
	cfg.Consumer.Return.Errors = true
	if o.instanceID != "" {
		cfg.Consumer.Group.InstanceId = o.instanceID
	}
	g, err := sarama.NewConsumerGroup([]string{o.bootstrap}, o.group, cfg)
	if err != nil {
		return fmt.Errorf("sarama consumer group: %w", err)
	}
	go func() {
		for err := range g.Errors() {
			em.errorf("sarama: %v", err)
		}
	}()
	em.emit("ready", nil)
	h := &saramaHandler{em: em, owned: &ownedSet{}, topic: o.topic}
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{o.topic}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) && ctx.Err() == nil {
			em.errorf("sarama consume: %v", err)
			time.Sleep(200 * time.Millisecond)
		}
	}
	err = g.Close()
	em.emit("closed", nil)
	if err != nil {
		return fmt.Errorf("sarama close: %w", err)
	}
	return nil
}
