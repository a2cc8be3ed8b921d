package main

// The share-serve fleet rows (issue 32): a share group served by a fleet
// of three kproxies (`--groups distributed --share-groups serve`, a fleet
// name of the row's own) in front of a cluster without share groups,
// three explicit-ack share consumers (the rule of shareserve.go), each
// bootstrapped at a different kproxy, records produced while they
// consume. A third of the way (a third of the records final) the
// consumer behind the group's owner is SIGKILLed; once two thirds of the
// records were produced, while they still flow, the owner kproxy itself
// is SIGKILLed. The consumer killed first is the one behind the owner: a
// client knows only the addresses of the kproxy it bootstrapped at (its
// metadata names that kproxy's broker ports), so the owner's death
// would also cut off a consumer behind it, a second member lost rather
// than a failover to watch. The survivors take the group over from its
// record in the groups topic (docs/share-groups.md, "In a fleet").
//
// The ledger (checkShareFleetLedger), from every consumer's REC, ACK and
// ERROR ack lines, with the failover rules of e2e/share_fleet_test.go:
//
//   - every record ends accepted or rejected as the rule says, answered
//     OK, or is settled without an answer seen: its accept or reject was
//     answered with an error (ambiguous: the dead owner may have stored
//     it before its answer was lost), or its last delivery was in the
//     killed consumer's last poll, which it may have acknowledged without
//     printing the answer (its earlier polls' answers were all printed:
//     it polls, prints, acknowledges and prints in turn), or it reached
//     the delivery limit (archived). Those count only once the group's
//     start offset of their share-partition passed them; and through
//     kproxy the row ends only when every share-partition's start
//     offset reached its log's end, through a survivor
//     (DescribeShareGroupOffsets): the group's own view that nothing is
//     left to deliver, so none is lost;
//   - no record is delivered again after its accept or reject was
//     answered OK, with a slack of one delivery (the next owner hands
//     out again what the lost one had handed out, possibly to the
//     member whose acknowledgement of the old copy then settles it:
//     acknowledgements name offsets, not deliveries): a delivery polled
//     after the answer with a count above the acknowledged one plus one
//     is a violation;
//   - no record is accepted or rejected OK twice;
//   - a record's delivery counts are distinct and within the limit (5):
//     a delivery the dead owner counted may never reach a consumer, nor
//     one the killed consumer fetched and did not print, so counts may
//     skip.
//
// Directly against a broker without share groups the row runs as
// runShareServe's direct path (two consumers, expected to fail: XFAIL).
// Directly against one that serves them (4.4.0) there is no fleet: the
// consumer is killed, nothing else.

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	// shareFleetPort is the offset of the row's fleet from the tier's
	// kproxy port: the nodes listen on +150, +160, +170 (admin +9).
	shareFleetPort = 140
	// shareFleetSlack: one failover (e2e/share_fleet_test.go).
	shareFleetSlack = 1
	// shareFleetChunk records are produced every shareFleetEvery, so
	// that the records flow for about 20 s.
	shareFleetChunk = 10
	shareFleetEvery = 200 * time.Millisecond
)

// shareFleetArgs are the flags the row's kproxies take after the tier's.
var shareFleetArgs = []string{"--groups", "distributed", "--share-groups", "serve"}

