package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/internal/faultnet"
)

const (
	testSession   = 1500 * time.Millisecond
	testHeartbeat = 200 * time.Millisecond
	testRebalance = 3 * time.Second
	testMargin    = 500 * time.Millisecond
	testP         = int32(6)
)

func newCluster(t *testing.T) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// netCut is a dialer whose connections the test can cut, like a network
// partition between one kproxy and the brokers.
// With relays set (slowNet), every connection goes through a fault
// relay per broker, so the test can slow the link too.
type netCut struct {
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
	relays map[string]*faultnet.Relay // nil: dial directly
}

// slowNet is a netCut whose links setDelay can slow.
func slowNet() *netCut { return &netCut{relays: make(map[string]*faultnet.Relay)} }

// setDelay adds d each way on every link of n (slowNet).
func (n *netCut) setDelay(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, r := range n.relays {
		r.Delay(faultnet.Both, d)
	}
}

// setBlackhole holds the bytes of direction d on every link of n
// (slowNet); faultnet.Direction(0) heals.
func (n *netCut) setBlackhole(d faultnet.Direction) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, r := range n.relays {
		if d == 0 {
			r.Heal()
		} else {
			r.Blackhole(d)
		}
	}
}

func (n *netCut) dial(ctx context.Context, network, host string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut {
		return nil, errors.New("test: network cut")
	}
	if n.relays != nil {
		r := n.relays[host]
		if r == nil {
			var err error
			if r, err = faultnet.Listen(host); err != nil {
				return nil, err
			}
			n.relays[host] = r
		}
		host = r.Addr()
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, host)
	if err == nil {
		n.conns = append(n.conns, c)
	}
	return c, err
}

func (n *netCut) setCut(cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = cut
	if cut {
		for _, c := range n.conns {
			c.Close()
		}
		n.conns = nil
	}
}

// event is one callback call, in the global order the log saw them.
type event struct {
	seq    int
	member string
	kind   string // assigned, revoking, revoked, lost
	parts  []int32
}

type eventLog struct {
	mu     sync.Mutex
	events []event
}

func (l *eventLog) add(member, kind string, parts []int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, event{seq: len(l.events), member: member, kind: kind, parts: slices.Clone(parts)})
}

// first returns the first event of kind for p (by member, "" any except
// not), or nil.
func (l *eventLog) find(pred func(event) bool) *event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if pred(e) {
			return &e
		}
	}
	return nil
}

// handover checks that from gave p up (kinds: revoked or lost) before
// anyone else was given p, counting from from's last gain of p.
func (l *eventLog) handover(t *testing.T, from string, p int32, giveUp string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	last := -1
	for _, e := range l.events {
		if e.member == from && e.kind == "assigned" && slices.Contains(e.parts, p) {
			last = e.seq
		}
	}
	if last < 0 {
		t.Errorf("%s was never given %d", from, p)
		return
	}
	gaveUp, taken := -1, -1
	for _, e := range l.events[last+1:] {
		if gaveUp < 0 && e.member == from && e.kind == giveUp && slices.Contains(e.parts, p) {
			gaveUp = e.seq
		}
		if taken < 0 && e.member != from && e.kind == "assigned" && slices.Contains(e.parts, p) {
			taken = e.seq
		}
	}
	if gaveUp < 0 || taken < 0 || gaveUp > taken {
		t.Errorf("partition %d: %s gave it up (%s) at event %d, another member got it at %d; events %+v", p, from, giveUp, gaveUp, taken, l.events)
	}
}

type testMember struct {
	id     string
	m      *Member
	cl     *kgo.Client
	net    *netCut
	skew   atomic.Int64 // added to the member's clock
	slow   atomic.Int64 // how long OnAssigned blocks
	cancel context.CancelFunc
	done   chan struct{}
}

func (tm *testMember) stop(t *testing.T) {
	t.Helper()
	tm.cancel()
	select {
	case <-tm.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Run did not return", tm.id)
	}
}

