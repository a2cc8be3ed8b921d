package e2e

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/kafkastore"
)

// BenchmarkFleet measures the distributed coordinator (docs/fleet.md)
// against `--groups local` and against the broker's own coordinator, in
// one run, with `kproxy serve` children in front of one in-memory kfake
// cluster in this process. Its parts (sub-benchmarks) are:
//
//   - latency: OffsetCommit and the leader's SyncGroup, one request at a
//     time from a one-member group, p50/p99 per path: the broker directly,
//     the broker's coordinator through a `--groups forward` kproxy, a
//     `--groups local` kproxy, a fleet of one, and a fleet of three with
//     the member on the group's owner and on a kproxy that relays to the
//     owner. Paths take turns in rounds so that noise of the shared
//     machine falls on all of them. It also counts the broker requests
//     each path's commits cost.
//   - failover: a fleet of three, SIGKILL of the owner of a group; the
//     time until an OffsetCommit through each surviving kproxy (the new
//     owner, and the one that relays to it) succeeds again, for a fleet
//     session timeout of 3s and of the default 10s.
//   - groups200: 200 groups of three members against the broker, a
//     `--groups local` kproxy, and a fleet of three with one member of
//     each group on each kproxy: the time until every group settled,
//     commits per second across all groups (every member committing one
//     request at a time), CPU per commit, broker requests per commit and
//     kproxy RSS.
//
// The tables go to stdout (b.Log keeps only a benchmark's first lines),
// the headline figures to b.ReportMetric too. It runs its work once
// whatever b.N is, in about 70s:
//
//	go test -run '^$' -bench BenchmarkFleet -benchtime 1x -timeout 10m ./e2e/
//
// $KPROXY_BENCH_COMMIT_FOR sets groups200's commit phase (default 5s);
// with GODEBUG=gctrace=1 the kproxies' last GC lines are printed too.
func BenchmarkFleet(b *testing.B) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(benchTopicPartitions, benchTopic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond), kfake.AllowAutoTopicCreation())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cluster.Close)
	reqs := countRequests(cluster)
	b.Run("latency", func(b *testing.B) { benchFleetLatency(b, cluster, reqs) })
	b.Run("failover", func(b *testing.B) { benchFleetFailover(b, cluster) })
	b.Run("groups200", func(b *testing.B) { benchFleetGroups(b, cluster, reqs) })
}

const (
	benchTopic           = "bench"
	benchTopicPartitions = 6
)

// fleetBenchArgs run a kproxy of a benchmark fleet named name: Kafka's
// defaults except no initial rebalance delay, so that a group's first
// generation does not wait 3s. session and heartbeat, if not "", set the
// fleet's timers.
func fleetBenchArgs(name, session, heartbeat string) []string {
	args := []string{"--groups", "distributed", "--fleet-name", name,
		"--group-initial-rebalance-delay", "0s", "--group-min-session-timeout", "1s"}
	if session != "" {
		args = append(args, "--fleet-session-timeout", session)
	}
	if heartbeat != "" {
		args = append(args, "--fleet-heartbeat-interval", heartbeat)
	}
	return args
}

// startFleet starts n kproxies of fleet name and waits until they share
// the groups topic's partitions; it returns them and who serves what.
func startBenchFleet(b *testing.B, cluster *kfake.Cluster, name string, n int, session, heartbeat string) ([]*kproxyProc, map[int32]string) {
	b.Helper()
	var procs []*kproxyProc
	for i := range n {
		procs = append(procs, startKproxy(b, name+"-"+strconv.Itoa(i), cluster.ListenAddrs(), fleetBenchArgs(name, session, heartbeat)...))
	}
	return procs, waitFleetSettled(b, procs, 60*time.Second)
}

// groupOwnedBy returns the first group name prefix-N whose groups-topic
// partition owners says is served by owner.
func groupOwnedBy(prefix string, owners map[int32]string, owner string) string {
	for i := 0; ; i++ {
		g := prefix + "-" + strconv.Itoa(i)
		if owners[kafkastore.GroupPartition(g, fleetPartitions)] == owner {
			return g
		}
	}
}

