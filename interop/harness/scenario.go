package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// row is one client scenario of the table.
type row struct {
	name     string
	client   []string // argv prefix that runs the client program
	assignor string   // range or cooperative-sticky
	static   bool     // members use group.instance.id; the stopped member comes back with the same id
	txn      bool     // consume-process-produce with transactions (Java only)
	producer []string // argv prefix used to produce; defaults to client
	// fleet: the row runs three members, with the clients in members,
	// against a fleet of kproxies and kills one (fleet.go); kproxy path only.
	fleet   bool
	members [][]string
	// apiVersions: the row is the ApiVersions check (apiversions.go), which
	// compares the direct path with kproxy itself; kproxy path only.
	apiVersions bool
	// brokerKill: the row kills and restarts a broker (brokerkill.go); it
	// needs a cluster of three.
	brokerKill bool
	// fault: the row puts a fault on a fleet owner's path and on a
	// direct member's own path and compares them (faults.go); kproxy
	// path only. faultFor is how long the fault lasts.
	fault    faultKind
	faultFor time.Duration
	// sessionMS overrides the harness's member session timeout when > 0.
	sessionMS int
	// security: the row runs three principals against a SASL_SSL broker
	// with ACLs (security.go); only in a run with -security.
	security bool
	// migration: the row rolls its group from the classic protocol to
	// the consumer protocol and back (migration.go).
	migration bool
	// needs is a broker feature the row's clients require; directly
	// against a release without it the row is expected to fail
	// (versions.go). nil = none.
	needs *feature
	// anchorAdmin: the row checks a group's anchor with Kafka's
	// kafka-consumer-groups (anchors.go); tools is the argv that prints
	// the tool's class path and main class (kafka.sh tools).
	anchorAdmin bool
	tools       []string
	// adoption: the row moves a live group's members behind a fleet of
	// kproxies and back, one at a time (anchors.go).
	adoption bool
	// rollbackAll: an adoption row whose way back is kproxy removed at
	// once: every member stopped, every sidecar stopped, every member
	// started against the brokers (anchors.go).
	rollbackAll bool
	// kind: the row runs share or streams groups (kinds.go): "share"
	// or "streams".
	kind string
	// groupProtocol is a streams row's Kafka Streams group.protocol:
	// "" = streams (KIP-1071, the cluster's), "classic" (kproxy's
	// engine serves it; kinds.go).
	groupProtocol string
	// shareServe: a share row through a kproxy of its own that serves
	// share groups (--share-groups serve), with explicit
	// acknowledgement and a per-delivery ledger (shareserve.go).
	// kindsLib, when set, is the jar directory (from the repository
	// root) the Java Share program runs with instead of its own
	// kafka-clients 4.4.0.
	shareServe bool
	kindsLib   string
	// shareFleet, with shareServe: the share group is served by a fleet
	// of three kproxies, and a consumer and then the group's owner are
	// SIGKILLed while records flow (sharefleet.go).
	shareFleet bool
	// connect: the row runs Kafka Connect in distributed mode, two
	// workers and FileStream connectors, one worker killed (connect.go).
	connect bool
	// brokerGroupTraffic, when set, says why the broker legitimately
	// serves the row's group requests on the kproxy path; it exempts
	// the row from KPROXY_INTEROP_EXPECT_ENGINE's 0/0/0.
	brokerGroupTraffic string
	// verifiable: Kafka's VerifiableProducer and three
	// VerifiableConsumers, one SIGKILLed (tools.go); groupsDiff: Kafka's
	// kafka-consumer-groups through the path, its outputs compared with
	// the direct path's (tools.go). Both use tools.
	verifiable bool
	groupsDiff bool
}

// threeBrokers reports whether the row needs a cluster of three brokers:
// it kills one (brokerKill), or it moves a group's members between
// brokers and kproxies (adoption), which must hold on the cluster shape
// applications run on, with the group's coordinator apart from the
// brokers the members bootstrap from.
func (r row) threeBrokers() bool { return r.brokerKill || r.adoption }

// result is one printed line of the table.
type result struct {
	row        string
	path       string
	pass       bool
	xfail      bool // failed as the broker version makes it expected to; pass is then true
	records    int
	rebalances string
	settle     string
	broker     string // group API requests the broker saw during the row
	elapsed    time.Duration
	reason     string
	notes      []string
}