func testLogger(t *testing.T, id string) *slog.Logger {
	if os.Getenv("FLEET_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("t", t.Name(), "m", id)
}

func startMember(t *testing.T, c *kfake.Cluster, log *eventLog, id string, owner bool) *testMember {
	t.Helper()
	return startMemberOn(t, c, log, id, owner, &netCut{})
}

// startMemberOn is startMember with its connections dialed by nc.
func startMemberOn(t *testing.T, c *kfake.Cluster, log *eventLog, id string, owner bool, nc *netCut) *testMember {
	t.Helper()
	tm := &testMember{id: id, net: nc, done: make(chan struct{})}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.Dialer(tm.net.dial),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }))
	if err != nil {
		t.Fatal(err)
	}
	tm.cl = cl
	tm.m, err = New(Config{
		Client: cl, ID: id, PeerAddr: id + ":9093", Partitions: testP, Owner: owner,
		SessionTimeout: testSession, HeartbeatInterval: testHeartbeat, RebalanceTimeout: testRebalance, LeaseMargin: testMargin,
		Now:    func() time.Time { return time.Now().Add(time.Duration(tm.skew.Load())) },
		Logger: testLogger(t, id),
		OnAssigned: func(ctx context.Context, _ int32, gained []int32) {
			log.add(id, "assigned", gained)
			if d := time.Duration(tm.slow.Load()); d > 0 { // a slow claim
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
				log.add(id, "claimed", gained)
			}
		},
		OnRevoked: func(_ context.Context, revoked []int32) {
			log.add(id, "revoking", revoked)
			time.Sleep(20 * time.Millisecond) // a flush
			log.add(id, "revoked", revoked)
		},
		OnLost: func(lost []int32) { log.add(id, "lost", lost) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tm.cancel = cancel
	go func() {
		defer close(tm.done)
		if err := tm.m.Run(ctx); err != nil {
			t.Errorf("%s: Run: %v", id, err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-tm.done
		cl.Close()
		nc.mu.Lock()
		for _, r := range nc.relays {
			r.Close()
		}
		nc.mu.Unlock()
	})
	return tm
}

// sampler watches every member's Owns for every partition and records
// any instant two members own the same partition. A partition counts as
// doubly owned only if two members were seen owning it in two successive
// passes: a member seen true in both passes owned it over the whole
// interval between its two reads, so two such intervals overlap. (A
// single pass could pair an old owner read just before its give-up with
// a new owner read just after its gain.)
type sampler struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	ms      []*testMember
	bad     []string
	samples atomic.Int64
}

func startSampler(t *testing.T, ms ...*testMember) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{}), ms: slices.Clone(ms)}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			s.mu.Lock()
			ms := slices.Clone(s.ms)
			s.mu.Unlock()
			for p := range testP {
				first := make([]bool, len(ms))
				for i, x := range ms {
					first[i] = x.m.Owns(p)
				}
				var both []string
				for i, x := range ms {
					if x.m.Owns(p) && first[i] {
						both = append(both, x.id)
					}
				}
				if len(both) > 1 {
					s.mu.Lock()
					s.bad = append(s.bad, fmt.Sprintf("partition %d owned by %v", p, both))
					s.mu.Unlock()
				}
			}
			s.samples.Add(1)
			time.Sleep(100 * time.Microsecond)
		}
	}()
	t.Cleanup(func() { s.finish(t) })
	return s
}

func (s *sampler) add(tm *testMember) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ms = append(s.ms, tm)
}

// finish stops the sampler and fails the test on any double ownership.
func (s *sampler) finish(t *testing.T) {
	t.Helper()
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.bad) > 0 {
		t.Fatalf("double ownership seen %d times, first: %s", len(s.bad), s.bad[0])
	}
	if s.samples.Load() < 10 {
		t.Fatalf("sampler took only %d samples", s.samples.Load())
	}
}