// requestCounts counts the requests kfake handles, by API key, and
// when it last began handling one of each key: the profile of where a
// coordinator request's time goes. Written by kfake's control functions
// (on kfake's loop), read by the benchmark.
type requestCounts struct {
	byKey [100]atomic.Int64
	last  [100]atomic.Int64 // UnixNano
}

func countRequests(c *kfake.Cluster) *requestCounts {
	rc := &requestCounts{}
	c.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		if k := req.Key(); k >= 0 && int(k) < len(rc.byKey) {
			rc.byKey[k].Add(1)
			rc.last[k].Store(time.Now().UnixNano())
		}
		c.KeepControl()
		return nil, nil, false
	})
	return rc
}

// stageKeys are the broker requests a coordinator's durable write is
// made of, in the order they are sent: OffsetCommit (local mode's
// commits), Produce, AddPartitionsToTxn, AddOffsetsToTxn,
// TxnOffsetCommit, EndTxn.
var stageKeys = []int16{8, 0, 24, 25, 28, 26}

// stages records, into into[key], how long after start the broker last
// began a request of each stage key, if it did after start.
func (rc *requestCounts) stages(start time.Time, into map[int16][]time.Duration) {
	for _, k := range stageKeys {
		if at := rc.last[k].Load(); at >= start.UnixNano() {
			into[k] = append(into[k], time.Duration(at-start.UnixNano()))
		}
	}
}

// stageLine formats the median offset of every stage seen in at least
// half of n operations, and the median total.
func stageLine(st map[int16][]time.Duration, total []time.Duration) string {
	type stage struct {
		key int16
		at  time.Duration
	}
	var seen []stage
	for _, k := range stageKeys {
		if d := st[k]; len(d) > 0 && len(d) >= len(total)/2 {
			m, _ := p50p99(d)
			seen = append(seen, stage{k, m})
		}
	}
	slices.SortFunc(seen, func(a, b stage) int { return cmp.Compare(a.at, b.at) })
	var parts []string
	for _, s := range seen {
		parts = append(parts, fmt.Sprintf("%s at %.3f", kmsg.NameForKey(s.key), ms(s.at)))
	}
	m, _ := p50p99(total)
	parts = append(parts, fmt.Sprintf("answer at %.3f ms", ms(m)))
	return strings.Join(parts, ", ")
}

func (rc *requestCounts) snapshot() [100]int64 {
	var out [100]int64
	for i := range rc.byKey {
		out[i] = rc.byKey[i].Load()
	}
	return out
}

