package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/faultnet"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// faultPath is a client's own path to the cluster through fault relays:
// its dialer sends every broker connection through a relay of its own
// (made on first use), so that a fault switched on the path hits all of
// the client's connections, as when its own network fails.
type faultPath struct {
	t      testing.TB
	mu     sync.Mutex
	relays map[string]*faultnet.Relay // guarded by mu: by broker address
	faults func(*faultnet.Relay)      // guarded by mu: applied to relays made later
}

func newFaultPath(t testing.TB) *faultPath {
	return &faultPath{t: t, relays: map[string]*faultnet.Relay{}}
}

func (p *faultPath) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	p.mu.Lock()
	r := p.relays[addr]
	if r == nil {
		var err error
		if r, err = faultnet.Listen(addr); err != nil {
			p.mu.Unlock()
			return nil, err
		}
		p.relays[addr] = r
		p.t.Cleanup(func() { r.Close() })
		if p.faults != nil {
			p.faults(r)
		}
	}
	p.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, network, r.Addr())
}

// apply switches f on every relay of the path, and on those made later
// (nil heals them all).
func (p *faultPath) apply(f func(*faultnet.Relay)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = f
	for _, r := range p.relays {
		r.Heal()
		if f != nil {
			f(r)
		}
	}
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startFleetKproxy starts an in-process kproxy of a fleet in front of
// brokers (distributed groups, short fleet timers).
func startFleetKproxy(t testing.TB, brokers []string, fc kproxy.FleetConfig) *kproxy.Server {
	t.Helper()
	fc.SessionTimeout, fc.HeartbeatInterval = 3*time.Second, 300*time.Millisecond
	return startKproxyConfig(t, inProcessConfig(brokers, kproxy.GroupsDistributed, fc))
}

// faultMember is a consumer group member that commits synchronously
// after every poll and records when its commits succeed, how long each
// commit call took, and every error.
type faultMember struct {
	name, group string
	cl          *kgo.Client

	mu       sync.Mutex
	commits  []time.Time     // guarded by mu: when each successful commit returned
	slowest  time.Duration   // guarded by mu: longest commit call during the fault
	errs     map[string]int  // guarded by mu: commit errors by text
	acked    map[int32]int64 // guarded by mu: highest acknowledged commit per partition
	inFault  atomic.Bool     // the fault is on: slowest is recorded
	log      *syncBuf
	polled   atomic.Int64
	assigned atomic.Int64 // partitions owned now, from the member\'s callbacks
	events   []partEvent  // guarded by mu: the member's partition callbacks, in order
}

// partEvent is one partition callback of a member: when it ran, which
// (assigned, revoked, lost) and the partitions it named.
type partEvent struct {
	at    time.Time
	kind  string
	parts []int32
}

func (m *faultMember) record(kind string, parts []int32) {
	m.mu.Lock()
	m.events = append(m.events, partEvent{at: time.Now(), kind: kind, parts: append([]int32(nil), parts...)})
	m.mu.Unlock()
}

// ownedAt is the set of partitions the member owned at at, from its
// callbacks.
func (m *faultMember) ownedAt(at time.Time) map[int32]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	own := map[int32]bool{}
	for _, e := range m.events {
		if e.at.After(at) {
			break
		}
		for _, p := range e.parts {
			own[p] = e.kind == "assigned"
		}
	}
	for p, o := range own {
		if !o {
			delete(own, p)
		}
	}
	return own
}

// firstEvent is the first callback at or after from whose kind is one of
// kinds and that names p; ok false if none.
func (m *faultMember) firstEvent(from time.Time, p int32, kinds ...string) (partEvent, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.events {
		if e.at.Before(from) {
			continue
		}
		for _, k := range kinds {
			if e.kind == k && slices.Contains(e.parts, p) {
				return e, true
			}
		}
	}
	return partEvent{}, false
}

