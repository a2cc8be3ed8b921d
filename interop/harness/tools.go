package main

// Rows that run programs nobody here wrote (issue 21): Kafka's own
// verifiable clients and its kafka-consumer-groups, direct and through
// kproxy with the same assertions.
//
// kafka-verifiable, kafka-verifiable-kip848: Kafka's VerifiableProducer
// (org.apache.kafka.tools, the kafka-tools jar of the broker's version)
// writes verifRecords records with acks=all at verifThroughput records/s
// while three VerifiableConsumers consume them as one group (classic with
// the cooperative-sticky assignor, or --group-protocol consumer, KIP-848);
// once a third of the records is acknowledged the first consumer is
// SIGKILLed. From the programs' own JSON lines the row asserts:
//
//   - every record the producer acknowledged (producer_send_success) is
//     in a records_consumed range of some consumer, and every range is
//     gapless (count = maxOffset-minOffset+1: the topic has no control
//     records, so a gap is a skipped record);
//   - no partition is owned by two live members at once: a member owns a
//     partition from its partitions_assigned event to its
//     partitions_revoked event (callbacks run in the member's poll, so a
//     member does not fetch or commit outside that span); the SIGKILLed
//     member owns its last assignment up to the kill, since a killed
//     process fetches and commits nothing after it, and another member
//     being assigned one of those partitions before the kill is an
//     overlap, after it is the group moving on;
//   - every successful commit (offsets_committed, success) is of a
//     partition its member owned at the time;
//   - per partition the successful commits, in time order across the
//     members, never go backwards, and the last one is the partition's
//     end offset; the broker's committed offsets (sampled every
//     anchorSampleEvery, read directly) never go backwards either and
//     reach the end offsets.
//
// The row measures the time from each consumer's start to its first
// assignment, to the group's first stable assignment, and from the kill
// to the survivors owning every partition.
//
// kafka-consumer-groups-diff: Kafka's kafka-consumer-groups, through the
// path, against the same sequence of group states on both paths (a
// classic group with a live member, then empty, reset, its offsets
// partly deleted, deleted; a KIP-848 group with a live member; a group
// that never existed). The kproxy path's outputs, normalized only in
// addresses, host, client and member ids, the coordinator and the
// group and topic names (diffNormalize), must equal the direct path's
// line for line; any other difference fails the row with the diff.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	verifRecords    = 20000 // records the VerifiableProducer writes
	verifThroughput = 2000  // its records/s
	verifConsumers  = 3
	verifProducer   = "org.apache.kafka.tools.VerifiableProducer"
	verifConsumer   = "org.apache.kafka.tools.VerifiableConsumer"
	groupsDiffCount = 300 // records of the kafka-consumer-groups-diff topic
)

// verifEvent is one JSON line of a VerifiableProducer or
// VerifiableConsumer (their ProducerEvent and ConsumerEvent classes).
type verifEvent struct {
	Timestamp  int64       `json:"timestamp"`
	Name       string      `json:"name"`
	Partitions []verifPart `json:"partitions"`
	Offsets    []verifPart `json:"offsets"`
	Success    *bool       `json:"success"`
	Error      string      `json:"error"`
	// producer_send_success / producer_send_error
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Value     string `json:"value"`
	Exception string `json:"exception"`
	Message   string `json:"message"`
	// tool_data
	Acked int64 `json:"acked"`
	Sent  int64 `json:"sent"`
}

// verifPart is a partition of partitions_assigned/revoked, a
// records_consumed summary or an offsets_committed offset.
type verifPart struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Count     int64  `json:"count"`
	MinOffset int64  `json:"minOffset"`
	MaxOffset int64  `json:"maxOffset"`
	Offset    int64  `json:"offset"`
}

// verifProc is one verifiable client process. name, cmd, started and
// done are immutable after startVerif; the rest is guarded by
// verifRun.mu and written by the process's reader goroutine (and
// killedAt by the row's goroutine).
type verifProc struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{} // closed when stdout is drained and the process reaped

	events   []verifEvent
	owned    map[int32]bool
	firstAt  time.Time // when the first non-empty partitions_assigned arrived
	killedAt time.Time // zero unless the row SIGKILLed it
	exitErr  error
	exited   bool
	badLines int
}

// verifRun is the state of one path of a verifiable row; mu guards the
// fields of every verifProc in procs.
type verifRun struct {
	s     *scenario
	java  []string // java and its flags with the tools' class path
	mu    sync.Mutex
	procs []*verifProc
}

// verifOutcome is what one path measured, for the comparison of the
// kproxy path with the direct one.
type verifOutcome struct {
	firstAssign time.Duration // slowest consumer's start to first assignment
	stable      time.Duration
	move        time.Duration
	dups        int64
}

// toolsJava returns the java command with the class path of the broker
// version's Kafka tools (kafka.sh tools prints it; the kafka-tools jar
// also holds the verifiable clients since Kafka 3.5).
func (s *scenario) toolsJava(ctx context.Context) ([]string, error) {
	t, err := s.newConsumerGroupsTool(ctx)
	if err != nil {
		return nil, err
	}
	return t.java, nil
}

// startVerif starts a verifiable client: java mainClass args..., its
// stdout (JSON lines) kept in NAME.jsonl and folded into p, stderr in
// NAME.stderr.
func (v *verifRun) startVerif(name, mainClass string, args ...string) (*verifProc, error) {
	argv := append(append(append([]string(nil), v.java...), mainClass), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	stderr, err := os.Create(v.s.logPath(name + ".stderr"))
	if err != nil {
		return nil, fmt.Errorf("stderr file for %s: %w", name, err)
	}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stderr.Close()
		return nil, fmt.Errorf("stdout pipe for %s: %w", name, err)
	}
	raw, err := os.Create(v.s.logPath(name + ".jsonl"))
	if err != nil {
		stderr.Close()
		return nil, fmt.Errorf("stdout file for %s: %w", name, err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		stderr.Close()
		raw.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, strings.Join(argv, " "), err)
	}
	p := &verifProc{name: name, cmd: cmd, started: time.Now(), done: make(chan struct{}), owned: map[int32]bool{}}
	v.mu.Lock()
	v.procs = append(v.procs, p)
	v.mu.Unlock()
	go func() {
		defer close(p.done)
		defer stderr.Close()
		defer raw.Close()
		sc := bufio.NewScanner(io.TeeReader(stdout, raw))
		sc.Buffer(make([]byte, 1<<16), 1<<22)
		for sc.Scan() {
			line := sc.Bytes()
			if len(line) == 0 || line[0] != '{' {
				continue
			}
			var e verifEvent
			err := json.Unmarshal(line, &e)
			v.mu.Lock()
			if err != nil {
				p.badLines++
			} else {
				v.observeLocked(p, e)
			}
			v.mu.Unlock()
		}
		werr := cmd.Wait()
		v.mu.Lock()
		p.exited, p.exitErr = true, werr
		v.mu.Unlock()
	}()
	return p, nil
}