// converged reports nil when the members agree: the same generation and
// table, nobody rejoining, every partition owned (Owns) by exactly the
// member the table names, and the owners' counts balanced.
func converged(ms []*testMember) error {
	s0 := ms[0].m.Snapshot()
	counts := map[string]int{}
	owners := 0
	for _, x := range ms {
		s := x.m.Snapshot()
		if s.Joining || s.MemberID == "" {
			return fmt.Errorf("%s is joining", x.id)
		}
		if s.Generation != s0.Generation || !slices.Equal(s.Table, s0.Table) {
			return fmt.Errorf("%s at generation %d with table %v, %s at %d with %v", x.id, s.Generation, s.Table, ms[0].id, s0.Generation, s0.Table)
		}
		if s.Owner {
			counts[x.id] = 0
			owners++
		}
	}
	for p := range testP {
		o := s0.Table[p]
		if o.IsZero() {
			return fmt.Errorf("partition %d has no owner", p)
		}
		var by []string
		for _, x := range ms {
			if x.m.Owns(p) {
				by = append(by, x.id)
			}
		}
		if len(by) != 1 || by[0] != o.ID {
			return fmt.Errorf("partition %d: table says %s, owned by %v", p, o.ID, by)
		}
		counts[o.ID]++
	}
	lo, hi := int(testP), 0
	for _, c := range counts {
		lo, hi = min(lo, c), max(hi, c)
	}
	if hi-lo > 1 {
		return fmt.Errorf("unbalanced: %v", counts)
	}
	return nil
}

func waitConverged(t *testing.T, within time.Duration, ms ...*testMember) {
	t.Helper()
	waitFor(t, within, func() error { return converged(ms) })
}

func waitFor(t *testing.T, within time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not reached within %v: %v", within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ownedBy(tm *testMember) []int32 {
	var out []int32
	for p := range testP {
		if tm.m.Owns(p) {
			out = append(out, p)
		}
	}
	return out
}

// startFleet starts n owners named a, b, c, … and waits for them to
// converge.
func startFleet(t *testing.T, c *kfake.Cluster, log *eventLog, n int) []*testMember {
	t.Helper()
	var ms []*testMember
	for i := range n {
		ms = append(ms, startMember(t, c, log, string(rune('a'+i)), true))
	}
	waitConverged(t, 10*time.Second, ms...)
	return ms
}

func TestFleetThreeMembersBalanced(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	ms := startFleet(t, c, log, 3)
	s := startSampler(t, ms...)

	leaders := 0
	for _, x := range ms {
		st := x.m.Snapshot()
		if n := len(ownedBy(x)); n != 2 {
			t.Errorf("%s owns %d partitions, want 2", x.id, n)
		}
		if st.Leader {
			leaders++
		}
		if !st.LeaseValid || st.LeaseRemaining <= 0 || st.LeaseRemaining > testSession-testMargin {
			t.Errorf("%s: lease valid %v remaining %v", x.id, st.LeaseValid, st.LeaseRemaining)
		}
		for p, o := range st.Table {
			if o.ID == x.id && (o.Peer != x.id+":9093" || o.MemberID != st.MemberID) {
				t.Errorf("%s: table entry %d = %+v", x.id, p, o)
			}
		}
	}
	if leaders != 1 {
		t.Errorf("%d leaders", leaders)
	}
	// Steady state stays put over several heartbeats.
	gen := ms[0].m.Snapshot().Generation
	time.Sleep(5 * testHeartbeat)
	if err := converged(ms); err != nil {
		t.Fatal(err)
	}
	if g := ms[0].m.Snapshot().Generation; g != gen {
		t.Fatalf("generation moved from %d to %d in steady state", gen, g)
	}
	s.finish(t)
}

