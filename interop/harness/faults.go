package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The fault rows (issue 20): a fleet of two kproxy processes, A and B, in
// front of the real broker, with a fault relay of the harness's own
// (relay.go) on A's path to the broker (kproxy's hidden
// --upstream-dial-via) and on the peer link into A (A's --peer-advertise
// is the relay). A owns the row's group; one in-process franz-go member
// of it bootstraps at A, one at B. Beside it, in the same run, a direct
// group on the same topic: one member's own path to the broker goes
// through a relay that gets the same fault, the other's is healthy.
//
// Each row switches its fault on both the kproxy side and the direct
// member's path at the same moment and heals both at the same moment,
// and asserts: committed offsets (polled every 100ms) never go
// backwards; every acknowledged commit is at or below the final
// committed offset; no member's commit fails with an error its client
// does not retry; every member commits again after heal, and the member
// cut off behind kproxy does so no later than the direct member cut off
// the same way (faultSlack); in the cut rows the member cut off behind
// kproxy gives its partitions up before they are given to the other
// member (a negative window). In the one-way row (only the broker's
// answers held) the broker still hears the cut-off side and may keep its
// membership alive, so there the partitions must be given away behind
// kproxy whenever they were directly, and the row also prints when the
// broker dropped A from the fleet's group and the direct member from its
// group. It prints, kproxy vs direct: each member's
// longest stall, the window of double ownership (from the members' own
// callbacks: another member assigned a partition of the cut-off member
// until the cut-off member gave it up; negative when it gave up first),
// the time to recover after heal, and commit p50/p99 during the fault.

// faultKind is which fault a row applies.
type faultKind string

const (
	// faultUpstreamCut blackholes A's every connection to the broker.
	faultUpstreamCut faultKind = "upstream-cut"
	// faultPeerCut blackholes the peer link into A (B's relayed
	// requests); the direct member's own path is blackholed.
	faultPeerCut faultKind = "peer-link-cut"
	// faultUpstreamSlow adds faultLatency each way on A's every
	// connection to the broker and on the direct member's own path.
	faultUpstreamSlow faultKind = "upstream-slow"
	// faultUpstreamVerySlow is faultUpstreamSlow with a second each way
	// (2 s per round trip).
	faultUpstreamVerySlow faultKind = "upstream-slow-2s"
	// faultUpstreamStalls stalls the same paths faultStall out of every
	// faultStallEvery (a blackhole without closing, as a lossy link's
	// retransmissions stall a TCP stream).
	faultUpstreamStalls faultKind = "upstream-stalls"
	// faultUpstreamResponsesHeld holds only the broker's bytes to A on
	// A's every connection to the broker, and to the direct member on
	// its own path (a one-way partition): their requests keep reaching
	// the broker, which keeps processing them (heartbeats, commits,
	// transactional writes) while none of its answers arrive.
	faultUpstreamResponsesHeld faultKind = "upstream-responses-held"
)

// slow reports whether k slows the paths rather than cutting them: the
// members keep their partitions, and their commits during the fault are
// compared (commitBound).
func (k faultKind) slow() bool {
	return k == faultUpstreamSlow || k == faultUpstreamVerySlow || k == faultUpstreamStalls
}

// faultStall and faultStallEvery shape faultUpstreamStalls.
const (
	faultStall      = 400 * time.Millisecond
	faultStallEvery = 2 * time.Second
)

// commitBound is how much slower than the direct member's the commits of
// the member behind kproxy may be during a slowing fault, at p50 and at
// p99: a slow upstream must delay a commit by about what it delays a
// direct one, never by a multiple (a commit costing two slowed round
// trips, or queued behind another, is at least 2x).
func commitBound(direct time.Duration) time.Duration {
	return direct*13/10 + 50*time.Millisecond
}

// faultTraffic says why a fault row's broker sees group traffic: the
// direct group it runs beside the kproxy group is the cluster's.
const faultTraffic = "the direct group the row compares with is served by the cluster"

// faultLatency is added each way by the slow row: 200ms per round trip.
const faultLatency = 100 * time.Millisecond