// observeLocked folds one event into p's owned set. Callers hold v.mu.
func (v *verifRun) observeLocked(p *verifProc, e verifEvent) {
	p.events = append(p.events, e)
	switch e.Name {
	case "partitions_assigned":
		for _, tp := range e.Partitions {
			p.owned[tp.Partition] = true
		}
		if len(e.Partitions) > 0 && p.firstAt.IsZero() {
			p.firstAt = time.Now()
		}
	case "partitions_revoked":
		for _, tp := range e.Partitions {
			delete(p.owned, tp.Partition)
		}
	}
}

// waitV polls cond (called with v.mu held) until it holds or timeout
// passes; it gives up at once when a process the row did not kill exited.
func (v *verifRun) waitV(timeout time.Duration, what string, cond func() bool) (time.Duration, error) {
	start := time.Now()
	for {
		v.mu.Lock()
		ok := cond()
		var crashed *verifProc
		for _, p := range v.procs {
			if p.exited && p.killedAt.IsZero() && (p.exitErr != nil || !strings.HasPrefix(p.name, "producer")) {
				crashed = p
				break
			}
		}
		v.mu.Unlock()
		if ok {
			return time.Since(start), nil
		}
		if crashed != nil {
			return time.Since(start), fmt.Errorf("gave up waiting for %s: %s exited on its own (%v); stderr tail: %s",
				what, crashed.name, crashed.exitErr, tail(v.s.logPath(crashed.name+".stderr"), 400))
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// coversLocked reports whether the live consumers of ms own every one of
// parts partitions exactly once, each at least one. Callers hold v.mu.
func coversLocked(ms []*verifProc, parts int) bool {
	held := map[int32]int{}
	for _, p := range ms {
		if p.exited || !p.killedAt.IsZero() || len(p.owned) == 0 {
			return false
		}
		for q := range p.owned {
			held[q]++
		}
	}
	if len(held) != parts {
		return false
	}
	for _, n := range held {
		if n != 1 {
			return false
		}
	}
	return true
}

// ownersLocked describes who owns what, for failure messages. Callers
// hold v.mu.
func (v *verifRun) ownersLocked() string {
	var b strings.Builder
	b.WriteString("owners:")
	for _, p := range v.procs {
		if strings.HasPrefix(p.name, "producer") {
			continue
		}
		var ps []int
		for q := range p.owned {
			ps = append(ps, int(q))
		}
		sort.Ints(ps)
		fmt.Fprintf(&b, " %s(killed=%v exited=%v)=%v", p.name, !p.killedAt.IsZero(), p.exited, ps)
	}
	return b.String()
}

// kill SIGKILLs p's process group and records when.
func (v *verifRun) kill(p *verifProc) {
	v.mu.Lock()
	p.killedAt = time.Now()
	v.mu.Unlock()
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// stopAll SIGTERMs the processes that still run (a VerifiableConsumer
// closes its consumer in a shutdown hook: it leaves the group) and waits
// for them, SIGKILLing what has not exited within timeout. It returns the
// names of those that did not shut down cleanly.
func (v *verifRun) stopAll(timeout time.Duration) []string {
	v.mu.Lock()
	ps := append([]*verifProc(nil), v.procs...)
	v.mu.Unlock()
	for _, p := range ps {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	var bad []string
	deadline := time.After(timeout)
	for _, p := range ps {
		select {
		case <-p.done:
		case <-deadline:
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
			bad = append(bad, p.name+" did not exit within "+timeout.String()+" of SIGTERM")
			continue
		}
		v.mu.Lock()
		if p.killedAt.IsZero() && !strings.HasPrefix(p.name, "producer") {
			clean := false
			for _, e := range p.events {
				clean = clean || e.Name == "shutdown_complete"
			}
			if !clean {
				bad = append(bad, fmt.Sprintf("%s exited (%v) without shutdown_complete", p.name, p.exitErr))
			}
		}
		v.mu.Unlock()
	}
	return bad
}

// killAll SIGKILLs every process still running; for the failure path.
func (v *verifRun) killAll() {
	v.mu.Lock()
	ps := append([]*verifProc(nil), v.procs...)
	v.mu.Unlock()
	for _, p := range ps {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
}

// runVerifiable runs a kafka-verifiable row on s.path; prior is the
// direct path's outcome when it ran first.
func (s *scenario) runVerifiable(ctx context.Context, prior *verifOutcome) (res result, out *verifOutcome) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	v := &verifRun{s: s}
	var sampler *offsetSampler
	defer func() {
		if sampler != nil {
			sampler.finish()
		}
		v.killAll()
		s.finish(&res, start)
	}()
	fail := func(format string, args ...any) (result, *verifOutcome) {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res, nil
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	java, err := s.toolsJava(ctx)
	if err != nil {
		return fail("Kafka tools: %v", err)
	}
	v.java = java
	parts := s.h.partitions
	if err := s.h.createTopic(ctx, s.topic, parts); err != nil {
		return fail("%v", err)
	}

	// The consumers: client.id names them in the broker's view too.
	var cs []*verifProc
	for i := 1; i <= verifConsumers; i++ {
		name := fmt.Sprintf("c%d", i)
		cfg := s.logPath(name + ".properties")
		if err := os.WriteFile(cfg, []byte("client.id="+name+"\n"), 0o644); err != nil {
			return fail("consumer config: %v", err)
		}
		args := []string{"--bootstrap-server", s.bootstrap, "--topic", s.topic, "--group-id", s.group,
			"--reset-policy", "earliest", "--consumer.config", cfg}
		if s.r.needs == kip848 {
			args = append(args, "--group-protocol", "consumer")
		} else {
			strategy := "org.apache.kafka.clients.consumer.RangeAssignor"
			if s.r.assignor == "cooperative-sticky" {
				strategy = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"
			}
			args = append(args, "--session-timeout", fmt.Sprint(s.h.sessionMS), "--assignment-strategy", strategy)
		}
		p, err := v.startVerif(name, verifConsumer, args...)
		if err != nil {
			return fail("%v", err)
		}
		cs = append(cs, p)
	}
	stable, err := v.waitV(s.h.settleTimeout, "every consumer's first assignment", func() bool { return coversLocked(cs, parts) })
	if err != nil {
		v.mu.Lock()
		defer v.mu.Unlock()
		return fail("initial join: %v; %s", err, v.ownersLocked())
	}
	o := &verifOutcome{stable: stable}
	var firsts []string
	v.mu.Lock()
	for _, p := range cs {
		d := p.firstAt.Sub(p.started)
		o.firstAssign = max(o.firstAssign, d)
		firsts = append(firsts, p.name+" "+fmtDur(d))
	}
	v.mu.Unlock()
	s.note("start to first assignment: %s; to the group's first stable assignment (all %d partitions, each consumer some) %s",
		strings.Join(firsts, ", "), parts, fmtDur(stable))

	sampler = s.startOffsetSampler(ctx)
	prod, err := v.startVerif("producer", verifProducer, "--bootstrap-server", s.bootstrap, "--topic", s.topic,
		"--max-messages", fmt.Sprint(verifRecords), "--throughput", fmt.Sprint(verifThroughput), "--acks", "-1",
		// Keys spread the records over every partition (unkeyed, the
		// sticky partitioner fills a few partitions only).
		"--repeating-keys", "1000")
	if err != nil {
		return fail("%v", err)
	}
	acked := func() int {
		n := 0
		for _, e := range prod.events {
			if e.Name == "producer_send_success" {
				n++
			}
		}
		return n
	}
	if _, err := v.waitV(60*time.Second, "a third of the records to be acknowledged", func() bool { return acked() >= verifRecords/3 }); err != nil {
		return fail("%v", err)
	}
	victim := cs[0]
	v.mu.Lock()
	var victimOwned []int
	for q := range victim.owned {
		victimOwned = append(victimOwned, int(q))
	}
	v.mu.Unlock()
	sort.Ints(victimOwned)
	v.kill(victim)
	survivors := cs[1:]
	move, err := v.waitV(s.h.settleTimeout, "the survivors to own every partition after the SIGKILL", func() bool { return coversLocked(survivors, parts) })
	if err != nil {
		v.mu.Lock()
		defer v.mu.Unlock()
		return fail("after the SIGKILL of %s: %v; %s", victim.name, err, v.ownersLocked())
	}
	o.move = move
	s.note("%s SIGKILLed owning %v once %d records were acknowledged; the survivors owned every partition %s later",
		victim.name, victimOwned, verifRecords/3, fmtDur(move))
	res.settle = fmtDur(stable) + "/" + fmtDur(move)

	select {
	case <-prod.done:
	case <-time.After(90 * time.Second):
		return fail("the VerifiableProducer did not finish within 90s")
	}
	v.mu.Lock()
	perr, nacked := prod.exitErr, acked()
	var sendErrs []string
	toolAcked := int64(-1)
	for _, e := range prod.events {
		switch e.Name {
		case "producer_send_error":
			if len(sendErrs) < 3 {
				sendErrs = append(sendErrs, e.Exception+": "+e.Message)
			}
		case "tool_data":
			toolAcked = e.Acked
		}
	}
	v.mu.Unlock()
	if perr != nil {
		return fail("the VerifiableProducer failed: %v; %s", perr, tail(s.logPath("producer.stderr"), 400))
	}
	if nacked != verifRecords || toolAcked != verifRecords {
		return fail("the VerifiableProducer acknowledged %d of %d records (tool_data acked %d); errors: %v", nacked, verifRecords, toolAcked, sendErrs)
	}

	// Wait for every acknowledged record to be consumed and committed.
	ends, err := s.endOffsets(ctx)
	if err != nil {
		return fail("%v", err)
	}
	caughtUp := func() bool {
		last := v.lastCommitsLocked()
		for q, end := range ends {
			if last[q] != end {
				return false
			}
		}
		return true
	}
	if _, err := v.waitV(s.h.consumeTimeout, "the consumers' commits to reach the end offsets", caughtUp); err != nil {
		v.mu.Lock()
		last := v.lastCommitsLocked()
		v.mu.Unlock()
		return fail("%v: last successful commits %v, end offsets %v", err, last, ends)
	}
	if err := s.h.waitCommitted(ctx, s); err != nil {
		return fail("%v", err)
	}
	samples, sampleErrs, decreases := sampler.finish()
	if bad := v.stopAll(30 * time.Second); len(bad) > 0 {
		return fail("closing the consumers: %s", strings.Join(bad, "; "))
	}

	v.mu.Lock()
	defer v.mu.Unlock()
	consumed, dups, problems := v.checkConsumedLocked(prod)
	res.records = consumed
	o.dups = dups
	problems = append(problems, v.checkOwnershipLocked()...)
	problems = append(problems, v.checkCommitsLocked(ends)...)
	for _, p := range v.procs {
		if p.badLines > 0 {
			problems = append(problems, fmt.Sprintf("%s printed %d lines that are not JSON events", p.name, p.badLines))
		}
	}
	assigns := 0
	for _, p := range cs {
		for _, e := range p.events {
			if e.Name == "partitions_assigned" {
				assigns++
			}
		}
	}
	res.rebalances = fmt.Sprintf("~%d", assigns)
	s.note("%d of %d acknowledged records consumed, %d deliveries more than once (at-least-once: the killed member's uncommitted records are read again); %d partitions_assigned events",
		consumed, verifRecords, dups, assigns)
	s.note("committed offsets sampled from the broker %d times (%d failed reads): %d decreases", samples, sampleErrs, len(decreases))
	if len(decreases) > 0 {
		problems = append(problems, "the broker's committed offsets went backwards: "+strings.Join(decreases, "; "))
	}
	if samples == 0 {
		problems = append(problems, fmt.Sprintf("the broker's committed offsets were never sampled (%d failed reads)", sampleErrs))
	}
	if prior != nil {
		s.note("kproxy vs direct: first assignment (slowest consumer) %s vs %s, stable group %s vs %s, killed member's partitions moved in %s vs %s, %d vs %d duplicate deliveries",
			fmtDur(o.firstAssign), fmtDur(prior.firstAssign), fmtDur(o.stable), fmtDur(prior.stable), fmtDur(o.move), fmtDur(prior.move), o.dups, prior.dups)
	}
	if len(problems) > 0 {
		if len(problems) > 8 {
			problems = append(problems[:8], fmt.Sprintf("... %d more", len(problems)-8))
		}
		return fail("%s", strings.Join(problems, "; "))
	}
	res.pass = true
	return res, o
}

// endOffsets reads the end offset of every partition of s.topic from the
// broker.
func (s *scenario) endOffsets(ctx context.Context) (map[int32]int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lo, err := s.h.adm.ListEndOffsets(cctx, s.topic)
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", s.topic, err)
	}
	if err := lo.Error(); err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", s.topic, err)
	}
	ends := map[int32]int64{}
	lo.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	if len(ends) != s.h.partitions {
		return nil, fmt.Errorf("end offsets of %s: %d of %d partitions", s.topic, len(ends), s.h.partitions)
	}
	return ends, nil
}

// lastCommitsLocked returns, per partition, the offset of the latest
// successful commit (by event time) of any consumer. Callers hold v.mu.
func (v *verifRun) lastCommitsLocked() map[int32]int64 {
	last, at := map[int32]int64{}, map[int32]int64{}
	for _, p := range v.procs {
		for _, e := range p.events {
			if e.Name != "offsets_committed" || e.Success == nil || !*e.Success {
				continue
			}
			for _, o := range e.Offsets {
				if t, ok := at[o.Partition]; !ok || e.Timestamp >= t {
					at[o.Partition], last[o.Partition] = e.Timestamp, o.Offset
				}
			}
		}
	}
	return last
}

// checkConsumedLocked matches the producer's acknowledged records with
// the consumers' records_consumed ranges; it returns the number of
// acknowledged records consumed, the deliveries beyond the first and the
// problems found. Callers hold v.mu.
func (v *verifRun) checkConsumedLocked(prod *verifProc) (int, int64, []string) {
	var problems []string
	seen := map[int32][]int{} // partition -> deliveries per offset
	grow := func(q int32, upTo int64) {
		for int64(len(seen[q])) <= upTo {
			seen[q] = append(seen[q], 0)
		}
	}
	var total int64
	for _, p := range v.procs {
		for _, e := range p.events {
			if e.Name != "records_consumed" {
				continue
			}
			for _, r := range e.Partitions {
				if r.Count != r.MaxOffset-r.MinOffset+1 {
					problems = append(problems, fmt.Sprintf("%s's records_consumed of p%d holds %d records over offsets %d..%d: a gap",
						p.name, r.Partition, r.Count, r.MinOffset, r.MaxOffset))
				}
				grow(r.Partition, r.MaxOffset)
				for o := r.MinOffset; o <= r.MaxOffset; o++ {
					seen[r.Partition][o]++
				}
				total += r.Count
			}
		}
	}
	consumed := 0
	var missing []string
	for _, e := range prod.events {
		if e.Name != "producer_send_success" {
			continue
		}
		if e.Offset < int64(len(seen[e.Partition])) && seen[e.Partition][e.Offset] > 0 {
			consumed++
		} else if len(missing) < 5 {
			missing = append(missing, fmt.Sprintf("p%d@%d (value %s)", e.Partition, e.Offset, e.Value))
		}
	}
	if consumed != verifRecords {
		problems = append(problems, fmt.Sprintf("%d acknowledged records never consumed, e.g. %s", verifRecords-consumed, strings.Join(missing, ", ")))
	}
	return consumed, total - int64(consumed), problems
}

// ownSpan is one stretch of a member owning a partition, in ms.
type ownSpan struct {
	member     string
	start, end int64
}

// spansLocked builds each partition's ownership spans from the
// consumers' assigned and revoked events; a killed member's open spans
// end at the kill, a member's that exited otherwise at its last event.
// Callers hold v.mu.
func (v *verifRun) spansLocked() map[int32][]ownSpan {
	spans := map[int32][]ownSpan{}
	for _, p := range v.procs {
		if strings.HasPrefix(p.name, "producer") {
			continue
		}
		open := map[int32]int64{}
		var lastTS int64
		for _, e := range p.events {
			lastTS = max(lastTS, e.Timestamp)
			switch e.Name {
			case "partitions_assigned":
				for _, tp := range e.Partitions {
					if _, ok := open[tp.Partition]; !ok {
						open[tp.Partition] = e.Timestamp
					}
				}
			case "partitions_revoked":
				for _, tp := range e.Partitions {
					if st, ok := open[tp.Partition]; ok {
						spans[tp.Partition] = append(spans[tp.Partition], ownSpan{p.name, st, e.Timestamp})
						delete(open, tp.Partition)
					}
				}
			}
		}
		end := lastTS
		if !p.killedAt.IsZero() {
			end = p.killedAt.UnixMilli()
		} else if !p.exited {
			end = 1 << 62
		}
		for q, st := range open {
			spans[q] = append(spans[q], ownSpan{p.name, st, end})
		}
	}
	return spans
}

// checkOwnershipLocked returns the overlaps of two members' ownership of
// a partition and the successful commits of a partition the committing
// member did not own. Callers hold v.mu.
func (v *verifRun) checkOwnershipLocked() []string {
	spans := v.spansLocked()
	var problems []string
	for q, ss := range spans {
		sort.Slice(ss, func(i, j int) bool { return ss[i].start < ss[j].start })
		for i := range ss {
			for j := i + 1; j < len(ss); j++ {
				a, b := ss[i], ss[j]
				if a.member != b.member && b.start < a.end && a.start < b.end {
					problems = append(problems, fmt.Sprintf("p%d owned by %s (%d..%d) and %s (%d..%d) at once", q, a.member, a.start, a.end, b.member, b.start, b.end))
				}
			}
		}
	}
	for _, p := range v.procs {
		for _, e := range p.events {
			if e.Name != "offsets_committed" || e.Success == nil || !*e.Success {
				continue
			}
			for _, o := range e.Offsets {
				owned := false
				for _, sp := range spans[o.Partition] {
					owned = owned || sp.member == p.name && sp.start <= e.Timestamp && e.Timestamp <= sp.end
				}
				if !owned {
					problems = append(problems, fmt.Sprintf("%s committed p%d at %d (offset %d) without owning it", p.name, o.Partition, e.Timestamp, o.Offset))
				}
			}
		}
	}
	sort.Strings(problems)
	return problems
}

// checkCommitsLocked returns where the successful commits of a partition,
// in time order across the consumers, went backwards, and where the last
// one is not the end offset. Callers hold v.mu.
func (v *verifRun) checkCommitsLocked(ends map[int32]int64) []string {
	type commit struct {
		ts     int64
		offset int64
		member string
	}
	byPart := map[int32][]commit{}
	for _, p := range v.procs {
		for _, e := range p.events {
			if e.Name != "offsets_committed" || e.Success == nil || !*e.Success {
				continue
			}
			for _, o := range e.Offsets {
				byPart[o.Partition] = append(byPart[o.Partition], commit{e.Timestamp, o.Offset, p.name})
			}
		}
	}
	var problems []string
	for q, end := range ends {
		cs := byPart[q]
		sort.SliceStable(cs, func(i, j int) bool { return cs[i].ts < cs[j].ts })
		for i := 1; i < len(cs); i++ {
			if cs[i].offset < cs[i-1].offset {
				problems = append(problems, fmt.Sprintf("p%d's committed offset went backwards: %d by %s at %d, then %d by %s at %d",
					q, cs[i-1].offset, cs[i-1].member, cs[i-1].ts, cs[i].offset, cs[i].member, cs[i].ts))
			}
		}
		if len(cs) == 0 || cs[len(cs)-1].offset != end {
			problems = append(problems, fmt.Sprintf("p%d's last successful commit is not its end offset %d", q, end))
		}
	}
	sort.Strings(problems)
	return problems
}

// ---------------------------------------------------------------------
// kafka-consumer-groups-diff

// groupsDiffOutcome is the direct path's normalized tool outputs, in
// order, for the kproxy path to be compared with.
type groupsDiffOutcome struct {
	steps []groupsDiffStep
}

// groupsDiffStep is one kafka-consumer-groups run: its arguments (with
// the names normalized) and its normalized output.
type groupsDiffStep struct {
	args, out string
}

// diffNames is what diffNormalize replaces: the row's names and the
// member ids it learnt, longest first.
type diffNames struct {
	pairs [][2]string // from, to
}

var (
	// An address host:port, with an optional leading slash (the HOST
	// column prints /127.0.0.1).
	diffAddr = regexp.MustCompile(`/?\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b`)
	// COORDINATOR (ID) of --describe --state: "host:port  (id)".
	diffCoordinator = regexp.MustCompile(`<addr>\s+\(\d+\)`)
	diffSpaces      = regexp.MustCompile(`[ \t]+`)
)

// diffNormalize rewrites a tool output so that the two paths can be
// compared: the row's group and topic names, addresses and the
// coordinator become placeholders, the CONSUMER-ID column's values
// <member-id>, runs of spaces one space (the tool pads its columns to
// the widest value), and each run of table rows is sorted: the tool
// prints a group's partitions in the hash order of their topic's name,
// which differs between the paths as the names do.
func diffNormalize(out string, names diffNames) string {
	for _, p := range names.pairs {
		out = strings.ReplaceAll(out, p[0], p[1])
	}
	out = diffAddr.ReplaceAllString(out, "<addr>")
	out = diffCoordinator.ReplaceAllString(out, "<coordinator>")
	var lines []string
	memberCol := -1
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(diffSpaces.ReplaceAllString(l, " "))
		if l == "" {
			continue
		}
		f := strings.Split(l, " ")
		switch {
		case f[0] == "GROUP" || f[0] == "TOPIC":
			memberCol = -1
			for i, c := range f {
				if c == "CONSUMER-ID" {
					memberCol = i
				}
			}
		case memberCol >= 0 && strings.HasPrefix(f[0], "<group") && len(f) > memberCol && f[memberCol] != "-":
			f[memberCol] = "<member-id>"
			l = strings.Join(f, " ")
		}
		lines = append(lines, l)
	}
	row := func(l string) bool { return strings.HasPrefix(l, "<group") || strings.HasPrefix(l, "<topic") }
	for i := 0; i < len(lines); {
		j := i
		for j < len(lines) && row(lines[j]) {
			j++
		}
		sort.Strings(lines[i:j])
		i = max(j, i+1)
	}
	return strings.Join(lines, "\n")
}

// listFilter keeps the lines of --list that name this row's groups (the
// cluster holds every other row's groups too, and kproxy its own), the
// header and the exit code.
func listFilter(out string, names diffNames) string {
	var kept, tail []string
	header := ""
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
		case f[0] == "GROUP":
			header = l
		case strings.HasPrefix(f[0], "(exit"):
			tail = append(tail, l)
		default:
			for _, p := range names.pairs {
				if strings.HasPrefix(p[1], "<group") && f[0] == p[0] {
					kept = append(kept, l)
				}
			}
		}
	}
	sort.Strings(kept)
	if header != "" {
		kept = append([]string{header}, kept...)
	}
	return strings.Join(append(kept, tail...), "\n")
}

// runGroupsDiff runs the kafka-consumer-groups-diff row on s.path; prior
// is the direct path's outcome when it ran first.
func (s *scenario) runGroupsDiff(ctx context.Context, prior *groupsDiffOutcome) (res result, out *groupsDiffOutcome) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	defer func() {
		s.killAll(!res.pass)
		s.finish(&res, start)
	}()
	fail := func(format string, args ...any) (result, *groupsDiffOutcome) {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res, nil
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	t, err := s.newConsumerGroupsTool(ctx)
	if err != nil {
		return fail("kafka-consumer-groups: %v", err)
	}
	tool, err := s.startGroupsLoop(t)
	if err != nil {
		return fail("kafka-consumer-groups: %v", err)
	}
	defer tool.close()
	s.group += "-cg" // the scenario names its topic and group alike
	g, g848, missing := s.group, s.group+"-kip848", s.group+"-missing"
	names := diffNames{pairs: [][2]string{{missing, "<group-missing>"}, {g848, "<group-kip848>"}, {g, "<group>"}, {s.topic, "<topic>"}}}
	parts := s.h.partitions
	if err := s.h.createTopic(ctx, s.topic, parts); err != nil {
		return fail("%v", err)
	}
	if err := s.runOnce("producer-1", s.clientArgs("produce", "producer-1", "--count", fmt.Sprint(groupsDiffCount), "--start", "0"), 90*time.Second); err != nil {
		return fail("produce: %v", err)
	}
	// A classic member (franz-go, range) and a KIP-848 one of a second
	// group, each consuming everything and committing.
	m1, err := s.startMember("m1", s.clientArgs("consume", "m1"))
	if err != nil {
		return fail("%v", err)
	}
	m1.identity = "m1"
	m2args := s.argsFor(s.r.client, s.bootstrap, "consume", "m2")
	for i, a := range m2args {
		switch {
		case a == "--group":
			m2args[i+1] = g848
		case a == "--assignor":
			m2args[i+1] = "server-uniform"
		}
	}
	m2, err := s.startMember("m2", m2args)
	if err != nil {
		return fail("%v", err)
	}
	m2.identity = "m2"
	n := groupsDiffCount
	if err := s.h.waitCommitted(ctx, s); err != nil {
		return fail("%v", err)
	}
	if err := s.waitCommittedGroup(ctx, g848); err != nil {
		return fail("%v", err)
	}

	var steps []groupsDiffStep
	runStep := func(args ...string) error {
		o, err := tool.run(ctx, args...)
		if err != nil {
			return err
		}
		a := diffNormalize(strings.Join(args, " "), names)
		norm := diffNormalize(o, names)
		if len(args) > 0 && args[0] == "--list" {
			norm = diffNormalize(listFilter(o, names), names)
		}
		steps = append(steps, groupsDiffStep{args: a, out: norm})
		return nil
	}
	script := [][]string{
		{"--list"},
		{"--list", "--state"},
		{"--list", "--type"},
		{"--list", "--state", "Stable"},
		{"--describe", "--group", g},
		{"--describe", "--members", "--verbose", "--group", g},
		{"--describe", "--state", "--group", g},
		{"--describe", "--group", g848},
		{"--describe", "--members", "--verbose", "--group", g848},
		{"--describe", "--state", "--group", g848},
		{"--describe", "--group", missing},
		{"--describe", "--state", "--group", missing},
		{"--delete", "--group", g},
		{"--delete-offsets", "--group", g, "--topic", s.topic},
		{"--reset-offsets", "--to-earliest", "--execute", "--group", g, "--topic", s.topic},
		{"--delete", "--group", missing},
		{"--describe", "--verbose", "--group", g848},
		{"--delete", "--group", g848},
		{"--delete-offsets", "--group", g848, "--topic", s.topic},
		{"--reset-offsets", "--to-latest", "--execute", "--group", g848, "--topic", s.topic},
	}
	live, err := s.rawGroupErrors(ctx, g, g848)
	if err != nil {
		return fail("%v", err)
	}
	steps = append(steps, groupsDiffStep{args: "(raw group API answers for the live <group>, <group-kip848>)", out: diffNormalize(live, names)})
	for _, a := range script {
		if err := runStep(a...); err != nil {
			return fail("%v", err)
		}
	}
	// The members leave: both groups empty.
	for _, m := range []*member{m1, m2} {
		if err := s.stop(m, 30*time.Second); err != nil {
			return fail("stopping %s: %v", m.name, err)
		}
	}
	if err := s.waitGroupsEmpty(ctx, g, g848); err != nil {
		return fail("%v", err)
	}
	script = [][]string{
		{"--describe", "--group", g},
		{"--describe", "--state", "--group", g},
		{"--describe", "--members", "--group", g},
		{"--describe", "--state", "--group", g848},
		{"--reset-offsets", "--to-earliest", "--execute", "--group", g, "--topic", s.topic},
		{"--reset-offsets", "--to-offset", "10", "--execute", "--group", g, "--all-topics"},
		{"--reset-offsets", "--shift-by", "-20", "--execute", "--group", g, "--topic", s.topic + ":0,1"},
		{"--describe", "--group", g},
		{"--delete-offsets", "--group", g, "--topic", s.topic + ":0"},
		{"--describe", "--group", g},
		{"--delete-offsets", "--group", g, "--topic", s.topic},
		{"--describe", "--group", g},
		{"--delete-offsets", "--group", missing, "--topic", s.topic},
		{"--reset-offsets", "--to-datetime", "2020-01-01T00:00:00.000", "--execute", "--group", g848, "--topic", s.topic},
		{"--describe", "--verbose", "--group", g848},
		{"--reset-offsets", "--to-latest", "--execute", "--group", g848, "--all-topics"},
		{"--delete-offsets", "--group", g848, "--topic", s.topic + ":1"},
		{"--describe", "--group", g848},
		{"--delete", "--group", g},
		{"--delete", "--group", g848},
		{"--describe", "--group", g},
		{"--describe", "--state", "--group", g848},
		{"--delete", "--group", g},
		{"--list"},
		{"--list", "--state"},
	}
	for _, a := range script {
		if err := runStep(a...); err != nil {
			return fail("%v", err)
		}
	}
	// The raw answers behind the tool's errors: codes and messages of
	// the group APIs for a group that never existed and a deleted one.
	raw, err := s.rawGroupErrors(ctx, missing, g, g848)
	if err != nil {
		return fail("%v", err)
	}
	steps = append(steps, groupsDiffStep{args: "(raw group API answers for <group-missing> and the deleted <group>, <group-kip848>)", out: diffNormalize(raw, names)})
	s.mu.Lock()
	res.records = s.distinctLocked(0, n)
	s.mu.Unlock()
	out = &groupsDiffOutcome{steps: steps}
	if err := writeSteps(s.logPath("normalized.txt"), steps); err != nil {
		return fail("%v", err)
	}
	res.settle = fmt.Sprintf("%d runs", len(steps))
	if s.path == "direct" {
		s.note("%d kafka-consumer-groups runs; their normalized outputs are what the kproxy path must print", len(steps))
		res.pass = true
		return res, out
	}
	if prior == nil {
		return fail("the direct path did not run: nothing to compare kafka-consumer-groups' outputs with (run -paths direct,kproxy)")
	}
	if d := diffSteps(prior.steps, steps); d != "" {
		return fail("kafka-consumer-groups through kproxy differs from directly (normalized; - direct, + kproxy):\n%s", d)
	}
	s.note("all %d kafka-consumer-groups outputs equal the direct path's after normalizing addresses, member and client ids, the coordinator and the names", len(steps))
	res.pass = true
	return res, out
}

// writeSteps saves the normalized outputs, for a look after the run.
func writeSteps(path string, steps []groupsDiffStep) error {
	var b strings.Builder
	for _, st := range steps {
		fmt.Fprintf(&b, "$ kafka-consumer-groups %s\n%s\n\n", st.args, st.out)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// diffSteps returns the differing steps of the two paths, each with its
// direct lines (-) and kproxy lines (+); "" when they are equal.
func diffSteps(direct, kp []groupsDiffStep) string {
	var b strings.Builder
	for i := 0; i < max(len(direct), len(kp)); i++ {
		var d, k groupsDiffStep
		if i < len(direct) {
			d = direct[i]
		}
		if i < len(kp) {
			k = kp[i]
		}
		if d == k {
			continue
		}
		fmt.Fprintf(&b, "$ kafka-consumer-groups %s\n", map[bool]string{true: d.args, false: k.args}[d.args != ""])
		if d.args != k.args {
			fmt.Fprintf(&b, "  (steps differ: direct %q, kproxy %q)\n", d.args, k.args)
		}
		dl, kl := strings.Split(d.out, "\n"), strings.Split(k.out, "\n")
		for j := 0; j < max(len(dl), len(kl)); j++ {
			var x, y string
			if j < len(dl) {
				x = dl[j]
			}
			if j < len(kl) {
				y = kl[j]
			}
			if x == y {
				fmt.Fprintf(&b, "   %s\n", x)
				continue
			}
			if x != "" {
				fmt.Fprintf(&b, " - %s\n", x)
			}
			if y != "" {
				fmt.Fprintf(&b, " + %s\n", y)
			}
		}
	}
	return b.String()
}

// waitCommittedGroup waits until group's committed offsets of s.topic
// equal the end offsets, read from the broker.
func (s *scenario) waitCommittedGroup(ctx context.Context, group string) error {
	ends, err := s.endOffsets(ctx)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(s.h.consumeTimeout)
	for {
		comm, err := s.h.committedOffsets(ctx, group, s.topic)
		if err == nil && fmt.Sprint(comm) == fmt.Sprint(ends) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s's committed offsets %v never reached the end offsets %v (last error %v)", group, comm, ends, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitGroupsEmpty waits until each group is Empty as the path under
// test describes it (through kproxy: kproxy's own view).
func (s *scenario) waitGroupsEmpty(ctx context.Context, groups ...string) error {
	adm, closeAdm, err := s.pathAdmin()
	if err != nil {
		return err
	}
	defer closeAdm()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lg, err := adm.ListGroups(cctx)
		cancel()
		empty := 0
		var states []string
		if err == nil {
			for _, g := range groups {
				if lg[g].State == "Empty" {
					empty++
				}
				states = append(states, g+"="+lg[g].State)
			}
		}
		if err == nil && empty == len(groups) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the groups never became Empty through %s within 30s: %v (err %v)", s.bootstrap, states, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pathAdmin returns an admin client bootstrapped at the path under test.
func (s *scenario) pathAdmin() (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.bootstrap))
	if err != nil {
		return nil, nil, fmt.Errorf("admin client via %s: %w", s.bootstrap, err)
	}
	return kadm.NewClient(cl), cl.Close, nil
}

// rawGroupErrors sends DescribeGroups, ConsumerGroupDescribe and
// OffsetFetch for each group through the path under test, and for a
// group without members DeleteGroups and OffsetDelete too, and prints
// each answer's error code, message and what it says of the group.
func (s *scenario) rawGroupErrors(ctx context.Context, groups ...string) (string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.bootstrap))
	if err != nil {
		return "", fmt.Errorf("client via %s: %w", s.bootstrap, err)
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msg := func(m *string) string {
		if m == nil {
			return "(no message)"
		}
		return *m
	}
	name := func(code int16) string {
		if code == 0 {
			return "NONE"
		}
		if e := kerr.ErrorForCode(code); e != nil {
			var ke *kerr.Error
			if errors.As(e, &ke) {
				return ke.Message
			}
			return e.Error()
		}
		return fmt.Sprint(code)
	}
	var lines []string
	for _, g := range groups {
		ph := g
		live := false
		dg := kmsg.NewPtrDescribeGroupsRequest()
		dg.Groups = []string{g}
		dresp, err := dg.RequestWith(cctx, cl)
		if err != nil {
			return "", fmt.Errorf("DescribeGroups %s: %w", g, err)
		}
		for _, r := range dresp.Groups {
			lines = append(lines, fmt.Sprintf("DescribeGroups %s: %s %q state %q protocol type %q protocol %q, %d members",
				ph, name(r.ErrorCode), msg(r.ErrorMessage), r.State, r.ProtocolType, r.Protocol, len(r.Members)))
			live = live || len(r.Members) > 0
		}
		cd := kmsg.NewPtrConsumerGroupDescribeRequest()
		cd.Groups = []string{g}
		cresp, err := cd.RequestWith(cctx, cl)
		if err != nil {
			return "", fmt.Errorf("ConsumerGroupDescribe %s: %w", g, err)
		}
		for _, r := range cresp.Groups {
			lines = append(lines, fmt.Sprintf("ConsumerGroupDescribe %s: %s %q state %q epoch %d assignor %q, %d members",
				ph, name(r.ErrorCode), msg(r.ErrorMessage), r.State, r.Epoch, r.AssignorName, len(r.Members)))
			live = live || len(r.Members) > 0
		}
		of := kmsg.NewPtrOffsetFetchRequest()
		og := kmsg.NewOffsetFetchRequestGroup()
		og.Group = g
		of.Groups = append(of.Groups, og)
		oresp, err := of.RequestWith(cctx, cl)
		if err != nil {
			return "", fmt.Errorf("OffsetFetch %s: %w", g, err)
		}
		for _, r := range oresp.Groups {
			lines = append(lines, fmt.Sprintf("OffsetFetch %s: %s, %d topics", ph, name(r.ErrorCode), len(r.Topics)))
		}
		if live {
			continue // the tool's --delete and --delete-offsets ran against the live groups
		}
		del := kmsg.NewPtrDeleteGroupsRequest()
		del.Groups = []string{g}
		delResp, err := del.RequestWith(cctx, cl)
		if err != nil {
			return "", fmt.Errorf("DeleteGroups %s: %w", g, err)
		}
		for _, r := range delResp.Groups {
			lines = append(lines, fmt.Sprintf("DeleteGroups %s: %s", ph, name(r.ErrorCode)))
		}
		od := kmsg.NewPtrOffsetDeleteRequest()
		od.Group = g
		ot := kmsg.NewOffsetDeleteRequestTopic()
		ot.Topic = s.topic
		op := kmsg.NewOffsetDeleteRequestTopicPartition()
		ot.Partitions = append(ot.Partitions, op)
		od.Topics = append(od.Topics, ot)
		odResp, err := od.RequestWith(cctx, cl)
		if err != nil {
			return "", fmt.Errorf("OffsetDelete %s: %w", g, err)
		}
		lines = append(lines, fmt.Sprintf("OffsetDelete %s: %s", ph, name(odResp.ErrorCode)))
	}
	return strings.Join(lines, "\n"), nil
}

// groupsLoop runs kafka-consumer-groups many times in one JVM
// (interop/tools/ConsumerGroupsLoop.java), bootstrapped at the path under
// test. Its fields are used by the row's goroutine only; lines is fed by
// the reader goroutine.
type groupsLoop struct {
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	lines     chan string // stdout lines; closed at EOF
	bootstrap string
	dir       string
	runs      int
}

// groupsLoopEnd ends each run's output (ConsumerGroupsLoop.END).
const groupsLoopEnd = "@@kproxy-interop-end "

// startGroupsLoop starts ConsumerGroupsLoop with t's java, class path
// and main class.
func (s *scenario) startGroupsLoop(t *consumerGroupsTool) (*groupsLoop, error) {
	src := filepath.Join(s.h.root, "interop/tools/ConsumerGroupsLoop.java")
	argv := append(append([]string(nil), t.java...), src, t.mainClass)
	cmd := exec.Command(argv[0], argv[1:]...)
	stderr, err := os.Create(s.logPath("kafka-consumer-groups.stderr"))
	if err != nil {
		return nil, fmt.Errorf("stderr file: %w", err)
	}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		stderr.Close()
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stderr.Close()
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		stderr.Close()
		return nil, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	l := &groupsLoop{cmd: cmd, stdin: stdin, lines: make(chan string, 256), bootstrap: s.bootstrap, dir: s.dir}
	go func() {
		defer close(l.lines)
		defer stderr.Close()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<22)
		for sc.Scan() {
			l.lines <- sc.Text()
		}
		_ = cmd.Wait()
	}()
	return l, nil
}

// run runs kafka-consumer-groups --bootstrap-server BOOTSTRAP args... and
// returns its output (standard output and error) and, as its last line,
// its exit code "(exit N)". Each run's output is kept
// in the row's log directory as kafka-consumer-groups-N.txt.
func (l *groupsLoop) run(ctx context.Context, args ...string) (string, error) {
	l.runs++
	full := append([]string{"--bootstrap-server", l.bootstrap}, args...)
	if _, err := io.WriteString(l.stdin, strings.Join(full, "\t")+"\n"); err != nil {
		return "", fmt.Errorf("kafka-consumer-groups %s: the loop is gone: %w", strings.Join(args, " "), err)
	}
	timeout := time.NewTimer(anchorToolTimeout)
	defer timeout.Stop()
	var kept []string
	code := ""
	for code == "" {
		select {
		case line, ok := <-l.lines:
			if !ok {
				return "", fmt.Errorf("kafka-consumer-groups %s: the loop exited; stderr in %s", strings.Join(args, " "), filepath.Join(l.dir, "kafka-consumer-groups.stderr"))
			}
			if c, ok := strings.CutPrefix(line, groupsLoopEnd); ok {
				code = c
			} else if !strings.HasPrefix(line, "SLF4J") {
				kept = append(kept, line)
			}
		case <-timeout.C:
			return "", fmt.Errorf("kafka-consumer-groups %s: timed out after %s", strings.Join(args, " "), anchorToolTimeout)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	out := strings.TrimSpace(strings.Join(kept, "\n"))
	_ = os.WriteFile(filepath.Join(l.dir, fmt.Sprintf("kafka-consumer-groups-%d.txt", l.runs)),
		[]byte("$ kafka-consumer-groups "+strings.Join(args, " ")+"\n"+out+"\n(exit "+code+")\n"), 0o644)
	return out + "\n(exit " + code + ")", nil
}

// close ends the loop: end of input, then SIGKILL if it lingers.
func (l *groupsLoop) close() {
	_ = l.stdin.Close()
	d := drain(l.lines)
	select {
	case <-d:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
		<-d
	}
}

// drain consumes lines until it is closed; the returned channel closes then.
func drain(lines chan string) chan struct{} {
	done := make(chan struct{})
	go func() {
		for range lines {
		}
		close(done)
	}()
	return done
}