// perOp formats the requests by key between two snapshots, divided by
// ops: "AddOffsetsToTxn 1.00, ...".
func perOp(before, after [100]int64, ops int) string {
	var parts []string
	for k := range before {
		if d := after[k] - before[k]; d > 0 && ops > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", kmsg.NameForKey(int16(k)), float64(d)/float64(ops)))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// benchTopicID asks the cluster for the benchmark topic's id.
func benchTopicID(b *testing.B, cluster *kfake.Cluster) [16]byte {
	b.Helper()
	return benchTopicIDAt(b, cluster.ListenAddrs()[0])
}

// benchTopicIDAt asks the broker at addr for the benchmark topic's id.
func benchTopicIDAt(b *testing.B, addr string) [16]byte {
	b.Helper()
	cl := oneClient(b, addr)
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(benchTopic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil || len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		b.Fatalf("metadata of %s: %v %+v", benchTopic, err, resp)
	}
	return resp.Topics[0].TopicID
}

// latencyPath is one way to reach a coordinator, with its one-member
// group. member and gen are the member's state, owned by the benchmark
// goroutine.
type latencyPath struct {
	name    string
	cl      *kgo.Client
	group   string
	member  string
	gen     int32
	offset  int64
	topicID [16]byte
	commits []time.Duration
	syncs   []time.Duration
	// brokerReqs is the broker requests per commit of this path.
	brokerReqs string
	// commitStages and syncStages: when, after the client sent its
	// request, the broker began each stage request (requestCounts.stages).
	commitStages, syncStages map[int16][]time.Duration
	reqs                     *requestCounts
}

func benchFleetLatency(b *testing.B, cluster *kfake.Cluster, reqs *requestCounts) {
	const rounds, commitsPerRound, syncsPerRound = 5, 200, 100
	brokers := cluster.ListenAddrs()
	forward := startKproxy(b, "forward", brokers, "--groups", "forward")
	local := startKproxy(b, "local", brokers, "--groups", "local",
		"--group-initial-rebalance-delay", "0s", "--group-min-session-timeout", "1s")
	one, _ := startBenchFleet(b, cluster, "lat1", 1, "", "")
	three, owners := startBenchFleet(b, cluster, "lat3", 3, "", "")
	// The relayed member's group is owned by three[0]; the member talks
	// to three[1].
	relayGroup := groupOwnedBy("lat-relay", owners, three[0].name)
	ownerGroup := groupOwnedBy("lat-owner", owners, three[0].name)
	paths := []*latencyPath{
		{name: "broker", cl: oneClient(b, brokers[0]), group: "lat-broker"},
		{name: "forward", cl: oneClient(b, forward.addr), group: "lat-forward"},
		{name: "local", cl: oneClient(b, local.addr), group: "lat-local"},
		{name: "fleet1", cl: oneClient(b, one[0].addr), group: "lat-fleet1"},
		{name: "fleet3-owner", cl: oneClient(b, three[0].addr), group: ownerGroup},
		{name: "fleet3-relay", cl: oneClient(b, three[1].addr), group: relayGroup},
	}
	id := benchTopicID(b, cluster)
	for _, p := range paths {
		ids, gen := settle(b, []*kgo.Client{p.cl}, p.group)
		p.member, p.gen, p.topicID = ids[0], gen, id
		p.reqs, p.commitStages, p.syncStages = reqs, map[int16][]time.Duration{}, map[int16][]time.Duration{}
	}
	for r := range rounds {
		for _, p := range paths {
			heartbeat(b, p)
			before := reqs.snapshot()
			for range commitsPerRound {
				p.commits = append(p.commits, commitOnce(b, p))
			}
			if r == 0 {
				p.brokerReqs = perOp(before, reqs.snapshot(), commitsPerRound)
			}
			for range syncsPerRound {
				p.syncs = append(p.syncs, rebalanceOnce(b, p))
			}
		}
	}
	base := map[string]*latencyPath{}
	for _, p := range paths {
		base[p.name] = p
	}
	broker, loc := base["broker"], base["local"]
	var sb strings.Builder
	fmt.Fprintf(&sb, "\none request at a time, %d rounds; ratios are p50/p50 and p99/p99\n", rounds)
	fmt.Fprintf(&sb, "%-13s %6s %8s %8s %9s %9s %8s | %6s %8s %8s %9s %9s %8s\n", "path",
		"commits", "p50 ms", "p99 ms", "x broker", "x local", "p99 x b",
		"syncs", "p50 ms", "p99 ms", "x broker", "x local", "p99 x b")
	for _, p := range paths {
		c50, c99 := p50p99(p.commits)
		s50, s99 := p50p99(p.syncs)
		b50c, b99c := p50p99(broker.commits)
		l50c, _ := p50p99(loc.commits)
		b50s, b99s := p50p99(broker.syncs)
		l50s, _ := p50p99(loc.syncs)
		fmt.Fprintf(&sb, "%-13s %6d %8.3f %8.3f %9.2f %9.2f %8.2f | %6d %8.3f %8.3f %9.2f %9.2f %8.2f\n", p.name,
			len(p.commits), ms(c50), ms(c99), ratio(c50, b50c), ratio(c50, l50c), ratio(c99, b99c),
			len(p.syncs), ms(s50), ms(s99), ratio(s50, b50s), ratio(s50, l50s), ratio(s99, b99s))
		b.ReportMetric(ms(c50), "commit-p50-ms/"+p.name)
		b.ReportMetric(ms(c99), "commit-p99-ms/"+p.name)
		b.ReportMetric(ms(s50), "sync-p50-ms/"+p.name)
		b.ReportMetric(ms(s99), "sync-p99-ms/"+p.name)
	}
	sb.WriteString("broker requests per commit (kfake's view, all clients of the cluster, fleet heartbeats included):\n")
	for _, p := range paths {
		fmt.Fprintf(&sb, "  %-13s %s\n", p.name, p.brokerReqs)
	}
	sb.WriteString("where the time goes: median ms after the client sent its request at which the broker began each request of the write\n")
	for _, p := range paths {
		fmt.Fprintf(&sb, "  %-13s commit: %s\n", p.name, stageLine(p.commitStages, p.commits))
		fmt.Fprintf(&sb, "  %-13s sync:   %s\n", "", stageLine(p.syncStages, p.syncs))
	}
	report(b, sb.String())
}

// oneClient is one kgo client of addr, closed when b ends.
func oneClient(b *testing.B, addr string) *kgo.Client {
	return benchClients(b, addr, 1)[0]
}

// heartbeat keeps p's member alive between its turns.
func heartbeat(b *testing.B, p *latencyPath) {
	b.Helper()
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group, req.MemberID, req.Generation = p.group, p.member, p.gen
	resp, err := req.RequestWith(context.Background(), p.cl)
	if err != nil || resp.ErrorCode != 0 {
		b.Fatalf("%s: heartbeat: %v (code %d)", p.name, err, resp.ErrorCode)
	}
}

// commitRequest is the OffsetCommit of the member of group at generation
// gen: offset for every partition of the benchmark topic.
func commitRequest(topicID [16]byte, group, member string, gen int32, offset int64) *kmsg.OffsetCommitRequest {
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.MemberID, req.Generation = group, member, gen
	t := kmsg.NewOffsetCommitRequestTopic()
	t.Topic, t.TopicID = benchTopic, topicID // v10+ names topics by id
	for i := range int32(benchTopicPartitions) {
		pt := kmsg.NewOffsetCommitRequestTopicPartition()
		pt.Partition, pt.Offset = i, offset
		t.Partitions = append(t.Partitions, pt)
	}
	req.Topics = append(req.Topics, t)
	return req
}

// commitCode returns the first error code of an OffsetCommit response.
func commitCode(resp *kmsg.OffsetCommitResponse) int16 {
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return p.ErrorCode
			}
		}
	}
	return 0
}

