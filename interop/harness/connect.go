package main

// kafka-connect (issue 21): Kafka Connect in distributed mode, a program
// nobody here wrote, directly and through the tier's kproxy with the same
// assertions. Two workers (org.apache.kafka.connect.cli.ConnectDistributed,
// connect-runtime 4.1.1 from interop/connect) form one Connect group,
// bootstrapped at the path's address; a FileStream source connector reads
// a file of numbered lines into a topic and a FileStream sink connector
// writes the topic into a file. Once the first lines are in the sink file,
// the worker running the source task is SIGKILLed and more lines are
// appended to the source file. The survivor must take over every task
// (the Connect group's rebalance: kproxy's engine on the kproxy path, as
// is the sink's consumer group) and every line must reach the sink file
// within a bound: no line missing, none garbled, duplicates only as
// at-least-once delivery permits (counted). The times from the kill to
// the tasks running on the survivor and to the last line delivered are
// compared between the paths.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	connectLines      = 1000 // source lines before the kill; as many again after it
	connectPartitions = 3    // partitions of the topic between the connectors
	connectRestPort   = 70   // the workers' REST ports: the tier's kproxy port +70 and +71
	connectSource     = "org.apache.kafka.connect.file.FileStreamSourceConnector"
	connectSink       = "org.apache.kafka.connect.file.FileStreamSinkConnector"
	// takeoverSlack is how much later than directly a killed member's work
	// may move through kproxy (the Connect and the classic Streams rows):
	// both paths wait out the same 10 s session, so a few seconds of a
	// loaded 2-core machine, not a second session or a rebalance timeout.
	takeoverSlack = 10 * time.Second
)

// connectOutcome is what one path of the Connect row measured, for the
// comparison of the kproxy path with the direct one.
type connectOutcome struct {
	moved      time.Duration // kill → every connector and task RUNNING on the survivor
	delivered  time.Duration // kill → every line in the sink file
	duplicates int           // sink lines beyond the first copy of each
}

// connectWorker is one Connect worker process of the row.
type connectWorker struct {
	name string
	id   string // Connect's worker id: the advertised REST host:port
	url  string // its REST base URL
	proc *kindProc
}

// connectorStatus is the answer of GET /connectors/NAME/status.
type connectorStatus struct {
	Name      string `json:"name"`
	Connector struct {
		State    string `json:"state"`
		WorkerID string `json:"worker_id"`
	} `json:"connector"`
	Tasks []struct {
		ID       int    `json:"id"`
		State    string `json:"state"`
		WorkerID string `json:"worker_id"`
		Trace    string `json:"trace"`
	} `json:"tasks"`
}

// runningOn reports whether the connector and all its tasks (at least
// one) run, on worker id when id is not "".
func (st connectorStatus) runningOn(id string) bool {
	if st.Connector.State != "RUNNING" || (id != "" && st.Connector.WorkerID != id) || len(st.Tasks) == 0 {
		return false
	}
	for _, t := range st.Tasks {
		if t.State != "RUNNING" || (id != "" && t.WorkerID != id) {
			return false
		}
	}
	return true
}

// String summarizes the status for failure messages.
func (st connectorStatus) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: connector %s on %s", st.Name, st.Connector.State, st.Connector.WorkerID)
	for _, t := range st.Tasks {
		fmt.Fprintf(&b, ", task %d %s on %s", t.ID, t.State, t.WorkerID)
		if t.Trace != "" {
			fmt.Fprintf(&b, " (%.200s)", t.Trace)
		}
	}
	return b.String()
}

// connectHTTP is the REST client of the row's requests; the workers
// listen on loopback only.
var connectHTTP = &http.Client{Timeout: 10 * time.Second}

// rest sends one request to a worker and decodes a 2xx JSON answer into
// out (when not nil); it returns the status code.
func (w *connectWorker) rest(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, w.url+path, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := connectHTTP.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s%s: %w", method, w.url, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s%s: reading the answer: %w", method, w.url, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s%s: %s: %.300s", method, w.url, path, resp.Status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s%s: %w: %.300s", method, w.url, path, err, b)
		}
	}
	return resp.StatusCode, nil
}

// status returns a connector's status as the worker sees it.
func (w *connectWorker) status(ctx context.Context, name string) (connectorStatus, error) {
	var st connectorStatus
	_, err := w.rest(ctx, http.MethodGet, "/connectors/"+name+"/status", nil, &st)
	return st, err
}

// exited reports whether the worker's process has ended.
func (w *connectWorker) exited() bool {
	select {
	case <-w.proc.done:
		return true
	default:
		return false
	}
}