// faultSlack is how much later than the direct member the cut-off member
// behind kproxy may recover: the members' commits are polled by their
// own loops (at most a fetch wait apart) and a kproxy adds one hop per
// request; a retry or a backoff kproxy caused (250ms and up in franz-go)
// would still exceed it.
const faultSlack = 500 * time.Millisecond

// faultHeartbeat is the members' heartbeat interval. After heal the
// cut-off member's rejoin waits for the healthy member's next heartbeat
// (REBALANCE_IN_PROGRESS), twice in a cooperative group: with one-second
// heartbeats that wait alone is 0-2 s, at a random phase on each path,
// and differs between kproxy and direct by more than faultSlack in runs
// where neither path did anything slower (measured on Kafka 4.1.1: 1.5 s
// and 1.5 s one run, 1.6 s and 0.6 s another). A short interval bounds
// that noise so the comparison sees what kproxy adds.
const faultHeartbeat = 200 * time.Millisecond

// fmember is one in-process franz-go member of a fault row. Its fields
// are guarded by mu, except the immutable name and client.
type fmember struct {
	name string
	cl   *kgo.Client

	mu      sync.Mutex
	events  []fevent
	commits []fcommit
	errs    map[string]int
}

type fevent struct {
	at    time.Time
	kind  string // assigned, revoked, lost
	parts []int32
}

type fcommit struct {
	at   time.Time
	took time.Duration
	offs map[int32]int64
}

func (m *fmember) record(kind string, assigned map[string][]int32) {
	var parts []int32
	for _, ps := range assigned {
		parts = append(parts, ps...)
	}
	m.mu.Lock()
	m.events = append(m.events, fevent{time.Now(), kind, parts})
	m.mu.Unlock()
}

// startFaultMember starts a classic member of group on topic through
// seeds (dial, when set, is its own path), committing synchronously
// after every poll until ctx ends.
func startFaultMember(ctx context.Context, name, group, topic string, seeds []string, dial func(context.Context, string, string) (net.Conn, error), session time.Duration, wg *sync.WaitGroup) (*fmember, error) {
	m := &fmember{name: name, errs: map[string]int{}}
	opts := []kgo.Opt{kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.ClientID(name),
		kgo.SessionTimeout(session), kgo.HeartbeatInterval(faultHeartbeat), kgo.DisableAutoCommit(),
		kgo.FetchMaxWait(500 * time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) { m.record("assigned", a) }),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, a map[string][]int32) { m.record("revoked", a) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, a map[string][]int32) { m.record("lost", a) })}
	if dial != nil {
		opts = append(opts, kgo.Dialer(dial))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("member %s: %w", name, err)
	}
	m.cl = cl
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			fs := cl.PollFetches(pctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if fs.NumRecords() == 0 {
				continue
			}
			offs := map[int32]int64{}
			for _, ps := range cl.UncommittedOffsets() {
				for p, o := range ps {
					offs[p] = o.Offset
				}
			}
			start := time.Now()
			err := cl.CommitUncommittedOffsets(ctx)
			m.mu.Lock()
			if err != nil {
				if ctx.Err() == nil {
					m.errs[faultErrText(err)]++
				}
			} else {
				m.commits = append(m.commits, fcommit{time.Now(), time.Since(start), offs})
			}
			m.mu.Unlock()
		}
	}()
	return m, nil
}

// faultErrText names an error by its Kafka error when it has one.
func faultErrText(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Message
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded) {
		return "timeout: " + err.Error()
	}
	return err.Error()
}

// faultRetriable says whether a client retries (or rejoins after) the
// error named text: retriable Kafka errors, the group errors after which
// a member rejoins, and network failures.
func faultRetriable(text string) bool {
	for _, e := range []*kerr.Error{kerr.CoordinatorNotAvailable, kerr.NotCoordinator, kerr.CoordinatorLoadInProgress,
		kerr.RebalanceInProgress, kerr.UnknownMemberID, kerr.IllegalGeneration, kerr.RequestTimedOut} {
		if text == e.Message {
			return true
		}
	}
	for _, s := range []string{"timeout: ", "broker connection has died", "connection reset", "EOF", "broken pipe"} {
		if strings.Contains(text, s) {
			return true
		}
	}
	return false
}