func TestFleetFourthMemberMovesFewWithoutOverlap(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	ms := startFleet(t, c, log, 3)
	before := ms[0].m.Table()
	s := startSampler(t, ms...)

	d := startMember(t, c, log, "d", true)
	s.add(d)
	ms = append(ms, d)
	waitConverged(t, 10*time.Second, ms...)
	s.finish(t)

	after := ms[0].m.Table()
	var moved []int32
	for p := range testP {
		if before[p].ID != after[p].ID {
			moved = append(moved, p)
			if after[p].ID != "d" {
				t.Errorf("partition %d moved from %s to %s, not to the newcomer", p, before[p].ID, after[p].ID)
			}
			// Two-phase: the old owner gave it up before d got it.
			log.handover(t, before[p].ID, p, "revoked")
		}
	}
	// P=6 over 4 members is 2,2,1,1: the newcomer takes one partition.
	if len(moved) != 1 || len(ownedBy(d)) != 1 {
		t.Fatalf("moved %v, d owns %v; want one partition moved to d", moved, ownedBy(d))
	}
	if ev := log.find(func(e event) bool { return e.kind == "lost" }); ev != nil {
		t.Fatalf("unexpected loss %+v", ev)
	}
}

func TestFleetLeaveRevokesBeforeReassign(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	ms := startFleet(t, c, log, 3)
	s := startSampler(t, ms...)
	b := ms[1]
	had := ownedBy(b)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.m.Leave(ctx); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after Leave")
	}
	if got := ownedBy(b); len(got) != 0 || b.m.LeaseValid() {
		t.Fatalf("after Leave b owns %v, lease %v", got, b.m.LeaseValid())
	}
	rest := []*testMember{ms[0], ms[2]}
	waitConverged(t, 10*time.Second, rest...)
	s.finish(t)
	for _, p := range had {
		log.handover(t, "b", p, "revoked")
	}
	if ev := log.find(func(e event) bool { return e.kind == "lost" }); ev != nil {
		t.Fatalf("Leave lost partitions instead of revoking: %+v", ev)
	}
}

func TestFleetRelayOwnsNothingButHasTable(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	ms := startFleet(t, c, log, 3)
	r := startMember(t, c, log, "relay", false)
	all := append(slices.Clone(ms), r)
	waitConverged(t, 10*time.Second, all...)
	for _, x := range ms {
		if n := len(ownedBy(x)); n != 2 {
			t.Errorf("%s owns %d, want 2", x.id, n)
		}
	}
	if got := ownedBy(r); len(got) != 0 {
		t.Fatalf("relay owns %v", got)
	}
	if st := r.m.Snapshot(); st.Owner || len(st.Owned) != 0 {
		t.Fatalf("relay snapshot %+v", st)
	}
	// The table a relay routes by names the owners and their peers.
	for p, o := range r.m.Table() {
		if o.ID == "relay" || o.Peer != o.ID+":9093" {
			t.Fatalf("relay table entry %d = %+v", p, o)
		}
	}
	if ev := log.find(func(e event) bool { return e.member == "relay" }); ev != nil {
		t.Fatalf("relay got a callback: %+v", ev)
	}
}

// TestFleetLeaseExpiresBeforeSessionOnPartition cuts one member off the
// brokers: its lease must run out, and OnLost fire, before the broker
// expels it and hands its partitions to the others.
func TestFleetLeaseExpiresBeforeSessionOnPartition(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	ms := startFleet(t, c, log, 3)
	s := startSampler(t, ms...)
	a := ms[0]
	had := ownedBy(a)
	idBefore := a.m.Snapshot().MemberID

	cutAt := time.Now()
	a.net.setCut(true)
	waitFor(t, 5*time.Second, func() error {
		if got := ownedBy(a); len(got) > 0 {
			return fmt.Errorf("a still owns %v", got)
		}
		return nil
	})
	lostAfter := time.Since(cutAt)
	if lostAfter > testSession {
		t.Fatalf("a noticed after %v, later than the session", lostAfter)
	}
	waitConverged(t, 10*time.Second, ms[1], ms[2])
	lost := log.find(func(e event) bool { return e.member == "a" && e.kind == "lost" })
	if lost == nil || !slices.Equal(lost.parts, had) {
		t.Fatalf("a's OnLost %+v, want %v", lost, had)
	}
	for _, p := range had {
		log.handover(t, "a", p, "lost")
	}

	// Healed, a rejoins as a new member: it gave its membership up
	// when its lease ran out (abandonLocked).
	a.net.setCut(false)
	waitConverged(t, 10*time.Second, ms...)
	s.finish(t)
	if st := a.m.Snapshot(); st.LeaseExpired == 0 || st.MemberID == idBefore {
		t.Fatalf("a after healing: lease expired %d, member id %q (before the cut %q)", st.LeaseExpired, st.MemberID, idBefore)
	}
}