// parseShareAckErrors reads a consumer's "ERROR ack" lines as
// acknowledgement events with status ERROR, one per record whose
// acknowledgement failed: goclient franzShare prints "ERROR ack pP O:
// ...", the Java Share program "ERROR ack TOPIC-P O ..." per record, or
// "ERROR ack CLASS: ..." when commitSync threw, which covers every
// record of the poll before it. Values come from the deliveries
// (valueAt: partition and offset to value).
func parseShareAckErrors(member string, lines []string, valueAt map[[2]int64]string) []shareEvent {
	var out []shareEvent
	var batch []shareEvent // the deliveries of the last poll
	acked := false         // an acknowledgement line followed them
	for _, l := range lines {
		if strings.HasPrefix(l, "REC ") {
			if acked {
				batch, acked = nil, false
			}
			batch = append(batch, parseShareEvents(member, []string{l})...)
			continue
		}
		if strings.HasPrefix(l, "ACK ") {
			acked = true
			continue
		}
		rest, ok := strings.CutPrefix(l, "ERROR ack ")
		if !ok {
			continue
		}
		acked = true
		if p, o, ok := parseAckErrorPosition(rest); ok {
			out = append(out, shareEvent{member: member, ack: true, partition: p, offset: o, status: "ERROR", value: valueAt[[2]int64{int64(p), o}]})
			continue
		}
		for _, r := range batch {
			out = append(out, shareEvent{member: member, ack: true, ms: r.ms, partition: r.partition, offset: r.offset, status: "ERROR", value: r.value})
		}
		batch = nil
	}
	return out
}

// parseAckErrorPosition reads the partition and offset at the start of
// an "ERROR ack" line's rest: "pP O:" or "TOPIC-P O".
func parseAckErrorPosition(rest string) (int32, int64, bool) {
	f := strings.Fields(rest)
	if len(f) < 2 {
		return 0, 0, false
	}
	ps := strings.TrimPrefix(f[0], "p")
	if i := strings.LastIndexByte(f[0], '-'); i >= 0 {
		ps = f[0][i+1:]
	}
	p, err1 := strconv.ParseInt(ps, 10, 32)
	o, err2 := strconv.ParseInt(strings.TrimSuffix(f[1], ":"), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return int32(p), o, true
}

// shareFleetReport is what checkShareFleetLedger found.
type shareFleetReport struct {
	accepted, rejected int // answered OK
	// Settled without an answer seen (see the file's comment).
	ambiguous, killedLast, archived int
	unsettled                       []string // none of the above
	// settledAt: partition and offset of each record settled without
	// an answer seen, which the group's start offsets must have passed.
	settledAt   [][2]int64
	deliveries  int // deliveries of values
	redelivered int // values delivered more than once
	beyondRule  int // of them, not released by the rule on their first delivery
	perMember   map[string]int
	violations  []string
}

// checkShareFleetLedger checks evs (REC, ACK and ERROR ack events of
// values) by the rules of the file's comment; inFlight holds the values
// of the killed consumer's last poll that it printed no answer for
// (lastPoll).
func checkShareFleetLedger(values []string, evs []shareEvent, inFlight map[string]bool, slack int) shareFleetReport {
	rep := shareFleetReport{perMember: map[string]int{}}
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
		// Time order; at one millisecond a delivery before its own
		// acknowledgement.
		sort.SliceStable(es, func(i, j int) bool {
			if es[i].ms != es[j].ms {
				return es[i].ms < es[j].ms
			}
			return !es[i].ack && es[j].ack
		})
		var recs []shareEvent
		var final *shareEvent
		finalCount, errored := 0, false
		seen := map[int]bool{}
		for i := range es {
			e := es[i]
			if !e.ack {
				recs = append(recs, e)
				rep.deliveries++
				rep.perMember[e.member]++
				if e.deliveries < 1 || e.deliveries > shareDeliveryLimit || seen[e.deliveries] {
					add("%s: delivery count %d (counts so far %v), want distinct counts within the limit %d", v, e.deliveries, shareCounts(recs[:len(recs)-1]), shareDeliveryLimit)
				}
				seen[e.deliveries] = true
				if final != nil && e.ms > final.ms && e.deliveries > finalCount+slack {
					add("%s: delivered to %s (count %d) at %d, after its %s of delivery %d was answered at %d", v, e.member, e.deliveries, e.ms, final.status, finalCount, final.ms)
				}
				continue
			}
			switch e.status {
			case "RELEASE":
				continue
			case "ERROR":
				errored = true
				continue
			}
			if final != nil {
				add("%s: %s answered OK to %s after %s answered OK to %s", v, e.status, e.member, final.status, final.member)
				continue
			}
			final = &es[i]
			// The acknowledged delivery: the member's last one polled.
			for j := len(recs) - 1; j >= 0; j-- {
				if recs[j].member == e.member {
					finalCount = recs[j].deliveries
					break
				}
			}
		}
		if len(recs) > 1 {
			rep.redelivered++
			if !strings.HasSuffix(v, "3") || len(recs) > 2 {
				rep.beyondRule++
			}
		}
		switch {
		case final != nil && final.status != shareWant(v):
			add("%s: %s, the consumers' rule says %s", v, final.status, shareWant(v))
		case final != nil && final.status == "REJECT":
			rep.rejected++
		case final != nil:
			rep.accepted++
		case errored:
			rep.ambiguous++
			rep.settledAt = append(rep.settledAt, [2]int64{int64(recs[0].partition), recs[0].offset})
		case len(recs) > 0 && inFlight[v]:
			rep.killedLast++
			rep.settledAt = append(rep.settledAt, [2]int64{int64(recs[0].partition), recs[0].offset})
		case len(recs) > 0 && recs[len(recs)-1].deliveries == shareDeliveryLimit:
			rep.archived++
			rep.settledAt = append(rep.settledAt, [2]int64{int64(recs[0].partition), recs[0].offset})
		default:
			if len(rep.unsettled) < 10 {
				rep.unsettled = append(rep.unsettled, fmt.Sprintf("%s (counts %v)", v, shareCounts(recs)))
			}
		}
	}
	return rep
}