// firstCommitAfter is the member's first successful commit at or after at.
func (m *fmember) firstCommitAfter(at time.Time) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.commits {
		if !c.at.Before(at) {
			return c.at, true
		}
	}
	return time.Time{}, false
}

// stall is the longest time between the member's commits within
// [from, to], the ends counting as commits.
func (m *fmember) stall(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	last, worst := from, time.Duration(0)
	for _, c := range m.commits {
		if c.at.Before(from) || c.at.After(to) {
			continue
		}
		worst = max(worst, c.at.Sub(last))
		last = c.at
	}
	return max(worst, to.Sub(last))
}

// commitLatency is the p50 and p99 of the member's commit latencies
// begun within [from, to], and how many; failed commits are not counted.
func (m *fmember) commitLatency(from, to time.Time) (p50, p99 time.Duration, n int) {
	m.mu.Lock()
	var ds []time.Duration
	for _, c := range m.commits {
		if begun := c.at.Add(-c.took); !begun.Before(from) && begun.Before(to) {
			ds = append(ds, c.took)
		}
	}
	m.mu.Unlock()
	if len(ds) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[min(len(ds)-1, len(ds)*99/100)], len(ds)
}

// ownedAt is what the member owned at t, from its callbacks.
func (m *fmember) ownedAt(t time.Time) map[int32]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	owned := map[int32]bool{}
	for _, e := range m.events {
		if e.at.After(t) {
			break
		}
		for _, p := range e.parts {
			if e.kind == "assigned" {
				owned[p] = true
			} else {
				delete(owned, p)
			}
		}
	}
	return owned
}

// firstEvent is the first event of one of kinds at or after from that
// names p.
func (m *fmember) firstEvent(from time.Time, p int32, kinds ...string) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.events {
		if e.at.Before(from) || !slices.Contains(kinds, e.kind) || !slices.Contains(e.parts, p) {
			continue
		}
		return e.at, true
	}
	return time.Time{}, false
}

// doubleOwnership is the worst window over the partitions cut owned at
// faultAt that other was assigned after faultAt: other's assignment until
// cut gave the partition up (until end if it never did). given counts
// those partitions.
func doubleOwnership(cut, other *fmember, faultAt, end time.Time) (worst time.Duration, given int) {
	first := true
	for p := range cut.ownedAt(faultAt) {
		to, ok := other.firstEvent(faultAt, p, "assigned")
		if !ok {
			continue
		}
		gaveUp, ok := cut.firstEvent(faultAt, p, "lost", "revoked")
		if !ok {
			gaveUp = end
		}
		if w := gaveUp.Sub(to); first || w > worst {
			worst, first = w, false
		}
		given++
	}
	return worst, given
}

// offsetWatch polls groups' committed offsets and records every decrease.
type offsetWatch struct {
	mu   sync.Mutex
	last map[string]map[int32]int64 // guarded by mu
	back []string                   // guarded by mu
}