// fleetWithSlowLink starts a fleet of a, b and x, x's links to the
// brokers going through fault relays (slowNet), converged; ms holds all
// three, x last.
func fleetWithSlowLink(t *testing.T, log *eventLog) (ms []*testMember, x *testMember) {
	t.Helper()
	c := newCluster(t)
	ms = startFleet(t, c, log, 2)
	x = startMemberOn(t, c, log, "x", true, slowNet())
	ms = append(ms, x)
	waitConverged(t, 10*time.Second, ms...)
	return ms, x
}

// TestFleetLeaseLostWhileOnlyAnswersAreLost cuts only the answers on x's
// link: its heartbeats keep reaching the coordinator, which therefore
// never expires it, while x hears nothing and drops its partitions when
// its lease runs out. Once x gave them up the others must be given them
// within about a rebalance, not only after heal: x leaves the
// membership whose lease ran out (abandonLocked) and sends no more of
// its heartbeats. Before, nobody owned x's partitions until the link
// healed.
func TestFleetLeaseLostWhileOnlyAnswersAreLost(t *testing.T) {
	log := &eventLog{}
	ms, x := fleetWithSlowLink(t, log)
	s := startSampler(t, ms...)
	had := ownedBy(x)
	idBefore := x.m.Snapshot().MemberID
	if len(had) == 0 {
		t.Fatal("x owns nothing: the test proves nothing")
	}

	x.net.setBlackhole(faultnet.ToClient)
	cutAt := time.Now()
	waitFor(t, 2*testSession, func() error {
		if got := ownedBy(x); len(got) > 0 {
			return fmt.Errorf("x still owns %v", got)
		}
		return nil
	})
	// The others own every partition between them within about a
	// session: x's lease runs out a session minus the margin after its
	// last answer, its leave rebalances the group. (Before, with x's
	// heartbeats arriving, they were given them 7 s in on kfake; on
	// Kafka, which keeps such a member, only after heal.)
	waitFor(t, 2*testSession, func() error {
		owned := map[int32]bool{}
		for _, x := range ms[:2] {
			for _, p := range ownedBy(x) {
				owned[p] = true
			}
		}
		if len(owned) != int(testP) {
			return fmt.Errorf("a and b own %v of %d partitions, %v after the answers to x were cut", slices.Sorted(maps.Keys(owned)), testP, time.Since(cutAt))
		}
		return nil
	})
	t.Logf("a and b own every partition %v after the answers to x were cut", time.Since(cutAt).Round(time.Millisecond))
	for _, p := range had {
		log.handover(t, "x", p, "lost")
	}

	x.net.setBlackhole(0)
	waitConverged(t, 10*time.Second, ms...)
	s.finish(t)
	if st := x.m.Snapshot(); st.LeaseExpired == 0 || st.MemberID == idBefore {
		t.Fatalf("x after healing: lease expired %d, member id %q (before the cut %q)", st.LeaseExpired, st.MemberID, idBefore)
	}
}

