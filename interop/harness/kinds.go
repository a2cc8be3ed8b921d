package main

// Every kind of group through kproxy (issue 19): share groups (KIP-932)
// and streams groups (KIP-1071), which only the cluster's coordinator
// serves; kproxy forwards their requests. Each row runs its scenario
// directly, through the tier's kproxy and through a fleet of two
// kproxies with one member on each, and holds them to the same outcome:
//
//   - java-share: two KafkaShareConsumers (kafka-clients 4.4.0) of one
//     share group; the first holds its first batch of acquired records
//     and is SIGKILLed with them. The broker releases them when its
//     connection closes, so the survivor gets them again (delivery count
//     2): every record read, none lost.
//   - go-franz-share: the same with franz-go's share consumer.
//   - java-streams: a Kafka Streams word count on group.protocol=streams
//     with exactly-once v2, two instances, one SIGKILLed mid-way: every
//     count exact once the input is read, the killed instance's tasks
//     taken over.
//   - java-streams-classic: the same word count on the classic group
//     protocol (Streams' default). kproxy's engine serves that group, so
//     it runs directly and through the tier's kproxy only (no fleet) and
//     is held to KPROXY_INTEROP_EXPECT_ENGINE; the survivor's time to
//     every count after the kill is compared between the paths.
//
// On a broker without the kind (4.1.1 has neither GA) the client's first
// error through kproxy must be the one it gets directly.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// shareGroups and streamsGroups are the group kinds of the rows; the
// cluster alone serves them, so a broker without them fails the rows on
// both paths alike.
var (
	shareGroups   = &feature{name: "share groups (ShareFetch v2)", since: "4.2.0", key: 78, minVersion: 2}
	streamsGroups = &feature{name: "streams groups (StreamsGroupHeartbeat)", since: "4.2.0", key: 88, minVersion: 0}
)

func init() { features = append(features, shareGroups, streamsGroups) }

const (
	kindRecords    = 1000 // records of a share row
	kindLines      = 2000 // input lines of a streams row
	kindWords      = 40   // distinct words of a streams row
	kindPartitions = 3
	kindFleetPort  = 100 // offset of the kinds fleet's ports from the tier's kproxy port
)

// kindOutcome is what one path of a kinds row saw, for the comparison of
// the kproxy path with the direct one.
type kindOutcome struct {
	firstError string        // on a broker without the kind: the client's first error
	shareRead  int           // share-serve rows, directly: records the consumers read
	takeover   time.Duration // streams rows: kill → the survivor has every count
}

// kindProc is one client process of a kinds row; its stdout lines are
// read into lines.
type kindProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when stdout is drained and the process reaped

	mu    sync.Mutex
	lines []string // guarded by mu
}