func (h *harness) watchOffsetsOf(ctx context.Context, wg *sync.WaitGroup, groups ...string) *offsetWatch {
	w := &offsetWatch{last: map[string]map[int32]int64{}}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			for _, g := range groups {
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				offs, err := h.adm.FetchOffsets(cctx, g)
				cancel()
				if err != nil || offs.Error() != nil {
					continue
				}
				w.mu.Lock()
				if w.last[g] == nil {
					w.last[g] = map[int32]int64{}
				}
				offs.Each(func(o kadm.OffsetResponse) {
					if prev, ok := w.last[g][o.Partition]; ok && o.At < prev {
						w.back = append(w.back, fmt.Sprintf("%s p%d %d→%d", g, o.Partition, prev, o.At))
					}
					w.last[g][o.Partition] = o.At
				})
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return w
}

// runFaultRow executes a fault row (kproxy path only: it runs its direct
// counterpart itself). basePort+10 and basePort+20 are A's and B's
// listen ports.
func (s *scenario) runFaultRow(ctx context.Context, bin string, basePort int, kind faultKind, faultFor time.Duration) (res result) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	defer func() {
		res.elapsed = time.Since(start)
		s.mu.Lock()
		res.notes = append(res.notes, s.notes...)
		s.mu.Unlock()
	}()
	fail := func(format string, args ...any) result {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	bin, err := s.h.kproxyBinary(bin)
	if err != nil {
		return fail("%v", err)
	}
	rctx, stopAll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var relays []*faultRelay
	var procs []*kproxyProc
	defer func() {
		stopAll()
		wg.Wait()
		for _, p := range procs {
			p.stop()
		}
		for _, r := range relays {
			r.close()
		}
	}()
	newRelay := func(target string) (*faultRelay, error) {
		r, err := listenRelay(target)
		if err == nil {
			relays = append(relays, r)
		}
		return r, err
	}

	// The broker's advertised addresses: kproxy A and the cut direct
	// member reach each through a relay of their own.
	brokers, err := s.h.adm.ListBrokers(ctx)
	if err != nil {
		return fail("listing brokers: %v", err)
	}
	viaA, viaD := map[string]*faultRelay{}, map[string]*faultRelay{}
	var via []string
	for _, b := range brokers {
		addr := net.JoinHostPort(b.Host, fmt.Sprint(b.Port))
		ra, err := newRelay(addr)
		if err != nil {
			return fail("%v", err)
		}
		rd, err := newRelay(addr)
		if err != nil {
			return fail("%v", err)
		}
		viaA[addr], viaD[addr] = ra, rd
		via = append(via, addr+"="+ra.addr())
	}
	directDial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if r := viaD[addr]; r != nil {
			addr = r.addr()
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}

	fleetName := strings.TrimPrefix(s.group, "interop-")
	portA, portB := basePort+10, basePort+20
	peerA := fmt.Sprintf("127.0.0.1:%d", portA+8)
	peerRelay, err := newRelay(peerA)
	if err != nil {
		return fail("%v", err)
	}
	nodeArgs := func(port int, extra ...string) []string {
		return append(append(append([]string(nil), s.h.kproxyArgs...),
			"--fleet-name", fleetName, "--fleet-session-timeout", fleetSession, "--fleet-heartbeat-interval", fleetHeartbeat,
			"--group-initial-rebalance-delay", "0s", "--admin-listen", fmt.Sprintf("127.0.0.1:%d", port+9), "--log-level", "debug"), extra...)
	}
	a, err := launchKproxy(ctx, s.h, bin, s.logPath("kproxy-a.log"), portA,
		nodeArgs(portA, "--peer-listen", peerA, "--peer-advertise", peerRelay.addr(), "--upstream-dial-via", strings.Join(via, ",")))
	if err != nil {
		return fail("kproxy A: %v", err)
	}
	procs = append(procs, a)
	nodeA := &fleetNode{name: "A", proc: a, admin: fmt.Sprintf("127.0.0.1:%d", portA+9)}
	if _, _, _, err := waitFleet(ctx, []*fleetNode{nodeA}, true, 60*time.Second); err != nil {
		return fail("A alone: %v", err)
	}
	b, err := launchKproxy(ctx, s.h, bin, s.logPath("kproxy-b.log"), portB, nodeArgs(portB))
	if err != nil {
		return fail("kproxy B: %v", err)
	}
	procs = append(procs, b)
	nodeB := &fleetNode{name: "B", proc: b, admin: fmt.Sprintf("127.0.0.1:%d", portB+9)}
	servedBy, parts, _, err := waitFleet(ctx, []*fleetNode{nodeA, nodeB}, true, 60*time.Second)
	if err != nil {
		return fail("A and B: %v", err)
	}
	// A group whose groups-topic partition A owns.
	group := ""
	for i := 0; i < 1000 && group == ""; i++ {
		if g := fmt.Sprintf("%s-k%d", s.group, i); servedBy[groupPartition(g, parts)] == "A" {
			group = g
		}
	}
	if group == "" {
		return fail("no group name maps to a partition A serves (%v)", servedBy)
	}
	direct := s.group + "-direct"
	if err := s.h.createTopic(ctx, s.topic, s.h.partitions); err != nil {
		return fail("%v", err)
	}

	// A steady producer straight to the broker: one record every 5ms.
	prod, err := kgo.NewClient(kgo.SeedBrokers(s.h.broker), kgo.DefaultProduceTopic(s.topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		return fail("producer: %v", err)
	}
	defer prod.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; rctx.Err() == nil; i++ {
			prod.ProduceSync(rctx, &kgo.Record{Value: []byte(fmt.Sprint(i))})
			time.Sleep(5 * time.Millisecond)
		}
	}()
	watch := s.h.watchOffsetsOf(rctx, &wg, group, direct)

	session := time.Duration(s.h.sessionMS) * time.Millisecond
	start1 := func(name, g string, seeds []string, dial func(context.Context, string, string) (net.Conn, error)) (*fmember, error) {
		return startFaultMember(rctx, name, g, s.topic, seeds, dial, session, &wg)
	}
	onA, err := start1("k-on-a", group, []string{a.addr}, nil)
	if err != nil {
		return fail("%v", err)
	}
	onB, err := start1("k-on-b", group, []string{b.addr}, nil)
	if err != nil {
		return fail("%v", err)
	}
	dCut, err := start1("d-cut", direct, []string{s.h.broker}, directDial)
	if err != nil {
		return fail("%v", err)
	}
	dHealthy, err := start1("d-healthy", direct, []string{s.h.broker}, nil)
	if err != nil {
		return fail("%v", err)
	}
	all := []*fmember{onA, onB, dCut, dHealthy}
	defer func() {
		for _, m := range all {
			m.cl.Close()
		}
	}()
	ready := func(at time.Time) bool {
		for _, m := range all {
			if _, ok := m.firstCommitAfter(at); !ok || len(m.ownedAt(time.Now())) == 0 {
				return false
			}
		}
		return true
	}
	if _, err := s.waitFor(90*time.Second, "every member to own a partition and commit", func() bool { return ready(time.Time{}) }); err != nil {
		return fail("%v", err)
	}
	time.Sleep(2 * time.Second)

	// cut is the member behind kproxy that the fault cuts off, other the
	// member of its group that may be given its partitions.
	var cut, other *fmember
	var apply func(on bool)
	switch kind {
	case faultUpstreamCut:
		cut, other = onA, onB
		apply = func(on bool) {
			for _, r := range viaA {
				r.set(on, 0)
			}
			for _, r := range viaD {
				r.set(on, 0)
			}
		}
	case faultPeerCut:
		cut, other = onB, onA
		apply = func(on bool) {
			peerRelay.set(on, 0)
			for _, r := range viaD {
				r.set(on, 0)
			}
		}
	case faultUpstreamSlow, faultUpstreamVerySlow:
		cut, other = onA, onB
		latency := faultLatency
		if kind == faultUpstreamVerySlow {
			latency = time.Second
		}
		apply = func(on bool) {
			d := time.Duration(0)
			if on {
				d = latency
			}
			for _, r := range viaA {
				r.set(false, d)
			}
			for _, r := range viaD {
				r.set(false, d)
			}
		}
	case faultUpstreamStalls:
		cut, other = onA, onB
		set := func(hole bool) {
			for _, r := range viaA {
				r.set(hole, 0)
			}
			for _, r := range viaD {
				r.set(hole, 0)
			}
		}
		var stop chan struct{}
		var stopped chan struct{}
		apply = func(on bool) {
			if !on {
				close(stop)
				<-stopped
				set(false)
				return
			}
			stop, stopped = make(chan struct{}), make(chan struct{})
			go func() {
				defer close(stopped)
				t := time.NewTicker(faultStallEvery)
				defer t.Stop()
				for {
					set(true)
					select {
					case <-stop:
						return
					case <-time.After(faultStall):
					}
					set(false)
					select {
					case <-stop:
						return
					case <-t.C:
					}
				}
			}()
		}
	case faultUpstreamResponsesHeld:
		cut, other = onA, onB
		apply = func(on bool) {
			holes := direction(0)
			if on {
				holes = toClient
			}
			for _, r := range viaA {
				r.setHoles(holes, 0)
			}
			for _, r := range viaD {
				r.setHoles(holes, 0)
			}
		}
	default:
		return fail("unknown fault %q", kind)
	}
	// In the one-way rows the broker keeps hearing the cut-off side, so
	// what it makes of their memberships is part of the comparison: A in
	// the fleet's group, d-cut in the direct group.
	var view *brokerView
	if kind == faultUpstreamResponsesHeld {
		// kproxy's fleet group for --fleet-name N is __kproxy_fleet.N;
		// A's member is the one whose join metadata carries A's
		// advertised peer address, the peer relay's.
		fleetGroup := "__kproxy_fleet." + fleetName
		view = s.h.watchBrokerView(rctx, &wg, brokerMember{"A", fleetGroup, func(m kmsg.DescribeGroupsResponseGroupMember) bool {
			return bytes.Contains(m.ProtocolMetadata, []byte(peerRelay.addr()))
		}}, brokerMember{dCut.name, direct, func(m kmsg.DescribeGroupsResponseGroupMember) bool { return m.ClientID == dCut.name }})
	}
	faultAt := time.Now()
	apply(true)
	s.h.log.Info("fault row: fault on", "row", s.r.name, "for", faultFor)
	time.Sleep(faultFor)
	healAt := time.Now()
	apply(false)
	s.h.log.Info("fault row: healed", "row", s.r.name)
	if _, err := s.waitFor(90*time.Second, "every member to own a partition and commit after heal", func() bool { return ready(healAt) }); err != nil {
		return fail("%v", err)
	}
	time.Sleep(2 * time.Second)
	stopAll()
	wg.Wait()
	for _, m := range all {
		m.cl.Close()
	}

	// Invariants.
	var problems []string
	watch.mu.Lock()
	if len(watch.back) > 0 {
		problems = append(problems, "committed offsets went backwards: "+strings.Join(watch.back, ", "))
	}
	watch.mu.Unlock()
	for _, g := range []struct {
		group   string
		members []*fmember
	}{{group, []*fmember{onA, onB}}, {direct, []*fmember{dCut, dHealthy}}} {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		final, err := s.h.adm.FetchOffsets(cctx, g.group)
		cancel()
		if err == nil {
			err = final.Error()
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("final offsets of %s: %v", g.group, err))
			continue
		}
		for _, m := range g.members {
			m.mu.Lock()
			for _, c := range m.commits {
				for p, o := range c.offs {
					if f, ok := final.Lookup(s.topic, p); !ok || f.At < o {
						problems = append(problems, fmt.Sprintf("%s: acknowledged commit of p%d at %d lost (final %d)", m.name, p, o, f.At))
					}
				}
			}
			for e, n := range m.errs {
				if !faultRetriable(e) {
					problems = append(problems, fmt.Sprintf("%s: %d commits failed with %q, which a client does not retry", m.name, n, e))
				}
			}
			m.mu.Unlock()
		}
	}

	// Figures, kproxy vs direct.
	recovK, _ := cut.firstCommitAfter(healAt)
	recovD, _ := dCut.firstCommitAfter(healAt)
	kRec, dRec := recovK.Sub(healAt), recovD.Sub(healAt)
	end := healAt.Add(max(kRec, dRec))
	line := func(what string, m, o *fmember) string {
		w, given := doubleOwnership(m, o, faultAt, end)
		win := "none given away"
		if given > 0 {
			win = fmt.Sprintf("%+.2fs", w.Seconds())
		}
		p50, p99, n := m.commitLatency(faultAt, healAt)
		return fmt.Sprintf("%s %s: stall %s, double ownership %s, recovered %s after heal, commits during the fault %d (p50 %s, p99 %s); %s stall %s",
			what, m.name, fmtDur(m.stall(faultAt, end)), win, fmtDur(m.firstCommitAfterDur(healAt)), n, p50.Round(time.Millisecond), p99.Round(time.Millisecond),
			o.name, fmtDur(o.stall(faultAt, end)))
	}
	s.note("%s for %s: %s", kind, fmtDur(faultFor), line("kproxy", cut, other))
	s.note("%s for %s: %s", kind, fmtDur(faultFor), line("direct", dCut, dHealthy))
	s.note("after heal (member: callbacks and first commit, seconds after heal): %s", afterHeal(healAt, cut, other, dCut, dHealthy))
	if view != nil {
		s.note("the broker's view during the fault (DescribeGroups every %s): %s", brokerViewEvery, view.summary(faultAt, healAt))
	}
	if kind.slow() {
		k50, k99, kn := cut.commitLatency(faultAt, healAt)
		d50, d99, dn := dCut.commitLatency(faultAt, healAt)
		switch {
		case kn == 0 || dn == 0:
			problems = append(problems, fmt.Sprintf("no commit during the fault: %s %d, %s %d", cut.name, kn, dCut.name, dn))
		case k50 > commitBound(d50) || k99 > commitBound(d99):
			problems = append(problems, fmt.Sprintf("commits behind kproxy during the fault p50/p99 %s/%s, directly %s/%s: more than 1.3x + 50ms",
				k50.Round(time.Millisecond), k99.Round(time.Millisecond), d50.Round(time.Millisecond), d99.Round(time.Millisecond)))
		}
	} else {
		// The cut-off member behind kproxy is told to give its
		// partitions up before the owner gives them away
		// (docs/fleet.md): its window must be negative. Directly it is
		// only reported.
		//
		// With only the broker's answers held, the broker hears the
		// cut-off side's heartbeats and may keep a membership alive
		// while the member hears nothing, so whether the partitions
		// are given away at all is the broker's call: behind kproxy
		// they must be given away whenever they were directly (a
		// member behind a kproxy that hears nothing must not hold on
		// to partitions a direct member in its place would lose).
		_, dGiven := doubleOwnership(dCut, dHealthy, faultAt, end)
		switch w, given := doubleOwnership(cut, other, faultAt, end); {
		case given == 0 && kind == faultUpstreamResponsesHeld && dGiven == 0:
		case given == 0 && kind == faultUpstreamResponsesHeld:
			problems = append(problems, fmt.Sprintf("none of %s's partitions was given to %s during the %s fault, while directly %s's were given to %s",
				cut.name, other.name, fmtDur(faultFor), dCut.name, dHealthy.name))
		case given == 0:
			problems = append(problems, fmt.Sprintf("none of %s's partitions was given to %s during the %s fault", cut.name, other.name, fmtDur(faultFor)))
		case w >= 0:
			problems = append(problems, fmt.Sprintf("%s kept partitions %s after they were given to %s", cut.name, fmtDur(w), other.name))
		}
		// The healthy member behind kproxy waits for the fleet to move
		// the cut-off owner's groups: the brokers expel the owner a
		// fleet session after its last heartbeat that reached them
		// (at once where its leave gets through), the other kproxies
		// learn it at their next fleet heartbeat, and the relay sends
		// the member's held request to the next owner as soon as it
		// serves the group (docs/fleet.md, "Failover, part by part"):
		// detection (fleet session plus heartbeat interval) plus 1 s at
		// most. Before the relay followed its groups this took up to
		// the member's own backoff more (7.5 s at a 6 s session).
		fs, _ := time.ParseDuration(fleetSession)
		hb, _ := time.ParseDuration(fleetHeartbeat)
		if st, bound := other.stall(faultAt, end), fs+hb+time.Second; st > bound {
			problems = append(problems, fmt.Sprintf("%s, on a healthy kproxy, went %s without a commit: more than the fleet's detection (session %s plus heartbeat %s) plus 1s",
				other.name, fmtDur(st), fmtDur(fs), fmtDur(hb)))
		}
	}
	if kRec > dRec+faultSlack {
		problems = append(problems, fmt.Sprintf("the member behind kproxy recovered %s after heal, the direct one %s (slack %s)", fmtDur(kRec), fmtDur(dRec), faultSlack))
	}
	res.settle = fmt.Sprintf("%s/%s", fmtDur(kRec), fmtDur(dRec))
	if len(problems) > 0 {
		sort.Strings(problems)
		return fail("%s", strings.Join(problems, "; "))
	}
	res.pass = true
	return res
}