// checkShareStarts checks through addr the start offset of every
// share-partition of group: each must have passed the records in
// settled (partition, offset), which the group thus holds final, and,
// if ends is given, be at the end of its log (ends): the group holds no
// record still to deliver or acknowledge.
func checkShareStarts(ctx context.Context, addr, group, topic string, settled [][2]int64, ends kadm.ListedOffsets) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RetryTimeout(3*time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(cl).DescribeShareGroupOffsets(cctx, group)
	if err != nil {
		return fmt.Errorf("describing the share offsets of %s: %w", group, err)
	}
	if err := offs[group].Err; err != nil {
		return fmt.Errorf("describing the share offsets of %s: %w", group, err)
	}
	var behind []string
	for _, po := range settled {
		o, ok := offs[group].Offsets.Lookup(topic, int32(po[0]))
		if !ok || o.Err != nil || o.StartOffset <= po[1] {
			behind = append(behind, fmt.Sprintf("%d at %d, not past %d", po[0], o.StartOffset, po[1]))
		}
	}
	ends.Each(func(e kadm.ListedOffset) {
		o, ok := offs[group].Offsets.Lookup(e.Topic, e.Partition)
		if !ok || o.Err != nil || o.StartOffset != e.Offset {
			behind = append(behind, fmt.Sprintf("%d at %d of %d", e.Partition, o.StartOffset, e.Offset))
		}
	})
	if len(behind) > 0 {
		return fmt.Errorf("share-partitions of %s/%s: %s", group, topic, strings.Join(behind, ", "))
	}
	return nil
}