// scenario is the state of one (row, path) run. mu guards every field below
// it; member reader goroutines write, the scenario goroutine reads.
type scenario struct {
	h         *harness
	r         row
	path      string
	bootstrap string
	topic     string
	outTopic  string
	group     string
	dir       string

	mu           sync.Mutex
	members      []*member
	seen         map[string]int
	consumed     int
	produced     int
	errorsSeen   int
	errorSamples []string
	// foreignCommits counts commits a member reported for partitions it
	// did not own by its own callbacks at that moment; foreignSamples
	// keeps the first few. dropped counts records a member threw away
	// because a rebalance took their partition while it held them.
	foreignCommits int
	foreignSamples []string
	dropped        int
	notes          []string
	lastChange     time.Time
	// epochsRestart is the client timestamp (ms) from which a KIP-848
	// group's epochs come from a new incarnation of the group (its
	// takeover: waitTakeover); 0 if they never restart.
	epochsRestart int64
}

// logPath returns the path of a per-member log file of this scenario.
func (s *scenario) logPath(name string) string { return filepath.Join(s.dir, name) }

// note records a remark printed under the table.
func (s *scenario) note(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notes = append(s.notes, fmt.Sprintf(format, args...))
}

// clientArgs builds the common argument list every client program accepts.
func (s *scenario) clientArgs(mode, name string, extra ...string) []string {
	prefix := s.r.client
	if mode == "produce" && s.r.producer != nil {
		prefix = s.r.producer
	}
	return s.argsFor(prefix, s.bootstrap, mode, name, extra...)
}

// argsFor builds the common argument list for the client program prefix,
// bootstrapped at bootstrap.
func (s *scenario) argsFor(prefix []string, bootstrap, mode, name string, extra ...string) []string {
	if s.r.txn && mode == "consume" {
		mode = "txn"
	}
	session := s.h.sessionMS
	if s.r.sessionMS > 0 {
		session = s.r.sessionMS
	}
	args := append(append([]string(nil), prefix...),
		"--mode", mode, "--bootstrap", bootstrap, "--topic", s.topic, "--group", s.group,
		"--member", name, "--assignor", s.r.assignor,
		"--session-ms", fmt.Sprint(session), "--heartbeat-ms", fmt.Sprint(s.h.heartbeatMS))
	if s.outTopic != "" && mode == "txn" {
		args = append(args, "--out-topic", s.outTopic)
	}
	return append(args, extra...)
}