// commitOnce times one OffsetCommit of p's member.
func commitOnce(b *testing.B, p *latencyPath) time.Duration {
	b.Helper()
	p.offset++
	req := commitRequest(p.topicID, p.group, p.member, p.gen, p.offset)
	start := time.Now()
	resp, err := req.RequestWith(context.Background(), p.cl)
	took := time.Since(start)
	if p.reqs != nil {
		p.reqs.stages(start, p.commitStages)
	}
	if err != nil {
		b.Fatalf("%s: offset commit: %v", p.name, err)
	}
	if code := commitCode(resp); code != 0 {
		b.Fatalf("%s: offset commit: %v", p.name, kerr.ErrorForCode(code))
	}
	return took
}

// rebalanceOnce rejoins p's member, which as the leader of a stable
// group starts a new generation, and times its SyncGroup carrying the
// assignment. The generation must grow by one.
func rebalanceOnce(b *testing.B, p *latencyPath) time.Duration {
	b.Helper()
	ctx := context.Background()
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{benchTopic}
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.MemberID, join.ProtocolType = p.group, p.member, "consumer"
	join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta.AppendTo(nil)}}
	join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = 30000, 60000
	jr, err := join.RequestWith(ctx, p.cl)
	if err != nil || jr.ErrorCode != 0 {
		b.Fatalf("%s: rejoin: %v (code %d)", p.name, err, jr.ErrorCode)
	}
	if jr.Generation != p.gen+1 || jr.LeaderID != p.member {
		b.Fatalf("%s: rejoin gave generation %d leader %q, want %d and %q", p.name, jr.Generation, jr.LeaderID, p.gen+1, p.member)
	}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.MemberID, sync.Generation = p.group, p.member, jr.Generation
	sync.ProtocolType, sync.Protocol = kmsg.StringPtr("consumer"), kmsg.StringPtr("range")
	a := kmsg.NewConsumerMemberAssignment()
	a.Topics = []kmsg.ConsumerMemberAssignmentTopic{{Topic: benchTopic, Partitions: []int32{0, 1, 2, 3, 4, 5}}}
	sync.GroupAssignment = []kmsg.SyncGroupRequestGroupAssignment{{MemberID: p.member, MemberAssignment: a.AppendTo(nil)}}
	start := time.Now()
	sr, err := sync.RequestWith(ctx, p.cl)
	took := time.Since(start)
	if p.reqs != nil {
		p.reqs.stages(start, p.syncStages)
	}
	if err != nil || sr.ErrorCode != 0 {
		b.Fatalf("%s: leader sync: %v (code %d)", p.name, err, sr.ErrorCode)
	}
	p.gen = jr.Generation
	return took
}

