package proxy

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestProduceConsumeByteIdentical sends records of mixed sizes through the
// proxy and reads them back through it: every record arrives, byte for
// byte, on the partition it was sent to.
func TestProduceConsumeByteIdentical(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), nil)
	const topic, partitions = "bytes", 6
	cl := newClient(t, p.Addr(), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
		t.Fatalf("create topic: %v", err)
	}

	sizes := []int{0, 1, 100, 1 << 10, 16 << 10, 200 << 10, 900 << 10}
	type key struct {
		part int32
		n    int
	}
	sent := map[key][]byte{}
	var records []*kgo.Record
	for i := range 60 {
		v := make([]byte, sizes[i%len(sizes)])
		for j := range v {
			v[j] = byte(i*31 + j*7)
		}
		part := int32(i % partitions)
		sent[key{part, i}] = v
		records = append(records, &kgo.Record{Partition: part, Key: []byte(strconv.Itoa(i)), Value: v})
	}
	if err := cl.ProduceSync(ctx, records...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	cons := newClient(t, p.Addr(), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(300<<10))
	got := 0
	for got < len(records) {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", got, len(records), err)
		}
		fs.EachError(func(topic string, part int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, part, err) })
		fs.EachRecord(func(r *kgo.Record) {
			i, _ := strconv.Atoi(string(r.Key))
			want, ok := sent[key{r.Partition, i}]
			if !ok {
				t.Fatalf("record %d arrived on partition %d, or twice", i, r.Partition)
			}
			if string(want) != string(r.Value) {
				t.Fatalf("record %d: value differs (%d bytes, want %d)", i, len(r.Value), len(want))
			}
			delete(sent, key{r.Partition, i})
			got++
		})
	}
	if len(sent) != 0 {
		t.Fatalf("%d records never arrived", len(sent))
	}
}

// TestMetadataHoldsProxyAddressesOnly checks every address-bearing
// response a client can get: no upstream address reaches it.
func TestMetadataHoldsProxyAddressesOnly(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), nil)
	upstream := map[string]bool{}
	for _, a := range c.ListenAddrs() {
		upstream[a] = true
	}
	cl := newClient(t, p.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, proxyPortStr, _ := net.SplitHostPort(p.Addr())
	check := func(what string, node, port int32, host string) {
		t.Helper()
		addr := net.JoinHostPort(host, strconv.Itoa(int(port)))
		if upstream[addr] {
			t.Fatalf("%s: node %d leaked upstream address %s", what, node, addr)
		}
		if host != "127.0.0.1" {
			t.Fatalf("%s: node %d advertised host %q", what, node, host)
		}
		if strconv.Itoa(int(port)) == proxyPortStr {
			t.Fatalf("%s: node %d mapped to the bootstrap port", what, node)
		}
	}
	for v := int16(0); v <= kmsg.NewPtrMetadataRequest().MaxVersion(); v++ {
		req := kmsg.NewPtrMetadataRequest()
		req.Version = v
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatalf("metadata v%d: %v", v, err)
		}
		if len(resp.Brokers) != 3 {
			t.Fatalf("metadata v%d: %d brokers, want 3", v, len(resp.Brokers))
		}
		for _, b := range resp.Brokers {
			check(fmt.Sprintf("metadata v%d", v), b.NodeID, b.Port, b.Host)
		}
	}
	dc := kmsg.NewPtrDescribeClusterRequest()
	dresp, err := dc.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("describe cluster: %v", err)
	}
	for _, b := range dresp.Brokers {
		check("describe cluster", b.NodeID, b.Port, b.Host)
	}
	// Transaction coordinators are the brokers' and are rewritten.
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.CoordinatorType = 1
	fc.CoordinatorKey = "txn-1"
	fc.CoordinatorKeys = []string{"txn-1"}
	fresp, err := fc.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("find coordinator: %v", err)
	}
	for _, co := range fresp.Coordinators {
		if co.ErrorCode == 0 {
			check("find txn coordinator", co.NodeID, co.Port, co.Host)
		}
	}
}