// startFaultMember starts member name of group on topic, whose client
// dials seeds through dial (nil: directly), and records what it consumed
// in seen. extra options are applied after the defaults (a later
// RetryTimeout wins).
func startFaultMember(t testing.TB, ctx context.Context, name, group, topic string, seeds []string, dial func(context.Context, string, string) (net.Conn, error), seen map[int32]map[int64]bool, seenMu *sync.Mutex, extra ...kgo.Opt) *faultMember {
	t.Helper()
	opts := []kgo.Opt{
		kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.SessionTimeout(4 * time.Second), kgo.HeartbeatInterval(300 * time.Millisecond),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.RetryTimeout(3 * time.Second),
		kgo.ClientID(name),
	}
	if dial != nil {
		opts = append(opts, kgo.Dialer(dial))
	}
	logBuf := &syncBuf{}
	// m is complete before the client exists: its callbacks may run as
	// soon as it does.
	m := &faultMember{log: logBuf, name: name, group: group, errs: map[string]int{}, acked: map[int32]int64{}}
	opts = append(opts, kgo.WithLogger(kgo.BasicLogger(logBuf, kgo.LogLevelInfo, nil)))
	opts = append(opts, kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
		m.record("assigned", a[topic])
		m.assigned.Add(int64(len(a[topic])))
	}), kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
		m.record("revoked", a[topic])
		m.assigned.Add(-int64(len(a[topic])))
	}), kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
		m.record("lost", a[topic])
		m.assigned.Add(-int64(len(a[topic])))
	}))
	opts = append(opts, extra...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	m.cl = cl
	go func() {
		defer cl.Close()
		for ctx.Err() == nil {
			pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			fs := cl.PollFetches(pctx)
			cancel()
			recs := fs.Records()
			fs.EachError(func(tp string, p int32, err error) {
				if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
					m.mu.Lock()
					m.errs["fetch: "+errText(err)]++
					m.mu.Unlock()
				}
			})
			m.polled.Add(int64(len(recs)))
			seenMu.Lock()
			for _, r := range recs {
				if seen[r.Partition] == nil {
					seen[r.Partition] = map[int64]bool{}
				}
				seen[r.Partition][r.Offset] = true
			}
			seenMu.Unlock()
			if len(recs) == 0 {
				continue
			}
			start := time.Now()
			cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			err := cl.CommitRecords(cctx, recs...)
			cancel()
			took := time.Since(start)
			m.mu.Lock()
			if m.inFault.Load() {
				m.slowest = max(m.slowest, took)
			}
			if err != nil {
				if ctx.Err() == nil {
					m.errs[errText(err)]++
				}
			} else {
				m.commits = append(m.commits, time.Now())
				for _, r := range recs {
					m.acked[r.Partition] = max(m.acked[r.Partition], r.Offset+1)
				}
			}
			m.mu.Unlock()
		}
	}()
	return m
}

// checkConsumedAndKept waits for every group to commit the topic's end
// offsets, then checks that each group consumed every record and that no
// member's acknowledged commit is above what its group has committed.
// Call it once production stopped.
func checkConsumedAndKept(t testing.TB, ctx context.Context, cl *kgo.Client, topic string, groups map[string][]*faultMember, seen map[string]map[int32]map[int64]bool, seenMu *sync.Mutex) {
	t.Helper()
	adm := kadm.NewClient(cl)
	end := map[int32]int64{}
	lo, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	lo.Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	waitUntil(t, 60*time.Second, "every group to commit the end offsets", func() bool {
		for g := range groups {
			offs, err := adm.FetchOffsets(ctx, g)
			if err != nil {
				return false
			}
			for p, e := range end {
				o, ok := offs.Lookup(topic, p)
				if !ok || o.At < e {
					return false
				}
			}
		}
		return true
	})
	for g, members := range groups {
		offs, err := adm.FetchOffsets(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			m.mu.Lock()
			for p, a := range m.acked {
				if o, _ := offs.Lookup(topic, p); o.At < a {
					t.Errorf("%s: partition %d committed at %d, below the acknowledged %d", m.name, p, o.At, a)
				}
			}
			m.mu.Unlock()
		}
		seenMu.Lock()
		for p, e := range end {
			for o := int64(0); o < e; o++ {
				if !seen[g][p][o] {
					t.Errorf("%s: record %d/%d never consumed", g, p, o)
					break
				}
			}
		}
		seenMu.Unlock()
	}
}

// retriableErrors are the errors a consumer retries (or, for
// UNKNOWN_MEMBER_ID and ILLEGAL_GENERATION, answers by rejoining). A
// connection that died or timed out is a network error, which every
// Kafka client retries (Java's NetworkException is retriable): franz-go
// returns it from a commit whose own path was cut (seen once from a
// direct member, 2026-12-02).
var retriableErrors = []string{"COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR", "REBALANCE_IN_PROGRESS", "UNKNOWN_MEMBER_ID",
	"ILLEGAL_GENERATION", "REQUEST_TIMED_OUT", "context deadline exceeded", "COORDINATOR_LOAD_IN_PROGRESS",
	"i/o timeout", "broker connection has died"}

