package e2e

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/coexist"
	"github.com/kproxy/kproxy/internal/kproxy"
	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// stack is an in-memory cluster with kproxy in front of it, assembled by
// internal/kproxy as `kproxy dev --groups local` assembles it.
type stack struct {
	t       testing.TB
	cluster *kfake.Cluster
	kproxy  *kproxy.Server     // nil while stopped
	engine  *groupstate.Engine // kproxy's engine
	opts    []stackOpt
	// listen is the proxy's bootstrap address: 127.0.0.1:0 at first, a
	// restart keeps the address so clients find it again.
	listen string
	// brokerGroupReqs counts the group requests the brokers received,
	// by api key, to prove the engine served them all.
	brokerGroupReqs [100]atomic.Int64

	mu     sync.Mutex
	events []groupstate.Event // guarded by mu
}

// stackOpt tweaks the kproxy a stack assembles.
type stackOpt func(*kproxy.Config)

// engineOpt tweaks the engine's configuration.
func engineOpt(f func(*groupstate.Config)) stackOpt {
	return func(c *kproxy.Config) { f(&c.Groups.Engine) }
}

func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}

func newStack(t testing.TB, opts ...stackOpt) *stack {
	t.Helper()
	return newStackOn(t, nil, opts...)
}

// newStackOn is newStack with options for the in-memory cluster.
func newStackOn(t testing.TB, clusterOpts []kfake.Opt, opts ...stackOpt) *stack {
	t.Helper()
	s := &stack{t: t, opts: opts, listen: "127.0.0.1:0"}
	c, err := kproxy.NewDevCluster(3, 0, testLogger(), clusterOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s.cluster = c
	for _, key := range []int16{11, 12, 13, 14} {
		c.ControlKey(key, func(req kmsg.Request) (kmsg.Response, error, bool) {
			if !anchorRequest(req) {
				s.brokerGroupReqs[key].Add(1)
			}
			return nil, nil, false
		})
	}
	s.start()
	return s
}

// start starts kproxy (again, after stop) in front of the cluster.
func (s *stack) start() {
	s.t.Helper()
	if err := s.tryStart(); err != nil {
		s.t.Fatal(err)
	}
}

// tryStart starts kproxy on s.listen with the stack's options.
func (s *stack) tryStart() error {
	cfg := kproxy.Config{
		Upstream: s.cluster.ListenAddrs(),
		Proxy:    proxy.Config{Listen: s.listen},
		Groups: kproxy.GroupsConfig{
			Mode: kproxy.GroupsLocal,
			Engine: groupstate.Config{
				InitialRebalanceDelay: -1,
				MinSessionTimeout:     time.Second,
				Events: func(ev groupstate.Event) {
					s.mu.Lock()
					s.events = append(s.events, ev)
					s.mu.Unlock()
				},
			},
		},
		Telemetry: tap.Config{Getenv: func(string) string { return "" }},
		Logger:    testLogger(),
	}
	for _, o := range s.opts {
		o(&cfg)
	}
	k, err := kproxy.Start(context.Background(), cfg)
	if err != nil {
		return err
	}
	s.kproxy, s.engine = k, k.Engine()
	s.listen = k.Addr()
	s.t.Cleanup(s.stop)
	return nil
}

// stop shuts kproxy down (proxy, engine, its upstream client); safe to
// call twice. The cluster keeps running.
func (s *stack) stop() {
	if s.kproxy == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.kproxy.Shutdown(ctx)
	s.kproxy = nil
}

func (s *stack) addr() string { return s.kproxy.Addr() }

// assertBrokersSawNoGroupTraffic fails if any JoinGroup, SyncGroup,
// Heartbeat or LeaveGroup reached the brokers.
func (s *stack) assertBrokersSawNoGroupTraffic() {
	s.t.Helper()
	for _, key := range []int16{11, 12, 13, 14} {
		if n := s.brokerGroupReqs[key].Load(); n != 0 {
			s.t.Fatalf("the brokers received %d %s requests", n, kmsg.NameForKey(key))
		}
	}
}

// anchorRequest reports whether req comes from a kproxy anchor (its
// static member in the cluster's group, docs/anchors.md) rather than
// from a client.
func anchorRequest(req kmsg.Request) bool {
	is := func(id *string) bool { return id != nil && strings.HasPrefix(*id, coexist.DefaultAnchorInstanceID) }
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		return is(r.InstanceID)
	case *kmsg.SyncGroupRequest:
		return is(r.InstanceID)
	case *kmsg.HeartbeatRequest:
		return is(r.InstanceID)
	case *kmsg.LeaveGroupRequest:
		return len(r.Members) > 0 && is(r.Members[0].InstanceID)
	}
	return false
}

