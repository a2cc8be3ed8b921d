package e2e

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
)

// The tests of this file put a KIP-848 member through kproxy beside one
// talking to the in-memory cluster directly, both told to heartbeat
// every freshHeartbeat, and compare when each gets the partitions of a
// topic that is new or grew.

// freshHeartbeat is the KIP-848 heartbeat interval of both paths.
const freshHeartbeat = time.Second

// freshStack is a stack whose engine and cluster both tell KIP-848
// members to heartbeat every freshHeartbeat, and whose engine reloads
// its topics every refresh.
func freshStack(t *testing.T, refresh time.Duration) *stack {
	t.Helper()
	return newStackOn(t,
		[]kfake.Opt{kfake.BrokerConfigs(map[string]string{
			"group.consumer.heartbeat.interval.ms": itoa(int(freshHeartbeat / time.Millisecond)),
		})},
		engineOpt(func(c *groupstate.Config) {
			c.ConsumerHeartbeatInterval = freshHeartbeat
			c.TopicRefreshInterval = refresh
		}))
}

// freshPath is one way to the cluster: directly or through kproxy.
type freshPath struct {
	name  string
	seeds []string
}

func (s *stack) freshPaths() []freshPath {
	return []freshPath{{"direct", s.cluster.ListenAddrs()}, {"kproxy", []string{s.addr()}}}
}

// createTopic creates topic on the cluster directly, as an operator
// would, so that kproxy learns of it only from the cluster.
func (s *stack) createTopic(ctx context.Context, topic string, partitions int32) {
	s.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.cluster.ListenAddrs()...))
	if err != nil {
		s.t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
		s.t.Fatalf("create topic %s: %v", topic, err)
	}
}

// joinRaw sends one joining ConsumerGroupHeartbeat (v1, epoch 0) to the
// coordinator behind seeds and returns its answer; the member leaves
// again at cleanup.
func joinRaw(ctx context.Context, t *testing.T, seeds []string, group, member, topic string) *kmsg.ConsumerGroupHeartbeatResponse {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Version = 1
	req.Group, req.MemberID, req.MemberEpoch = group, member, 0
	req.RebalanceTimeoutMillis = 30000
	req.SubscribedTopicNames = []string{topic}
	req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("heartbeat to %s: %v", group, err)
	}
	t.Cleanup(func() {
		leave := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		leave.Version, leave.Group, leave.MemberID, leave.MemberEpoch = 1, group, member, -1
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = leave.RequestWith(ctx, cl)
	})
	return resp
}

// assignedCount is the number of partitions a heartbeat answer assigns.
func assignedCount(resp *kmsg.ConsumerGroupHeartbeatResponse) int {
	if resp.Assignment == nil {
		return 0
	}
	n := 0
	for _, t := range resp.Assignment.Topics {
		n += len(t.Partitions)
	}
	return n
}

// watchedMember is a franz-go KIP-848 consumer that records when it got
// how many partitions of its topic.
type watchedMember struct {
	cl *kgo.Client

	mu    sync.Mutex // guards owned, gen, grown
	owned map[int32]bool
	gen   int32         // member epoch of the last assignment
	grown chan struct{} // signalled on every assignment
}

// startWatched starts a KIP-848 consumer of topic in group behind seeds.
func startWatched(t testing.TB, seeds []string, group, topic string) *watchedMember {
	t.Helper()
	w := &watchedMember{owned: map[int32]bool{}, grown: make(chan struct{}, 64)}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.ServerSideBalancer(),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, a map[string][]int32) {
			_, gen := cl.GroupMetadata()
			w.mu.Lock()
			for _, p := range a[topic] {
				w.owned[p] = true
			}
			w.gen = gen
			w.mu.Unlock()
			w.grown <- struct{}{}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
			w.mu.Lock()
			for _, p := range r[topic] {
				delete(w.owned, p)
			}
			w.mu.Unlock()
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	w.cl = cl
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		cl.Close()
	})
	return w
}

