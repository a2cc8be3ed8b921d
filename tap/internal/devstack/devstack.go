// Package devstack starts a whole kproxy in one process for tap's tests and
// its browser test: an in-memory Kafka cluster (kfake) and kproxy in front
// of it, assembled by internal/kproxy as `kproxy dev` is, with local groups
// and the admin server. Real franz-go clients then connect to Bootstrap.
// It adds what those tests need around it: consumers, a producer, topic
// creation and a wait for a group to settle.
package devstack

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// maxVersions lets the clients use every version they know.
var maxVersions = kgo.MaxVersions(kversion.Stable())

// Options tweak a Stack.
type Options struct {
	// SpanExporter receives rebalance spans (synchronously); nil uses
	// the environment like kproxy does.
	SpanExporter sdktrace.SpanExporter
	// Logger; nil discards.
	Logger *slog.Logger
	// AdminListen is the admin server's address, 127.0.0.1:0 when empty.
	AdminListen string
	// AdminWrap, when set, wraps the admin handler (the browser-test
	// server adds its control endpoint this way).
	AdminWrap func(http.Handler) http.Handler
	// Fleet, when set, serves /api/fleet (the browser test serves a
	// fixed fleet); nil answers 404 like kproxy with local groups.
	Fleet func() tap.FleetView
}

// Stack is a running in-process kproxy. Every field is immutable after
// Start.
type Stack struct {
	Cluster   *kfake.Cluster
	Kproxy    *kproxy.Server
	Engine    *groupstate.Engine
	Tap       *tap.Tap
	Admin     *kadm.Client // talks to the cluster through the proxy
	Bootstrap string       // the proxy's bootstrap address
	AdminURL  string       // http://host:port of the admin server

	adminCl *kgo.Client
}

// Start builds and starts the stack. Close releases it.
func Start(ctx context.Context, opt Options) (s *Stack, err error) {
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s = &Stack{}
	defer func() {
		if err != nil {
			s.Close(context.Background())
		}
	}()
	s.Cluster, err = kproxy.NewDevCluster(3, 0, log)
	if err != nil {
		return nil, fmt.Errorf("devstack: %w", err)
	}
	addr := opt.AdminListen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	s.Kproxy, err = kproxy.Start(ctx, kproxy.Config{
		Upstream: s.Cluster.ListenAddrs(),
		Proxy:    proxy.Config{Listen: "127.0.0.1:0"},
		Groups: kproxy.GroupsConfig{
			Mode: kproxy.GroupsLocal,
			Engine: groupstate.Config{
				InitialRebalanceDelay: -1,
				MinSessionTimeout:     100 * time.Millisecond,
			},
		},
		Telemetry: tap.Config{
			ServiceName:  "kproxy-devstack",
			SpanExporter: opt.SpanExporter,
			SyncExport:   opt.SpanExporter != nil,
		},
		AdminListen: addr,
		AdminWrap:   opt.AdminWrap,
		FleetView:   opt.Fleet,
		Logger:      log,
	})
	if err != nil {
		return nil, fmt.Errorf("devstack: %w", err)
	}
	s.Engine, s.Tap = s.Kproxy.Engine(), s.Kproxy.Tap()
	s.Bootstrap = s.Kproxy.Addr()
	s.AdminURL = "http://" + s.Kproxy.AdminAddr()

	s.adminCl, err = kgo.NewClient(kgo.SeedBrokers(s.Bootstrap), kgo.ClientID("kproxy-admin"), maxVersions)
	if err != nil {
		return nil, fmt.Errorf("devstack: admin client: %w", err)
	}
	s.Admin = kadm.NewClient(s.adminCl)
	return s, nil
}

// Close stops everything Start started, in reverse order.
func (s *Stack) Close(ctx context.Context) {
	if s.adminCl != nil {
		s.adminCl.Close()
	}
	if s.Kproxy != nil {
		_ = s.Kproxy.Shutdown(ctx)
	}
	if s.Cluster != nil {
		s.Cluster.Close()
	}
}

// Consumer starts a franz-go group consumer through the proxy that polls
// and commits until it is closed.
type Consumer struct {
	Client *kgo.Client
	done   chan struct{}
}

// NewConsumer joins group as clientID, consuming topics. Extra options
// (session timeout, instance id) come last.
func (s *Stack) NewConsumer(group, clientID string, topics []string, opts ...kgo.Opt) (*Consumer, error) {
	base := []kgo.Opt{
		kgo.SeedBrokers(s.Bootstrap),
		kgo.ClientID(clientID),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topics...),
		kgo.HeartbeatInterval(300 * time.Millisecond),
		kgo.SessionTimeout(6 * time.Second),
		kgo.AutoCommitInterval(200 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		maxVersions,
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("devstack: consumer %s: %w", clientID, err)
	}
	c := &Consumer{Client: cl, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			fs := cl.PollFetches(context.Background())
			if fs.IsClientClosed() {
				return
			}
		}
	}()
	return c, nil
}

// Close leaves the group (dynamic members) and stops polling.
func (c *Consumer) Close() {
	c.Client.Close()
	<-c.done
}

// Produce writes n small records to topic through the proxy.
func (s *Stack) Produce(ctx context.Context, topic string, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Bootstrap), kgo.ClientID("devstack-producer"), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return fmt.Errorf("devstack: producer: %w", err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, n)
	for i := range n {
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprint(i % 17)), Value: []byte(fmt.Sprintf("record %d", i))})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("devstack: produce: %w", err)
	}
	return nil
}

// CreateTopic creates topic with the given partition count through the
// proxy.
func (s *Stack) CreateTopic(ctx context.Context, topic string, partitions int32) error {
	resp, err := s.Admin.CreateTopic(ctx, partitions, 1, nil, topic)
	if err != nil {
		return fmt.Errorf("devstack: create topic %s: %w", topic, err)
	}
	if resp.Err != nil {
		return fmt.Errorf("devstack: create topic %s: %w", topic, resp.Err)
	}
	return nil
}

// WaitGroup polls the engine until group is Stable with n members, and
// returns its snapshot.
func (s *Stack) WaitGroup(ctx context.Context, group string, n int) (groupstate.GroupSnapshot, error) {
	for {
		g, ok := s.Engine.Group(group)
		if ok && g.State == "Stable" && len(g.Members) == n {
			allAssigned := true
			for _, m := range g.Members {
				// The engine hands a member the leader left out a
				// serialized empty assignment: count partitions.
				var a kmsg.ConsumerMemberAssignment
				if err := a.ReadFrom(m.Assignment); err != nil || len(m.Assignment) == 0 {
					allAssigned = false
					continue
				}
				parts := 0
				for _, t := range a.Topics {
					parts += len(t.Partitions)
				}
				if parts == 0 {
					allAssigned = false
				}
			}
			if allAssigned {
				return g, nil
			}
		}
		select {
		case <-ctx.Done():
			return g, fmt.Errorf("devstack: waiting for %s Stable with %d members (now %s, %d): %w", group, n, g.State, len(g.Members), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