// connectPoll calls cond every 250 ms until it holds, fails at once when
// a worker of live (the ones the row did not kill) has exited, and gives
// up after timeout with cond's last error.
func (s *scenario) connectPoll(ctx context.Context, timeout time.Duration, what string, live []*connectWorker, cond func() (bool, error)) (time.Duration, error) {
	start := time.Now()
	var last error
	for {
		ok, err := cond()
		if ok {
			return time.Since(start), nil
		}
		if err != nil {
			last = err
		}
		for _, w := range live {
			if w.exited() {
				return time.Since(start), fmt.Errorf("worker %s exited while waiting for %s: %s", w.name, what, tail(s.logPath(w.proc.name+".log"), 600))
			}
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("timed out after %s waiting for %s (last: %v)", timeout, what, last)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// connectLine is the source file's line number n.
func connectLine(n int) string { return fmt.Sprintf("line-%06d", n) }

// appendLines appends lines from..to-1 to the file at path.
func appendLines(path string, from, to int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("source file: %w", err)
	}
	w := bufio.NewWriter(f)
	for n := from; n < to; n++ {
		fmt.Fprintln(w, connectLine(n))
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("source file: %w", err)
	}
	return f.Close()
}

// sinkFile is what the sink file holds: each numbered line's copies, and
// the lines that are not a line of the source file.
type sinkFile struct {
	copies  map[int]int
	total   int
	garbled []string
}

// readSink reads the sink file (missing = empty): only whole lines count.
func readSink(path string) (sinkFile, error) {
	sf := sinkFile{copies: map[int]int{}}
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return sf, nil
	}
	if err != nil {
		return sf, fmt.Errorf("sink file: %w", err)
	}
	lines := strings.Split(string(b), "\n")
	for _, l := range lines[:len(lines)-1] { // the last one is unterminated or empty
		n, err := strconv.Atoi(strings.TrimPrefix(l, "line-"))
		if err != nil || !strings.HasPrefix(l, "line-") || l != connectLine(n) {
			sf.garbled = append(sf.garbled, l)
			continue
		}
		sf.copies[n]++
		sf.total++
	}
	return sf, nil
}

// missing returns the lines of 0..n-1 the sink file lacks.
func (sf sinkFile) missing(n int) []int {
	var out []int
	for i := 0; i < n; i++ {
		if sf.copies[i] == 0 {
			out = append(out, i)
		}
	}
	return out
}

// loopbackOnly reads the kernel's table of listening TCP sockets
// (/proc/net/tcp and tcp6) and fails unless every socket listening on
// port is bound to 127.0.0.1 (or its IPv4-mapped IPv6 form), and one is.
func loopbackOnly(port int) error {
	hexPort := fmt.Sprintf(":%04X", port)
	found := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading %s: %w", f, err)
		}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) < 4 || fs[3] != "0A" || !strings.HasSuffix(fs[1], hexPort) { // 0A: LISTEN
				continue
			}
			addr := strings.TrimSuffix(fs[1], hexPort)
			switch addr {
			case "0100007F", "0000000000000000FFFF00000100007F":
				found++
			default:
				return fmt.Errorf("a socket listens on port %d at %s (%s), not on 127.0.0.1", port, addr, f)
			}
		}
	}
	if found == 0 {
		return fmt.Errorf("nothing listens on port %d", port)
	}
	return nil
}

// connectLog4j is the workers' log4j2 configuration: warnings, and the
// distributed herder's and the worker's own lines (joins, assignments,
// task starts), on stderr, which the row keeps in wN.log.
const connectLog4j = `status = warn
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = err
logger.herder.name = org.apache.kafka.connect.runtime.distributed
logger.herder.level = info
logger.worker.name = org.apache.kafka.connect.runtime.Worker
logger.worker.level = info
`

// workerProps returns a worker's configuration: the Connect group and its
// topics named after the row's group, the REST server on 127.0.0.1 only,
// offsets flushed every second, a killed worker's tasks reassigned as
// soon as the group notices (scheduled.rebalance.max.delay.ms=0, the
// default waits 5 min for it to return) within a 10 s session, for the
// workers and the sink's consumers alike.
func (s *scenario) workerProps(port int) string {
	g := s.group
	return strings.Join([]string{
		"bootstrap.servers=" + s.bootstrap,
		"group.id=" + g,
		"config.storage.topic=" + g + "-configs",
		"offset.storage.topic=" + g + "-offsets",
		"status.storage.topic=" + g + "-status",
		"config.storage.replication.factor=1",
		"offset.storage.replication.factor=1",
		"status.storage.replication.factor=1",
		"offset.storage.partitions=3",
		"status.storage.partitions=1",
		"key.converter=org.apache.kafka.connect.json.JsonConverter",
		"value.converter=org.apache.kafka.connect.json.JsonConverter",
		"key.converter.schemas.enable=false",
		"value.converter.schemas.enable=false",
		fmt.Sprintf("listeners=http://127.0.0.1:%d", port),
		"rest.advertised.host.name=127.0.0.1",
		fmt.Sprintf("rest.advertised.port=%d", port),
		"plugin.discovery=service_load",
		"offset.flush.interval.ms=1000",
		"scheduled.rebalance.max.delay.ms=0",
		"session.timeout.ms=10000",
		"heartbeat.interval.ms=1000",
		"consumer.session.timeout.ms=10000",
		"consumer.heartbeat.interval.ms=1000",
		"",
	}, "\n")
}

