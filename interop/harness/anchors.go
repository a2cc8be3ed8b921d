package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The anchor rows (docs/anchors.md, README "Rolling kproxy into a running
// application, and back"): every group kproxy serves holds one static
// member in the cluster's own group coordinator, its anchor
// (group.instance.id kproxy-anchor, client id kproxy), and a group live on
// the cluster without an anchor is forwarded to the cluster's coordinator.
//
// anchor-admin: a franz-go member consumes and commits through the path;
// then Kafka's own kafka-consumer-groups (ConsumerGroupCommand, against the
// broker directly) must see the group live: --describe shows one member
// (the anchor, client id kproxy, through kproxy; the member itself
// directly) owning every partition, with the committed offsets; --delete
// fails NON_EMPTY_GROUP, --delete-offsets GROUP_SUBSCRIBED_TO_TOPIC, and
// the offsets stay; once the member left, the group is Empty on the
// cluster (the anchor left) and --delete succeeds. The direct path is the
// control: the same tool, the same answers, for a group the cluster serves.
//
// franz-adoption: three franz-go members (cooperative-sticky) consume
// directly while records stream in; one at a time each is restarted
// behind a kproxy of its own (a fleet of three, distributed mode), then
// one at a time back to the broker. Directly the same moves are a plain
// rolling restart. Both paths check: no partition held by two members at
// once, every record consumed, committed offsets (sampled from the broker
// every anchorSampleEvery) never decrease; the duplicates of the two
// paths are compared.

const (
	anchorRecords     = 300              // anchor-admin: records consumed before the tool runs
	adoptionFirst     = 300              // franz-adoption: records before the moves
	adoptionStream    = 900              // franz-adoption: records streamed during the moves
	adoptionEvery     = 20               // ms between streamed records
	adoptionFleet     = 3                // kproxies of the adoption fleet, one per member
	adoptionIdleGrace = 10 * time.Second // a moved-back member may idle (docs/anchors.md) once this passed
	// kip848HandBackBound bounds a move back of a KIP-848 member through
	// kproxy: the anchor leaves once kproxy's members were fenced (at
	// their next heartbeat to kproxy) or a heartbeat interval (5 s) and
	// a second after the unload, and the member moved back gets the
	// anchor's partitions at its next heartbeat to the broker, 5 s after
	// its join (docs/anchors.md): 5.0-5.6 s measured, 10.1-10.6 s when
	// the anchor left after that heartbeat (32 s when the hand-back
	// waited a fixed 30 s).
	kip848HandBackBound = 20 * time.Second
	// classicHandBackBound bounds a move back of a classic member through
	// kproxy: the anchor learns of the direct member within 250 ms (3 s before),
	// kproxy's members follow at their next heartbeat (3.0-6.1 s
	// measured; 22.6-23.7 s for static members when the hand-back counted
	// them by number and waited for the one replaced).
	classicHandBackBound = 15 * time.Second
	adoptionProgress     = 15 * time.Second       // every moved-in member commits within this
	anchorSampleEvery    = 300 * time.Millisecond // committed offsets sampling period
	anchorToolTimeout    = 60 * time.Second       // one kafka-consumer-groups run
	anchorClientID       = "kproxy"               // the anchor's client id
	// adoptionTraffic is why the adoption rows' groups reach the broker
	// on the kproxy path (row.brokerGroupTraffic).
	adoptionTraffic = "the group is live on the cluster while its members move, so kproxy forwards their group requests to the cluster's coordinator (docs/anchors.md, per-group forwarding)"
)

// consumerGroupsTool runs Kafka's kafka-consumer-groups against the broker.
type consumerGroupsTool struct {
	java      []string // java and its flags, class path included
	mainClass string
	bootstrap string
	dir       string // where each run's output is saved
	runs      int
}

// newConsumerGroupsTool asks `kafka.sh tools` (row.tools) for the class
// path and main class of kafka-consumer-groups of the broker's version,
// fetching the jars once.
func (s *scenario) newConsumerGroupsTool(ctx context.Context) (*consumerGroupsTool, error) {
	return s.newConsumerGroupsToolOf(ctx, s.h.kafkaVersion)
}

// newConsumerGroupsToolOf is newConsumerGroupsTool with the tools of
// Kafka version ("" for kafka.sh's default).
func (s *scenario) newConsumerGroupsToolOf(ctx context.Context, version string) (*consumerGroupsTool, error) {
	if len(s.r.tools) == 0 {
		return nil, fmt.Errorf("row has no tools command")
	}
	argv := append([]string(nil), s.r.tools...)
	if version != "" {
		argv = append(argv, "--version", version)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Fields(strings.TrimSpace(string(out)))
	if len(lines) != 2 {
		return nil, fmt.Errorf("%s printed %q, want a class path and a main class", strings.Join(argv, " "), out)
	}
	return &consumerGroupsTool{
		java: []string{"java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
			"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", lines[0]},
		mainClass: lines[1], bootstrap: s.h.broker, dir: s.dir,
	}, nil
}

// run runs kafka-consumer-groups --bootstrap-server BROKER args... and
// returns its output without the SLF4J noise. The tool exits 0 on most
// errors, so callers judge the text; the output is kept in the row's log
// directory as kafka-consumer-groups-N.txt.
func (t *consumerGroupsTool) run(ctx context.Context, args ...string) (string, error) {
	t.runs++
	cctx, cancel := context.WithTimeout(ctx, anchorToolTimeout)
	defer cancel()
	argv := append(append(append([]string(nil), t.java...), t.mainClass, "--bootstrap-server", t.bootstrap), args...)
	cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
	b, err := cmd.CombinedOutput()
	var kept []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "SLF4J") {
			kept = append(kept, l)
		}
	}
	out := strings.TrimSpace(strings.Join(kept, "\n"))
	_ = os.WriteFile(filepath.Join(t.dir, fmt.Sprintf("kafka-consumer-groups-%d.txt", t.runs)),
		[]byte("$ kafka-consumer-groups "+strings.Join(args, " ")+"\n"+out+"\n"), 0o644)
	if cctx.Err() != nil {
		return out, fmt.Errorf("kafka-consumer-groups %s: timed out after %s", strings.Join(args, " "), anchorToolTimeout)
	}
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			return out, fmt.Errorf("kafka-consumer-groups %s: %w", strings.Join(args, " "), err)
		}
	}
	return out, nil
}