// TestPipelinedMixedSizes keeps many requests of mixed sizes in flight on
// one connection: every response comes back, in order, matching its
// request.
func TestPipelinedMixedSizes(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), nil)
	const topic = "pipelined"
	cl := newClient(t, p.Addr(),
		kgo.DefaultProduceTopic(topic),
		kgo.MaxBufferedRecords(100000),
		kgo.ProducerLinger(0),
		kgo.MaxProduceRequestsInflightPerBroker(32),
		kgo.DisableIdempotentWrite(),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 6, 1, nil, topic); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	const n = 3000
	for i := range n {
		wg.Add(1)
		size := []int{10, 500, 5000, 70000}[i%4]
		cl.Produce(ctx, &kgo.Record{Value: make([]byte, size)}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	// Metadata requests interleave with the produces on the same
	// connections.
	for range 20 {
		if _, err := kadm.NewClient(cl).BrokerMetadata(ctx); err != nil {
			t.Fatalf("metadata while producing: %v", err)
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d produces failed, first: %v", len(errs), n, errs[0])
	}
	offs, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	var total int64
	offs.Each(func(o kadm.ListedOffset) { total += o.Offset })
	if total != n {
		t.Fatalf("end offsets sum to %d, want %d", total, n)
	}
}

// TestProduceAcksZero sends acks=0 produces at every Produce version: the
// proxy must not wait for (or invent) a response, and the records land.
func TestProduceAcksZero(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admCl := newClient(t, p.Addr())
	adm := kadm.NewClient(admCl)
	for v := int16(3); v <= kmsg.NewPtrProduceRequest().MaxVersion(); v++ {
		topic := fmt.Sprintf("acks0-v%d", v)
		if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
			t.Fatalf("create %s: %v", topic, err)
		}
		cl := newClient(t, p.Addr(),
			kgo.DefaultProduceTopic(topic),
			kgo.RequiredAcks(kgo.NoAck()),
			kgo.DisableIdempotentWrite(),
			kgo.MaxVersions(maxProduce(v)),
		)
		for i := range 50 {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
				t.Fatalf("produce v%d: %v", v, err)
			}
		}
		waitFor(t, 10*time.Second, fmt.Sprintf("50 records in %s", topic), func() bool {
			offs, err := adm.ListEndOffsets(ctx, topic)
			if err != nil {
				return false
			}
			o, _ := offs.Lookup(topic, 0)
			return o.Offset == 50
		})
	}
	// The connection still answers afterwards: nothing is out of order.
	if _, err := adm.BrokerMetadata(ctx); err != nil {
		t.Fatalf("metadata after acks=0: %v", err)
	}
}

// TestBrokerAddedMidTest adds a broker to the cluster while a client is
// connected: the proxy opens a listener for it and the client reaches it.
func TestBrokerAddedMidTest(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) { cfg.MetadataInterval = 200 * time.Millisecond })
	cl := newClient(t, p.Addr(), kgo.MetadataMinAge(50*time.Millisecond), kgo.MetadataMaxAge(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	node, _, err := c.AddNode(-1, 0)
	if err != nil {
		t.Fatalf("add node: %v", err)
	}
	const topic = "moved"
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	if err := c.MoveTopicPartition(topic, 0, node); err != nil {
		t.Fatalf("move partition: %v", err)
	}
	var md kadm.Metadata
	waitFor(t, 10*time.Second, "the new broker in metadata", func() bool {
		md, err = adm.Metadata(ctx, topic)
		return err == nil && len(md.Brokers) == 4 && md.Topics[topic].Partitions[0].Leader == node
	})
	prod := newClient(t, p.Addr(), kgo.DefaultProduceTopic(topic), kgo.MetadataMinAge(50*time.Millisecond), kgo.MetadataMaxAge(200*time.Millisecond))
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("to the new broker")}).FirstErr(); err != nil {
		t.Fatalf("produce to the new broker: %v", err)
	}
	for _, b := range md.Brokers {
		if b.NodeID == node && (b.Host != "127.0.0.1" || strings.Contains(strings.Join(c.ListenAddrs(), ","), ":"+strconv.Itoa(int(b.Port)))) {
			t.Fatalf("new broker advertised as %s:%d", b.Host, b.Port)
		}
	}
}

// TestAdvertisePortShiftsEveryPort puts the proxy "behind a port mapping":
// clients are told the advertised ports, each broker shifted by the same
// amount as the bootstrap port.
func TestAdvertisePortShiftsEveryPort(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) { cfg.AdvertisePort = 40000 })
	p.mu.Lock()
	boot := p.listeners[-1]
	var real, adv []int32
	for node, l := range p.listeners {
		if node >= 0 {
			real = append(real, int32(l.ln.Addr().(*net.TCPAddr).Port))
			adv = append(adv, l.port)
		}
	}
	p.mu.Unlock()
	if boot.port != 40000 || !strings.HasSuffix(p.Addr(), ":40000") {
		t.Fatalf("bootstrap advertised as %d (%s)", boot.port, p.Addr())
	}
	bootReal := int32(boot.ln.Addr().(*net.TCPAddr).Port)
	for i := range real {
		if adv[i]-40000 != real[i]-bootReal {
			t.Fatalf("broker listening on %d advertised as %d (bootstrap %d -> 40000)", real[i], adv[i], bootReal)
		}
	}
	if len(real) != 3 {
		t.Fatalf("%d broker listeners", len(real))
	}
}