// waitFor polls cond (called with s.mu held) until it holds or the timeout
// passes. It gives up at once when a member exits on its own (a consumer
// that was not asked to stop, or a producer that failed): the condition
// can no longer hold, and a client that refuses the cluster (the Java
// consumer protocol against a broker without KIP-848) fails in seconds
// rather than after the timeout.
func (s *scenario) waitFor(timeout time.Duration, what string, cond func() bool) (time.Duration, error) {
	start := time.Now()
	for {
		s.mu.Lock()
		ok := cond()
		crashed := s.crashedLocked()
		s.mu.Unlock()
		if ok {
			return time.Since(start), nil
		}
		if crashed != nil {
			return time.Since(start), fmt.Errorf("gave up waiting for %s: %w", what, crashed)
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// crashedLocked returns an error naming the first member that exited on
// its own, with its last error event and the tail of its stderr. Callers
// hold s.mu.
func (s *scenario) crashedLocked() error {
	for _, m := range s.members {
		if !m.exited || m.stopping {
			continue
		}
		if strings.HasPrefix(m.name, "producer") && m.exitErr == nil {
			continue // a producer that finished its records
		}
		return s.exitedLocked(m)
	}
	return nil
}

// exitedLocked describes a member that exited on its own: its exit status,
// its last error event and the tail of its stderr. Callers hold s.mu.
func (s *scenario) exitedLocked(m *member) error {
	last := ""
	for _, e := range s.errorSamples {
		if strings.HasPrefix(e, m.name+": ") {
			last = e
		}
	}
	return fmt.Errorf("%s exited on its own (%v); last error event: %q; stderr tail: %s",
		m.name, m.exitErr, last, tail(s.logPath(m.name+".stderr"), 300))
}

// stableLocked reports whether the live members hold every partition exactly
// once and each holds at least one. Callers hold s.mu.
func (s *scenario) stableLocked(want []*member) bool {
	held := map[int32]int{}
	for _, m := range want {
		if !m.live() || len(m.owned) == 0 {
			return false
		}
		for _, p := range m.owned {
			held[p]++
		}
	}
	for _, m := range s.members {
		if m.live() && !contains(want, m) && len(m.owned) > 0 {
			return false
		}
	}
	if len(held) != s.h.partitions {
		return false
	}
	for _, n := range held {
		if n != 1 {
			return false
		}
	}
	return true
}

func contains(ms []*member, m *member) bool {
	for _, x := range ms {
		if x == m {
			return true
		}
	}
	return false
}

// run executes the scenario and returns its table line.
func (s *scenario) run(ctx context.Context) (res result) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	defer func() {
		s.killAll(!res.pass)
		res.elapsed = time.Since(start)
		s.mu.Lock()
		res.notes = append(res.notes, s.notes...)
		if s.errorsSeen > 0 {
			res.notes = append(res.notes, fmt.Sprintf("%d client error events, e.g. %s", s.errorsSeen, strings.Join(s.errorSamples, " | ")))
		}
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
	n := s.h.records
	half := n / 2
	parts := s.h.partitions

	if err := s.h.createTopic(ctx, s.topic, parts); err != nil {
		return fail("%v", err)
	}
	if s.r.txn {
		if err := s.h.createTopic(ctx, s.outTopic, parts); err != nil {
			return fail("%v", err)
		}
	}
	if err := s.runOnce("producer-1", s.clientArgs("produce", "producer-1", "--count", fmt.Sprint(half), "--start", "0"), 90*time.Second); err != nil {
		return fail("produce first half: %v", err)
	}

	instance := func(slot string) []string {
		if !s.r.static {
			return nil
		}
		return []string{"--instance-id", s.group + "-" + slot}
	}
	var ms []*member
	for i := 1; i <= s.h.membersN; i++ {
		name := fmt.Sprintf("m%d", i)
		m, err := s.startMember(name, s.clientArgs("consume", name, instance(name)...))
		m.identity = s.identity(name)
		if err != nil {
			return fail("%v", err)
		}
		ms = append(ms, m)
	}
	var settles []string
	d, err := s.waitFor(s.h.settleTimeout, "the first assignment of all members", func() bool { return s.stableLocked(ms) })
	if err != nil {
		return fail("initial join: %v; %s", err, s.ownersSummary())
	}
	settles = append(settles, fmtDur(d))
	if _, err := s.waitFor(s.h.consumeTimeout, "the first half to be consumed", func() bool { return s.distinctLocked(0, half) == half }); err != nil {
		return fail("%v (consumed %d distinct)", err, s.distinctLocked(0, half))
	}

	// A member leaves cleanly.
	leaving := ms[0]
	stopAt := time.Now()
	if err := s.stop(leaving, 30*time.Second); err != nil {
		return fail("stopping %s: %v", leaving.name, err)
	}
	rest := ms[1:]
	s.mu.Lock()
	eventsBefore := 0
	for _, m := range rest {
		eventsBefore += len(m.events)
	}
	s.mu.Unlock()
	if s.r.static {
		// A static member's close sends no LeaveGroup: its partitions stay
		// parked until it returns, so there is nothing to settle yet.
		settles = append(settles, "parked")
	} else {
		if _, err := s.waitFor(s.h.settleTimeout, "the group to settle after a member left", func() bool { return s.stableLocked(rest) }); err != nil {
			return fail("after leave: %v; %s", err, s.ownersSummary())
		}
		settles = append(settles, fmtDur(time.Since(stopAt)))
	}

	// A new member joins (for static rows: the same instance id comes back).
	joinName := fmt.Sprintf("m%d", s.h.membersN+1)
	joiner, err := s.startMember(joinName, s.clientArgs("consume", joinName, instance(leaving.name)...))
	if err != nil {
		return fail("%v", err)
	}
	joiner.identity = s.identity(joinName)
	if s.r.static {
		joiner.identity = leaving.identity
	}
	final := append(append([]*member(nil), rest...), joiner)
	d, err = s.waitFor(s.h.settleTimeout, "the group to settle after a member joined", func() bool { return s.stableLocked(final) })
	if err != nil {
		return fail("after join: %v; %s", err, s.ownersSummary())
	}
	settles = append(settles, fmtDur(d))
	res.settle = strings.Join(settles, "/")

	if err := s.runOnce("producer-2", s.clientArgs("produce", "producer-2", "--count", fmt.Sprint(n-half), "--start", fmt.Sprint(half)), 90*time.Second); err != nil {
		return fail("produce second half: %v", err)
	}
	if _, err := s.waitFor(s.h.consumeTimeout, "every record to be consumed", func() bool { return s.distinctLocked(0, n) == n }); err != nil {
		return fail("%v (consumed %d distinct of %d)", err, s.distinctLocked(0, n), n)
	}
	if err := s.h.waitCommitted(ctx, s); err != nil {
		return fail("%v", err)
	}
	if s.r.static {
		s.mu.Lock()
		after := 0
		for _, m := range rest {
			after += len(m.events)
		}
		s.mu.Unlock()
		if after != eventsBefore {
			return fail("static member restart caused a rebalance: the other members saw %d new assignment events", after-eventsBefore)
		}
	}
	var stopErrs []string
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, m := range final {
		wg.Add(1)
		go func(m *member) {
			defer wg.Done()
			if err := s.stop(m, 30*time.Second); err != nil {
				emu.Lock()
				stopErrs = append(stopErrs, err.Error())
				emu.Unlock()
			}
		}(m)
	}
	wg.Wait()
	if len(stopErrs) > 0 {
		return fail("closing members: %s", strings.Join(stopErrs, "; "))
	}

	s.mu.Lock()
	res.records = s.distinctLocked(0, n)
	dups := s.consumed - res.records
	s.mu.Unlock()
	if dups > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d records delivered more than once (allowed: at-least-once)", dups))
	}
	if s.r.txn {
		got, dupOut, err := s.h.readCommittedIDs(ctx, s.outTopic, n)
		if err != nil {
			return fail("reading transactional output: %v", err)
		}
		if got != n {
			return fail("transactional output holds %d of %d ids", got, n)
		}
		if dupOut > 0 {
			res.notes = append(res.notes, fmt.Sprintf("transactional output holds %d duplicate records", dupOut))
		}
	}
	rebalances, err := s.checkOwnership()
	res.rebalances = rebalances
	if err != nil {
		return fail("%v", err)
	}
	res.pass = true
	return res
}

// distinctLocked counts ids id-from..id-(to-1) seen at least once. Callers
// hold s.mu (waitFor does) or own the scenario exclusively.
func (s *scenario) distinctLocked(from, to int) int {
	c := 0
	for i := from; i < to; i++ {
		if s.seen[fmt.Sprintf("id-%d", i)] > 0 {
			c++
		}
	}
	return c
}

// ownersSummary describes who holds what, for failure messages.
func (s *scenario) ownersSummary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	b.WriteString("owners:")
	for _, m := range s.members {
		if strings.HasPrefix(m.name, "producer") {
			continue
		}
		fmt.Fprintf(&b, " %s(live=%v)=%v", m.name, m.live(), m.owned)
	}
	return b.String()
}

// checkOwnership verifies from the members' own logs that no partition was
// held by two members in one generation (when the client reports
// generations) nor by two members at the same instant (client timestamps),
// and returns the number of rebalances observed.
func (s *scenario) checkOwnership() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	type span struct {
		member     string
		start, end int64
	}
	// Generations are compared within one incarnation of the group: a
	// KIP-848 group taken over is converted by Kafka into a classic group
	// for the anchor and back when a member returns, which restarts its
	// epochs, while kproxy's members go on at the engine's (docs/anchors.md).
	// The same number then names two assignments; the instant check below
	// covers the whole run.
	type genKey struct{ era, gen int64 }
	gens := map[genKey]map[int32]string{}
	spans := map[int32][]span{}
	var problems []string
	maxAssigns := 0
	for _, m := range s.members {
		if strings.HasPrefix(m.name, "producer") {
			continue
		}
		if m.assigns > maxAssigns {
			maxAssigns = m.assigns
		}
		open := map[int32]int64{}
		for _, e := range m.events {
			if e.ownershipChange() && e.Generation != nil && *e.Generation >= 0 {
				g := genKey{gen: *e.Generation}
				if s.epochsRestart > 0 && e.TS >= s.epochsRestart {
					g.era = 1
				}
				if gens[g] == nil {
					gens[g] = map[int32]string{}
				}
				for _, p := range e.Partitions {
					if other, ok := gens[g][p]; ok && other != m.identity {
						problems = append(problems, fmt.Sprintf("partition %d held by %s and %s in generation %d", p, other, m.identity, g.gen))
					}
					gens[g][p] = m.identity
				}
			}
			now := map[int32]bool{}
			for _, p := range e.Partitions {
				now[p] = true
			}
			for p, st := range open {
				if !now[p] {
					spans[p] = append(spans[p], span{m.identity, st, e.TS})
					delete(open, p)
				}
			}
			for p := range now {
				if _, ok := open[p]; !ok {
					open[p] = e.TS
				}
			}
		}
		for p, st := range open {
			spans[p] = append(spans[p], span{m.identity, st, 1 << 62})
		}
	}
	for p, ss := range spans {
		sort.Slice(ss, func(i, j int) bool { return ss[i].start < ss[j].start })
		for i := 1; i < len(ss); i++ {
			if ss[i].start < ss[i-1].end && ss[i].member != ss[i-1].member {
				problems = append(problems, fmt.Sprintf("partition %d held by %s and %s at the same time (ts %d < %d)", p, ss[i-1].member, ss[i].member, ss[i].start, ss[i-1].end))
			}
		}
	}
	rebalances := fmt.Sprint(len(gens))
	if len(gens) == 0 {
		// The client hides its generation: count the assignments the most
		// often assigned member saw instead.
		rebalances = fmt.Sprintf("~%d", maxAssigns)
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		if len(problems) > 5 {
			problems = append(problems[:5], fmt.Sprintf("... %d more", len(problems)-5))
		}
		return rebalances, fmt.Errorf("ownership violated: %s", strings.Join(problems, "; "))
	}
	return rebalances, nil
}