// describedOffset is one line of `kafka-consumer-groups --describe`.
type describedOffset struct {
	topic           string
	partition       int32
	current, end    int64 // -1 for "-"
	lag             int64 // -1 for "-"
	consumer, cliID string
}

// describedMember is one line of `kafka-consumer-groups --describe --members`.
type describedMember struct {
	consumer, instance, cliID string // instance "" when the tool prints no such column
	partitions                int
}

// toolInt parses a number column; "-" is -1.
func toolInt(s string) (int64, error) {
	if s == "-" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// parseDescribeOffsets reads the data lines of --describe for group:
// GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID.
func parseDescribeOffsets(out, group string) ([]describedOffset, error) {
	var rows []describedOffset
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != group {
			continue
		}
		if len(f) != 9 {
			return nil, fmt.Errorf("unexpected --describe line %q", l)
		}
		p, err1 := strconv.ParseInt(f[2], 10, 32)
		cur, err2 := toolInt(f[3])
		end, err3 := toolInt(f[4])
		lag, err4 := toolInt(f[5])
		for _, err := range []error{err1, err2, err3, err4} {
			if err != nil {
				return nil, fmt.Errorf("unexpected --describe line %q: %v", l, err)
			}
		}
		rows = append(rows, describedOffset{topic: f[1], partition: int32(p), current: cur, end: end, lag: lag, consumer: f[6], cliID: f[8]})
	}
	return rows, nil
}

// parseDescribeMembers reads the data lines of --describe --members:
// GROUP CONSUMER-ID [GROUP-INSTANCE-ID] HOST CLIENT-ID #PARTITIONS (the
// tool adds the instance id column when a member is static, as the
// anchor is).
func parseDescribeMembers(out, group string) ([]describedMember, error) {
	var rows []describedMember
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != group {
			continue
		}
		if len(f) != 5 && len(f) != 6 {
			return nil, fmt.Errorf("unexpected --describe --members line %q", l)
		}
		n, err := strconv.Atoi(f[len(f)-1])
		if err != nil {
			return nil, fmt.Errorf("unexpected --describe --members line %q: %v", l, err)
		}
		m := describedMember{consumer: f[1], cliID: f[len(f)-2], partitions: n}
		if len(f) == 6 {
			m.instance = f[2]
		}
		rows = append(rows, m)
	}
	return rows, nil
}

// parseDescribeState reads the data line of --describe --state:
// GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS.
func parseDescribeState(out, group string) (state string, members int, err error) {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != group {
			continue
		}
		n, err := strconv.Atoi(f[len(f)-1])
		if err != nil {
			return "", 0, fmt.Errorf("unexpected --describe --state line %q: %v", l, err)
		}
		return f[len(f)-2], n, nil
	}
	return "", 0, fmt.Errorf("no --describe --state line for %s in %q", group, out)
}

// committedOffsets reads group's committed offsets of topic from the broker
// (partitions without a commit are left out).
func (h *harness) committedOffsets(ctx context.Context, group, topic string) (map[int32]int64, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	comm, err := h.adm.FetchOffsetsForTopics(cctx, group, topic)
	if err != nil {
		return nil, err
	}
	if err := comm.Error(); err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	comm.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.At >= 0 {
			out[o.Partition] = o.At
		}
	})
	return out, nil
}

// clusterGroup describes group as the broker's coordinator sees it.
func (h *harness) clusterGroup(ctx context.Context, group string) (kadm.DescribedGroup, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dg, err := h.adm.DescribeGroups(cctx, group)
	if err != nil {
		return kadm.DescribedGroup{}, err
	}
	g, ok := dg[group]
	if !ok {
		return kadm.DescribedGroup{}, fmt.Errorf("group %s missing from DescribeGroups", group)
	}
	return g, g.Err
}

// clusterMembers returns the state of group on the broker and its
// members' client ids, for a classic group (DescribeGroups) or a KIP-848
// one (ConsumerGroupDescribe, which Kafka answers where DescribeGroups
// says the group is not a classic one).
func (h *harness) clusterMembers(ctx context.Context, group string) (string, []string, error) {
	g, err := h.clusterGroup(ctx, group)
	if err == nil {
		var ids []string
		for _, m := range g.Members {
			ids = append(ids, m.ClientID)
		}
		return g.State, ids, nil
	}
	if !errors.Is(err, kerr.GroupIDNotFound) {
		return "", nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dg, derr := h.adm.DescribeConsumerGroups(cctx, group)
	if derr != nil {
		return "", nil, fmt.Errorf("%w; ConsumerGroupDescribe: %w", err, derr)
	}
	cg, ok := dg[group]
	if !ok || cg.Err != nil {
		return "", nil, fmt.Errorf("%w; ConsumerGroupDescribe: %v", err, cg.Err)
	}
	var ids []string
	for _, m := range cg.Members {
		ids = append(ids, m.ClientID)
	}
	return cg.State, ids, nil
}

// errorSummary names the client error events seen so far and the first
// one, for failure messages (the notes list more).
func (s *scenario) errorSummary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.errorsSeen == 0 {
		return "no client error events"
	}
	return fmt.Sprintf("%d client error events, the first %s", s.errorsSeen, s.errorSamples[0])
}