// afterHeal renders, for each member, its callbacks after heal and its
// first commit, in seconds after heal: where a slow recovery spent its
// time (the rejoin, the healthy member's heartbeat, the fetch).
func afterHeal(heal time.Time, ms ...*fmember) string {
	var parts []string
	for _, m := range ms {
		var b strings.Builder
		b.WriteString(m.name + ":")
		m.mu.Lock()
		for _, e := range m.events {
			if !e.at.Before(heal) {
				fmt.Fprintf(&b, " %s%v@%.2f", e.kind, e.parts, e.at.Sub(heal).Seconds())
			}
		}
		m.mu.Unlock()
		if t, ok := m.firstCommitAfter(heal); ok {
			fmt.Fprintf(&b, " commit@%.2f", t.Sub(heal).Seconds())
		}
		parts = append(parts, b.String())
	}
	return strings.Join(parts, "; ")
}

// firstCommitAfterDur is how long after at the member first committed.
func (m *fmember) firstCommitAfterDur(at time.Time) time.Duration {
	t, ok := m.firstCommitAfter(at)
	if !ok {
		return -1
	}
	return t.Sub(at)
}

// brokerViewEvery is how often watchBrokerView asks the broker.
const brokerViewEvery = 250 * time.Millisecond

// brokerMember names one member of a group on the broker: is tells it
// among the group's members.
type brokerMember struct {
	name  string
	group string
	is    func(kmsg.DescribeGroupsResponseGroupMember) bool
}

