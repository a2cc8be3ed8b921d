package main

// Share groups served by kproxy itself (issue 32): `kproxy serve --groups
// local --share-groups serve` in front of a cluster without share groups
// (Kafka 4.1.1, where they are an unreleased preview switched off, and
// 3.6.2, which predates KIP-932). Each row runs two unmodified share
// consumers of one group, explicit acknowledgement (the Java Share
// program's and goclient's --ack explicit: reject values ending in 7,
// release those ending in 3 on their first delivery, accept the rest):
//
//   - directly against the broker, where the consumers are expected to
//     fail (the row needs share groups: XFAIL, versions.go); the note
//     says how many records they read and what the client reported;
//   - through a kproxy of its own serving share groups, where every
//     record must end accepted or rejected, per the ledger below.
//
// share.auto.offset.reset=earliest is set as a GROUP config on the
// broker when it takes one (Kafka 4.0+), else through kproxy on the
// kproxy path (it keeps GROUP configs for a cluster without them), and
// the records are then produced before the consumers start. Directly
// against a broker without GROUP configs (3.6.2) the group starts at the
// log end (Kafka's default, latest): the harness produces one probe
// record per partition each second until a consumer has read a probe of
// every partition (every share-partition's start offset is then set),
// and only then the records. Probes are acknowledged like the others and
// left out of the ledger.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	shareServePort     = 130 // offset of the row's kproxy port from the tier's kproxy port
	shareDeliveryLimit = 5   // Kafka's share.delivery.count.limit default, which kproxy applies
)

// shareServeArgs are the flags of the row's kproxy.
var shareServeArgs = []string{"--groups", "local", "--share-groups", "serve", "--group-initial-rebalance-delay=0"}

// shareArgs is args for a share row's kproxies, with a config file that
// gives the share groups kproxy serves the share sessions kafka.sh gives
// a 4.x broker (10 s, heartbeats every 2 s) when the broker is older than
// 4.0: it names no group.share.* settings, so kproxy would otherwise use
// Kafka's 45 s, and a SIGKILLed consumer's records would wait for it.
// A 4.x broker's own settings reach kproxy from the cluster
// (docs/group-settings.md), which those rows check.
func (s *scenario) shareArgs(args []string) ([]string, error) {
	if s.h.kafkaVersion == "" || !versionLess(s.h.kafkaVersion, "4.0.0") {
		return args, nil
	}
	path := s.logPath("kproxy-share.yaml")
	cfg := "groups:\n  share:\n    session_timeout: 10s\n    heartbeat_interval: 2s\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("share settings file: %w", err)
	}
	return append(append([]string(nil), args...), "--config", path), nil
}

// shareEvent is one REC or ACK line of an explicit-ack share consumer.
type shareEvent struct {
	member     string
	ack        bool   // an ACK line (else a delivery)
	ms         int64  // wall clock: poll's return (REC), acknowledgement answered (ACK)
	partition  int32  //
	offset     int64  //
	deliveries int    // REC: the record's delivery count
	status     string // ACK: ACCEPT, RELEASE or REJECT
	value      string
}

// parseShareEvents reads the REC and ACK lines of an explicit-ack share
// consumer (Share.java, goclient franzShare).
func parseShareEvents(member string, lines []string) []shareEvent {
	var out []shareEvent
	for _, l := range lines {
		f := strings.Fields(l)
		switch {
		case len(f) == 6 && f[0] == "REC":
			p, _ := strconv.Atoi(f[1])
			o, _ := strconv.ParseInt(f[2], 10, 64)
			d, _ := strconv.Atoi(f[3])
			ms, _ := strconv.ParseInt(f[5], 10, 64)
			out = append(out, shareEvent{member: member, ms: ms, partition: int32(p), offset: o, deliveries: d, value: f[4]})
		case len(f) == 6 && f[0] == "ACK":
			ms, _ := strconv.ParseInt(f[1], 10, 64)
			p, _ := strconv.Atoi(f[2])
			o, _ := strconv.ParseInt(f[3], 10, 64)
			// Java prints AcknowledgeType in lower case.
			out = append(out, shareEvent{member: member, ack: true, ms: ms, partition: int32(p), offset: o, status: strings.ToUpper(f[4]), value: f[5]})
		}
	}
	return out
}