// runConnect runs the Connect row on s.path; prior is the direct path's
// outcome, for the comparison on the kproxy path.
func (s *scenario) runConnect(ctx context.Context, kproxyPort int, prior *connectOutcome) (res result, out *connectOutcome) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	defer s.finish(&res, start)
	fail := func(format string, args ...any) (result, *connectOutcome) {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res, nil
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	lib := filepath.Join(s.h.root, "interop/connect/target/lib")
	if jars, _ := filepath.Glob(filepath.Join(lib, "connect-runtime-*.jar")); len(jars) == 0 {
		return fail("no connect-runtime jar in %s: interop/run.sh builds interop/connect (mvn package)", lib)
	}
	if err := s.h.createTopic(ctx, s.topic, connectPartitions); err != nil {
		return fail("%v", err)
	}
	srcPath, sinkPath := s.logPath("source.txt"), s.logPath("sink.txt")
	if err := appendLines(srcPath, 0, connectLines); err != nil {
		return fail("%v", err)
	}
	logCfg := s.logPath("log4j2.properties")
	if err := os.WriteFile(logCfg, []byte(connectLog4j), 0o644); err != nil {
		return fail("log4j2 config: %v", err)
	}

	// Two workers of one Connect group, bootstrapped at the path.
	var workers []*connectWorker
	defer func() {
		for _, w := range workers {
			w.proc.kill()
		}
	}()
	for i, name := range []string{"w1", "w2"} {
		port := kproxyPort + connectRestPort + i
		props := s.logPath(name + ".properties")
		if err := os.WriteFile(props, []byte(s.workerProps(port)), 0o644); err != nil {
			return fail("worker config: %v", err)
		}
		argv := []string{"java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
			"-Dlog4j2.configurationFile=" + logCfg, "-cp", lib + "/*",
			"org.apache.kafka.connect.cli.ConnectDistributed", props}
		p, err := s.startKindProc(name, argv)
		if err != nil {
			return fail("%v", err)
		}
		id := fmt.Sprintf("127.0.0.1:%d", port)
		workers = append(workers, &connectWorker{name: name, id: id, url: "http://" + id, proc: p})
	}
	// GET /health answers 200 once the worker has joined its group and
	// read the config topic (KIP-1017).
	up, err := s.connectPoll(ctx, 120*time.Second, "both workers healthy (GET /health)", workers, func() (bool, error) {
		for _, w := range workers {
			if _, err := w.rest(ctx, http.MethodGet, "/health", nil, nil); err != nil {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		return fail("%v", err)
	}
	for i, w := range workers {
		if err := loopbackOnly(kproxyPort + connectRestPort + i); err != nil {
			return fail("worker %s's REST server: %v", w.name, err)
		}
	}

	srcName, sinkName := s.group+"-source", s.group+"-sink"
	configs := []struct {
		name string
		cfg  map[string]string
	}{
		{srcName, map[string]string{"connector.class": connectSource, "tasks.max": "1", "file": srcPath, "topic": s.topic}},
		// Three sink tasks, one per partition: with the source task
		// that makes four, two on each worker (Connect balances the task
		// counts), so the killed worker takes a member of the sink's
		// consumer group with it too. They append whole lines to one
		// file (one write each).
		{sinkName, map[string]string{"connector.class": connectSink, "tasks.max": strconv.Itoa(connectPartitions), "file": sinkPath, "topics": s.topic}},
	}
	for i, c := range configs {
		// Through either worker: a follower forwards to the leader.
		// A rebalance under way answers 409; try again.
		w := workers[i%len(workers)]
		if _, err := s.connectPoll(ctx, 60*time.Second, "creating connector "+c.name, workers, func() (bool, error) {
			_, err := w.rest(ctx, http.MethodPut, "/connectors/"+c.name+"/config", c.cfg, nil)
			return err == nil, err
		}); err != nil {
			return fail("%v", err)
		}
	}
	var st map[string]connectorStatus
	statuses := func(w *connectWorker, id string) (bool, error) {
		st = map[string]connectorStatus{}
		ok := true
		for _, n := range []string{srcName, sinkName} {
			x, err := w.status(ctx, n)
			if err != nil {
				return false, err
			}
			st[n] = x
			if !x.runningOn(id) {
				ok = false
			}
		}
		if !ok {
			return false, fmt.Errorf("%v; %v", st[srcName], st[sinkName])
		}
		return true, nil
	}
	running, err := s.connectPoll(ctx, 60*time.Second, "both connectors and their tasks RUNNING", workers, func() (bool, error) { return statuses(workers[0], "") })
	if err != nil {
		return fail("%v", err)
	}
	_, err = s.connectPoll(ctx, 60*time.Second, fmt.Sprintf("the first %d lines in the sink file", connectLines), workers, func() (bool, error) {
		sf, err := readSink(sinkPath)
		return err == nil && len(sf.missing(connectLines)) == 0, err
	})
	if err != nil {
		return fail("%v", err)
	}
	if _, err := statuses(workers[0], ""); err != nil {
		return fail("before the kill: %v", err)
	}
	before := fmt.Sprintf("%v; %v", st[srcName], st[sinkName])

	// SIGKILL the worker that runs the source task, then more lines.
	victim, survivor := workers[0], workers[1]
	if st[srcName].Tasks[0].WorkerID == workers[1].id {
		victim, survivor = workers[1], workers[0]
	}
	sinkMoved := 0
	for _, t := range st[sinkName].Tasks {
		if t.WorkerID == victim.id {
			sinkMoved++
		}
	}
	victim.proc.kill()
	killed := time.Now()
	if err := appendLines(srcPath, connectLines, 2*connectLines); err != nil {
		return fail("%v", err)
	}
	live := []*connectWorker{survivor}
	_, err = s.connectPoll(ctx, 90*time.Second, "every connector and task RUNNING on the survivor "+survivor.name, live,
		func() (bool, error) { return statuses(survivor, survivor.id) })
	if err != nil {
		return fail("after %s was killed: %v (before: %s)", victim.name, err, before)
	}
	moved := time.Since(killed)
	var sf sinkFile
	_, err = s.connectPoll(ctx, 90*time.Second, fmt.Sprintf("all %d lines in the sink file", 2*connectLines), live, func() (bool, error) {
		var err error
		sf, err = readSink(sinkPath)
		return err == nil && len(sf.missing(2*connectLines)) == 0, err
	})
	delivered := time.Since(killed)
	if err != nil {
		miss := sf.missing(2 * connectLines)
		sample := miss
		if len(sample) > 10 {
			sample = sample[:10]
		}
		return fail("after %s was killed: %v: %d lines missing, e.g. %v", victim.name, err, len(miss), sample)
	}
	if len(sf.garbled) > 0 {
		sort.Strings(sf.garbled)
		return fail("the sink file holds %d lines that are no source line, e.g. %q", len(sf.garbled), sf.garbled[0])
	}
	// Only a line read before the kill may come twice: its source offset
	// or its sink commit may not have been flushed when the worker died.
	// A line appended after the kill is read by the survivor alone, with
	// no failure after it.
	var again []int
	for n := connectLines; n < 2*connectLines; n++ {
		if sf.copies[n] > 1 {
			again = append(again, n)
		}
	}
	if len(again) > 0 {
		return fail("%d lines appended after the kill are in the sink file more than once (e.g. line %d %d times): at-least-once permits duplicates only of what was in flight at the kill",
			len(again), again[0], sf.copies[again[0]])
	}
	maxCopies := 0
	for _, c := range sf.copies {
		maxCopies = max(maxCopies, c)
	}
	out = &connectOutcome{moved: moved, delivered: delivered, duplicates: sf.total - 2*connectLines}
	res.records = 2 * connectLines
	res.settle = fmt.Sprintf("%s/%s/%s", fmtDur(up+running), fmtDur(out.moved), fmtDur(out.delivered))
	s.note("%s: before the kill %s; %s (running the source task and %d of the %d sink tasks) SIGKILLed, %d lines appended; every task on %s %s after the kill, all %d lines in the sink file %s after it; %d duplicates, all of lines read before the kill (at most %d copies of one; at-least-once, offsets flushed every 1 s)",
		s.path, before, victim.name, sinkMoved, connectPartitions, connectLines, survivor.name, fmtDur(out.moved), 2*connectLines, fmtDur(out.delivered), out.duplicates, maxCopies)
	if s.path == "kproxy" && prior != nil {
		s.note("kill → tasks on the survivor: %s through kproxy, %s directly (%+.1fs); kill → every line: %s vs %s; duplicates %d vs %d",
			fmtDur(out.moved), fmtDur(prior.moved), (out.moved - prior.moved).Seconds(),
			fmtDur(out.delivered), fmtDur(prior.delivered), out.duplicates, prior.duplicates)
		if out.moved > prior.moved+takeoverSlack {
			return fail("the tasks moved %s after the kill through kproxy, %s directly: more than %s later",
				fmtDur(out.moved), fmtDur(prior.moved), takeoverSlack)
		}
	}
	res.pass = true
	return res, out
}
