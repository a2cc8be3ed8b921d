package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// The tests of this file repeat rolling migrations between the classic
// and the KIP-848 protocol (issue 33) and check, at every steady point,
// that every partition has exactly one owner among the running members,
// as the members' own assign/revoke/lost callbacks say.

// rollRepeat is how many times a test of this file repeats its roll:
// KPROXY_ROLL_REPEAT, else def.
func rollRepeat(t testing.TB, def int) int {
	t.Helper()
	v := os.Getenv("KPROXY_ROLL_REPEAT")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("KPROXY_ROLL_REPEAT=%q: want a positive count", v)
	}
	return n
}

// coverageMismatch says how the owners in own differ from every one of
// parts partitions being owned by one of names, or "".
func coverageMismatch(own *ownership, parts int, names []string) string {
	owners := own.owners()
	seen := map[int32]string{}
	var problems []string
	for who, ps := range owners {
		if !slices.Contains(names, who) {
			problems = append(problems, fmt.Sprintf("%s, not running, owns %v", who, ps))
		}
		for _, p := range ps {
			if other, ok := seen[p]; ok {
				problems = append(problems, fmt.Sprintf("p%d owned by %s and %s", p, other, who))
			}
			seen[p] = who
		}
	}
	var unowned []int32
	for p := range int32(parts) {
		if _, ok := seen[p]; !ok {
			unowned = append(unowned, p)
		}
	}
	if len(unowned) > 0 {
		problems = append(problems, fmt.Sprintf("unowned %v", unowned))
	}
	if len(problems) == 0 {
		return ""
	}
	return strings.Join(problems, "; ") + fmt.Sprintf(" (owners %v)", owners)
}