func p50p99(d []time.Duration) (time.Duration, time.Duration) {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0, 0
	}
	at := func(q float64) time.Duration { return s[int(q*float64(len(s)-1))] }
	return at(0.50), at(0.99)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// benchFleetFailover SIGKILLs the owner of a group in a fleet of three
// and times until an OffsetCommit through each surviving kproxy succeeds
// again (one of them becomes the group's owner, the other relays to it),
// for a fleet session of 3s (heartbeats every 300ms, as the fleet tests
// run) and of the default 10s (heartbeats every 1s).
func benchFleetFailover(b *testing.B, cluster *kfake.Cluster) {
	var sb strings.Builder
	sb.WriteString("\nfailover after SIGKILL of a group's owner, fleet of 3; one member, commits every 5ms through each survivor\n")
	for _, c := range []struct{ name, session, heartbeat string }{
		{"fo3s", "3s", "300ms"},
		{"fo10s", "", ""},
	} {
		b.Run("session="+orDefault(c.session, "10s"), func(b *testing.B) {
			r := failoverOnce(b, cluster, c.name, c.session, c.heartbeat)
			fmt.Fprintf(&sb, "  session %-4s (heartbeat %s): %s killed; its groups partition served again by %s after %v, every partition after %v\n",
				orDefault(c.session, "10s"), orDefault(c.heartbeat, "1s"), r.oldOwner, r.newOwner,
				r.served.Round(time.Millisecond), r.fleetSettled.Round(time.Millisecond))
			for _, cm := range r.committers {
				role := "relays to the new owner"
				if cm.via == r.newOwner {
					role = "is the new owner"
				}
				fmt.Fprintf(&sb, "    commits through %s (%s) back after %v; errors meanwhile: %s\n",
					cm.via, role, cm.back.Round(time.Millisecond), cm.errors)
				metric := "s-to-commit/relay"
				if cm.via == r.newOwner {
					metric = "s-to-commit/new-owner"
				}
				b.ReportMetric(cm.back.Seconds(), metric)
			}
			b.ReportMetric(r.served.Seconds(), "s-to-served")
		})
	}
	report(b, sb.String())
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

type failoverResult struct {
	// served is when a survivor served the group's partition again,
	// fleetSettled when the survivors served every partition (both
	// polled over /api/fleet, every 10ms and 50ms).
	served, fleetSettled time.Duration
	oldOwner, newOwner   string
	committers           []*committer
}

// committer commits one group's offsets through one kproxy, one request
// at a time, 5ms apart, and records when the first commit sent after
// the kill succeeded. Its fields are written by its goroutine and read
// after done is closed.
type committer struct {
	via    string
	back   time.Duration
	errors string
	done   chan struct{}
}

func (cm *committer) run(ctx context.Context, p *latencyPath, cl *kgo.Client, killedAt *atomic.Int64, from int64) {
	defer close(cm.done)
	counts := map[string]int{}
	defer func() {
		var errs []string
		for e, n := range counts {
			errs = append(errs, fmt.Sprintf("%s x%d", e, n))
		}
		slices.Sort(errs)
		cm.errors = orDefault(strings.Join(errs, ", "), "none")
	}()
	for off := from; ctx.Err() == nil; off++ {
		sentAt := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := commitRequest(p.topicID, p.group, p.member, p.gen, off).RequestWith(rctx, cl)
		cancel()
		k := killedAt.Load()
		if k != 0 && sentAt.UnixNano() >= k {
			if err == nil {
				if code := commitCode(resp); code != 0 {
					err = kerr.ErrorForCode(code)
				}
			}
			if err == nil {
				cm.back = time.Since(time.Unix(0, k))
				return
			}
			msg := err.Error()
			var ke *kerr.Error
			if errors.As(err, &ke) {
				msg = ke.Message
			}
			counts[msg]++
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func failoverOnce(b *testing.B, cluster *kfake.Cluster, name, session, heartbeat string) failoverResult {
	procs, owners := startBenchFleet(b, cluster, name, 3, session, heartbeat)
	owner, survivors := procs[0], procs[1:]
	group := groupOwnedBy(name+"-g", owners, owner.name)
	part := kafkastore.GroupPartition(group, fleetPartitions)
	// No retries inside the clients: the committers retry every 5ms
	// themselves and see every error.
	clients := make([]*kgo.Client, len(survivors))
	for i, k := range survivors {
		cl, err := kgo.NewClient(kgo.SeedBrokers(k.addr), kgo.RequestRetries(0))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cl.Close)
		clients[i] = cl
	}
	p := &latencyPath{name: name, cl: clients[0], group: group, topicID: benchTopicID(b, cluster)}
	ids, gen := settle(b, []*kgo.Client{p.cl}, group)
	p.member, p.gen = ids[0], gen
	commitOnce(b, p)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var killedAt atomic.Int64 // UnixNano of the SIGKILL, 0 before
	var cms []*committer
	for i, k := range survivors {
		cm := &committer{via: k.name, done: make(chan struct{})}
		cms = append(cms, cm)
		go cm.run(ctx, p, clients[i], &killedAt, int64(1_000_000*(i+1)))
	}
	time.Sleep(300 * time.Millisecond) // commits flow before the kill
	killed := time.Now()
	killedAt.Store(killed.UnixNano())
	owner.signal(b, syscall.SIGKILL)
	<-owner.exited
	var served time.Duration
	for served == 0 && ctx.Err() == nil {
		if m := servingMap(survivors); len(m[part]) > 0 {
			served = time.Since(killed)
		}
		time.Sleep(10 * time.Millisecond)
	}
	newOwners := waitFleetSettled(b, survivors, 60*time.Second)
	settled := time.Since(killed)
	for _, cm := range cms {
		<-cm.done
		if cm.back == 0 {
			b.Fatalf("%s: no commit succeeded through %s within 90s of killing %s", name, cm.via, owner.name)
		}
	}
	return failoverResult{served: served, fleetSettled: settled, oldOwner: owner.name, newOwner: newOwners[part], committers: cms}
}

// procUsage is a process's CPU time and resident set, from /proc.
type procUsage struct {
	cpu time.Duration
	rss int64 // bytes
}

// readProcUsage reads utime+stime (fields 14 and 15 of /proc/PID/stat,
// counted after the command name, which may hold spaces) and VmRSS of
// /proc/PID/status. USER_HZ is 100 on every Linux architecture Go
// supports.
func readProcUsage(pid int) (procUsage, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procUsage{}, fmt.Errorf("reading CPU time of %d: %w", pid, err)
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return procUsage{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return procUsage{}, fmt.Errorf("malformed /proc/%d/stat: %w", pid, err)
	}
	u := procUsage{cpu: time.Duration(ut+st) * time.Second / 100}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return procUsage{}, fmt.Errorf("reading RSS of %d: %w", pid, err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return procUsage{}, fmt.Errorf("malformed VmRSS in /proc/%d/status: %w", pid, err)
			}
			u.rss = kb << 10
		}
	}
	return u, nil
}

// usages reads every proc's usage.
func usages(b *testing.B, procs []*kproxyProc) []procUsage {
	b.Helper()
	out := make([]procUsage, len(procs))
	for i, k := range procs {
		u, err := readProcUsage(k.cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		out[i] = u
	}
	return out
}

// cpuDelta sums the CPU the procs used between two readings.
func cpuDelta(before, after []procUsage) time.Duration {
	var d time.Duration
	for i := range before {
		d += after[i].cpu - before[i].cpu
	}
	return d
}

// selfCPUTime is this process's CPU time: the clients and kfake.
func selfCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchFleetGroups runs 200 groups of three members against the broker
// directly, against one `--groups local` kproxy, and against a fleet of
// three with one member of each group on each kproxy: the time until
// every group settled, then every member commits, one request at a time,
// for a while.
func benchFleetGroups(b *testing.B, cluster *kfake.Cluster, reqs *requestCounts) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%d groups of 3 members, %d clients (one connection each); then every member commits, one request at a time, for %v\n",
		loadGroups, 3*loadGroups, loadCommitFor)
	brokers := cluster.ListenAddrs()
	var base float64
	for _, target := range []string{"broker", "local", "fleet3"} {
		b.Run(target, func(b *testing.B) {
			var procs []*kproxyProc
			var addrs [3]string
			switch target {
			case "broker":
				addrs = [3]string{brokers[0], brokers[0], brokers[0]}
			case "local":
				procs = []*kproxyProc{startKproxy(b, "g200-local", brokers, "--groups", "local",
					"--group-initial-rebalance-delay", "0s", "--group-min-session-timeout", "1s")}
				addrs = [3]string{procs[0].addr, procs[0].addr, procs[0].addr}
			case "fleet3":
				procs, _ = startBenchFleet(b, cluster, "g200", 3, "", "")
				addrs = [3]string{procs[0].addr, procs[1].addr, procs[2].addr}
			}
			r := groupsLoad(b, cluster, reqs, target, addrs, procs)
			if target == "broker" {
				base = r.rate
			}
			fmt.Fprintf(&sb, "%s:\n%s", target, r.text)
			if base > 0 {
				fmt.Fprintf(&sb, "  commits/s x broker: %.2f\n", r.rate/base)
			}
		})
	}
	report(b, sb.String())
}