// checkRetriableOnly fails the test for every error a member got that
// is not in retriableErrors.
func checkRetriableOnly(t testing.TB, members []*faultMember) {
	t.Helper()
	for _, m := range members {
		m.mu.Lock()
		for e, n := range m.errs {
			ok := false
			for _, r := range retriableErrors {
				ok = ok || strings.Contains(e, r)
			}
			if !ok {
				t.Errorf("%s: %d commits failed with %q, which a client does not retry", m.name, n, e)
			}
		}
		m.mu.Unlock()
	}
}

// errText names an error by its Kafka error when it has one.
func errText(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Message
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "context deadline exceeded"
	}
	return err.Error()
}

// stall is the longest time between successful commits within [from, to]
// (the window's ends count as commits).
func (m *faultMember) stall(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	last, worst := from, time.Duration(0)
	for _, c := range m.commits {
		if c.Before(from) || c.After(to) {
			continue
		}
		worst = max(worst, c.Sub(last))
		last = c
	}
	return max(worst, to.Sub(last))
}

// firstCommitAfter is the first successful commit at or after at; ok
// false if none.
func (m *faultMember) firstCommitAfter(at time.Time) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.commits {
		if !c.Before(at) {
			return c, true
		}
	}
	return time.Time{}, false
}

// probe is one timed OffsetFetch sent straight to the coordinator a
// FindCoordinator named, with no client retry in between.
type probe struct {
	at   time.Time
	took time.Duration
	code int16 // -1: no answer (the request failed or timed out)
}

