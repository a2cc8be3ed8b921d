package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// cutListener is a broker's listener that a test can cut as if the
// broker's process had been killed: its port refuses connections and
// every open connection is closed. restore listens on the same port
// again, as a restarted broker does. kfake's accept loop keeps calling
// Accept across a cut.
type cutListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once

	mu   sync.Mutex
	ln   net.Listener // guarded by mu; nil while cut
	open []net.Conn   // guarded by mu: connections accepted since the last cut
}

func newCutListener(network, address string) (*cutListener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	l := &cutListener{addr: ln.Addr(), conns: make(chan net.Conn), closed: make(chan struct{}), ln: ln}
	go l.pump(ln)
	return l, nil
}

func (l *cutListener) pump(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		l.open = append(l.open, c)
		l.mu.Unlock()
		select {
		case l.conns <- c:
		case <-l.closed:
			c.Close()
			return
		}
	}
}

func (l *cutListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *cutListener) Close() error {
	l.once.Do(func() { close(l.closed); l.cut() })
	return nil
}

func (l *cutListener) Addr() net.Addr { return l.addr }

func (l *cutListener) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		l.ln.Close()
		l.ln = nil
	}
	for _, c := range l.open {
		c.Close()
	}
	l.open = nil
}

func (l *cutListener) restore() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln, err := net.Listen("tcp", l.addr.String())
	if err != nil {
		return err
	}
	l.ln = ln
	go l.pump(ln)
	return nil
}

// outage is what one run of the broker-kill scenario measured.
type outage struct {
	produced, failedProduces int64
	commitErrors             int64
	consumed                 int
	maxAckGap                time.Duration // longest time without a produce acknowledgement while producing
	resumed                  time.Duration // from the kill to the first record consumed from a moved partition
	apiVersionsEOFs          int64         // connections closed cleanly during ApiVersions, which clients read as TLS or SASL trouble
}

// firstReadEOFs counts ApiVersions requests whose response read ended in
// a clean EOF: a connection accepted and then closed before any answer,
// which franz-go reports as "is TLS misconfigured?" and does not retry.
type firstReadEOFs struct{ n atomic.Int64 }

func (h *firstReadEOFs) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e kgo.BrokerE2E) {
	if key == 18 && errors.Is(e.ReadErr, io.EOF) {
		h.n.Add(1)
	}
}

// clientLogger logs a test client's warnings with -v, and everything it
// does (each request written and read, with its timing) with -v and
// KPROXY_CLIENT_DEBUG=1 in the environment: how the share fleet test's
// stalled FlushAcks was traced to an acknowledgement error franz-go
// kept to resend.
func clientLogger(name string, start time.Time) kgo.Logger {
	level := kgo.LogLevelNone
	if testing.Verbose() {
		level = kgo.LogLevelWarn
		if os.Getenv("KPROXY_CLIENT_DEBUG") != "" {
			level = kgo.LogLevelDebug
		}
	}
	return kgo.BasicLogger(os.Stderr, level, func() string { return name + " " + time.Since(start).Round(time.Millisecond).String() + " " })
}

// TestBrokerKilledSameAsDirect kills a partition leader of a 3-broker
// cluster (its port refuses, its connections drop), moves its partitions
// to the survivors as a controller would, and restarts it, while an
// idempotent producer and a consumer group run: once directly, once
// through kproxy. Through kproxy there must be no failed produce and no
// commit error, every acknowledged record must be consumed, and the
// stall must stay within 1.5 s of the direct path's (measured: both
// resume 0.5-0.85 s after the kill, kproxy within 0.3 s of direct).
func TestBrokerKilledSameAsDirect(t *testing.T) {
	direct := runBrokerKill(t, false)
	t.Logf("direct:  %+v", direct)
	viaProxy := runBrokerKill(t, true)
	t.Logf("kproxy:  %+v", viaProxy)
	for name, o := range map[string]outage{"direct": direct, "kproxy": viaProxy} {
		if o.failedProduces != 0 || o.commitErrors != 0 || o.apiVersionsEOFs != 0 {
			t.Errorf("%s: %d failed produces, %d commit errors, %d connections closed during ApiVersions; want none",
				name, o.failedProduces, o.commitErrors, o.apiVersionsEOFs)
		}
		if int64(o.consumed) != o.produced {
			t.Errorf("%s: consumed %d distinct records of %d acknowledged", name, o.consumed, o.produced)
		}
	}
	if viaProxy.maxAckGap > direct.maxAckGap+2*time.Second {
		t.Errorf("produce stall through kproxy %v, directly %v", viaProxy.maxAckGap, direct.maxAckGap)
	}
	if viaProxy.resumed > direct.resumed+1500*time.Millisecond {
		t.Errorf("consumption of moved partitions resumed after %v through kproxy, %v directly", viaProxy.resumed, direct.resumed)
	}
}