// startKindProc starts argv, its stdout and stderr copied to the row's
// log dir and its stdout lines kept.
func (s *scenario) startKindProc(name string, argv []string) (*kindProc, error) {
	lf, err := os.Create(s.logPath(name + ".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		lf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &kindProc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer lf.Close()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(lf, line)
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	return p, nil
}

// snapshot returns the lines read so far.
func (p *kindProc) snapshot() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// has reports whether a line starting with prefix was printed.
func (p *kindProc) has(prefix string) bool {
	for _, l := range p.snapshot() {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

// firstError returns the first ERROR line, or "".
func (p *kindProc) firstError() string {
	for _, l := range p.snapshot() {
		if strings.HasPrefix(l, "ERROR ") {
			return l
		}
	}
	return ""
}

// kill SIGKILLs the process group and waits for it.
func (p *kindProc) kill() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
}

// stop asks the process to end (SIGTERM: a member leaves its group as an
// application stopping does) and waits up to within for it, then kills
// it. It reports whether the process ended on its own.
func (p *kindProc) stop(within time.Duration) bool {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
		return true
	case <-time.After(within):
		p.kill()
		return false
	}
}

// kindJava returns the argv prefix of a kinds program (interop/kinds).
func (h *harness) kindJava(class string) []string {
	cp := filepath.Join(h.root, "interop/kinds/target/classes") + ":" + filepath.Join(h.root, "interop/kinds/target/lib/*")
	return []string{"java", "-Xmx256m", "-Xss512k", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
		// A classic group's joins and assignments, for the logs.
		"-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients.consumer.internals.ConsumerCoordinator=info",
		"-cp", cp, "io.kproxy.interop.kinds." + class}
}

// runKind runs a kinds row on s.path; prior is the direct path's outcome.
func (s *scenario) runKind(ctx context.Context, bin string, basePort int, prior *kindOutcome) (res result, out *kindOutcome) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	defer s.finish(&res, start)
	fail := func(format string, args ...any) (result, *kindOutcome) {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res, nil
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	if s.r.shareFleet {
		return s.runShareFleet(ctx, bin, basePort, prior)
	}
	if s.r.shareServe {
		return s.runShareServe(ctx, bin, basePort, prior)
	}
	need := shareGroups
	if s.r.kind == "streams" {
		need = streamsGroups
	}
	classic := s.r.groupProtocol == "classic"
	if !classic && !s.h.brokerHas(need) {
		return s.runKindMissing(ctx, need, prior)
	}
	targets := []struct{ name, a, b string }{{"", s.bootstrap, s.bootstrap}}
	if s.path == "kproxy" && !classic {
		nodes, err := s.startFleetOf(ctx, bin, basePort+kindFleetPort, 2)
		defer func() {
			var wg sync.WaitGroup
			for _, n := range nodes {
				wg.Add(1)
				go func(n *fleetNode) { defer wg.Done(); n.proc.stop() }(n)
			}
			wg.Wait()
		}()
		if err != nil {
			return fail("%v", err)
		}
		targets = append(targets, struct{ name, a, b string }{"fleet", nodes[0].proc.addr, nodes[1].proc.addr})
	}
	res.pass = true
	out = &kindOutcome{}
	for _, tg := range targets {
		var err error
		label := "through the tier's kproxy"
		switch {
		case s.path == "direct":
			label = "directly"
		case tg.name == "fleet":
			label = "through a fleet of two kproxies, one member on each"
		}
		if s.r.kind == "share" {
			err = s.runShareOnce(ctx, tg.name, tg.a, tg.b, label)
		} else {
			var took time.Duration
			took, err = s.runStreamsOnce(ctx, tg.name, tg.a, tg.b, label)
			if tg.name == "" {
				out.takeover = took
				res.settle = "takeover " + fmtDur(took)
			}
		}
		if err != nil {
			return fail("%s: %v", label, err)
		}
	}
	res.records = kindRecords
	if s.r.kind == "streams" {
		res.records = kindLines
		if s.path == "kproxy" && prior != nil && prior.takeover > 0 {
			s.note("kill → m2 had every count: %s through kproxy, %s directly (%+.1fs)",
				fmtDur(out.takeover), fmtDur(prior.takeover), (out.takeover - prior.takeover).Seconds())
			if classic && out.takeover > prior.takeover+takeoverSlack {
				return fail("m2 had every count %s after the kill through kproxy, %s directly: more than %s later",
					fmtDur(out.takeover), fmtDur(prior.takeover), takeoverSlack)
			}
		}
	}
	return res, out
}

// runKindMissing runs the row's client once against a broker without the
// kind: it must fail, and through kproxy with the error it gets directly.
func (s *scenario) runKindMissing(ctx context.Context, need *feature, prior *kindOutcome) (result, *kindOutcome) {
	res := result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	topic, group := s.topic, s.group
	if err := s.h.createTopic(ctx, topic, kindPartitions); err != nil {
		res.reason = err.Error()
		return res, nil
	}
	var argv []string
	if s.r.kind == "share" {
		argv = s.shareArgv(s.bootstrap, group, topic, "m1", 0)
	} else {
		argv = append(s.h.kindJava("WordCount"), "--bootstrap", s.bootstrap, "--group", group, "--in", topic,
			"--out", topic+"-out", "--state-dir", s.logPath("state-m1"), "--name", "m1", "--seconds", "20")
	}
	p, err := s.startKindProc("m1", argv)
	if err != nil {
		res.reason = err.Error()
		return res, nil
	}
	defer p.kill()
	_, _ = s.waitFor(30*time.Second, "the client's first error", func() bool { return p.firstError() != "" })
	got := normalizeKindError(p.firstError(), group)
	if got == "" {
		res.reason = fmt.Sprintf("Kafka %s lacks %s, yet the client reported no error", s.h.kafkaVersion, need.name)
		return res, nil
	}
	res.pass, res.xfail = true, true
	res.notes = append(res.notes, fmt.Sprintf("Kafka %s lacks %s: the client fails with %q", s.h.kafkaVersion, need.name, got))
	if s.path == "kproxy" && prior != nil && prior.firstError != got {
		res.pass, res.xfail = false, false
		res.reason = fmt.Sprintf("through kproxy the client fails with %q, directly with %q", got, prior.firstError)
	}
	return res, &kindOutcome{firstError: got}
}

// normalizeKindError drops what differs between two runs of the same
// failure (the group's name, addresses) from an ERROR line.
func normalizeKindError(line, group string) string {
	if group != "" {
		line = strings.ReplaceAll(line, group, "GROUP")
	}
	var out []string
	for _, f := range strings.Fields(line) {
		if strings.Contains(f, "127.0.0.1:") {
			f = "ADDR"
		}
		out = append(out, f)
	}
	return strings.Join(out, " ")
}

// setGroupConfig sets one dynamic group config (KIP-848's group configs)
// on the broker.
func (h *harness) setGroupConfig(ctx context.Context, group, name, value string) error {
	return setGroupConfigWith(ctx, h.cl, group, name, value)
}

// setGroupConfigVia is setGroupConfig through addr (a kproxy), and waits
// until DescribeConfigs through each of readers shows the value: kproxy
// keeps GROUP configs itself for a cluster without them (Kafka 3.x), and
// every kproxy of a fleet follows them.
func (h *harness) setGroupConfigVia(ctx context.Context, addr string, readers []string, group, name, value string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := setGroupConfigWith(ctx, cl, group, name, value); err != nil {
		return err
	}
	for _, r := range readers {
		rcl, err := kgo.NewClient(kgo.SeedBrokers(r))
		if err != nil {
			return err
		}
		deadline := time.Now().Add(15 * time.Second)
		for !groupConfigIs(ctx, rcl, group, name, value) {
			if time.Now().After(deadline) {
				rcl.Close()
				return fmt.Errorf("%s=%s of group %s set through %s, not read back through %s within 15 s", name, value, group, addr, r)
			}
			time.Sleep(100 * time.Millisecond)
		}
		rcl.Close()
	}
	return nil
}

// groupConfigIs reports whether DescribeConfigs on cl reads group's
// config name as value.
func groupConfigIs(ctx context.Context, cl *kgo.Client, group, name, value string) bool {
	req := kmsg.NewPtrDescribeConfigsRequest()
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	r.ConfigNames = []string{name}
	req.Resources = append(req.Resources, r)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(cctx, cl)
	if err != nil {
		return false
	}
	for _, rr := range resp.Resources {
		for _, c := range rr.Configs {
			if rr.ErrorCode == 0 && c.Name == name && c.Value != nil && *c.Value == value {
				return true
			}
		}
	}
	return false
}

// setGroupConfigWith is setGroupConfig on cl.
func setGroupConfigWith(ctx context.Context, cl *kgo.Client, group, name, value string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = name, kmsg.StringPtr(value)
	r.Configs = append(r.Configs, c)
	req.Resources = append(req.Resources, r)
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	resp, err := req.RequestWith(cctx, cl)
	if err != nil {
		return fmt.Errorf("setting %s of group %s: %w", name, group, err)
	}
	for _, rr := range resp.Resources {
		if err := kerr.ErrorForCode(rr.ErrorCode); err != nil {
			return fmt.Errorf("setting %s of group %s: %w", name, group, err)
		}
	}
	return nil
}

// produceValues writes values to topic, round robin over its partitions.
func (h *harness) produceValues(ctx context.Context, topic string, values []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.broker), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = kgo.StringRecord(v)
	}
	if err := cl.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("producing to %s: %w", topic, err)
	}
	return nil
}