// finish fills the common end of a row's result: elapsed time, notes and
// client error events.
func (s *scenario) finish(res *result, start time.Time) {
	res.elapsed = time.Since(start)
	s.mu.Lock()
	res.notes = append(res.notes, s.notes...)
	if s.errorsSeen > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d client error events, e.g. %s", s.errorsSeen, strings.Join(s.errorSamples, " | ")))
	}
	if s.foreignCommits > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d commits of partitions the member did not own by its callbacks, e.g. %s", s.foreignCommits, strings.Join(s.foreignSamples, " | ")))
	}
	if s.dropped > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d records dropped by members after a rebalance took their partition", s.dropped))
	}
	s.mu.Unlock()
}

// runAnchorAdmin runs the anchor-admin row on s.path.
func (s *scenario) runAnchorAdmin(ctx context.Context) (res result) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	defer func() {
		s.killAll(!res.pass)
		s.finish(&res, start)
	}()
	fail := func(format string, args ...any) result {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	tool, err := s.newConsumerGroupsTool(ctx)
	if err != nil {
		return fail("kafka-consumer-groups: %v", err)
	}
	n, parts := anchorRecords, s.h.partitions
	if err := s.h.createTopic(ctx, s.topic, parts); err != nil {
		return fail("%v", err)
	}
	if err := s.runOnce("producer-1", s.clientArgs("produce", "producer-1", "--count", fmt.Sprint(n), "--start", "0"), 90*time.Second); err != nil {
		return fail("produce: %v", err)
	}
	m, err := s.startMember("m1", s.clientArgs("consume", "m1"))
	if err != nil {
		return fail("%v", err)
	}
	m.identity = s.identity("m1")
	d, err := s.waitFor(s.h.settleTimeout, "m1's assignment", func() bool { return s.stableLocked([]*member{m}) })
	if err != nil {
		return fail("join: %v; %s", err, s.ownersSummary())
	}
	settles := []string{fmtDur(d)}
	if _, err := s.waitFor(s.h.consumeTimeout, "every record to be consumed", func() bool { return s.distinctLocked(0, n) == n }); err != nil {
		return fail("%v (consumed %d distinct of %d)", err, s.distinctLocked(0, n), n)
	}
	if err := s.h.waitCommitted(ctx, s); err != nil {
		return fail("%v", err)
	}
	before, err := s.h.committedOffsets(ctx, s.group, s.topic)
	if err != nil {
		return fail("committed offsets: %v", err)
	}

	// Whom the cluster must show: the anchor through kproxy, the member
	// itself directly.
	wantClient := "m1"
	if s.path == "kproxy" {
		wantClient = anchorClientID
	}
	out, err := tool.run(ctx, "--describe", "--group", s.group)
	if err != nil {
		return fail("%v", err)
	}
	offs, err := parseDescribeOffsets(out, s.group)
	if err != nil {
		return fail("%v", err)
	}
	// Every partition at its committed offset with lag 0, held by the
	// member directly and by the anchor through kproxy (it assigns
	// itself the partitions kproxy's members own: groupstate's
	// Anchor.SameMembership).
	var bad []string
	seenParts := map[int32]bool{}
	held := 0
	for _, o := range offs {
		if o.topic != s.topic {
			bad = append(bad, "topic "+o.topic)
			continue
		}
		seenParts[o.partition] = true
		okClient := o.cliID == wantClient
		if c, ok := before[o.partition]; !ok || o.current != c || o.lag != 0 || o.end != c || !okClient {
			bad = append(bad, fmt.Sprintf("p%d current %d end %d lag %d client %s (committed %d)", o.partition, o.current, o.end, o.lag, o.cliID, c))
		}
		if o.cliID == wantClient {
			held++
		}
	}
	if len(seenParts) != parts || len(bad) > 0 {
		return fail("kafka-consumer-groups --describe: want %d partitions of %s at the committed offsets, lag 0, client id %s; got %d: %s; output: %s",
			parts, s.topic, wantClient, len(seenParts), strings.Join(bad, ", "), out)
	}
	out, err = tool.run(ctx, "--describe", "--members", "--group", s.group)
	if err != nil {
		return fail("%v", err)
	}
	mems, err := parseDescribeMembers(out, s.group)
	if err != nil {
		return fail("%v", err)
	}
	if len(mems) != 1 || mems[0].cliID != wantClient || mems[0].partitions != held {
		return fail("kafka-consumer-groups --describe --members: want one member, client id %s, owning %d partitions (as --describe showed); got %+v; output: %s", wantClient, held, mems, out)
	}
	out, err = tool.run(ctx, "--describe", "--state", "--group", s.group)
	if err != nil {
		return fail("%v", err)
	}
	state, count, err := parseDescribeState(out, s.group)
	if err != nil {
		return fail("%v", err)
	}
	if state != "Stable" || count != 1 {
		return fail("kafka-consumer-groups --describe --state: want Stable with 1 member, got %s with %d; output: %s", state, count, out)
	}
	if s.path == "kproxy" && !strings.HasPrefix(mems[0].instance, "kproxy-anchor") {
		return fail("kafka-consumer-groups --describe --members: the member's group.instance.id is %q, not kproxy-anchor...; output: %s", mems[0].instance, out)
	}
	s.note("kafka-consumer-groups --describe (broker %s): %s, 1 member %s (instance id %q, client id %s) owning %d partitions, %d of %d partitions at the committed offsets with lag 0",
		s.h.broker, state, mems[0].consumer, mems[0].instance, mems[0].cliID, mems[0].partitions, len(offs), parts)

	// The cluster refuses to delete a live group or a subscribed topic's
	// offsets: through the tool, and by error code with raw requests.
	out, err = tool.run(ctx, "--delete", "--group", s.group)
	if err != nil {
		return fail("%v", err)
	}
	if !strings.Contains(out, "GroupNotEmptyException") || strings.Contains(out, "was successful") {
		return fail("kafka-consumer-groups --delete of the live group: want GroupNotEmptyException (NON_EMPTY_GROUP), got: %s", out)
	}
	out, err = tool.run(ctx, "--delete-offsets", "--group", s.group, "--topic", s.topic)
	if err != nil {
		return fail("%v", err)
	}
	if !strings.Contains(out, "GroupSubscribedToTopicException") {
		return fail("kafka-consumer-groups --delete-offsets of the subscribed topic: want GroupSubscribedToTopicException (GROUP_SUBSCRIBED_TO_TOPIC), got: %s", out)
	}
	if err := s.rawDeletesRefused(ctx); err != nil {
		return fail("%v", err)
	}
	after, err := s.h.committedOffsets(ctx, s.group, s.topic)
	if err != nil {
		return fail("committed offsets after the refused deletes: %v", err)
	}
	if fmt.Sprint(after) != fmt.Sprint(before) {
		return fail("committed offsets changed by the refused deletes: %v before, %v after", before, after)
	}
	s.note("--delete: GroupNotEmptyException (NON_EMPTY_GROUP), --delete-offsets: GroupSubscribedToTopicException (GROUP_SUBSCRIBED_TO_TOPIC), the same codes for raw DeleteGroups/OffsetDelete; offsets unchanged")

	// The member leaves; the group empties on the cluster (through
	// kproxy: the anchor leaves once kproxy's group is empty) and can be
	// deleted.
	stopAt := time.Now()
	if err := s.stop(m, 30*time.Second); err != nil {
		return fail("stopping m1: %v", err)
	}
	var last string
	for {
		g, err := s.h.clusterGroup(ctx, s.group)
		if err == nil && g.State == "Empty" && len(g.Members) == 0 {
			break
		}
		last = fmt.Sprintf("state %q, %d members, err %v", g.State, len(g.Members), err)
		if time.Since(stopAt) > 30*time.Second {
			return fail("the group never became Empty on the cluster within 30s of m1's leave: %s", last)
		}
		time.Sleep(100 * time.Millisecond)
	}
	empty := time.Since(stopAt)
	settles = append(settles, fmtDur(empty))
	out, err = tool.run(ctx, "--delete", "--group", s.group)
	if err != nil {
		return fail("%v", err)
	}
	if !strings.Contains(out, "was successful") {
		return fail("kafka-consumer-groups --delete after the member left: %s", out)
	}
	if left, err := s.h.committedOffsets(ctx, s.group, s.topic); err == nil && len(left) > 0 {
		return fail("offsets %v remain after the group was deleted", left)
	}
	s.note("m1 left: the group was Empty on the cluster %s later and --delete succeeded; settle column = join/leave→Empty", fmtDur(empty))
	res.settle = strings.Join(settles, "/")

	s.mu.Lock()
	res.records = s.distinctLocked(0, n)
	s.mu.Unlock()
	rebalances, err := s.checkOwnership()
	res.rebalances = rebalances
	if err != nil {
		return fail("%v", err)
	}
	res.pass = true
	return res
}