// shareWant is the final acknowledgement the consumers give value v.
func shareWant(v string) string {
	if strings.HasSuffix(v, "7") {
		return "REJECT"
	}
	return "ACCEPT"
}

// shareLedgerReport is what checkShareLedger found.
type shareLedgerReport struct {
	final, accepted, rejected int // records of values with a final ack answered OK
	deliveries                int // deliveries of values (probes left out)
	released, redelivered     int // values released on their first delivery; of them, delivered again with count 2
	perMember                 map[string]int
	violations                []string
}

// checkShareLedger checks every delivery and acknowledgement of values
// in evs: each record ends accepted or rejected as the consumers' rule
// says, none is delivered after its accept or reject was answered OK,
// delivery counts run 1, 2, ... in time order and never exceed the
// limit, and a record released on its first delivery comes back with
// count 2.
func checkShareLedger(values []string, evs []shareEvent) shareLedgerReport {
	rep := shareLedgerReport{perMember: map[string]int{}}
	byValue := map[string][]shareEvent{}
	for _, e := range evs {
		byValue[e.value] = append(byValue[e.value], e)
	}
	add := func(format string, args ...any) {
		if len(rep.violations) < 20 {
			rep.violations = append(rep.violations, fmt.Sprintf(format, args...))
		}
	}
	for _, v := range values {
		es := byValue[v]
		sort.SliceStable(es, func(i, j int) bool { return es[i].ms < es[j].ms })
		var recs []shareEvent
		var final *shareEvent
		for i := range es {
			e := es[i]
			if !e.ack {
				recs = append(recs, e)
				rep.deliveries++
				rep.perMember[e.member]++
				continue
			}
			if e.status == "RELEASE" {
				continue
			}
			if final != nil {
				add("%s: acknowledged %s by %s after %s by %s", v, e.status, e.member, final.status, final.member)
				continue
			}
			final = &es[i]
		}
		sort.SliceStable(recs, func(i, j int) bool {
			if recs[i].ms != recs[j].ms {
				return recs[i].ms < recs[j].ms
			}
			return recs[i].deliveries < recs[j].deliveries
		})
		for i, r := range recs {
			if r.deliveries != i+1 {
				add("%s: delivery %d in time order has count %d (counts %v)", v, i+1, r.deliveries, shareCounts(recs))
				break
			}
		}
		for _, r := range recs {
			if r.deliveries > shareDeliveryLimit {
				add("%s: delivered with count %d, above the limit %d", v, r.deliveries, shareDeliveryLimit)
			}
			if final != nil && r.ms > final.ms {
				add("%s: delivered to %s (count %d) at %d, after its %s was answered at %d", v, r.member, r.deliveries, r.ms, final.status, final.ms)
			}
		}
		if strings.HasSuffix(v, "3") && len(recs) > 0 {
			rep.released++
			if len(recs) >= 2 && recs[1].deliveries == 2 {
				rep.redelivered++
			}
		}
		switch {
		case final == nil:
			if len(recs) == 0 {
				add("%s: never delivered", v)
			} else {
				add("%s: delivered %d times, never accepted or rejected", v, len(recs))
			}
		case final.status != shareWant(v):
			add("%s: %s, the consumers' rule says %s", v, final.status, shareWant(v))
		default:
			rep.final++
			if final.status == "REJECT" {
				rep.rejected++
			} else {
				rep.accepted++
			}
		}
	}
	if rep.redelivered != rep.released {
		add("%d of %d records released on their first delivery came back with count 2", rep.redelivered, rep.released)
	}
	return rep
}

func shareCounts(recs []shareEvent) []int {
	out := make([]int, len(recs))
	for i, r := range recs {
		out[i] = r.deliveries
	}
	return out
}