// shareRec is one record a share consumer printed.
type shareRec struct {
	value      string
	deliveries int
}

// shareRecs parses a share consumer's REC lines; batch1 are the records
// of its first batch.
func shareRecs(lines []string) (all []shareRec, batch1 []string) {
	inFirst := true
	for _, l := range lines {
		if strings.HasPrefix(l, "BATCH ") {
			inFirst = false
			continue
		}
		f := strings.Fields(l)
		if len(f) != 5 || f[0] != "REC" {
			continue
		}
		d, _ := strconv.Atoi(f[3])
		all = append(all, shareRec{value: f[4], deliveries: d})
		if inFirst {
			batch1 = append(batch1, f[4])
		}
	}
	return all, batch1
}

// shareArgv returns the argv of share member name of group on topic at
// addr, holding each batch holdMS: the row's Go client (goclient -mode
// share, franz-go) when it names one, else the Java Share program.
func (s *scenario) shareArgv(addr, group, topic, name string, holdMS int) []string {
	if len(s.r.client) > 0 {
		return append(append([]string(nil), s.r.client...), "--mode", "share", "--bootstrap", addr, "--group", group,
			"--topic", topic, "--member", name, "--hold-ms", strconv.Itoa(holdMS))
	}
	return append(s.h.kindJava("Share"), "--bootstrap", addr, "--group", group, "--topic", topic,
		"--name", name, "--hold-ms", strconv.Itoa(holdMS), "--seconds", "120")
}