// rawDeletesRefused sends DeleteGroups and OffsetDelete for the live group
// to the broker and requires NON_EMPTY_GROUP and GROUP_SUBSCRIBED_TO_TOPIC.
func (s *scenario) rawDeletesRefused(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dg := kmsg.NewPtrDeleteGroupsRequest()
	dg.Groups = []string{s.group}
	dresp, err := dg.RequestWith(cctx, s.h.cl)
	if err != nil {
		return fmt.Errorf("DeleteGroups: %w", err)
	}
	if len(dresp.Groups) != 1 || dresp.Groups[0].ErrorCode != kerr.NonEmptyGroup.Code {
		return fmt.Errorf("DeleteGroups of the live group: want NON_EMPTY_GROUP, got %+v", dresp.Groups)
	}
	od := kmsg.NewPtrOffsetDeleteRequest()
	od.Group = s.group
	t := kmsg.NewOffsetDeleteRequestTopic()
	t.Topic = s.topic
	for p := range s.h.partitions {
		pp := kmsg.NewOffsetDeleteRequestTopicPartition()
		pp.Partition = int32(p)
		t.Partitions = append(t.Partitions, pp)
	}
	od.Topics = append(od.Topics, t)
	oresp, err := od.RequestWith(cctx, s.h.cl)
	if err != nil {
		return fmt.Errorf("OffsetDelete: %w", err)
	}
	if oresp.ErrorCode != 0 {
		return fmt.Errorf("OffsetDelete of the subscribed topic: top-level %v, want per-partition GROUP_SUBSCRIBED_TO_TOPIC", kerr.ErrorForCode(oresp.ErrorCode))
	}
	got := 0
	for _, rt := range oresp.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode != kerr.GroupSubscribedToTopic.Code {
				return fmt.Errorf("OffsetDelete of %s/%d: want GROUP_SUBSCRIBED_TO_TOPIC, got %v", rt.Topic, rp.Partition, kerr.ErrorForCode(rp.ErrorCode))
			}
			got++
		}
	}
	if got != s.h.partitions {
		return fmt.Errorf("OffsetDelete answered %d of %d partitions", got, s.h.partitions)
	}
	return nil
}