func (s *stack) eventsOf(kind groupstate.EventKind) []groupstate.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []groupstate.Event
	for _, ev := range s.events {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

func (s *stack) client(opts ...kgo.Opt) *kgo.Client {
	s.t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.addr())}, opts...)...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(cl.Close)
	return cl
}

// produce creates topic with partitions partitions and writes records
// "0".."n-1" to it through the proxy.
func (s *stack) produce(ctx context.Context, topic string, partitions int32, n int) {
	s.t.Helper()
	if _, err := kadm.NewClient(s.client()).CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
		s.t.Fatalf("create topic: %v", err)
	}
	s.produceRange(ctx, topic, 0, n)
}

// produceEvenly creates topic with partitions and writes n records to
// it through the proxy, round robin: every partition gets n/partitions.
func (s *stack) produceEvenly(ctx context.Context, topic string, partitions int32, n int) {
	s.t.Helper()
	if _, err := kadm.NewClient(s.client()).CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
		s.t.Fatalf("create topic: %v", err)
	}
	s.produceWith(ctx, s.client(kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner())), 0, n)
}

// produceRange writes records "from".."to-1" to topic through the proxy.
func (s *stack) produceRange(ctx context.Context, topic string, from, to int) {
	s.t.Helper()
	s.produceWith(ctx, s.client(kgo.DefaultProduceTopic(topic)), from, to)
}

