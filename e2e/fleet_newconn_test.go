package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/internal/faultnet"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// TestNewConnectionToCutKproxy opens new client connections to a kproxy
// whose every connection to the cluster is blackholed (issue 20), beside
// a direct client whose own path to the cluster is blackholed the same
// way, in the same run, both real franz-go clients that start during the
// fault and produce one record. Through kproxy the connection's
// ApiVersions must be answered during the fault (from the brokers' last
// known versions, within api_versions_timeout) so that kproxy's own
// answers can reach the client; the client must get only retriable
// errors and must have its record acknowledged after heal no later than
// the direct client (recoverySlack).
//
// Two fault lengths: one shorter than franz-go's 10s read timeout (the
// first requests are held and answered at heal, directly as through
// kproxy) and one longer (both clients time out, reconnect and retry
// during the fault).
func TestNewConnectionToCutKproxy(t *testing.T) {
	for _, faultFor := range []time.Duration{6 * time.Second, 13 * time.Second} {
		t.Run(fmt.Sprint(faultFor), func(t *testing.T) { newConnectionToCutKproxy(t, faultFor) })
	}
}

// recoverySlack is how much later than the direct client the client
// through kproxy may recover: one more hop on loopback and two more
// goroutine handoffs, scheduled on two shared cores under -race (the
// two differed by under 10ms in every run so far); below franz-go's
// shortest retry backoff (250ms, less at most 20% jitter), so a retry
// kproxy caused would still fail the test.
const recoverySlack = 200 * time.Millisecond

// apiVersionsWatch records when a client's ApiVersions answers arrived
// and the errors its reads got. A kgo hook (HookBrokerRead).
type apiVersionsWatch struct {
	mu       sync.Mutex
	answered []time.Time // guarded by mu
	errs     []string    // guarded by mu
}

func (w *apiVersionsWatch) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.errs = append(w.errs, errText(err))
		return
	}
	if key == 18 {
		w.answered = append(w.answered, time.Now())
	}
}

func (w *apiVersionsWatch) answeredIn(from, to time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, at := range w.answered {
		if at.After(from) && at.Before(to) {
			n++
		}
	}
	return n
}

func newConnectionToCutKproxy(t *testing.T, faultFor time.Duration) {
	const topic, partitions = "newconn", 3
	cluster, err := kproxy.NewDevCluster(3, partitions, testLogger(), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	pathK, pathD := newFaultPath(t), newFaultPath(t)
	k := startCutFleetKproxy(t, brokers, kproxy.FleetConfig{}, pathK)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type client struct {
		name  string
		seeds []string
		dial  func(context.Context, string, string) (net.Conn, error)
	}
	clients := []client{{"kproxy", []string{k.Addr()}, nil}, {"direct", brokers, pathD.dial}}
	newClient := func(c client, watch *apiVersionsWatch) *kgo.Client {
		opts := []kgo.Opt{kgo.SeedBrokers(c.seeds...), kgo.DefaultProduceTopic(topic),
			kgo.RecordDeliveryTimeout(90 * time.Second), kgo.RetryTimeout(90 * time.Second)}
		if c.dial != nil {
			opts = append(opts, kgo.Dialer(c.dial))
		}
		if watch != nil {
			opts = append(opts, kgo.WithHooks(watch))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	// Both paths carry traffic before the fault: kproxy learns the
	// brokers' versions from the answers it forwards.
	for _, c := range clients {
		cl := newClient(c, nil)
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("before")}).FirstErr(); err != nil {
			t.Fatalf("%s: producing before the fault: %v", c.name, err)
		}
		cl.Close()
	}

	blackhole := func(r *faultnet.Relay) { r.Blackhole(faultnet.Both) }
	faultAt := time.Now()
	pathK.apply(blackhole)
	pathD.apply(blackhole)
	acked := make([]time.Time, len(clients))
	errs := make([]error, len(clients))
	watches := make([]*apiVersionsWatch, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		watches[i] = &apiVersionsWatch{}
		cl := newClient(c, watches[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cl.ProduceSync(ctx, &kgo.Record{Value: []byte("during")}).FirstErr()
			acked[i] = time.Now()
		}()
	}
	time.Sleep(faultFor)
	healAt := time.Now()
	pathK.apply(nil)
	pathD.apply(nil)
	wg.Wait()

	recovered := make([]time.Duration, len(clients))
	for i, c := range clients {
		if errs[i] != nil {
			t.Fatalf("%s: the record produced during the fault failed: %v", c.name, errs[i])
		}
		recovered[i] = acked[i].Sub(healAt)
		w := watches[i]
		during := w.answeredIn(faultAt, healAt)
		w.mu.Lock()
		t.Logf("%-6s fault %v: ApiVersions answered during the fault %d, acknowledged %v after heal, read errors %v",
			c.name, faultFor, during, recovered[i].Round(time.Millisecond), w.errs)
		for _, e := range w.errs {
			ok := false
			for _, r := range retriableErrors {
				ok = ok || strings.Contains(e, r)
			}
			if !ok {
				t.Errorf("%s: a read failed with %q, which a client does not retry", c.name, e)
			}
		}
		w.mu.Unlock()
	}
	if n := watches[0].answeredIn(faultAt, healAt); n == 0 {
		t.Errorf("no ApiVersions of the new client was answered through the cut-off kproxy during the %v fault", faultFor)
	}
	if recovered[0] > recovered[1]+recoverySlack {
		t.Errorf("through kproxy the record was acknowledged %v after heal, directly %v: want no later than direct (+%v)",
			recovered[0].Round(time.Millisecond), recovered[1].Round(time.Millisecond), recoverySlack)
	}
}