// offsetSampler reads a group's committed offsets from the broker every
// anchorSampleEvery and counts decreases. Its fields are guarded by mu.
type offsetSampler struct {
	mu        sync.Mutex
	last      map[int32]int64
	samples   int
	errs      int
	decreases []string
	stop      chan struct{}
	done      chan struct{}
}

// startOffsetSampler begins sampling s.group's offsets of s.topic.
func (s *scenario) startOffsetSampler(ctx context.Context) *offsetSampler {
	o := &offsetSampler{last: map[int32]int64{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(o.done)
		t := time.NewTicker(anchorSampleEvery)
		defer t.Stop()
		for {
			offs, err := s.h.committedOffsets(ctx, s.group, s.topic)
			o.mu.Lock()
			if err != nil {
				o.errs++
			} else {
				o.samples++
				for p, at := range offs {
					if prev, ok := o.last[p]; ok && at < prev {
						o.decreases = append(o.decreases, fmt.Sprintf("p%d %d→%d at %s", p, prev, at, time.Now().Format("15:04:05.000")))
					}
					o.last[p] = at
				}
			}
			o.mu.Unlock()
			select {
			case <-o.stop:
				return
			case <-t.C:
			}
		}
	}()
	return o
}

// finish stops the sampler and returns its sample count, errors and decreases.
func (o *offsetSampler) finish() (int, int, []string) {
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	<-o.done
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.samples, o.errs, append([]string(nil), o.decreases...)
}

// adoption is what a franz-adoption path measured, for the comparison of
// the kproxy path with the direct one.
type adoption struct {
	dups      int
	decreases int
	idle      int
}

// coveredLocked reports whether the live members of ms hold every
// partition exactly once and no other member holds any, with members that
// hold nothing allowed. Callers hold s.mu.
func (s *scenario) coveredLocked(ms []*member) bool {
	held := map[int32]int{}
	for _, m := range s.members {
		if strings.HasPrefix(m.name, "producer") || !m.live() {
			continue
		}
		if !contains(ms, m) && len(m.owned) > 0 {
			return false
		}
		for _, p := range m.owned {
			held[p]++
		}
	}
	for _, m := range ms {
		if !m.live() {
			return false
		}
	}
	if len(held) != s.h.partitions {
		return false
	}
	for _, c := range held {
		if c != 1 {
			return false
		}
	}
	return true
}

// startAdoptionFleet starts adoptionFleet kproxies in distributed mode
// with a fleet name of the row's own, as the fleet row does (fleet.go):
// listen ports basePort+10*i, admin servers +9, and waits until they
// serve the groups topic between them.
func (s *scenario) startAdoptionFleet(ctx context.Context, bin string, basePort int) ([]*fleetNode, error) {
	return s.startFleetOf(ctx, bin, basePort, adoptionFleet)
}

// startFleetOf starts n kproxies in distributed mode as one fleet named
// after the row's group, on ports basePort+10, +20, ... (admin +9), and
// waits until every one serves the groups topic's partitions.
func (s *scenario) startFleetOf(ctx context.Context, bin string, basePort, n int) ([]*fleetNode, error) {
	return s.startFleetWith(ctx, bin, basePort, n, nil)
}

// startFleetWith is startFleetOf with extra flags after the tier's (a
// flag given twice takes its last value).
func (s *scenario) startFleetWith(ctx context.Context, bin string, basePort, n int, extra []string) ([]*fleetNode, error) {
	bin, err := s.h.kproxyBinary(bin)
	if err != nil {
		return nil, err
	}
	fleetName := strings.TrimPrefix(s.group, "interop-")
	nodes := make([]*fleetNode, n)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		startErr []string
	)
	for i := range nodes {
		port := basePort + 10*(i+1)
		n := &fleetNode{name: fmt.Sprintf("kproxy-%d", i+1), admin: fmt.Sprintf("127.0.0.1:%d", port+9)}
		args := append(append([]string(nil), s.h.kproxyArgs...),
			"--fleet-name", fleetName, "--fleet-session-timeout", fleetSession,
			"--fleet-heartbeat-interval", fleetHeartbeat, "--group-initial-rebalance-delay", "0s",
			"--admin-listen", n.admin,
			// The takeover's and hand-back's reasons are logged at
			// debug: a row that fails shows why in the node's log.
			"--log-level", "debug")
		args = append(args, extra...)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			p, err := launchKproxy(ctx, s.h, bin, s.logPath(n.name+".log"), port, args)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				startErr = append(startErr, n.name+": "+err.Error())
				return
			}
			n.proc = p
			nodes[i] = n
		}(i)
	}
	wg.Wait()
	var up []*fleetNode
	for _, n := range nodes {
		if n != nil {
			up = append(up, n)
		}
	}
	if len(startErr) > 0 {
		return up, fmt.Errorf("fleet did not start: %s", strings.Join(startErr, "; "))
	}
	_, _, formed, err := waitFleet(ctx, up, true, 60*time.Second)
	if err != nil {
		return up, err
	}
	s.note("fleet of %d kproxies (distributed mode, fleet name %s) formed in %s", n, fleetName, fmtDur(formed))
	return up, nil
}