// runShareOnce runs the share scenario once with its members bootstrapped
// at a and b.
func (s *scenario) runShareOnce(ctx context.Context, suffix, a, b, label string) error {
	topic, group := s.topic, s.group
	if suffix != "" {
		topic, group = topic+"-"+suffix, group+"-"+suffix
	}
	if err := s.h.createTopic(ctx, topic, kindPartitions); err != nil {
		return err
	}
	if err := s.h.setGroupConfig(ctx, group, "share.auto.offset.reset", "earliest"); err != nil {
		return err
	}
	pre := "share"
	if suffix != "" {
		pre += "-" + suffix
	}
	m1, err := s.startKindProc(pre+"-m1", s.shareArgv(a, group, topic, "m1", 60000))
	if err != nil {
		return err
	}
	defer m1.kill()
	m2, err := s.startKindProc(pre+"-m2", s.shareArgv(b, group, topic, "m2", 0))
	if err != nil {
		return err
	}
	defer m2.kill()
	if _, err := s.waitFor(60*time.Second, "both share consumers to start", func() bool { return m1.has("STARTED") && m2.has("STARTED") }); err != nil {
		return err
	}
	values := make([]string, kindRecords)
	for i := range values {
		values[i] = fmt.Sprintf("v%05d", i)
	}
	if err := s.h.produceValues(ctx, topic, values); err != nil {
		return err
	}
	if _, err := s.waitFor(60*time.Second, "m1's first batch", func() bool { return m1.has("BATCH 1") }); err != nil {
		return fmt.Errorf("%v (m1: %s; m2: %s)", err, m1.firstError(), m2.firstError())
	}
	m1.kill() // holding its first batch, unacknowledged
	_, held := shareRecs(m1.snapshot())
	killed := time.Now()
	seen := func() map[string]int {
		got := map[string]int{}
		r1, _ := shareRecs(m1.snapshot())
		r2, _ := shareRecs(m2.snapshot())
		for _, r := range append(r1, r2...) {
			got[r.value]++
		}
		return got
	}
	redelivered := func() int {
		r2, _ := shareRecs(m2.snapshot())
		again := map[string]bool{}
		for _, r := range r2 {
			if r.deliveries >= 2 {
				again[r.value] = true
			}
		}
		n := 0
		for _, v := range held {
			if again[v] {
				n++
			}
		}
		return n
	}
	_, err = s.waitFor(90*time.Second, "every record read and m1's held batch redelivered to m2", func() bool {
		return len(seen()) == kindRecords && redelivered() == len(held)
	})
	got := seen()
	deliveries := 0
	for _, n := range got {
		deliveries += n
	}
	var lost []string
	for _, v := range values {
		if got[v] == 0 {
			lost = append(lost, v)
		}
	}
	sort.Strings(lost)
	s.note("%s: %d of %d records read, %d deliveries; m1 SIGKILLed holding %d acquired records, %d of them redelivered to m2 (delivery count 2) within %s",
		label, len(got), kindRecords, deliveries, len(held), redelivered(), fmtDur(time.Since(killed)))
	if err != nil {
		if len(lost) > 10 {
			lost = append(lost[:10], "...")
		}
		return fmt.Errorf("%v: lost %v; m2's first error %q", err, lost, m2.firstError())
	}
	if len(held) == 0 {
		return fmt.Errorf("m1 held no records when killed: the row proves nothing")
	}
	if len(s.r.tools) > 0 {
		m2.kill()
		return s.shareTools(ctx, a, group, topic, label)
	}
	return nil
}