// TestFleetLeaseClockJump jumps one member's clock past its lease: Owns
// turns false at that instant, OnLost follows, and the member earns its
// partitions back through a new assignment.
func TestFleetLeaseClockJump(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	ms := startFleet(t, c, log, 3)
	s := startSampler(t, ms...)
	a := ms[0]
	had := ownedBy(a)
	gen := a.m.Snapshot().Generation

	a.skew.Store(int64(testSession))
	if a.m.LeaseValid() {
		t.Fatal("lease still valid after the clock passed it")
	}
	for _, p := range had {
		if a.m.Owns(p) {
			t.Fatalf("a still owns %d after the clock passed the lease", p)
		}
	}
	var lost *event
	waitFor(t, 2*time.Second, func() error {
		if lost = log.find(func(e event) bool { return e.member == "a" && e.kind == "lost" && slices.Equal(e.parts, had) }); lost == nil {
			return errors.New("no OnLost for a")
		}
		return nil
	})
	waitConverged(t, 10*time.Second, ms...)
	s.finish(t)
	// a owns partitions again only through a new assignment after the
	// loss (the coordinator may hand it the same generation's assignment
	// back: a follower rejoining with unchanged metadata into a stable
	// group gets the current generation, and nobody else holds its
	// partitions in it).
	// Owns turns true when the generation is installed, just before
	// OnAssigned runs (kproxy serves a partition only once its claim in
	// OnAssigned is done), so the event may trail convergence a little.
	if len(ownedBy(a)) > 0 {
		waitFor(t, 2*time.Second, func() error {
			if log.find(func(e event) bool { return e.member == "a" && e.kind == "assigned" && e.seq > lost.seq }) == nil {
				return errors.New("a owns partitions again without an assignment after its loss")
			}
			return nil
		})
	}
	if st := a.m.Snapshot(); st.LeaseExpired != 1 || st.Generation < gen {
		t.Fatalf("a: lease expired %d times, generation %d (was %d)", st.LeaseExpired, st.Generation, gen)
	}
}

func TestFleetKilledMemberExpiresAfterSession(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	ms := startFleet(t, c, log, 3)
	s := startSampler(t, ms...)
	k := ms[2]
	had := ownedBy(k)

	killedAt := time.Now()
	k.stop(t) // no LeaveGroup
	k.cl.Close()
	if got := ownedBy(k); len(got) != 0 {
		t.Fatalf("stopped member owns %v", got)
	}
	lost := log.find(func(e event) bool { return e.member == k.id && e.kind == "lost" })
	if lost == nil || !slices.Equal(lost.parts, had) {
		t.Fatalf("stopped member's OnLost %+v, want %v", lost, had)
	}
	rest := ms[:2]
	waitConverged(t, 10*time.Second, rest...)
	took := time.Since(killedAt)
	s.finish(t)
	// The others can only get them once the broker expelled the member,
	// a session after its last heartbeat.
	if took < testSession-testHeartbeat-100*time.Millisecond {
		t.Fatalf("partitions moved %v after the kill, before the session could expire", took)
	}
	for _, x := range rest {
		if n := len(ownedBy(x)); n != 3 {
			t.Errorf("%s owns %d, want 3", x.id, n)
		}
	}
}

func TestFleetDropReassigns(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	ms := startFleet(t, c, log, 2)
	s := startSampler(t, ms...)
	a := ms[0]
	p := ownedBy(a)[0]
	gen := a.m.Snapshot().Generation
	a.m.Drop(p)
	if a.m.Owns(p) {
		t.Fatal("Owns true right after Drop")
	}
	waitFor(t, 2*time.Second, func() error {
		if log.find(func(e event) bool { return e.member == "a" && e.kind == "lost" && slices.Equal(e.parts, []int32{p}) }) == nil {
			return errors.New("no OnLost for the dropped partition")
		}
		return nil
	})
	waitConverged(t, 10*time.Second, ms...)
	s.finish(t)
	if g := a.m.Snapshot().Generation; g <= gen {
		t.Fatalf("no new generation after Drop: %d", g)
	}
}

// TestFleetHeartbeatsDuringSlowCallback blocks OnAssigned for longer
// than the session: heartbeats go on meanwhile, so the member keeps its
// membership, its lease and what it was given, and the others wait.
func TestFleetHeartbeatsDuringSlowCallback(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	ms := startFleet(t, c, log, 2)
	s := startSampler(t, ms...)
	x := startMember(t, c, log, "x", true)
	x.slow.Store(int64(2 * testSession))
	s.add(x)
	ms = append(ms, x)
	waitFor(t, 10*time.Second, func() error {
		if log.find(func(e event) bool { return e.member == "x" && e.kind == "claimed" }) == nil {
			return errors.New("x has not finished its slow claim")
		}
		return nil
	})
	waitConverged(t, 10*time.Second, ms...)
	s.finish(t)
	st := x.m.Snapshot()
	if st.Fenced != 0 || st.LeaseExpired != 0 || st.Lost != 0 {
		t.Fatalf("x during a slow callback: fenced %d, lease expired %d, lost %d", st.Fenced, st.LeaseExpired, st.Lost)
	}
}

