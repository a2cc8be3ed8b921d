package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// saramaMember is one sarama consumer-group member.
type saramaMember struct {
	name   string
	cg     sarama.ConsumerGroup
	dialer *cuttableDialer
	cancel context.CancelFunc
	done   chan struct{}
}

type saramaHandler struct {
	name  string
	topic string
	own   *ownership
	recs  *records
}

func (h *saramaHandler) Setup(s sarama.ConsumerGroupSession) error {
	h.own.assigned(h.name, s.Claims()[h.topic])
	return nil
}

func (h *saramaHandler) Cleanup(s sarama.ConsumerGroupSession) error {
	s.Commit()
	h.own.released(h.name, s.Claims()[h.topic])
	return nil
}

func (h *saramaHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		h.recs.add(string(m.Value))
		s.MarkMessage(m, "")
	}
	return nil
}

func (s *stack) startSarama(name string, strategy sarama.BalanceStrategy, mc memberCfg) *saramaMember {
	s.t.Helper()
	return startSaramaAt(s.t, s.addr(), name, strategy, mc)
}

// startSaramaAt starts a sarama member bootstrapped at addr.
func startSaramaAt(t testing.TB, addr, name string, strategy sarama.BalanceStrategy, mc memberCfg) *saramaMember {
	t.Helper()
	m := &saramaMember{name: name, dialer: &cuttableDialer{}, done: make(chan struct{})}
	cfg := sarama.NewConfig()
	cfg.ClientID = name
	cfg.Version = sarama.V3_6_0_0
	cfg.Net.Proxy.Enable = true
	cfg.Net.Proxy.Dialer = m.dialer
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	cfg.Consumer.Group.Session.Timeout = 3 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	if mc.session > 0 {
		cfg.Consumer.Group.Session.Timeout = mc.session
		cfg.Consumer.Group.Heartbeat.Interval = mc.session / 10
	}
	cfg.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{strategy}
	cfg.Consumer.MaxWaitTime = 200 * time.Millisecond
	cg, err := sarama.NewConsumerGroup([]string{addr}, mc.group, cfg)
	if err != nil {
		t.Fatalf("sarama group: %v", err)
	}
	m.cg = cg
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	h := &saramaHandler{name: name, topic: mc.topic, own: mc.own, recs: mc.recs}
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			err := cg.Consume(ctx, []string{mc.topic}, h)
			if errors.Is(err, sarama.ErrClosedConsumerGroup) {
				return
			}
			if err != nil && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	return m
}

func (m *saramaMember) leave() {
	m.cancel()
	<-m.done
	m.cg.Close()
}

func (m *saramaMember) kill(own *ownership) {
	m.dialer.kill()
	own.releaseAll(m.name)
	m.cancel()
	go m.cg.Close()
}

// TestSaramaGroupLifecycle runs sarama groups (range, round robin, sticky)
// through scale up, a clean leave and a killed member, served by kproxy's
// engine.
func TestSaramaGroupLifecycle(t *testing.T) {
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
			s := newStack(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			const topic, group, parts = "sarama", "sarama-group", 6
			s.produce(ctx, topic, parts, 300)
			own, recs := newOwnership(t), newRecords()
			mc := memberCfg{group: group, topic: topic, own: own, recs: recs}
			a := s.startSarama("a", tc.strategy, mc)
			b := s.startSarama("b", tc.strategy, mc)
			waitOwners(t, own, parts, "a", "b")
			waitConsumed(t, recs, 300)
			c := s.startSarama("c", tc.strategy, mc)
			waitOwners(t, own, parts, "a", "b", "c")
			a.leave()
			waitOwners(t, own, parts, "b", "c")
			b.kill(own)
			waitOwners(t, own, parts, "c")
			s.produceRange(ctx, topic, 300, 600)
			waitConsumed(t, recs, 600)
			own.check()
			s.assertCommittedAtEnd(ctx, group, topic)
			c.leave()
			s.assertBrokersSawNoGroupTraffic()
		})
	}
}
