package proxy

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestShutdownDrains shuts the proxy down under load: Shutdown returns
// well inside its deadline, every acknowledged produce is in the log, and
// the listeners are closed.
func TestShutdownDrains(t *testing.T) {
	c := newCluster(t)
	p, err := New(Config{Upstreams: c.ListenAddrs(), Listen: "127.0.0.1:0", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	addr := p.Addr()
	const topic = "drain"
	cl := newClient(t, addr, kgo.DefaultProduceTopic(topic), kgo.RecordRetries(0), kgo.RequestRetries(0))
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	var acked atomic.Int64
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			cl.Produce(ctx, &kgo.Record{Value: make([]byte, 100)}, func(_ *kgo.Record, err error) {
				if err == nil {
					acked.Add(1)
				}
			})
			time.Sleep(100 * time.Microsecond)
		}
	}()
	waitFor(t, 10*time.Second, "some acknowledged produces", func() bool { return acked.Load() > 200 })
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	begin := time.Now()
	if err := p.Shutdown(sctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	close(stop)
	if d := time.Since(begin); d > 4*time.Second {
		t.Fatalf("shutdown took %v", d)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("bootstrap listener still accepting after shutdown")
	}
	cl.Close()
	// Everything the client saw acknowledged is in the log (read directly
	// from the cluster).
	direct := newClient(t, c.ListenAddrs()[0])
	offs, err := kadm.NewClient(direct).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	offs.Each(func(o kadm.ListedOffset) { total += o.Offset })
	if total < acked.Load() {
		t.Fatalf("%d records in the log, %d acknowledged", total, acked.Load())
	}
}
