package main

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRawClientsAgainstBroker: the conns mode's raw clients speak to a
// real in-memory broker: the handshake, the hand-built record batch (its
// CRC checked by the broker), a fetch of the synthetic batch and the
// idle heartbeat all succeed.
func TestRawClientsAgainstBroker(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.BlackholeProduce(),
		kfake.SyntheticFetch(kfake.SyntheticBatch{RecordBytes: 100, Records: 10}),
		kfake.SeedTopics(2, produceTopic, fetchTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := dialRaw(ctx, c.ListenAddrs()[0], sourceAddr(0, 10))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.c.Close()
	md, err := rc.handshake(produceTopic, fetchTopic)
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Topics) != 2 || len(md.Brokers) != 1 {
		t.Fatalf("metadata: %d topics, %d brokers", len(md.Topics), len(md.Brokers))
	}
	a := &activeLoad{}
	a.measuring.Store(true)
	for _, producer := range []bool{true, false} {
		actx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); a.run(actx, rc, producer, produceFrame(100, 5), 1) }()
		for a.reqs.Load() < 3 && a.errs.Load() == 0 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		stop()
		<-done
		if n := a.errs.Load(); n > 0 || a.reqs.Load() < 3 {
			t.Fatalf("producer=%v: %d errors, %d requests answered", producer, n, a.reqs.Load())
		}
		a.reqs.Store(0)
	}
	if _, err := rc.roundTrip(apiVersionsReq()); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	var b kmsg.RecordBatch
	if err := b.ReadFrom(produceFrame(10, 3)); err != nil || b.NumRecords != 3 {
		t.Fatalf("batch: %v, %d records", err, b.NumRecords)
	}
}

func TestConnsOptionsValidate(t *testing.T) {
	ok := connsOptions{total: 100, active: 10, heartbeat: time.Second, phase: time.Second, perIP: 10}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	quiet := ok
	quiet.heartbeat = 0
	if err := quiet.validate(); err != nil {
		t.Fatalf("heartbeat 0: %v", err)
	}
	for _, bad := range []connsOptions{
		{total: 5, active: 10, heartbeat: time.Second, phase: time.Second, perIP: 10},
		{total: 100, active: 0, heartbeat: time.Second, phase: time.Second, perIP: 10},
		{total: 100, active: 10, heartbeat: time.Millisecond, phase: time.Second, perIP: 10},
		{total: 100, active: 10, heartbeat: time.Second, phase: time.Second, perIP: 0},
	} {
		if bad.validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}