// runShareFleet runs a share-serve fleet row on s.path; prior is the
// direct path's outcome.
func (s *scenario) runShareFleet(ctx context.Context, bin string, basePort int, prior *kindOutcome) (res result, out *kindOutcome) {
	if s.path == "direct" && !s.h.brokerHas(shareGroups) {
		return s.runShareServe(ctx, bin, basePort, prior)
	}
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"} // runKind adds the notes and time
	fail := func(format string, args ...any) (result, *kindOutcome) {
		res.pass = false
		res.reason = joinReason(res.reason, fmt.Sprintf(format, args...))
		return res, out
	}
	topic, group := s.topic, s.group
	n := kindRecords
	values := make([]string, n)
	for i := range values {
		values[i] = fmt.Sprintf("s%05d", i)
	}

	// The fleet, and the group's owner: the kproxy serving the group's
	// partition of the groups topic (fleet.go).
	addrs := []string{s.bootstrap, s.bootstrap, s.bootstrap}
	var owner *fleetNode
	var survivors []*fleetNode
	label := "directly (no fleet: the consumer is killed, nothing else)"
	if s.path == "kproxy" {
		args, err := s.shareArgs(shareFleetArgs)
		if err != nil {
			return fail("%v", err)
		}
		nodes, err := s.startFleetWith(ctx, bin, basePort+shareFleetPort, 3, args)
		defer func() {
			var wg sync.WaitGroup
			for _, nd := range nodes {
				if nd != owner && !nd.proc.alive() {
					res.pass = false
					res.reason = joinReason(res.reason, nd.name+" died: "+tail(nd.proc.logPath, 300))
				}
				wg.Add(1)
				go func(nd *fleetNode) { defer wg.Done(); nd.proc.stop() }(nd)
			}
			wg.Wait()
		}()
		if err != nil {
			return fail("%v", err)
		}
		servedBy, parts, ok, err := fleetCoverage(ctx, nodes, true)
		if err != nil || !ok {
			return fail("fleet coverage after forming: %v %v", servedBy, err)
		}
		gp := groupPartition(group, parts)
		for _, nd := range nodes {
			if servedBy[gp] == nd.name {
				owner = nd
			} else {
				survivors = append(survivors, nd)
			}
		}
		if owner == nil {
			return fail("no kproxy serves partition %d of the groups topic", gp)
		}
		// m1 and m2 on the survivors-to-be, m3 on the owner.
		addrs = []string{survivors[0].proc.addr, survivors[1].proc.addr, owner.proc.addr}
		label = fmt.Sprintf("through a fleet of 3 (%s)", strings.Join(args, " "))
		s.note("group %s lives in groups-topic partition %d of %d, owned by %s; m1 on %s, m2 on %s, m3 on the owner",
			group, gp, parts, owner.name, survivors[0].name, survivors[1].name)
	}
	if err := s.h.createTopic(ctx, topic, kindPartitions); err != nil {
		return fail("%v", err)
	}
	// kproxy keeps GROUP configs for a cluster without them, one store
	// for the fleet: set through m1's kproxy, read back through each.
	earliest, refused, err := s.shareEarliest(ctx, group, addrs[0], addrs)
	if err != nil {
		return fail("%v", err)
	}
	if refused != nil && earliest {
		s.note("share.auto.offset.reset=earliest as a GROUP config: Kafka %s refuses it; set through m1's kproxy, which keeps GROUP configs for it, and read back through all three", s.h.kafkaVersion)
	}
	began := time.Now()
	var members []*kindProc
	defer func() {
		for _, m := range members {
			m.kill()
		}
	}()
	for i, a := range addrs {
		name := fmt.Sprintf("m%d", i+1)
		argv := s.shareServeArgv(a, group, topic, name)
		for j := range argv[:len(argv)-1] {
			if argv[j] == "--seconds" {
				// The Java program stops after --seconds: past the
				// row's own bounds here.
				argv[j+1] = "300"
			}
		}
		m, err := s.startKindProc("share-"+name, argv)
		if err != nil {
			return fail("%v", err)
		}
		members = append(members, m)
	}
	victim := members[2]
	if _, err := s.waitFor(60*time.Second, "the share consumers to start", func() bool {
		for _, m := range members {
			if !m.has("STARTED") {
				return false
			}
		}
		return true
	}); err != nil {
		return fail("%v", err)
	}
	// events reads every member's lines; acknowledgement errors are
	// matched to values by partition and offset.
	events := func() []shareEvent {
		var evs []shareEvent
		lines := map[string][]string{}
		valueAt := map[[2]int64]string{}
		for _, m := range members {
			lines[m.name] = m.snapshot()
			for _, e := range parseShareEvents(m.name, lines[m.name]) {
				evs = append(evs, e)
				if !e.ack {
					valueAt[[2]int64{int64(e.partition), e.offset}] = e.value
				}
			}
		}
		for _, m := range members {
			evs = append(evs, parseShareAckErrors(m.name, lines[m.name], valueAt)...)
		}
		return evs
	}
	exited := func() string {
		for _, m := range members {
			if m == victim {
				continue
			}
			select {
			case <-m.done:
				return m.name + " exited: " + tail(s.logPath(m.name+".log"), 400)
			default:
			}
		}
		return ""
	}
	if err := s.waitShareMembers(ctx, addrs[0], group, len(members)); err != nil {
		return fail("%v", err)
	}
	joined := time.Since(began)
	time.Sleep(time.Second) // as runShareServe: fetches sent before the shares shrank
	if !earliest {
		if err := s.probeShareStarts(ctx, topic, events, exited); err != nil {
			return fail("%v", err)
		}
		s.note("no GROUP configs on Kafka %s: the group starts at the log end; a probe of every partition read %s after the consumers started, then the records", s.h.kafkaVersion, fmtDur(time.Since(began)))
	}

	// The records flow: shareFleetChunk every shareFleetEvery.
	var produced atomic.Int64
	prodErr := make(chan error, 1)
	pctx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	prod, err := kgo.NewClient(kgo.SeedBrokers(s.h.broker), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		return fail("producer: %v", err)
	}
	defer prod.Close()
	go func() {
		var err error
		defer func() { prodErr <- err }()
		for i := 0; i < n && pctx.Err() == nil; i += shareFleetChunk {
			var recs []*kgo.Record
			for _, v := range values[i:min(i+shareFleetChunk, n)] {
				recs = append(recs, &kgo.Record{Value: []byte(v)})
			}
			cctx, cancel := context.WithTimeout(pctx, 30*time.Second)
			err = prod.ProduceSync(cctx, recs...).FirstErr()
			cancel()
			if err != nil {
				err = fmt.Errorf("producing to %s: %w", topic, err)
				return
			}
			produced.Store(int64(min(i+shareFleetChunk, n)))
			time.Sleep(shareFleetEvery)
		}
	}()
	var inFlight map[string]bool // set once the consumer is killed
	finalNow := func() int {
		rep := checkShareFleetLedger(values, events(), inFlight, shareFleetSlack)
		return rep.accepted + rep.rejected
	}
	// (a) The consumer behind the owner, a third of the way.
	if _, err := s.waitFor(60*time.Second, "a third of the records final", func() bool { return finalNow() >= n/3 || exited() != "" }); err != nil {
		return fail("%v", err)
	}
	if e := exited(); e != "" {
		return fail("%s", e)
	}
	memberKill := time.Now()
	victim.kill()
	inFlight = lastPoll(victim.snapshot())
	s.h.log.Info("share fleet row: killed a consumer", "member", victim.name, "final", finalNow())
	// (b) The owner, once two thirds were produced.
	var ownerKill time.Time
	producedAtKill := int64(-1)
	if owner != nil {
		if _, err := s.waitFor(60*time.Second, "two thirds of the records produced", func() bool { return produced.Load() >= int64(2*n/3) }); err != nil {
			return fail("%v", err)
		}
		producedAtKill = produced.Load()
		ownerKill = time.Now()
		owner.proc.kill()
		s.h.log.Info("share fleet row: killed the group's owner", "kproxy", owner.name, "produced", producedAtKill)
	}
	if err := <-prodErr; err != nil {
		return fail("producing: %v", err)
	}
	ends, err := kadm.NewClient(s.h.cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return fail("listing the log ends of %s: %v", topic, err)
	}
	if owner == nil {
		// Kafka 4.4 serving the group itself left each share-partition's
		// start offset 3 short of its log's end for 2 min with every
		// record accepted or rejected (DescribeShareGroupOffsets: 330
		// of 333): directly only the records settled without an answer
		// are checked against the start offsets.
		ends = nil
	}
	// Every record final, or settled by the group's own view.
	var lastCheck time.Time
	var atEnds error
	_, err = s.waitFor(120*time.Second, "every record final, the group's start offsets past those settled without an answer, and at the log's end through kproxy", func() bool {
		if exited() != "" {
			return true
		}
		rep := checkShareFleetLedger(values, events(), inFlight, shareFleetSlack)
		if rep.accepted+rep.rejected+rep.ambiguous+rep.killedLast+rep.archived < n || time.Since(lastCheck) < 500*time.Millisecond {
			return false
		}
		lastCheck = time.Now()
		atEnds = checkShareStarts(ctx, addrs[0], group, topic, rep.settledAt, ends)
		return atEnds == nil
	})
	took := time.Since(began)
	gone := exited()
	for _, m := range members {
		m.kill()
	}
	evs := events()
	rep := checkShareFleetLedger(values, evs, inFlight, shareFleetSlack)
	res.records = rep.accepted + rep.rejected
	res.settle = fmt.Sprintf("%s/%s", fmtDur(joined), fmtDur(took))

	// Figures: from each kill to the next delivery or accept.
	firstAfter := func(at time.Time, want func(shareEvent) bool) string {
		best := int64(-1)
		for _, e := range evs {
			if e.ms > at.UnixMilli() && want(e) && (best < 0 || e.ms < best) {
				best = e.ms
			}
		}
		if best < 0 {
			return "never"
		}
		return fmtDur(time.UnixMilli(best).Sub(at))
	}
	settledWhat := "every share-partition at its log's end"
	if owner == nil {
		settledWhat = "every record settled"
	}
	s.note("%s: %d records produced over about %s while consuming; %d of %d final (%d accepted, %d rejected), %d settled without an answer seen (%d acknowledged with an error, %d in the last poll of the killed %s, %d archived at the limit), %s %s after the consumers started (all %d held partitions after %s); %d deliveries %v; %d records delivered more than once, %d of them beyond the rule's release",
		label, n, fmtDur(time.Duration(n/shareFleetChunk)*shareFleetEvery), rep.accepted+rep.rejected, n, rep.accepted, rep.rejected,
		rep.ambiguous+rep.killedLast+rep.archived, rep.ambiguous, rep.killedLast, victim.name, rep.archived,
		settledWhat, fmtDur(took), len(members), fmtDur(joined), rep.deliveries, rep.perMember, rep.redelivered, rep.beyondRule)
	held := map[string]bool{}       // values the killed consumer polled and left unacknowledged
	victimParts := map[int32]bool{} // partitions it got records of
	for _, e := range evs {
		if e.member == victim.name && !e.ack {
			held[e.value] = true
			victimParts[e.partition] = true
		}
	}
	for _, e := range evs {
		if e.member == victim.name && e.ack {
			delete(held, e.value)
		}
	}
	s.note("SIGKILL of consumer %s (it got records of partitions %v): the first of them delivered to a survivor %s later (once its share session ended: share.session.timeout.ms); %d records it polled without an acknowledgement answered, the first of them delivered again %s later",
		victim.name, sortedParts(victimParts),
		firstAfter(memberKill, func(e shareEvent) bool { return !e.ack && e.member != victim.name && victimParts[e.partition] }),
		len(held), firstAfter(memberKill, func(e shareEvent) bool { return !e.ack && e.member != victim.name && held[e.value] }))
	if owner != nil {
		s.note("SIGKILL of the owner %s with %d of %d records produced: next accept answered OK %s later, next delivery %s later",
			owner.name, producedAtKill, n,
			firstAfter(ownerKill, func(e shareEvent) bool { return e.ack && e.status == "ACCEPT" }),
			firstAfter(ownerKill, func(e shareEvent) bool { return !e.ack }))
	}
	if prior != nil && prior.firstError != "" {
		s.note("direct: %d of %d read (the consumers report %s)", prior.shareRead, n, prior.firstError)
	}
	// The survivors may see only the failover's errors, as in
	// e2e/share_fleet_test.go: acknowledgements the owner could not take
	// (NOT_LEADER_OR_FOLLOWER) and those of records the next owner handed
	// to another member (INVALID_RECORD_STATE).
	var ackErrs, otherErrs []string
	nErrs := 0
	for _, m := range members {
		if m == victim {
			continue
		}
		for _, l := range m.snapshot() {
			if !strings.HasPrefix(l, "ERROR ") {
				continue
			}
			nErrs++
			failover := strings.HasPrefix(l, "ERROR ack ") && (strings.Contains(l, "NOT_LEADER_FOR_PARTITION") ||
				strings.Contains(l, "NotLeaderOrFollowerException") || strings.Contains(l, "INVALID_RECORD_STATE") ||
				strings.Contains(l, "InvalidRecordStateException"))
			switch {
			case !failover && len(otherErrs) < 3:
				otherErrs = append(otherErrs, m.name+": "+normalizeKindError(l, group))
			case failover && len(ackErrs) < 2:
				ackErrs = append(ackErrs, m.name+": "+normalizeKindError(l, group))
			}
		}
	}
	if nErrs > 0 {
		s.note("%d error lines of the surviving consumers, e.g. %s", nErrs, strings.Join(append(ackErrs, otherErrs...), " | "))
	}
	if gone != "" {
		return fail("%s", gone)
	}
	if err != nil {
		return fail("%v (last check: %v; unsettled %v)", err, atEnds, rep.unsettled)
	}
	if len(rep.violations) > 0 {
		return fail("ledger: %s", strings.Join(rep.violations, "; "))
	}
	if owner != nil && producedAtKill >= int64(n) {
		return fail("every record was produced before the owner's kill: the row did not kill it while records flowed")
	}
	if len(otherErrs) > 0 {
		return fail("the surviving consumers reported errors other than the failover's: %s", strings.Join(otherErrs, " | "))
	}
	if rep.rejected == 0 {
		return fail("no record rejected: the row did not exercise rejects")
	}
	res.pass = true
	return res, out
}