// identity names the member for ownership checks: a static member that comes
// back with the same instance id is the same owner.
func (s *scenario) identity(name string) string { return name }

// fmtDur prints a duration in seconds with one decimal.
func fmtDur(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// createTopic creates a topic directly on the broker.
func (h *harness) createTopic(ctx context.Context, topic string, parts int) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := h.adm.CreateTopic(cctx, int32(parts), 1, nil, topic)
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	if resp.Err != nil {
		return fmt.Errorf("create topic %s: %w", topic, resp.Err)
	}
	// Wait until the broker knows every partition's leader.
	deadline := time.Now().Add(20 * time.Second)
	for {
		offs, err := h.adm.ListEndOffsets(cctx, topic)
		if err == nil && offs.Error() == nil {
			c := 0
			offs.Each(func(kadm.ListedOffset) { c++ })
			if c == parts {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s not ready: %v", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitCommitted waits until the group's committed offsets equal the end
// offsets of every partition, read from the broker directly (and, when
// KPROXY_INTEROP_OFFSETS=path, through the path under test instead).
func (h *harness) waitCommitted(ctx context.Context, s *scenario) error {
	adm := h.adm
	if os.Getenv("KPROXY_INTEROP_OFFSETS") == "path" && s.path == "kproxy" {
		cl, err := kgo.NewClient(kgo.SeedBrokers(s.bootstrap))
		if err != nil {
			return fmt.Errorf("admin client via %s: %w", s.bootstrap, err)
		}
		defer cl.Close()
		adm = kadm.NewClient(cl)
	}
	deadline := time.Now().Add(h.consumeTimeout)
	var last string
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ends, err1 := adm.ListEndOffsets(cctx, s.topic)
		comm, err2 := adm.FetchOffsetsForTopics(cctx, s.group, s.topic)
		cancel()
		if err1 == nil && err2 == nil {
			var diffs []string
			ends.Each(func(lo kadm.ListedOffset) {
				c, ok := comm.Lookup(s.topic, lo.Partition)
				if !ok || c.At != lo.Offset {
					at := int64(-1)
					if ok {
						at = c.At
					}
					diffs = append(diffs, fmt.Sprintf("p%d committed %d end %d", lo.Partition, at, lo.Offset))
				}
			})
			if len(diffs) == 0 {
				return nil
			}
			sort.Strings(diffs)
			last = strings.Join(diffs, ", ")
		} else {
			last = fmt.Sprintf("end offsets: %v, committed: %v", err1, err2)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("committed offsets never reached the end offsets: %s", last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// readCommittedIDs reads a topic from the broker with read_committed and
// returns how many distinct ids of id-0..id-(n-1) it holds and how many
// records repeat an id.
func (h *harness) readCommittedIDs(ctx context.Context, topic string, n int) (int, int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.broker), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, 0, fmt.Errorf("reader: %w", err)
	}
	defer cl.Close()
	seen := map[string]int{}
	dups := 0
	deadline := time.Now().Add(20 * time.Second)
	for len(seen) < n && time.Now().Before(deadline) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			seen[string(r.Value)]++
			if seen[string(r.Value)] > 1 {
				dups++
			}
		})
	}
	got := 0
	for i := 0; i < n; i++ {
		if seen[fmt.Sprintf("id-%d", i)] > 0 {
			got++
		}
	}
	return got, dups, nil
}