// shareTools runs Kafka's kafka-share-groups (ShareGroupCommand) through
// addr and against the broker for group, once its members are gone: the
// list, the offsets, the members and the state must read the same both
// ways (the coordinator's address aside), and a reset of the offsets to
// the latest through addr must reach the broker.
func (s *scenario) shareTools(ctx context.Context, addr, group, topic, label string) error {
	t, err := s.newConsumerGroupsTool(ctx)
	if err != nil {
		return err
	}
	t.mainClass = strings.Replace(t.mainClass, "ConsumerGroupCommand", "ShareGroupCommand", 1)
	run := func(at string, args ...string) (string, error) {
		t.bootstrap = at
		return t.run(ctx, args...)
	}
	// The members' sessions end on the broker (SIGKILL: no leave).
	if _, err := s.waitFor(60*time.Second, "the share group to be empty", func() bool {
		out, err := run(s.h.broker, "--describe", "--group", group, "--state")
		return err == nil && strings.Contains(out, " Empty ")
	}); err != nil {
		return err
	}
	same := func(what string, args ...string) error {
		via, err := run(addr, args...)
		if err != nil {
			return err
		}
		direct, err := run(s.h.broker, args...)
		if err != nil {
			return err
		}
		if normalizeKindError(via, "") != normalizeKindError(direct, "") {
			return fmt.Errorf("kafka-share-groups %s %s reads\n%s\nand directly\n%s", what, strings.Join(args, " "), via, direct)
		}
		return nil
	}
	list, err := run(addr, "--list")
	if err != nil {
		return err
	}
	if !slices.Contains(strings.Fields(list), group) {
		return fmt.Errorf("kafka-share-groups --list %s lacks %s: %s", label, group, list)
	}
	for _, args := range [][]string{
		{"--describe", "--group", group},
		{"--describe", "--group", group, "--members"},
		{"--describe", "--group", group, "--state"},
	} {
		if err := same(label, args...); err != nil {
			return err
		}
	}
	if _, err := run(addr, "--reset-offsets", "--group", group, "--topic", topic, "--to-latest", "--execute"); err != nil {
		return err
	}
	end, err := s.h.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return err
	}
	req := kmsg.NewPtrDescribeShareGroupOffsetsRequest()
	g := kmsg.NewDescribeShareGroupOffsetsRequestGroup()
	g.GroupID = group
	req.Groups = append(req.Groups, g)
	resp, err := req.RequestWith(ctx, s.h.cl)
	if err != nil {
		return fmt.Errorf("DescribeShareGroupOffsets %s: %w", group, err)
	}
	got := 0
	for _, rg := range resp.Groups {
		for _, tp := range rg.Topics {
			for _, p := range tp.Partitions {
				if o, ok := end.Lookup(topic, p.Partition); ok && p.StartOffset == o.Offset {
					got++
				}
			}
		}
	}
	if got != kindPartitions {
		return fmt.Errorf("after kafka-share-groups --reset-offsets --to-latest %s, %d of %d partitions start at their end on the broker: %+v",
			label, got, kindPartitions, resp.Groups)
	}
	s.note("%s: kafka-share-groups --list, --describe (offsets, --members, --state) read as against the broker; --reset-offsets --to-latest reached it", label)
	return nil
}

// words returns the input lines of a streams row and the counts they make.
func words() ([]string, map[string]int64) {
	lines := make([]string, kindLines)
	want := map[string]int64{}
	for i := range lines {
		w1, w2 := fmt.Sprintf("w%02d", i%kindWords), fmt.Sprintf("w%02d", (i*7+3)%kindWords)
		lines[i] = w1 + " " + w2
		want[w1]++
		want[w2]++
	}
	return lines, want
}

// readCounts reads a word count's output (read_committed) and returns
// each word's last count. The transaction markers are kept, so the read
// ends as soon as it reaches every partition's end offset: an
// exactly-once output ends with a marker, and without them the read
// waited out its 20 s timeout on every call, which made the takeover
// times of the streams rows multiples of it.
func (h *harness) readCounts(ctx context.Context, topic string) (map[string]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.broker), kgo.ConsumeTopics(topic), kgo.KeepControlRecords(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	end, err := h.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	want := map[int32]int64{}
	end.Each(func(o kadm.ListedOffset) { want[o.Partition] = o.Offset })
	got := map[string]int64{}
	pos := map[int32]int64{}
	done := func() bool {
		for p, o := range want {
			if pos[p] < o {
				return false
			}
		}
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for !done() {
		fs := cl.PollFetches(rctx)
		if rctx.Err() != nil {
			break // an open transaction holds the rest
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() && len(r.Value) == 8 {
				var n int64
				for _, b := range r.Value {
					n = n<<8 | int64(b)
				}
				got[string(r.Key)] = n
			}
			pos[r.Partition] = r.Offset + 1
		})
	}
	return got, nil
}