// probeShareStarts produces a probe record to every partition of topic
// each second until a consumer (events) has read one of each: on a
// cluster without GROUP configs the group starts at the log end, and
// only then is every share-partition's start set (shareserve.go).
func (s *scenario) probeShareStarts(ctx context.Context, topic string, events func() []shareEvent, exited func() string) error {
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
			return fmt.Errorf("no consumer read a probe of every partition within 30 s")
		}
		if e := exited(); e != "" {
			return fmt.Errorf("%s", e)
		}
		ps := map[int32]string{}
		for p := range int32(kindPartitions) {
			ps[p] = fmt.Sprintf("probe-%d-%d-x", p, i)
		}
		if err := s.h.produceToPartitions(ctx, topic, ps); err != nil {
			return err
		}
		_, _ = s.waitFor(time.Second, "a probe of every partition", probed)
	}
	return nil
}

func sortedParts(ps map[int32]bool) []int32 {
	out := make([]int32, 0, len(ps))
	for p := range ps {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// lastPoll returns the values a consumer polled after its last
// acknowledgement line (ACK or ERROR ack): the poll it may have
// acknowledged without printing the answer.
func lastPoll(lines []string) map[string]bool {
	out := map[string]bool{}
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "ACK ") || strings.HasPrefix(l, "ERROR ack "):
			clear(out)
		case strings.HasPrefix(l, "REC "):
			for _, e := range parseShareEvents("", []string{l}) {
				out[e.value] = true
			}
		}
	}
	return out
}