// produceWith writes records "from".."to-1" with cl, to its default
// topic.
func (s *stack) produceWith(ctx context.Context, cl *kgo.Client, from, to int) {
	s.t.Helper()
	for i := from; i < to; i++ {
		cl.Produce(ctx, &kgo.Record{Value: []byte(itoa(i))}, func(_ *kgo.Record, err error) {
			if err != nil {
				s.t.Errorf("produce: %v", err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		s.t.Fatal(err)
	}
}

// assertCommittedAtEnd checks, directly against the cluster, that the
// group's committed offsets equal the end offsets of every partition.
func (s *stack) assertCommittedAtEnd(ctx context.Context, group, topic string) {
	s.t.Helper()
	assertCommittedAtEnd(ctx, s.t, s.cluster.ListenAddrs(), group, topic)
}

// assertCommittedAtEnd checks against brokers that the group's committed
// offsets equal the end offsets of every partition of topic.
func assertCommittedAtEnd(ctx context.Context, t testing.TB, brokers []string, group, topic string) {
	t.Helper()
	direct, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	adm := kadm.NewClient(direct)
	var last string
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		offs, err := adm.FetchOffsets(ctx, group)
		ends, err2 := adm.ListEndOffsets(ctx, topic)
		if err == nil && err2 == nil {
			ok := true
			last = ""
			ends.Each(func(e kadm.ListedOffset) {
				o, found := offs.Lookup(topic, e.Partition)
				if !(found && o.At == e.Offset) && !(!found && e.Offset == 0) {
					ok = false
					last += " p" + itoa(int(e.Partition)) + ": committed " + itoa(int(o.At)) + " end " + itoa(int(e.Offset))
				}
			})
			if ok {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("committed offsets of %s never reached the end offsets:%s", group, last)
}

func itoa(i int) string { return strconv.Itoa(i) }

// ownership checks that no partition is owned by two live members at
// once: a member must have given a partition up (revoked or lost, or been
// killed) before another member is given it.
type ownership struct {
	t     testing.TB
	mu    sync.Mutex
	owner map[int32]string // guarded by mu
	bad   []string         // guarded by mu
	// given[gen][p] is the member given p at generation (classic) or
	// member epoch (KIP-848) gen: within one, a partition is given to
	// one member only. Guarded by mu.
	given map[int32]map[int32]string
	// calls counts each member's assign callbacks (one per generation
	// or epoch it completed); guarded by mu.
	calls map[string]int
}

func newOwnership(t testing.TB) *ownership {
	return &ownership{t: t, owner: map[int32]string{}, given: map[int32]map[int32]string{}, calls: map[string]int{}}
}

// assignCalls returns how many assign callbacks member had.
func (o *ownership) assignCalls(member string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls[member]
}

// assignedAt records that member was given parts at generation or
// epoch gen, as assigned does, and checks that no other member (who
// names it: its instance id when static) was given them at gen.
func (o *ownership) assignedAt(member, who string, gen int32, parts []int32) {
	o.mu.Lock()
	o.calls[member]++
	if gen >= 0 {
		if o.given[gen] == nil {
			o.given[gen] = map[int32]string{}
		}
		for _, p := range parts {
			if have, ok := o.given[gen][p]; ok && have != who {
				o.bad = append(o.bad, "partition "+itoa(int(p))+" given to "+who+" and "+have+" at generation/epoch "+itoa(int(gen)))
			}
			o.given[gen][p] = who
		}
	}
	o.mu.Unlock()
	o.assigned(member, parts)
}

func (o *ownership) assigned(member string, parts []int32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range parts {
		if have, ok := o.owner[p]; ok && have != member {
			o.bad = append(o.bad, "partition "+itoa(int(p))+" given to "+member+" while "+have+" owned it")
		}
		o.owner[p] = member
	}
}

func (o *ownership) released(member string, parts []int32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range parts {
		if o.owner[p] == member {
			delete(o.owner, p)
		}
	}
}

// releaseAll drops everything member owns (it was killed).
func (o *ownership) releaseAll(member string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for p, m := range o.owner {
		if m == member {
			delete(o.owner, p)
		}
	}
}

func (o *ownership) check() {
	o.t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.bad) > 0 {
		o.t.Fatalf("double ownership: %v", o.bad)
	}
}

func (o *ownership) owners() map[string][]int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][]int32{}
	for p, m := range o.owner {
		out[m] = append(out[m], p)
	}
	for _, ps := range out {
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	}
	return out
}

// cuttableDialer lets a test cut a client off the network, as if its
// process died: open connections are closed and new dials fail.
type cuttableDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (d *cuttableDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cuttableDialer) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	for _, c := range d.conns {
		c.Close()
	}
}

// Dial lets sarama use the dialer (its Net.Proxy.Dialer).
func (d *cuttableDialer) Dial(network, addr string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, addr)
}

// assertRestartInvisible checks what a kproxy restart in steady state must
// leave unchanged: no rebalance (or KIP-848 epoch bump) since rebalances
// were counted, the group reloaded from its record, the same partition
// owners, no partition owned twice, and records 0..n-1 all consumed.
func (s *stack) assertRestartInvisible(rebalances int, own *ownership, owners map[string][]int32, recs *records, n int) {
	s.t.Helper()
	if evs := s.eventsOf(groupstate.EventRebalanceStarted); len(evs) != rebalances {
		for _, ev := range evs[rebalances:] {
			s.t.Logf("rebalance: cause %s member %+v generation %d", ev.Cause, ev.Member, ev.Generation)
		}
		s.t.Fatalf("the restart caused %d rebalance(s)", len(evs)-rebalances)
	}
	if len(s.eventsOf(groupstate.EventGroupLoaded)) == 0 {
		s.t.Fatal("no group_loaded event: the group was not reloaded")
	}
	own.check()
	if now := own.owners(); !equalOwners(now, owners) {
		s.t.Fatalf("partition owners changed across the restart: %v → %v", owners, now)
	}
	if missing := recs.missing(n); len(missing) > 0 {
		s.t.Fatalf("records lost: %v", head(missing, 10))
	}
}