// adoptionTakeover bounds how long, once every member is behind kproxy
// and the group settled, kproxy may take to take a classic group over.
const adoptionTakeover = 20 * time.Second

// waitTakeover checks, once every member of the adoption rows is behind
// kproxy, what becomes of the group (docs/anchors.md, "Rolling kproxy
// in"): the group, classic or KIP-848, is taken over without a rebalance
// (the broker's coordinator then lists the anchor alone, and no member
// sees its partitions change).
func (s *scenario) waitTakeover(ctx context.Context, ms []*member) error {
	s.mu.Lock()
	changes := 0
	for _, m := range ms {
		changes += len(m.events)
	}
	s.mu.Unlock()
	began := time.Now()
	var state string
	var ids []string
	for {
		var err error
		state, ids, err = s.h.clusterMembers(ctx, s.group)
		switch {
		case err != nil && s.r.needs == kip848 && errors.Is(err, kerr.GroupIDNotFound) && time.Since(began) <= adoptionTakeover:
			// A KIP-848 takeover turns the broker's group into a
			// classic one (docs/anchors.md): a DescribeGroups before
			// and a ConsumerGroupDescribe after the conversion both
			// answer GROUP_ID_NOT_FOUND. Asked again.
			time.Sleep(100 * time.Millisecond)
			continue
		case err != nil:
			return fmt.Errorf("describing the group on the broker after the moves in: %w", err)
		}
		if len(ids) == 1 && ids[0] == anchorClientID && state == "Stable" {
			break
		}
		if time.Since(began) > adoptionTakeover {
			sort.Strings(ids)
			return fmt.Errorf("the group was not taken over within %s of every member moving behind kproxy: the broker's coordinator shows it %s with client ids %v", adoptionTakeover, state, ids)
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(began)
	if s.r.needs == kip848 {
		s.mu.Lock()
		s.epochsRestart = time.Now().UnixMilli()
		s.mu.Unlock()
	}
	// A KIP-848 group reconciles within an epoch, after its members
	// seemed settled: its changes count from 2 s before the takeover was
	// seen (kproxy takes it over only after 3 s without one, and the
	// takeover shows on the broker within about a second of its start).
	from := time.Now().Add(-2 * time.Second).UnixMilli()
	time.Sleep(3 * time.Second) // a rebalance the takeover caused shows by now
	s.mu.Lock()
	after := 0
	for _, m := range ms {
		after += len(m.events)
		if s.r.needs == kip848 {
			for _, e := range m.events {
				if e.TS < from {
					after--
				}
			}
		}
	}
	if s.r.needs == kip848 {
		changes = 0
	}
	s.mu.Unlock()
	if after != changes {
		return fmt.Errorf("kproxy's takeover of the group made its members rebalance: %d ownership changes within 3 s of it", after-changes)
	}
	s.note("taken over by kproxy %s after the last member's move settled, without a rebalance (the broker's coordinator lists the anchor alone; no member's partitions changed)", fmtDur(took))
	return nil
}

// runAdoption runs the franz-adoption row on s.path; prior is the direct
// path's outcome, if it ran first.
func (s *scenario) runAdoption(ctx context.Context, bin string, basePort int, prior *adoption) (res result, out *adoption) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	var nodes []*fleetNode
	var sampler *offsetSampler
	defer func() {
		if sampler != nil {
			sampler.finish()
		}
		s.killAll(!res.pass)
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Add(1)
			go func(n *fleetNode) { defer wg.Done(); n.proc.stop() }(n)
		}
		wg.Wait()
		s.finish(&res, start)
	}()
	fail := func(format string, args ...any) (result, *adoption) {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res, nil
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	// Where each member goes when it is moved in: its own kproxy, or
	// (directly) the broker again, a plain rolling restart.
	targets := make([]string, s.h.membersN)
	for i := range targets {
		targets[i] = s.h.broker
	}
	if s.path == "kproxy" {
		var err error
		nodes, err = s.startAdoptionFleet(ctx, bin, basePort)
		if err != nil {
			return fail("%v", err)
		}
		for i := range targets {
			targets[i] = nodes[i%len(nodes)].proc.addr
		}
	}
	if err := s.h.createTopic(ctx, s.topic, s.h.partitions); err != nil {
		return fail("%v", err)
	}
	total := adoptionFirst + adoptionStream
	producer := s.r.client
	if len(s.r.producer) > 0 {
		producer = s.r.producer
	}
	if err := s.runOnce("producer-1", s.argsFor(producer, s.h.broker, "produce", "producer-1", "--count", fmt.Sprint(adoptionFirst), "--start", "0"), 90*time.Second); err != nil {
		return fail("produce first records: %v", err)
	}
	next := 0
	// startAt starts the member of slot (0..membersN-1) at bootstrap; a
	// static row's member keeps its slot's group.instance.id across
	// moves, as a restarted static member does.
	startAt := func(bootstrap string, slot int) (*member, error) {
		next++
		name := fmt.Sprintf("m%d", next)
		var extra []string
		if s.r.static {
			extra = []string{"--instance-id", fmt.Sprintf("%s-s%d", s.group, slot)}
		}
		m, err := s.startMember(name, s.argsFor(s.r.client, bootstrap, "consume", name, extra...))
		if err != nil {
			return nil, err
		}
		m.identity = s.identity(name)
		if s.r.static {
			// The same instance id is the same owner (it was stopped
			// before it came back): the ownership checks follow the slot.
			m.identity = extra[1]
		}
		return m, nil
	}
	var ms []*member
	for slot := range s.h.membersN {
		m, err := startAt(s.h.broker, slot)
		if err != nil {
			return fail("%v", err)
		}
		ms = append(ms, m)
	}
	d, err := s.waitFor(s.h.settleTimeout, "the first assignment of all members", func() bool { return s.stableLocked(ms) })
	if err != nil {
		return fail("initial join: %v; %s", err, s.ownersSummary())
	}
	settles := []string{fmtDur(d)}
	if _, err := s.waitFor(s.h.consumeTimeout, "the first records to be consumed", func() bool { return s.distinctLocked(0, adoptionFirst) == adoptionFirst }); err != nil {
		return fail("%v (consumed %d distinct)", err, s.distinctLocked(0, adoptionFirst))
	}
	sampler = s.startOffsetSampler(ctx)
	prod, err := s.startMember("producer-2", s.argsFor(producer, s.h.broker, "produce", "producer-2",
		"--count", fmt.Sprint(adoptionStream), "--start", fmt.Sprint(adoptionFirst), "--interval-ms", fmt.Sprint(adoptionEvery)))
	if err != nil {
		return fail("%v", err)
	}
	if _, err := s.waitFor(30*time.Second, "streamed records to be consumed", func() bool { return s.distinctLocked(adoptionFirst, total) >= 30 }); err != nil {
		return fail("%v", err)
	}

	// In: one member at a time onto its kproxy (directly: restarted).
	rolled := time.Now()
	var moves []string
	for i := range ms {
		if err := s.stop(ms[i], 30*time.Second); err != nil {
			return fail("stopping %s: %v", ms[i].name, err)
		}
		at := time.Now()
		m, err := startAt(targets[i], i)
		if err != nil {
			return fail("%v", err)
		}
		ms[i] = m
		if _, err := s.waitFor(s.h.settleTimeout, "the group to settle after "+m.name+" started at "+targets[i], func() bool { return s.stableLocked(ms) }); err != nil {
			return fail("moving in: %v; %s", err, s.ownersSummary())
		}
		moves = append(moves, fmt.Sprintf("%s@%s %s", m.name, targets[i], fmtDur(time.Since(at))))
	}
	s.note("moves in (member@bootstrap settle): %s", strings.Join(moves, ", "))
	moves = nil
	// Every moved member consumes where it was moved to: records keep
	// streaming, so each commits within adoptionProgress.
	if _, err := s.waitFor(adoptionProgress, "every moved member to commit", func() bool {
		for _, m := range ms {
			if len(m.commits) == 0 {
				return false
			}
		}
		return true
	}); err != nil {
		s.mu.Lock()
		var idle []string
		for i, m := range ms {
			if len(m.commits) == 0 {
				idle = append(idle, fmt.Sprintf("%s@%s (owns %v)", m.name, targets[i], m.owned))
			}
		}
		s.mu.Unlock()
		return fail("after the moves in, %s consumed nothing within %s while records streamed: %v; %s", strings.Join(idle, ", "), adoptionProgress, err, s.errorSummary())
	}
	settles = append(settles, fmtDur(time.Since(rolled)))
	if s.path == "kproxy" {
		if err := s.waitTakeover(ctx, ms); err != nil {
			return fail("%v", err)
		}
	}

	// Out: one member at a time back to the broker. The first one makes
	// kproxy hand a classic group back (docs/anchors.md), so none idles;
	// a KIP-848 group's moved-back member may idle until the last member
	// left kproxy, the members behind kproxy holding every partition.
	rolled = time.Now()
	idle := 0
	var slowest time.Duration // the longest move back
	if s.r.rollbackAll {
		// Out all at once: the application stops, its sidecars stop,
		// and it starts again against the brokers (directly: a plain
		// restart of the whole application).
		for i := range ms {
			if err := s.stop(ms[i], 30*time.Second); err != nil {
				return fail("stopping %s: %v", ms[i].name, err)
			}
		}
		for _, n := range nodes {
			n.proc.stop()
		}
		if s.path == "kproxy" {
			// The last sidecar to stop takes the anchor out: the
			// broker's group is empty, its offsets kept.
			state, ids, err := s.h.clusterMembers(ctx, s.group)
			if err != nil {
				return fail("describing the group on the broker after the sidecars stopped: %v", err)
			}
			if len(ids) != 0 {
				return fail("after every sidecar stopped the broker's coordinator still shows the group %s with client ids %v", state, ids)
			}
			s.note("after every sidecar stopped the broker's group is %s with no member: the anchor left", state)
		}
		at := time.Now()
		for i := range ms {
			m, err := startAt(s.h.broker, i)
			if err != nil {
				return fail("%v", err)
			}
			ms[i] = m
		}
		if _, err := s.waitFor(s.h.settleTimeout, "the group to settle after every member started against the broker", func() bool { return s.stableLocked(ms) }); err != nil {
			return fail("moving back all at once: %v; %s", err, s.ownersSummary())
		}
		moves = append(moves, fmt.Sprintf("all %d members@%s %s", len(ms), s.h.broker, fmtDur(time.Since(at))))
	}
	for i := range ms {
		if s.r.rollbackAll {
			break
		}
		if err := s.stop(ms[i], 30*time.Second); err != nil {
			return fail("stopping %s: %v", ms[i].name, err)
		}
		at := time.Now()
		m, err := startAt(s.h.broker, i)
		if err != nil {
			return fail("%v", err)
		}
		ms[i] = m
		last := i == len(ms)-1
		if _, err := s.waitFor(s.h.settleTimeout, "the group to settle after "+m.name+" moved back", func() bool {
			return s.stableLocked(ms) || !last && time.Since(at) > adoptionIdleGrace && s.coveredLocked(ms)
		}); err != nil {
			return fail("moving back: %v; %s", err, s.ownersSummary())
		}
		s.mu.Lock()
		idles := len(m.owned) == 0
		owning, owns := firstOwning(m, at)
		s.mu.Unlock()
		if idles {
			idle++
		}
		took := time.Since(at)
		slowest = max(slowest, took)
		own := ""
		if owns && owning < took && fmtDur(owning) != fmtDur(took) {
			own = ", owning " + fmtDur(owning)
		}
		moves = append(moves, fmt.Sprintf("%s@%s %s%s%s", m.name, s.h.broker, fmtDur(took), own, map[bool]string{true: " (idle)"}[idles]))
	}
	settles = append(settles, fmtDur(time.Since(rolled)))
	res.settle = strings.Join(settles, "/")
	s.note("moves back (member@bootstrap settle, and when the member moved back owned a partition if that was sooner): %s; settle column = initial/roll in/roll back", strings.Join(moves, ", "))
	if idle > 0 {
		if s.path == "kproxy" && s.r.needs != kip848 {
			// A classic group is handed back when its first member
			// reaches the broker (docs/anchors.md): nobody idles.
			return fail("%d moved-back member(s) idled: the classic group was not handed back to the broker's coordinator; moves %s",
				idle, strings.Join(moves, ", "))
		}
		s.note("%d moved-back member(s) idled while kproxy handed the KIP-848 group back (documented: the anchor holds kproxy's partitions until kproxy's members were told to rejoin the broker's group, a heartbeat interval)", idle)
	}
	bound := classicHandBackBound
	if s.r.needs == kip848 {
		bound = kip848HandBackBound
	}
	if s.path == "kproxy" && slowest > bound {
		return fail("a move back took %s, more than %s: the hand-back waited too long; moves %s",
			fmtDur(slowest), bound, strings.Join(moves, ", "))
	}

	select {
	case <-prod.done:
	case <-time.After(90 * time.Second):
		return fail("producer-2 did not finish within 90s")
	}
	if s.prodFailed(prod) {
		return fail("producer-2 failed: %s", tail(s.logPath("producer-2.stderr"), 400))
	}
	if _, err := s.waitFor(s.h.consumeTimeout, "every record to be consumed", func() bool { return s.distinctLocked(0, total) == total }); err != nil {
		return fail("%v (consumed %d distinct of %d)", err, s.distinctLocked(0, total), total)
	}
	if err := s.h.waitCommitted(ctx, s); err != nil {
		return fail("%v", err)
	}
	samples, sampleErrs, decreases := sampler.finish()
	for _, m := range ms {
		if err := s.stop(m, 30*time.Second); err != nil {
			return fail("closing members: %v", err)
		}
	}
	for _, n := range nodes {
		if !n.proc.alive() && !s.r.rollbackAll {
			return fail("%s died: %s", n.name, tail(n.proc.logPath, 300))
		}
	}
	s.mu.Lock()
	res.records = s.distinctLocked(0, total)
	dups := s.consumed - res.records
	s.mu.Unlock()
	out = &adoption{dups: dups, decreases: len(decreases), idle: idle}
	s.note("committed offsets sampled from the broker %d times (every %s, %d failed reads): %d decreases", samples, anchorSampleEvery, sampleErrs, len(decreases))
	switch {
	case s.path == "direct":
		s.note("%d records consumed more than once (the plain rolling restart's duplicates)", dups)
	case prior != nil:
		s.note("%d records consumed more than once through kproxy, %d directly (the same moves as a plain rolling restart)", dups, prior.dups)
	default:
		s.note("%d records consumed more than once through kproxy (the direct path did not run for comparison)", dups)
	}
	rebalances, err := s.checkOwnership()
	res.rebalances = rebalances
	if err != nil {
		return fail("%v", err)
	}
	if len(decreases) > 0 {
		if len(decreases) > 5 {
			decreases = append(decreases[:5], fmt.Sprintf("... %d more", len(decreases)-5))
		}
		return fail("committed offsets went backwards %d times: %s", out.decreases, strings.Join(decreases, "; "))
	}
	if samples == 0 {
		return fail("the committed offsets were never sampled (%d failed reads)", sampleErrs)
	}
	res.pass = true
	return res, out
}

// firstOwning returns how long after at member m, moved back, was first
// given a partition (it consumes from then on), and false if it has not
// been; s.mu is held. The group may settle later: another member may
// still wait for its share.
func firstOwning(m *member, at time.Time) (time.Duration, bool) {
	for _, e := range m.events {
		if e.ownershipChange() && len(e.Partitions) > 0 {
			return time.UnixMilli(e.TS).Sub(at), true
		}
	}
	return 0, false
}