// shareEarliest sets group's share.auto.offset.reset=earliest: on the
// broker, or, on the kproxy path of a broker that refuses it (no GROUP
// configs before Kafka 4.0), through the kproxy at via, read back
// through each of readers. refused is the broker's refusal; err a
// failure through kproxy.
func (s *scenario) shareEarliest(ctx context.Context, group, via string, readers []string) (earliest bool, refused, err error) {
	refused = s.h.setGroupConfig(ctx, group, "share.auto.offset.reset", "earliest")
	if refused == nil {
		return true, nil, nil
	}
	if s.path != "kproxy" {
		return false, refused, nil
	}
	if err := s.h.setGroupConfigVia(ctx, via, readers, group, "share.auto.offset.reset", "earliest"); err != nil {
		return false, refused, fmt.Errorf("share.auto.offset.reset=earliest: Kafka %s refuses it as a GROUP config (%v), and so does kproxy: %w", s.h.kafkaVersion, refused, err)
	}
	return true, refused, nil
}

// shareServeArgv is the argv of explicit-ack share member name.
func (s *scenario) shareServeArgv(addr, group, topic, name string) []string {
	if len(s.r.client) > 0 {
		return append(s.shareArgv(addr, group, topic, name, 0), "--ack", "explicit")
	}
	argv := s.h.kindJava("Share")
	if s.r.kindsLib != "" {
		for i, a := range argv {
			if a == "-cp" {
				argv[i+1] = filepath.Join(s.h.root, "interop/kinds/target/classes") + ":" + filepath.Join(s.h.root, s.r.kindsLib, "*")
			}
		}
	}
	return append(argv, "--bootstrap", addr, "--group", group, "--topic", topic,
		"--name", name, "--hold-ms", "0", "--seconds", "120", "--ack", "explicit")
}

// produceToPartitions writes one record per entry of values (partition → value).
func (h *harness) produceToPartitions(ctx context.Context, topic string, values map[int32]string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.broker), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for p, v := range values {
		recs = append(recs, &kgo.Record{Partition: p, Value: []byte(v)})
	}
	if err := cl.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("producing probes to %s: %w", topic, err)
	}
	return nil
}