// brokerView is what the broker's DescribeGroups said of some members
// over time.
type brokerView struct {
	members []brokerMember // immutable
	mu      sync.Mutex
	samples []brokerSample // guarded by mu
}

// brokerSample is one DescribeGroups answer: for each member of the
// view, whether its group listed it (nil when the group's description
// failed).
type brokerSample struct {
	at      time.Time
	present []*bool
}

// watchBrokerView describes the members' groups every brokerViewEvery
// until ctx ends.
func (h *harness) watchBrokerView(ctx context.Context, wg *sync.WaitGroup, members ...brokerMember) *brokerView {
	v := &brokerView{members: members}
	var groups []string
	for _, m := range members {
		if !slices.Contains(groups, m.group) {
			groups = append(groups, m.group)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			req := kmsg.NewPtrDescribeGroupsRequest()
			req.Groups = groups
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			resp, err := req.RequestWith(cctx, h.cl)
			cancel()
			smp := brokerSample{at: time.Now(), present: make([]*bool, len(members))}
			if err == nil {
				for _, g := range resp.Groups {
					if g.ErrorCode != 0 {
						continue
					}
					for i, m := range members {
						if m.group != g.Group {
							continue
						}
						in := slices.ContainsFunc(g.Members, m.is)
						smp.present[i] = &in
					}
				}
			}
			v.mu.Lock()
			v.samples = append(v.samples, smp)
			v.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(brokerViewEvery):
			}
		}
	}()
	return v
}

// gone is the first moment in [from, to] the broker described member i's
// group without it.
func (v *brokerView) gone(i int, from, to time.Time) (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, smp := range v.samples {
		if smp.at.Before(from) || smp.at.After(to) {
			continue
		}
		if p := smp.present[i]; p != nil && !*p {
			return smp.at, true
		}
	}
	return time.Time{}, false
}

// seen reports whether the broker ever described member i's group with
// it.
func (v *brokerView) seen(i int) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, smp := range v.samples {
		if p := smp.present[i]; p != nil && *p {
			return true
		}
	}
	return false
}

// summary renders, for each member, when in [from, to] the broker first
// described its group without it (seconds after from).
func (v *brokerView) summary(from, to time.Time) string {
	var parts []string
	for i, m := range v.members {
		if !v.seen(i) {
			parts = append(parts, fmt.Sprintf("%s never found in %s", m.name, m.group))
		} else if at, ok := v.gone(i, from, to); ok {
			parts = append(parts, fmt.Sprintf("%s out of %s at +%.1fs", m.name, m.group, at.Sub(from).Seconds()))
		} else {
			parts = append(parts, fmt.Sprintf("%s kept in %s the whole fault", m.name, m.group))
		}
	}
	return strings.Join(parts, "; ")
}