// waitCovered waits until every partition is owned by one running member
// and returns how long that took, or the mismatch it still saw after
// within.
func waitCovered(own *ownership, parts int, names []string, within time.Duration) (time.Duration, string) {
	start := time.Now()
	for {
		last := coverageMismatch(own, parts, names)
		if last == "" {
			return time.Since(start), ""
		}
		if time.Since(start) > within {
			return time.Since(start), last
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rollStep is one member moved: from stops, to starts with cfg.
type rollStep struct {
	from int // index into the running members
	to   string
	cfg  memberCfg
}

// TestMigrationRollsKeepEveryPartitionOwned rolls groups of three franz-go
// members through one kproxy (groups local, and distributed as a fleet of
// one) from the classic protocol (cooperative-sticky, then eager range) to
// group.protocol=consumer and back, one member at a time while records
// flow, and repeats it: KPROXY_ROLL_REPEAT rounds per mode, 8 by default
// (32 rolls, 224 steady points). After each step, once the group settled
// (up to 30 s), every partition must be owned by exactly one running
// member, as the members' callbacks say, and no partition may ever have
// had two owners at once.
//
// For longer runs: -run 'TestMigrationRollsKeepEveryPartitionOwned$/local'
// (or /distributed) runs one mode, KPROXY_ROLL_DEFAULTS=1 gives the classic members franz-go's default
// session (45 s) and heartbeat (3 s), and KPROXY_ROLL_AUTOCOMMIT=1 runs
// the members as plain consumers (autocommit, rebalances not held by
// the poll loop), KPROXY_ROLL_SURGE=1 starts each new instance a second
// before its old one stops.
func TestMigrationRollsKeepEveryPartitionOwned(t *testing.T) {
	t.Parallel()
	for _, mode := range []kproxy.GroupsMode{kproxy.GroupsLocal, kproxy.GroupsDistributed} {
		t.Run(string(mode), func(t *testing.T) { testMigrationRollsOwned(t, mode) })
	}
}

// testMigrationRollsOwned runs TestMigrationRollsKeepEveryPartitionOwned
// in one groups mode.
func testMigrationRollsOwned(t *testing.T, mode kproxy.GroupsMode) {
	opts := []stackOpt{func(c *kproxy.Config) {
		c.Groups.Mode = mode
		c.Groups.Fleet.Name = "owners-" + string(mode)
	}}
	if os.Getenv("KPROXY_ROLL_ENGINE_DEFAULTS") != "" {
		// The engine's own KIP-848 session (45 s) and heartbeat (5 s),
		// and Kafka's initial rebalance delay (3 s).
		opts = append(opts, engineOpt(func(c *groupstate.Config) {
			c.ConsumerSessionTimeout, c.ConsumerHeartbeatInterval = 0, 0
			c.InitialRebalanceDelay = 3 * time.Second
		}))
	}
	s := kip848Stack(t, opts...)
	const topic, parts = "owners", 6
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.produce(ctx, topic, parts, 60)
	stop := s.flow(ctx, topic, 60)
	defer stop()
	rollOwned(t, topic, parts, rollRepeat(t, 8), func(_ int, name string, cfg memberCfg) *member {
		return s.startMember(name, cfg)
	}, func(group string) string { return describeOwners(ctx, s.client(), group) })
}

// rollOwned runs rounds of the rolls of
// TestMigrationRollsKeepEveryPartitionOwned on topic (parts partitions,
// records flowing): start starts a member (i is its slot, 0-2), describe
// says what kproxy holds of a group when a check fails.
func rollOwned(t *testing.T, topic string, parts, rounds int, start func(i int, name string, cfg memberCfg) *member, describe func(group string) string) {
	var steps, slow int
	var worst time.Duration
	failures := 0
	surge := os.Getenv("KPROXY_ROLL_SURGE") != ""
	for round := range rounds {
		for _, kind := range []struct {
			name string
			opts []kgo.Opt
		}{{"coop", coopOpts}, {"eager", eagerOpts}} {
			if os.Getenv("KPROXY_ROLL_DEFAULTS") != "" {
				kind.opts = []kgo.Opt{kind.opts[0], kgo.SessionTimeout(45 * time.Second), kgo.HeartbeatInterval(3 * time.Second), kgo.RebalanceTimeout(60 * time.Second)}
			}
			group := fmt.Sprintf("owners-%s-%d", kind.name, round)
			own, recs := newOwnership(t), newRecords()
			cfg := func(opts []kgo.Opt) memberCfg {
				return memberCfg{group: group, topic: topic, own: own, recs: recs, opts: opts, autoCommit: os.Getenv("KPROXY_ROLL_AUTOCOMMIT") != ""}
			}
			running := []*member{start(0, "a", cfg(kind.opts)), start(1, "b", cfg(kind.opts)), start(2, "c", cfg(kind.opts))}
			plan := []rollStep{
				{0, "a2", cfg(k848Opts)}, {1, "b2", cfg(k848Opts)}, {2, "c2", cfg(k848Opts)},
				{0, "a3", cfg(kind.opts)}, {1, "b3", cfg(kind.opts)}, {2, "c3", cfg(kind.opts)},
			}
			check := func(what string) bool {
				names := make([]string, len(running))
				for i, m := range running {
					names[i] = m.name
				}
				took, bad := waitCovered(own, parts, names, 30*time.Second)
				steps++
				worst = max(worst, took)
				if took > 5*time.Second {
					slow++
				}
				if bad != "" {
					failures++
					t.Errorf("%s %s: %s after %v; kproxy: %s", group, what, bad, took.Round(time.Millisecond), describe(group))
					return false
				}
				own.check()
				return true
			}
			ok := check("start")
			for _, st := range plan {
				if !ok {
					break
				}
				if surge {
					// The new instance first, then the old one stops.
					old := running[st.from]
					running[st.from] = start(st.from, st.to, st.cfg)
					time.Sleep(time.Second)
					old.leave()
				} else {
					running[st.from].leave()
					running[st.from] = start(st.from, st.to, st.cfg)
				}
				ok = check("after " + st.to + " replaced a member")
			}
			for _, m := range running {
				m.leave()
			}
		}
	}
	t.Logf("%d rounds, %d steady points, %d failed, %d took over 5 s, slowest %v", rounds, steps, failures, slow, worst.Round(time.Millisecond))
}

// TestMigrationRollsKeepEveryPartitionOwnedFleet is
// TestMigrationRollsKeepEveryPartitionOwned with the members spread over a
// fleet of two `kproxy serve` processes (members a, c on one, b on the
// other; the group's owner is either), KPROXY_ROLL_REPEAT rounds, 4 by
// default.
func TestMigrationRollsKeepEveryPartitionOwnedFleet(t *testing.T) {
	const topic, parts = "owners", 6
	// KIP-848 members heartbeat every 500 ms (the cluster's setting,
	// which kproxy reads), so a roll is not paced by 5 s heartbeats.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(parts, topic),
		kfake.GroupMinSessionTimeout(500*time.Millisecond), kfake.AllowAutoTopicCreation(),
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "500", "group.consumer.min.heartbeat.interval.ms": "500"}))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	procs := []*kproxyProc{startKproxy(t, "A", brokers, fleetArgs...), startKproxy(t, "B", brokers, fleetArgs...)}
	waitFleetSettled(t, procs, 30*time.Second)

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // records flow during the rolls
		defer wg.Done()
		for n := 0; ctx.Err() == nil; n++ {
			if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(itoa(n))}).FirstErr(); err != nil && ctx.Err() == nil {
				t.Errorf("produce: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer wg.Wait()
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(procs[0].addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rollOwned(t, topic, parts, rollRepeat(t, 4), func(i int, name string, cfg memberCfg) *member {
		return startMemberAt(t, procs[i%2].addr, name, cfg)
	}, func(group string) string { return describeOwners(ctx, cl, group) })
}

// describeOwners renders what kproxy says of group's members and their
// assignments (ConsumerGroupDescribe, else DescribeGroups), for a
// failure's message.
func describeOwners(ctx context.Context, cl *kgo.Client, group string) string {
	cg := kmsg.NewPtrConsumerGroupDescribeRequest()
	cg.Groups = []string{group}
	if resp, err := cg.RequestWith(ctx, cl); err == nil && resp.Groups[0].ErrorCode == 0 {
		b, _ := json.Marshal(resp.Groups[0])
		return string(b)
	}
	dg := kmsg.NewPtrDescribeGroupsRequest()
	dg.Groups = []string{group}
	resp, err := dg.RequestWith(ctx, cl)
	if err != nil {
		return "DescribeGroups: " + err.Error()
	}
	g := resp.Groups[0]
	out := fmt.Sprintf("classic %s generation? protocol %s:", g.State, g.Protocol)
	for _, m := range g.Members {
		var a kmsg.ConsumerMemberAssignment
		_ = a.ReadFrom(m.MemberAssignment)
		out += fmt.Sprintf(" %s(%s)=%v", m.MemberID, m.ClientID, a.Topics)
	}
	return out
}