const loadGroups = 200

// loadCommitFor is how long the members commit: 5s, or
// $KPROXY_BENCH_COMMIT_FOR (a Go duration, at most 5m).
var loadCommitFor = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KPROXY_BENCH_COMMIT_FOR")); err == nil && d > 0 && d <= 5*time.Minute {
		return d
	}
	return 5 * time.Second
}()

type loadResult struct {
	rate float64
	text string
}

// groupsLoad settles loadGroups groups whose member k connects to
// addrs[k], then commits for loadCommitFor; procs are the kproxies
// serving them (none for the broker).
func groupsLoad(b *testing.B, cluster *kfake.Cluster, reqs *requestCounts, target string, addrs [3]string, procs []*kproxyProc) loadResult {
	topicID := benchTopicID(b, cluster)
	idle := usages(b, procs)
	var clients [3][]*kgo.Client // [member][group]
	for k, addr := range addrs {
		clients[k] = benchClients(b, addr, loadGroups)
	}
	names := make([]string, loadGroups)
	ids := make([][]string, loadGroups)
	gens := make([]int32, loadGroups)
	took := make([]time.Duration, loadGroups)
	before, selfBefore := usages(b, procs), selfCPUTime()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range loadGroups {
		names[g] = "load-" + target + "-" + strconv.Itoa(g)
		members := []*kgo.Client{clients[0][g], clients[1][g], clients[2][g]}
		wg.Add(1)
		go func() {
			// settle fails b from this goroutine on a timeout (then
			// the goroutine exits, deferred calls run); the benchmark
			// goroutine stops below.
			defer wg.Done()
			s := time.Now()
			ids[g], gens[g] = settle(b, members, names[g])
			took[g] = time.Since(s)
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	settleAll := time.Since(start)
	afterSettle, selfSettle := usages(b, procs), selfCPUTime()

	var ok, failed atomic.Int64
	var latMu sync.Mutex
	var lats []time.Duration // guarded by latMu
	ctx, cancel := context.WithTimeout(context.Background(), loadCommitFor)
	defer cancel()
	// RSS once a second while committing.
	var rssSeries []string // written by the sampler, read after sampled is closed
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var mibs []string
			for _, k := range procs {
				if u, err := readProcUsage(k.cmd.Process.Pid); err == nil {
					mibs = append(mibs, fmt.Sprintf("%.0f", mib(u.rss)))
				}
			}
			rssSeries = append(rssSeries, strings.Join(mibs, "/"))
		}
	}()
	reqsBefore := reqs.snapshot()
	cstart := time.Now()
	for g := range loadGroups {
		for k := range addrs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				for off := int64(1); ctx.Err() == nil; off++ {
					s := time.Now()
					resp, err := commitRequest(topicID, names[g], ids[g][k], gens[g], off).RequestWith(ctx, clients[k][g])
					if ctx.Err() != nil {
						break
					}
					if err != nil || commitCode(resp) != 0 {
						failed.Add(1)
						continue
					}
					ok.Add(1)
					mine = append(mine, time.Since(s))
				}
				latMu.Lock()
				lats = append(lats, mine...)
				latMu.Unlock()
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(cstart)
	reqsAfter := reqs.snapshot()
	<-sampled
	afterCommits, selfCommits := usages(b, procs), selfCPUTime()

	s50, s99 := p50p99(took)
	c50, c99 := p50p99(lats)
	n := ok.Load()
	rate := float64(n) / elapsed.Seconds()
	var sb strings.Builder
	fmt.Fprintf(&sb, "  settle: all groups in %v (per group p50 %v, p99 %v); kproxy CPU %v, this process (kfake, clients) %v\n",
		settleAll.Round(time.Millisecond), s50.Round(time.Millisecond), s99.Round(time.Millisecond),
		cpuDelta(before, afterSettle), (selfSettle - selfBefore).Round(time.Millisecond))
	fmt.Fprintf(&sb, "  commits: %.0f/s across all groups (%d ok, %d failed in %v), latency p50 %.3f ms p99 %.3f ms (%d in flight)\n",
		rate, n, failed.Load(), elapsed.Round(time.Millisecond), ms(c50), ms(c99), 3*loadGroups)
	commitCPU := cpuDelta(afterSettle, afterCommits)
	fmt.Fprintf(&sb, "    CPU: kproxy %.2f cores (%.0f µs per commit), this process (kfake, clients) %.2f cores (%.0f µs per commit)\n",
		commitCPU.Seconds()/elapsed.Seconds(), float64(commitCPU.Microseconds())/max(1, float64(n)),
		(selfCommits-selfSettle).Seconds()/elapsed.Seconds(), float64((selfCommits-selfSettle).Microseconds())/max(1, float64(n)))
	fmt.Fprintf(&sb, "    broker requests per commit: %s\n", perOp(reqsBefore, reqsAfter, int(n)))
	for i, k := range procs {
		fmt.Fprintf(&sb, "    %s: RSS idle %.1f MiB, settled %.1f MiB, after commits %.1f MiB; CPU settle %v, commits %v\n", k.name,
			mib(idle[i].rss), mib(afterSettle[i].rss), mib(afterCommits[i].rss),
			afterSettle[i].cpu-before[i].cpu, afterCommits[i].cpu-afterSettle[i].cpu)
	}
	if len(procs) > 0 {
		fmt.Fprintf(&sb, "    RSS MiB each second while committing: %s\n", strings.Join(rssSeries, "  "))
	}
	if strings.Contains(os.Getenv("GODEBUG"), "gctrace=1") {
		// The kproxies inherit GODEBUG: their last GC lines say how
		// much of the RSS is live heap.
		for _, k := range procs {
			var gcs []string
			for line := range strings.SplitSeq(k.log(), "\n") {
				if strings.HasPrefix(line, "gc ") {
					gcs = append(gcs, line)
				}
			}
			fmt.Fprintf(&sb, "    %s: %d GCs, last: %s\n", k.name, len(gcs), strings.Join(gcs[max(0, len(gcs)-2):], " | "))
		}
	}
	if failed.Load() > 0 {
		b.Errorf("%s: %d commits failed in settled groups", target, failed.Load())
	}
	b.ReportMetric(settleAll.Seconds(), "s-to-settle-all")
	b.ReportMetric(rate, "commits/s")
	if len(procs) > 0 {
		b.ReportMetric(commitCPU.Seconds()/elapsed.Seconds(), "kproxy-cores")
	}
	return loadResult{rate: rate, text: sb.String()}
}

// report prints a table to stdout: b.Log keeps only the first lines of
// a benchmark's output.
func report(b *testing.B, s string) {
	b.Helper()
	fmt.Printf("--- %s%s\n", b.Name(), s)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