// runStreamsOnce runs the streams scenario once with its instances
// bootstrapped at a and b, on the row's group protocol, and returns the
// time from m1's kill until m2 had every count.
func (s *scenario) runStreamsOnce(ctx context.Context, suffix, a, b, label string) (time.Duration, error) {
	in, group := s.topic, s.group
	if suffix != "" {
		in, group = in+"-"+suffix, group+"-"+suffix
	}
	out := in + "-out"
	for _, t := range []string{in, out} {
		if err := s.h.createTopic(ctx, t, kindPartitions); err != nil {
			return 0, err
		}
	}
	lines, want := words()
	half := len(lines) / 2
	if err := s.h.produceValues(ctx, in, lines[:half]); err != nil {
		return 0, err
	}
	pre := "streams"
	if suffix != "" {
		pre += "-" + suffix
	}
	protocol := s.r.groupProtocol
	if protocol == "" {
		protocol = "streams"
	}
	start := func(name, addr string) (*kindProc, error) {
		return s.startKindProc(pre+"-"+name, append(s.h.kindJava("WordCount"), "--bootstrap", addr, "--group", group,
			"--in", in, "--out", out, "--state-dir", s.logPath(pre+"-state-"+name), "--name", name, "--seconds", "300",
			"--protocol", protocol))
	}
	m1, err := start("m1", a)
	if err != nil {
		return 0, err
	}
	defer m1.kill()
	m2, err := start("m2", b)
	if err != nil {
		return 0, err
	}
	defer m2.kill()
	running := func(p *kindProc) bool {
		l := p.snapshot()
		for i := len(l) - 1; i >= 0; i-- {
			if strings.HasPrefix(l[i], "STATE ") {
				return l[i] == "STATE RUNNING"
			}
		}
		return false
	}
	if _, err := s.waitFor(90*time.Second, "both instances RUNNING", func() bool { return running(m1) && running(m2) }); err != nil {
		return 0, fmt.Errorf("%v (m1: %s; m2: %s)", err, m1.firstError(), m2.firstError())
	}
	// The first half counted by the two, then m1 killed mid-stream.
	half1 := map[string]int64{}
	for _, l := range lines[:half] {
		for _, w := range strings.Fields(l) {
			half1[w]++
		}
	}
	if err := s.waitCounts(ctx, out, half1, 90*time.Second); err != nil {
		return 0, fmt.Errorf("first half: %v (m1: %s; m2: %s)", err, m1.firstError(), m2.firstError())
	}
	m1.kill()
	killed := time.Now()
	if err := s.h.produceValues(ctx, in, lines[half:]); err != nil {
		return 0, err
	}
	if err := s.waitCounts(ctx, out, want, 120*time.Second); err != nil {
		return 0, fmt.Errorf("after m1 was killed: %v (m2: %s)", err, m2.firstError())
	}
	took := time.Since(killed)
	s.note("%s: %d words of %d lines counted exactly (exactly-once v2, group.protocol=%s) after m1 was SIGKILLed; m2 had every count %s after the kill",
		label, len(want), len(lines), protocol, fmtDur(took))
	if e := m2.firstError(); e != "" {
		return took, fmt.Errorf("m2 reported %s", e)
	}
	return took, nil
}

// waitCounts waits until the word count's output holds want exactly; a
// count above want (a record counted twice) fails at once.
func (s *scenario) waitCounts(ctx context.Context, out string, want map[string]int64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		got, err := s.h.readCounts(ctx, out)
		if err == nil {
			exact := len(got) == len(want)
			for w, n := range want {
				if got[w] > n {
					return fmt.Errorf("word %s counted %d times, %d in the input: counted twice", w, got[w], n)
				}
				if got[w] != n {
					exact = false
				}
			}
			if exact {
				return nil
			}
			if time.Now().After(deadline) {
				short := 0
				for w, n := range want {
					if got[w] != n {
						short++
					}
				}
				return fmt.Errorf("%d of %d words not at their count after %s", short, len(want), within)
			}
		} else if time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Second)
	}
}