// waitOwns waits until w owns n partitions and returns when it did and
// at which member epoch.
func (w *watchedMember) waitOwns(t testing.TB, n int, within time.Duration) (time.Time, int32) {
	t.Helper()
	deadline := time.After(within)
	for {
		w.mu.Lock()
		got, gen := len(w.owned), w.gen
		w.mu.Unlock()
		if got >= n {
			return time.Now(), gen
		}
		select {
		case <-w.grown:
		case <-deadline:
			t.Fatalf("the member owns %d partitions after %v, want %d", got, within, n)
		}
	}
}

// TestKIP848FirstAssignmentOfNewTopic guards the first assignment of a
// KIP-848 member whose topic was created just before it joined: through
// kproxy, as directly, the first heartbeat answer carries the topic's
// partitions (kproxy used to answer with none and assign them a
// heartbeat later). kproxy's periodic topic refresh is set to a minute so
// that only the refresh on demand can find the topic.
func TestKIP848FirstAssignmentOfNewTopic(t *testing.T) {
	s := freshStack(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const parts = 4

	// kproxy's topic cache is loaded (its first refresh, at start, is
	// done) once a join to an older topic gets that topic's partitions.
	s.createTopic(ctx, "fresh-warm", 1)
	if resp := joinRaw(ctx, t, []string{s.addr()}, "fresh-warm", "warm", "fresh-warm"); resp.ErrorCode != 0 {
		t.Fatalf("warm-up heartbeat: error %d", resp.ErrorCode)
	}

	// One heartbeat: its answer assigns every partition, on both paths.
	for _, p := range s.freshPaths() {
		topic := "fresh-raw-" + p.name
		s.createTopic(ctx, topic, parts)
		start := time.Now()
		resp := joinRaw(ctx, t, p.seeds, topic, "member-"+p.name, topic)
		took := time.Since(start)
		if resp.ErrorCode != 0 || resp.MemberEpoch < 1 || assignedCount(resp) != parts {
			t.Fatalf("%s: the first heartbeat answer assigns %d partitions at epoch %d (error %d), want %d",
				p.name, assignedCount(resp), resp.MemberEpoch, resp.ErrorCode, parts)
		}
		t.Logf("%s: first heartbeat answered in %v with %d partitions", p.name, took.Round(time.Millisecond), parts)
	}

	// franz-go consumers started side by side just after the topic was
	// created: each gets the partitions at the member epoch of its first
	// answer, the same on both paths.
	const topic = "fresh-franz"
	s.createTopic(ctx, topic, parts)
	start := time.Now()
	paths := s.freshPaths()
	members := make([]*watchedMember, len(paths))
	for i, p := range paths {
		members[i] = startWatched(t, p.seeds, "fresh-franz-"+p.name, topic)
	}
	gens := make([]int32, len(paths))
	for i, p := range paths {
		at, gen := members[i].waitOwns(t, parts, 20*time.Second)
		gens[i] = gen
		t.Logf("%s: first assignment %v after the consumer started, member epoch %d", p.name, at.Sub(start).Round(time.Millisecond), gen)
	}
	if gens[0] != gens[1] {
		t.Fatalf("first assignment at member epoch %d directly, %d through kproxy: kproxy needed another heartbeat", gens[0], gens[1])
	}
}

// TestKIP848PartitionIncrease guards how soon a partition increase
// reaches a KIP-848 member through kproxy: within kproxy's topic refresh
// interval plus a heartbeat (and some slack for a loaded machine), where
// it used to take up to 30s. A member of another group consuming the same
// topic directly is measured beside it.
func TestKIP848PartitionIncrease(t *testing.T) {
	const refresh = 2 * time.Second // the configured default
	s := freshStack(t, refresh)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic = "grows"
	s.createTopic(ctx, topic, 2)
	paths := s.freshPaths()
	members := make([]*watchedMember, len(paths))
	for i, p := range paths {
		members[i] = startWatched(t, p.seeds, "grows-"+p.name, topic)
	}
	for i := range paths {
		members[i].waitOwns(t, 2, 20*time.Second)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(s.cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	grownAt := time.Now()
	if _, err := kadm.NewClient(cl).CreatePartitions(ctx, 2, topic); err != nil {
		t.Fatalf("create partitions: %v", err)
	}
	bound := refresh + freshHeartbeat + 3*time.Second // slack: two shared cores, -race
	took := make(map[string]time.Duration)
	for i, p := range paths {
		at, _ := members[i].waitOwns(t, 4, 30*time.Second)
		took[p.name] = at.Sub(grownAt)
		t.Logf("%s: new partitions assigned %v after the increase", p.name, took[p.name].Round(time.Millisecond))
	}
	if took["kproxy"] > bound {
		t.Fatalf("through kproxy the new partitions came %v after the increase, want at most the refresh interval %v plus a heartbeat %v (+3s)",
			took["kproxy"], refresh, freshHeartbeat)
	}
	// The member owns exactly the topic's four partitions.
	w := members[1]
	w.mu.Lock()
	var owned []int
	for p := range w.owned {
		owned = append(owned, int(p))
	}
	w.mu.Unlock()
	sort.Ints(owned)
	if len(owned) != 4 || owned[0] != 0 || owned[3] != 3 {
		t.Fatalf("through kproxy the member owns %v, want 0-3", owned)
	}
}

// TestKIP848RegexAfterLiteralTopics guards the order in which kproxy
// assigns a member subscribed to a literal topic and a regex: the first
// heartbeat answer carries the literal topic, the regex's matches come on
// the next heartbeat, as Kafka resolves regexes asynchronously (KIP-848).
// kfake resolves them synchronously (all partitions in the first answer),
// so the direct path is logged, not compared.
func TestKIP848RegexAfterLiteralTopics(t *testing.T) {
	s := freshStack(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.createTopic(ctx, "lit", 2)
	s.createTopic(ctx, "rx-a", 2)
	s.createTopic(ctx, "rx-b", 1)
	for _, p := range s.freshPaths() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(p.seeds...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		group, member := "regex-order-"+p.name, "member-"+p.name
		join := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		join.Version, join.Group, join.MemberID, join.MemberEpoch = 1, group, member, 0
		join.RebalanceTimeoutMillis = 30000
		join.SubscribedTopicNames = []string{"lit"}
		re := "rx-.*"
		join.SubscribedTopicRegex = &re
		join.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		first, err := join.RequestWith(ctx, cl)
		if err != nil || first.ErrorCode != 0 {
			t.Fatalf("%s: join: %v (error %d)", p.name, err, first.ErrorCode)
		}
		beat := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		beat.Version, beat.Group, beat.MemberID, beat.MemberEpoch = 1, group, member, first.MemberEpoch
		beat.RebalanceTimeoutMillis = -1
		beat.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		if first.Assignment != nil {
			for _, at := range first.Assignment.Topics {
				beat.Topics = append(beat.Topics, kmsg.ConsumerGroupHeartbeatRequestTopic{TopicID: at.TopicID, Partitions: at.Partitions})
			}
		}
		second, err := beat.RequestWith(ctx, cl)
		if err != nil || second.ErrorCode != 0 {
			t.Fatalf("%s: second heartbeat: %v (error %d)", p.name, err, second.ErrorCode)
		}
		secondSays := itoa(assignedCount(second)) + " partitions"
		if second.Assignment == nil {
			secondSays = "no assignment (unchanged)"
		}
		t.Logf("%s: first answer %d partitions at epoch %d, second %s at epoch %d",
			p.name, assignedCount(first), first.MemberEpoch, secondSays, second.MemberEpoch)
		leave := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		leave.Version, leave.Group, leave.MemberID, leave.MemberEpoch = 1, group, member, -1
		_, _ = leave.RequestWith(ctx, cl)
		if p.name != "kproxy" {
			continue
		}
		if assignedCount(first) != 2 || first.Assignment == nil || len(first.Assignment.Topics) != 1 {
			t.Fatalf("through kproxy the first answer assigns %d partitions, want the literal topic's 2 only", assignedCount(first))
		}
		if assignedCount(second) != 5 || second.MemberEpoch <= first.MemberEpoch {
			t.Fatalf("through kproxy the second answer assigns %d partitions at epoch %d, want all 5 at an epoch after %d",
				assignedCount(second), second.MemberEpoch, first.MemberEpoch)
		}
	}
}