// runShareServe runs a share-serve row on s.path; prior is the direct
// path's outcome.
func (s *scenario) runShareServe(ctx context.Context, bin string, basePort int, prior *kindOutcome) (res result, out *kindOutcome) {
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"} // runKind adds the notes and time
	fail := func(format string, args ...any) (result, *kindOutcome) {
		res.pass = false
		res.reason = joinReason(res.reason, fmt.Sprintf(format, args...))
		return res, out
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	addr := s.bootstrap
	label := "directly"
	if s.path == "kproxy" {
		b, err := s.h.kproxyBinary(bin)
		if err != nil {
			return fail("%v", err)
		}
		args, err := s.shareArgs(shareServeArgs)
		if err != nil {
			return fail("%v", err)
		}
		kp, err := launchKproxy(ctx, s.h, b, s.logPath("kproxy.log"), basePort+shareServePort, args)
		if err != nil {
			return fail("%v", err)
		}
		defer func() {
			if !kp.alive() {
				res.pass = false
				res.reason = joinReason(res.reason, "the row's kproxy died: "+tail(kp.logPath, 300))
			}
			kp.stop()
		}()
		addr = kp.addr
		label = "through kproxy " + strings.Join(args, " ")
	}
	// Directly against a broker without share groups the consumers are
	// expected to fail and read nothing (the row is then XFAIL).
	lacks := s.path == "direct" && !s.h.brokerHas(shareGroups)
	topic, group := s.topic, s.group
	if err := s.h.createTopic(ctx, topic, kindPartitions); err != nil {
		return fail("%v", err)
	}
	values := make([]string, kindRecords)
	for i := range values {
		values[i] = fmt.Sprintf("s%05d", i)
	}
	half := kindRecords / 2
	earliest, refused, err := s.shareEarliest(ctx, group, addr, []string{addr})
	switch {
	case err != nil:
		return fail("%v", err)
	case refused != nil && earliest:
		s.note("share.auto.offset.reset=earliest as a GROUP config: Kafka %s refuses it (%v); set %s, which keeps GROUP configs for it, and read back there; %d records are produced before the consumers start, %d once both hold partitions", s.h.kafkaVersion, refused, label, half, kindRecords-half)
	case refused != nil:
		s.note("share.auto.offset.reset=earliest as a GROUP config: Kafka %s refuses it (%v); the group starts at the log end, so records are produced once a probe of every partition was read", s.h.kafkaVersion, refused)
	default:
		s.note("share.auto.offset.reset=earliest as a GROUP config: Kafka %s accepts it; %d records are produced before the consumers start, %d once both hold partitions", s.h.kafkaVersion, half, kindRecords-half)
	}
	if earliest {
		if err := s.h.produceValues(ctx, topic, values[:half]); err != nil {
			return fail("%v", err)
		}
	}
	began := time.Now() // the consumers start
	m1, err := s.startKindProc("share-m1", s.shareServeArgv(addr, group, topic, "m1"))
	if err != nil {
		return fail("%v", err)
	}
	defer m1.kill()
	m2, err := s.startKindProc("share-m2", s.shareServeArgv(addr, group, topic, "m2"))
	if err != nil {
		return fail("%v", err)
	}
	defer m2.kill()
	members := []*kindProc{m1, m2}
	if _, err := s.waitFor(60*time.Second, "both share consumers to start", func() bool { return m1.has("STARTED") && m2.has("STARTED") }); err != nil {
		return fail("%v", err)
	}
	events := func() []shareEvent {
		var evs []shareEvent
		for _, m := range members {
			evs = append(evs, parseShareEvents(m.name, m.snapshot())...)
		}
		return evs
	}
	exited := func() string {
		for _, m := range members {
			select {
			case <-m.done:
				return m.name + " exited: " + tail(s.logPath(m.name+".log"), 400)
			default:
			}
		}
		return ""
	}
	firstErrors := func() string {
		var es []string
		for _, m := range members {
			if e := m.firstError(); e != "" {
				es = append(es, m.name+": "+normalizeKindError(e, group))
			}
		}
		return strings.Join(es, "; ")
	}
	read := func() int {
		got := map[string]bool{}
		for _, e := range events() {
			if !e.ack && strings.HasPrefix(e.value, "s") {
				got[e.value] = true
			}
		}
		return len(got)
	}

	if lacks {
		rest := values
		if earliest {
			rest = values[half:]
		}
		if err := s.h.produceValues(ctx, topic, rest); err != nil {
			return fail("%v", err)
		}
		// Both members report an error, or 30 s pass; then 2 s more for
		// any record to arrive after all.
		_, _ = s.waitFor(30*time.Second, "both members' first error", func() bool {
			return m1.firstError() != "" && m2.firstError() != "" || exited() != ""
		})
		time.Sleep(2 * time.Second)
		n := read()
		why := firstErrors()
		if why == "" {
			why = "no error printed; stderr: " + tail(s.logPath("share-m1.log"), 300)
		}
		res.records = n
		out = &kindOutcome{firstError: why, shareRead: n}
		s.note("directly: %d of %d records read in %s; the consumers report %s", n, kindRecords, fmtDur(time.Since(began)), why)
		if n == kindRecords {
			res.pass = true // applyExpectation fails it: the broker was expected to lack share groups
			return res, out
		}
		return fail("%d of %d records read: %s", n, kindRecords, why)
	}

	// Both members in the group with partitions, from ShareGroupDescribe
	// through the path, so that both read records.
	if err := s.waitShareMembers(ctx, addr, group, 2); err != nil {
		return fail("%v (%s)", err, firstErrors())
	}
	joined := time.Since(began)
	// A ShareFetch sent before a member's share shrank still names the
	// partitions it lost and acquires what arrives on them while it
	// waits (Kafka does not check the assignment in ShareFetch either);
	// wait it out (the Java client's fetch.max.wait.ms is 500 ms), so
	// that both members read.
	time.Sleep(time.Second)
	if earliest {
		if err := s.h.produceValues(ctx, topic, values[half:]); err != nil {
			return fail("%v", err)
		}
	} else {
		// Probes until a consumer read one of every partition.
		probed := func() bool {
			seen := map[int32]bool{}
			for _, e := range events() {
				if !e.ack && strings.HasPrefix(e.value, "probe-") {
					seen[e.partition] = true
				}
			}
			return len(seen) == kindPartitions
		}
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; !probed(); i++ {
			if time.Now().After(deadline) {
				return fail("no consumer read a probe of every partition within 30 s (%s)", firstErrors())
			}
			if e := exited(); e != "" {
				return fail("%s", e)
			}
			ps := map[int32]string{}
			for p := range int32(kindPartitions) {
				ps[p] = fmt.Sprintf("probe-%d-%d-x", p, i)
			}
			if err := s.h.produceToPartitions(ctx, topic, ps); err != nil {
				return fail("%v", err)
			}
			_, _ = s.waitFor(time.Second, "a probe of every partition", probed)
		}
		s.note("%s: a probe of every partition read %s after the consumers started; then the %d records produced", label, fmtDur(time.Since(began)), kindRecords)
		if err := s.h.produceValues(ctx, topic, values); err != nil {
			return fail("%v", err)
		}
	}
	finalCount := func() int {
		return checkShareLedger(values, events()).final
	}
	_, err = s.waitFor(60*time.Second, "every record accepted or rejected", func() bool {
		return finalCount() == kindRecords || exited() != ""
	})
	took := time.Since(began)
	gone := exited()
	tools := len(s.r.tools) > 0 && gone == "" && err == nil
	if tools {
		// They leave the group, as applications stopping do, for the
		// tools to find it Empty.
		for _, m := range members {
			if !m.stop(15 * time.Second) {
				s.note("%s did not end within 15 s of SIGTERM: killed", m.name)
			}
		}
	}
	m1.kill()
	m2.kill()
	rep := checkShareLedger(values, events())
	res.records = rep.final
	res.settle = fmt.Sprintf("%s/%s", fmtDur(joined), fmtDur(took))
	s.note("%s: %d of %d records final (%d accepted, %d rejected) %s after the consumers were started (both held their partitions after %s), %d deliveries (m1 %d, m2 %d); %d released on their first delivery, %d of them delivered again with count 2; settle column: both members assigned / every record final, from their start",
		label, rep.final, kindRecords, rep.accepted, rep.rejected, fmtDur(took), fmtDur(joined), rep.deliveries,
		rep.perMember["share-m1"], rep.perMember["share-m2"], rep.released, rep.redelivered)
	if prior != nil {
		s.note("direct: %d of %d, %s: %d of %d (directly the consumers report %s)", prior.shareRead, kindRecords, label, rep.final, kindRecords, prior.firstError)
	}
	if gone != "" {
		return fail("%s", gone)
	}
	if err != nil {
		return fail("%v (%s)", err, firstErrors())
	}
	if len(rep.violations) > 0 {
		return fail("ledger: %s", strings.Join(rep.violations, "; "))
	}
	if e := firstErrors(); e != "" {
		return fail("the consumers reported errors: %s", e)
	}
	if rep.rejected == 0 || rep.released == 0 {
		return fail("%d rejected, %d released: the row did not exercise both", rep.rejected, rep.released)
	}
	if tools {
		if err := s.shareServeTools(ctx, addr, group, topic, label); err != nil {
			return fail("%v", err)
		}
	}
	res.pass = true
	return res, out
}

// waitShareMembers waits until ShareGroupDescribe through addr shows
// group with n members, each told its part of the current assignment
// (at least one partition).
func (s *scenario) waitShareMembers(ctx context.Context, addr, group string, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	var last string
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		req := kmsg.NewPtrShareGroupDescribeRequest()
		req.GroupIDs = []string{group}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := req.RequestWith(cctx, cl)
		cancel()
		switch {
		case err != nil:
			last = err.Error()
		case len(resp.Groups) != 1:
			last = fmt.Sprintf("%d groups described", len(resp.Groups))
		case resp.Groups[0].ErrorCode != 0:
			last = kerr.ErrorForCode(resp.Groups[0].ErrorCode).Error()
		default:
			g := resp.Groups[0]
			// A member's epoch reaches the assignment epoch on the
			// heartbeat that tells it the current assignment (KIP-932),
			// and the first member's share shrinks only then.
			assigned := 0
			for _, m := range g.Members {
				if len(m.Assignment.TopicPartitions) > 0 && m.MemberEpoch == g.AssignmentEpoch {
					assigned++
				}
			}
			if assigned == n && len(g.Members) == n {
				return nil
			}
			last = fmt.Sprintf("%d members, %d with partitions at assignment epoch %d", len(g.Members), assigned, g.AssignmentEpoch)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("ShareGroupDescribe of %s: no %d members with partitions within 45 s: %s", group, n, last)
}