// TestLeaseBounds checks the lease arithmetic on an injected clock: the
// session bound moves with every proof, the rebalance bound only with
// proofs that the group was not rebalancing.
func TestLeaseBounds(t *testing.T) {
	c := newCluster(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var now atomic.Int64
	start := time.Now()
	m, err := New(Config{Client: cl, ID: "a", Partitions: 2, Owner: true,
		SessionTimeout: 10 * time.Second, RebalanceTimeout: 15 * time.Second, LeaseMargin: 2 * time.Second,
		Now: func() time.Time { return start.Add(time.Duration(now.Load())) }})
	if err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) { now.Store(int64(d)) }
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.deadlineLocked() != math.MinInt64 || m.LeaseValid() {
		t.Fatal("lease valid before any proof")
	}
	m.proveLocked(0, true) // a successful JoinGroup sent at 0
	m.owned[0] = 1
	m.publishLocked()
	if got := m.deadlineLocked(); got != 8*time.Second {
		t.Fatalf("deadline %v, want session 10s - margin 2s", got)
	}
	// REBALANCE_IN_PROGRESS answers extend the session bound only: the
	// rebalance began after 0 and may complete without us at 15s.
	for _, sent := range []time.Duration{4 * time.Second, 8 * time.Second, 12 * time.Second} {
		at(sent)
		m.proveLocked(sent, false)
	}
	if got := m.deadlineLocked(); got != 13*time.Second {
		t.Fatalf("deadline %v, want rebalance bound 15s - 2s", got)
	}
	at(12*time.Second + 999*time.Millisecond)
	if !m.Owns(0) || m.Owns(1) {
		t.Fatal("Owns wrong before the deadline")
	}
	at(13 * time.Second)
	if m.Owns(0) || m.LeaseValid() {
		t.Fatal("Owns true at the deadline")
	}
	// A late proof must not revive the lease for what was owned: it
	// loses the partitions first.
	m.proveLocked(13*time.Second, true)
	if m.Owns(0) || len(m.owned) != 0 || !slices.Equal(m.pend.lost, []int32{0}) {
		t.Fatalf("after a late proof: owns %v, owned %v, pending lost %v", m.Owns(0), m.owned, m.pend.lost)
	}
	if !m.LeaseValid() {
		t.Fatal("the lease itself is valid again after a fresh proof")
	}
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config{Partitions: 0, HeartbeatInterval: time.Hour})
	if err == nil {
		t.Fatal("accepted an empty config")
	}
	for _, want := range []string{"Client", "ID", "Partitions", "HeartbeatInterval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// TestFleetFreshJoinReadsTheTable: a member joining afresh routes by the
// cluster's table while its JoinGroup waits for the others to rejoin,
// without waiting for the join: here the only other member is cut off, so
// the join waits for its session to end, and meanwhile the newcomer's
// table names it as the owner of every partition (its own entries stay
// empty: it serves nothing until its join completes).
func TestFleetFreshJoinReadsTheTable(t *testing.T) {
	c := newCluster(t)
	log := &eventLog{}
	b := startMember(t, c, log, "b", true)
	waitConverged(t, 10*time.Second, b)
	b.net.setCut(true)
	a := startMember(t, c, log, "a", true)
	start := time.Now()
	waitFor(t, testSession, func() error {
		for p, o := range a.m.Table() {
			if o.ID != "b" || o.Peer != "b:9093" {
				return fmt.Errorf("partition %d: %+v", p, o)
			}
		}
		return nil
	})
	if took := time.Since(start); took > testSession/2 {
		t.Fatalf("the table came %v after the start, past half of b's session: read by the join, not before it", took)
	}
	if got := ownedBy(a); len(got) != 0 {
		t.Fatalf("a owns %v before its join completed", got)
	}
	b.net.setCut(false)
}

// TestFleetSlowLinkKeepsTheLease: a member whose link to the brokers
// takes 600 ms per round trip (0.4 of the session, as 2 s round trips
// are of a 6 s session) keeps its lease and what it owns, as a direct
// client keeps its session on such a link. Heartbeats waiting for each
// other timed out at a third of the session and ran the lease out.
func TestFleetSlowLinkKeepsTheLease(t *testing.T) {
	log := &eventLog{}
	ms, x := fleetWithSlowLink(t, log)
	s := startSampler(t, ms...)
	had := ownedBy(x)
	x.net.setDelay(300 * time.Millisecond)
	time.Sleep(4 * testSession)
	x.net.setDelay(0)
	s.finish(t)
	if st := x.m.Snapshot(); st.Fenced != 0 || st.LeaseExpired != 0 || st.Lost != 0 {
		t.Fatalf("x on a slow link: fenced %d, lease expired %d, lost %d", st.Fenced, st.LeaseExpired, st.Lost)
	}
	if got := ownedBy(x); !slices.Equal(got, had) {
		t.Fatalf("x owns %v after the slow link, had %v", got, had)
	}
}

// TestFleetHealedMemberRoutesBeforeItsJoin cuts x off from the brokers
// (every byte held, as a partition does) until its lease ran out and the
// others own everything, then heals. x must know the owners of the
// partitions it lost before its fresh join completes: its relays route
// those groups from the heal on, not from the fleet's rebalance, which
// waits for the others' next heartbeat. Before, a JoinGroup held by the
// cut reached the coordinator at the heal and the rebalance it started
// made the table unreadable until then.
func TestFleetHealedMemberRoutesBeforeItsJoin(t *testing.T) {
	log := &eventLog{}
	ms, x := fleetWithSlowLink(t, log)
	had := ownedBy(x)
	if len(had) == 0 {
		t.Fatal("x owns nothing: the test proves nothing")
	}

	x.net.setBlackhole(faultnet.Both)
	var lost time.Time // when x's lease ran out and its fresh join began
	for lost.IsZero() {
		if len(ownedBy(x)) == 0 {
			lost = time.Now()
		}
		time.Sleep(time.Millisecond)
	}
	waitFor(t, 4*testSession, func() error {
		n := 0
		for _, o := range ms[:2] {
			n += len(ownedBy(o))
		}
		if n != int(testP) {
			return fmt.Errorf("a and b own %d of %d partitions", n, testP)
		}
		return nil
	})
	// The heal comes while x's second attempt to read the table is in
	// flight (the first timed out); before, that was while its JoinGroup
	// was, sent after the one read that timed out.
	time.Sleep(time.Until(lost.Add(3 * learnTableTimeout / 2)))
	genBefore := x.m.Snapshot().Generation

	x.net.setBlackhole(0)
	healed := time.Now()
	for {
		st := x.m.Snapshot()
		if st.Generation != genBefore {
			t.Fatalf("x's join completed (generation %d, %d before the heal) %v after the heal, before it knew the owners of %v: %+v",
				st.Generation, genBefore, time.Since(healed).Round(time.Millisecond), had, st.Table)
		}
		known := true
		for _, p := range had {
			if o := st.Table[p]; o.ID != "a" && o.ID != "b" {
				known = false
			}
		}
		if known {
			t.Logf("x routes its lost partitions %v after the heal, before its join", time.Since(healed).Round(time.Millisecond))
			break
		}
		if time.Since(healed) > 4*testSession {
			t.Fatalf("x does not know the owners of %v %v after the heal: %+v", had, time.Since(healed), st.Table)
		}
		time.Sleep(time.Millisecond)
	}
	waitConverged(t, 10*time.Second, ms...)
}