// probeCoordinator sends OffsetFetch for group to its coordinator as
// named through seeds, one after the other, until ctx ends.
func probeCoordinator(ctx context.Context, t testing.TB, seeds []string, dial func(context.Context, string, string) (net.Conn, error), group string) func() []probe {
	t.Helper()
	opts := []kgo.Opt{kgo.SeedBrokers(seeds...), kgo.RequestRetries(0), kgo.RetryTimeout(time.Millisecond)}
	if dial != nil {
		opts = append(opts, kgo.Dialer(dial))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out []probe
	go func() {
		defer cl.Close()
		node := int32(-1)
		for ctx.Err() == nil {
			start := time.Now()
			code := int16(-1)
			rctx, cancel := context.WithTimeout(ctx, 8*time.Second)
			if node < 0 {
				fc := kmsg.NewPtrFindCoordinatorRequest()
				fc.CoordinatorKey, fc.CoordinatorKeys = group, []string{group}
				if resp, err := fc.RequestWith(rctx, cl); err == nil && len(resp.Coordinators) == 1 && resp.Coordinators[0].ErrorCode == 0 {
					node = resp.Coordinators[0].NodeID
				} else if err == nil && len(resp.Coordinators) == 0 && resp.ErrorCode == 0 {
					node = resp.NodeID
				}
			}
			if node >= 0 {
				of := kmsg.NewPtrOffsetFetchRequest()
				of.Group = group
				of.Groups = []kmsg.OffsetFetchRequestGroup{{Group: group}}
				if resp, err := cl.Broker(int(node)).Request(rctx, of); err == nil {
					fr := resp.(*kmsg.OffsetFetchResponse)
					code = fr.ErrorCode
					if len(fr.Groups) == 1 {
						code = fr.Groups[0].ErrorCode
					}
				}
			}
			cancel()
			mu.Lock()
			out = append(out, probe{at: start, took: time.Since(start), code: code})
			mu.Unlock()
			if code == 15 || code == 16 { // look the coordinator up again, as a client does
				node = -1
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() []probe {
		mu.Lock()
		defer mu.Unlock()
		return append([]probe(nil), out...)
	}
}

// TestFleetPeerLinkBlackhole blackholes the peer link into the owner of
// a fleet of three in-process kproxies over kfake (two relay-only
// kproxies send every group request over it) for 10s, with one member of
// a group on each kproxy, beside a direct group whose members' own paths
// to the cluster are blackholed the same way (two of three), in the same
// run. It asserts:
//
//   - behind a relaying kproxy, the group request in flight when the
//     link went silent is answered with a retriable error within the
//     relay timeout, and every later one at once (not 5s each);
//   - no member gets an error that is not retriable;
//   - committed offsets never go backwards, every acknowledged commit
//     is kept, and every record is consumed;
//   - after heal every member commits again;
//
// and reports each member's stall and time to recover, kproxy vs direct.
func TestFleetPeerLinkBlackhole(t *testing.T) {
	const topic, partitions = "faults", 6
	cluster, err := kproxy.NewDevCluster(3, partitions, testLogger(), kfake.GroupMinSessionTimeout(time.Second), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	ownerPeer := freeAddr(t)
	link, err := faultnet.Listen(ownerPeer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	owner := startFleetKproxy(t, brokers, kproxy.FleetConfig{PeerListen: ownerPeer, PeerAdvertise: link.Addr()})
	r1 := startFleetKproxy(t, brokers, kproxy.FleetConfig{Relay: true})
	r2 := startFleetKproxy(t, brokers, kproxy.FleetConfig{Relay: true})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const viaGroup, directGroup = "faults-kproxy", "faults-direct"

	// The relays know the owner once a relayed group request is served.
	waitUntil(t, 60*time.Second, "the relays to reach the owner", func() bool {
		for _, k := range []*kproxy.Server{r1, r2} {
			cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addr()))
			if err != nil {
				t.Fatal(err)
			}
			offs, err := kadm.NewClient(cl).FetchOffsets(ctx, viaGroup)
			cl.Close()
			if err != nil || offs.Error() != nil {
				return false
			}
		}
		return true
	})

	// A producer, directly, all along: 200 records a second.
	prod, produced, stopProducing := startSteadyProducer(ctx, t, brokers, topic)

	seen := map[string]map[int32]map[int64]bool{viaGroup: {}, directGroup: {}}
	var seenMu sync.Mutex
	watch := watchOffsets(ctx, t, brokers, topic, viaGroup, directGroup)
	path1, path2 := newFaultPath(t), newFaultPath(t)
	via := []*faultMember{
		startFaultMember(t, ctx, "k-owner", viaGroup, topic, []string{owner.Addr()}, nil, seen[viaGroup], &seenMu),
		startFaultMember(t, ctx, "k-relay1", viaGroup, topic, []string{r1.Addr()}, nil, seen[viaGroup], &seenMu),
		startFaultMember(t, ctx, "k-relay2", viaGroup, topic, []string{r2.Addr()}, nil, seen[viaGroup], &seenMu),
	}
	direct := []*faultMember{
		startFaultMember(t, ctx, "d-healthy", directGroup, topic, brokers, nil, seen[directGroup], &seenMu),
		startFaultMember(t, ctx, "d-cut1", directGroup, topic, brokers, path1.dial, seen[directGroup], &seenMu),
		startFaultMember(t, ctx, "d-cut2", directGroup, topic, brokers, path2.dial, seen[directGroup], &seenMu),
	}
	all := append(append([]*faultMember{}, via...), direct...)
	var waiting string
	defer func() {
		if t.Failed() && waiting != "" {
			t.Logf("last waited for %s", waiting)
			for _, m := range all {
				if _, ok := m.firstCommitAfter(time.Time{}); !ok {
					l := m.log.String()
					t.Logf("%s log tail:\n%s", m.name, l[max(0, len(l)-6000):])
					break
				}
			}
		}
	}()
	waitUntil(t, 60*time.Second, "every member to commit", func() bool {
		for _, m := range all {
			if _, ok := m.firstCommitAfter(time.Time{}); !ok {
				m.mu.Lock()
				waiting = fmt.Sprintf("%s (errors %v, produced %d, owns %d, polled %d)", m.name, m.errs, produced.Load(), m.assigned.Load(), m.polled.Load())
				m.mu.Unlock()
				return false
			}
		}
		return true
	})
	time.Sleep(2 * time.Second) // steady state

	probeKproxy := probeCoordinator(ctx, t, []string{r1.Addr()}, nil, viaGroup)
	directProbePath := newFaultPath(t)
	probeDirectCut := probeCoordinator(ctx, t, brokers, directProbePath.dial, directGroup)
	time.Sleep(time.Second)

	// The fault: the owner's peer link, and the direct members' paths.
	const faultFor = 10 * time.Second
	for _, m := range all {
		m.inFault.Store(true)
	}
	faultAt := time.Now()
	link.Blackhole(faultnet.Both)
	blackhole := func(r *faultnet.Relay) { r.Blackhole(faultnet.Both) }
	path1.apply(blackhole)
	path2.apply(blackhole)
	directProbePath.apply(blackhole)
	time.Sleep(faultFor)
	healAt := time.Now()
	link.Heal()
	path1.apply(nil)
	path2.apply(nil)
	directProbePath.apply(nil)

	recovered := map[string]time.Duration{}
	waitUntil(t, 60*time.Second, "every member to commit after heal", func() bool {
		for _, m := range all {
			at, ok := m.firstCommitAfter(healAt)
			if !ok {
				return false
			}
			recovered[m.name] = at.Sub(healAt)
		}
		return true
	})
	for _, m := range all {
		m.inFault.Store(false)
	}
	settledAt := time.Now()
	time.Sleep(3 * time.Second)
	stopProducing()

	checkConsumedAndKept(t, ctx, prod, topic, map[string][]*faultMember{viaGroup: via, directGroup: direct}, seen, &seenMu)
	watch.check(t)

	// No error a client must not retry, through kproxy or directly.
	checkRetriableOnly(t, all)
	for _, m := range all {
		stall := m.stall(faultAt, settledAt)
		m.mu.Lock()
		t.Logf("%-9s stall %5.1fs  recovered %5.2fs after heal  slowest commit call in the fault %5.2fs  errors %v",
			m.name, stall.Seconds(), recovered[m.name].Seconds(), m.slowest.Seconds(), m.errs)
		m.mu.Unlock()
	}

	// After heal, the members behind the relays commit again within a
	// bound of when the direct members whose own path was cut do. It is
	// not "no later": a direct member's requests only waited and flow on
	// at heal, while a member behind a relay got errors and is in its
	// client's retry backoff (franz-go's default caps at 2.5s), after the
	// relay's reconnection (at most 1.2s after heal). Measured: direct
	// 0.4-0.85s, behind the relays 0.9-2.8s.
	directRecovery := max(recovered["d-cut1"], recovered["d-cut2"])
	for _, n := range []string{"k-relay1", "k-relay2"} {
		if recovered[n] > directRecovery+4*time.Second {
			t.Errorf("%s recovered %v after heal, direct members in %v", n, recovered[n], directRecovery)
		}
	}

	// Group requests behind the relaying kproxy: retriable and fast.
	const relayTimeout = 5 * time.Second
	summarize := func(name string, ps []probe) (slow, fast int, worstAfter time.Duration) {
		var during []probe
		for _, p := range ps {
			if !p.at.Before(faultAt) && p.at.Before(healAt) {
				during = append(during, p)
			}
		}
		codes := map[int16]int{}
		var lat []time.Duration
		for _, p := range during {
			codes[p.code]++
			lat = append(lat, p.took)
			if p.took >= time.Second {
				slow++
			} else {
				fast++
			}
			if p.at.After(faultAt.Add(relayTimeout)) {
				worstAfter = max(worstAfter, p.took)
			}
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		p50 := time.Duration(0)
		if len(lat) > 0 {
			p50 = lat[len(lat)/2]
		}
		t.Logf("%s: %d group requests during the fault, codes %v, %d took ≥1s, p50 %v, first took %v", name, len(during), codes, slow, p50.Round(time.Microsecond), firstTook(during))
		return slow, fast, worstAfter
	}
	slow, fast, worst := summarize("through the relaying kproxy", probeKproxy())
	summarize("direct, path blackholed", probeDirectCut())
	if slow > 1 || fast < 20 || worst > 500*time.Millisecond {
		t.Errorf("through the relaying kproxy: %d slow and %d fast answers, worst %v after the relay timeout; want at most one slow (the request in flight when the link went silent), then answers at once", slow, fast, worst)
	}
	for _, p := range probeKproxy() {
		if !p.at.Before(faultAt) && p.at.Before(healAt) && p.code != 15 && p.code != 16 {
			t.Errorf("through the relaying kproxy during the fault: code %d, want COORDINATOR_NOT_AVAILABLE (or NOT_COORDINATOR)", p.code)
			break
		}
		if !p.at.Before(faultAt) && p.took >= relayTimeout {
			t.Errorf("through the relaying kproxy: a group request took %v, the relay timeout is %v", p.took, relayTimeout)
			break
		}
	}
	cancel()
}

func firstTook(ps []probe) time.Duration {
	if len(ps) == 0 {
		return 0
	}
	return ps[0].took.Round(time.Millisecond)
}

// waitUntil polls cond every 50ms for at most d.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startSteadyProducer produces to topic directly, round robin, one
// record about every 5 ms, until stop returns; produced counts the
// acknowledged records. The client closes when the test ends.
func startSteadyProducer(ctx context.Context, t testing.TB, brokers []string, topic string) (prod *kgo.Client, produced *atomic.Int64, stop func()) {
	t.Helper()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	produced = new(atomic.Int64)
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; pctx.Err() == nil; i++ {
			if err := prod.ProduceSync(pctx, &kgo.Record{Value: []byte(fmt.Sprint(i))}).FirstErr(); err == nil {
				produced.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return prod, produced, func() { cancel(); <-done }
}