func runBrokerKill(t *testing.T, throughProxy bool) outage {
	t.Helper()
	const (
		topic = "kill"
		group = "kill-group"
		// refreshAge is how soon the clients may refresh metadata again.
		// franz-go's default (5 s) quantizes when a client learns of the
		// new leaders, so one run's stall could differ from another's by
		// seconds whichever path it took; with a short age the stall
		// measures the path, which is what the test compares.
		refreshAge = 250 * time.Millisecond
	)
	var lns []*cutListener
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.AllowAutoTopicCreation(), kfake.SeedTopics(6, topic),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			l, err := newCutListener(network, address)
			if err == nil {
				lns = append(lns, l) // NewCluster opens them in node order
			}
			return l, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seeds := c.ListenAddrs()
	if throughProxy {
		k, err := kproxy.Start(context.Background(), kproxy.Config{
			Upstream:  c.ListenAddrs(),
			Proxy:     proxy.Config{Listen: "127.0.0.1:0", DialTimeout: 2 * time.Second},
			Groups:    kproxy.GroupsConfig{Mode: kproxy.GroupsLocal, Engine: groupstate.Config{InitialRebalanceDelay: -1}},
			Telemetry: tap.Config{Getenv: func(string) string { return "" }},
			Logger:    testLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			k.Shutdown(ctx)
		}()
		seeds = []string{k.Addr()}
	}

	// The victim leads partitions of the topic and is not the cluster's
	// coordinator of the group (kfake does not move coordinators, and
	// the engine stores offsets through that coordinator).
	coord := c.CoordinatorFor(group)
	victim := int32(-1)
	for part := range int32(6) {
		if l := c.LeaderFor(topic, part); l != coord {
			victim = l
			break
		}
	}
	if victim < 0 {
		t.Fatalf("every partition is led by the coordinator %d", coord)
	}
	var moved []int32
	for part := range int32(6) {
		if c.LeaderFor(topic, part) == victim {
			moved = append(moved, part)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var o outage
	var mu sync.Mutex
	seen := map[string]bool{}
	var lastAck atomic.Int64 // nanoseconds since start
	start := time.Now()
	var killedAt atomic.Int64
	eofs := &firstReadEOFs{}
	var resumedAt atomic.Int64

	cons, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.FetchMaxWait(200*time.Millisecond), kgo.AutoCommitInterval(300*time.Millisecond), kgo.MetadataMinAge(refreshAge),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithHooks(eofs), kgo.WithLogger(clientLogger("consumer", start)),
		kgo.AutoCommitCallback(func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
				t.Logf("commit error: %v", err)
				atomic.AddInt64(&o.commitErrors, 1)
				return
			}
			if resp == nil {
				return
			}
			for _, tp := range resp.Topics {
				for _, p := range tp.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						t.Logf("commit error %s/%d: %v", tp.Topic, p.Partition, err)
						atomic.AddInt64(&o.commitErrors, 1)
					}
				}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	consDone := make(chan struct{})
	go func() {
		defer close(consDone)
		for ctx.Err() == nil {
			fs := cons.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				mu.Lock()
				seen[string(r.Value)] = true
				mu.Unlock()
				if k := killedAt.Load(); k != 0 && resumedAt.Load() == 0 {
					for _, p := range moved {
						if r.Partition == p && r.Timestamp.Sub(start) > time.Duration(k) {
							resumedAt.CompareAndSwap(0, int64(time.Since(start)))
						}
					}
				}
			})
		}
	}()
	defer func() { cancel(); <-consDone; cons.Close() }()

	prod, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.MetadataMinAge(refreshAge), kgo.WithHooks(eofs), kgo.WithLogger(clientLogger("producer", start)))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var maxGap atomic.Int64
	produceFor := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			n := atomic.AddInt64(&o.produced, 1)
			prod.Produce(ctx, &kgo.Record{Value: []byte(strconv.FormatInt(n, 10))}, func(_ *kgo.Record, err error) {
				if err != nil {
					t.Logf("produce error: %v", err)
					atomic.AddInt64(&o.failedProduces, 1)
					return
				}
				now := int64(time.Since(start))
				if prev := lastAck.Swap(now); prev != 0 && now-prev > maxGap.Load() {
					maxGap.Store(now - prev)
				}
			})
			time.Sleep(3 * time.Millisecond)
		}
	}
	produceFor(1500 * time.Millisecond)
	killedAt.Store(int64(time.Since(start)))
	lns[victim].cut()
	// A controller notices the dead broker and elects new leaders.
	time.Sleep(300 * time.Millisecond)
	moveLeadersOff(t, c, victim)
	produceFor(3500 * time.Millisecond)
	if err := lns[victim].restore(); err != nil {
		t.Fatal(err)
	}
	produceFor(time.Second)
	if err := prod.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if int64(n) >= o.produced-o.failedProduces || time.Now().After(deadline) {
			o.consumed = n
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	o.maxAckGap = time.Duration(maxGap.Load())
	o.apiVersionsEOFs = eofs.n.Load()
	if r := resumedAt.Load(); r != 0 {
		o.resumed = time.Duration(r - killedAt.Load())
	} else {
		o.resumed = time.Hour
	}
	return o
}

// moveLeadersOff moves every partition the victim leads, of every topic
// (kproxy's own included), to the other brokers.
func moveLeadersOff(t *testing.T, c *kfake.Cluster, victim int32) {
	t.Helper()
	var others []int32
	for n := range int32(3) {
		if n != victim {
			others = append(others, n)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()[others[0]]))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	topics, err := kadm.NewClient(cl).ListTopicsWithInternal(ctx)
	if err != nil {
		t.Fatalf("listing topics: %v", err)
	}
	i := 0
	for _, td := range topics {
		for _, pd := range td.Partitions {
			if c.LeaderFor(td.Topic, pd.Partition) != victim {
				continue
			}
			if err := c.MoveTopicPartition(td.Topic, pd.Partition, others[i%2]); err != nil {
				t.Fatalf("moving %s/%d: %v", td.Topic, pd.Partition, err)
			}
			i++
		}
	}
}
