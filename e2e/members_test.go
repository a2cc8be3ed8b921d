package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// records tracks which record values were consumed, and how often.
type records struct {
	mu   sync.Mutex
	seen map[string]int // guarded by mu
}

func newRecords() *records { return &records{seen: map[string]int{}} }

func (r *records) add(v string) {
	r.mu.Lock()
	r.seen[v]++
	r.mu.Unlock()
}

func (r *records) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// missing lists the values in [0, n) never consumed.
func (r *records) missing(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for i := range n {
		if r.seen[itoa(i)] == 0 {
			out = append(out, itoa(i))
		}
	}
	return out
}

// member is one franz-go group consumer that processes, commits and then
// allows rebalances, so that a rebalance never loses a commit.
type member struct {
	name   string
	cl     *kgo.Client
	dialer *cuttableDialer
	cancel context.CancelFunc // stops the poll loop
	// abort also cuts short a commit in flight (kill); leave lets it
	// finish, as a consumer that closes cleanly commits what it read.
	abort context.CancelFunc
	done  chan struct{}
	// closing is set by the first close of cl (leave, kill, or the
	// test's cleanup).
	closing atomic.Bool
}

// close closes the member's client once; a later call returns at once.
func (m *member) close() {
	if m.closing.CompareAndSwap(false, true) {
		m.cl.Close()
	}
}

type memberCfg struct {
	group, topic string
	own          *ownership
	recs         *records
	opts         []kgo.Opt
	// session, when set, is the session timeout of a sarama member
	// (franz-go members take theirs from opts).
	session time.Duration
	// autoCommit runs the member as a plain franz-go consumer: offsets
	// committed by the client's own autocommit, rebalances not held
	// back by the poll loop.
	autoCommit bool
}

func (s *stack) startMember(name string, mc memberCfg) *member {
	s.t.Helper()
	return startMemberAt(s.t, s.addr(), name, mc)
}

// startMemberAt starts a member bootstrapped at addr.
func startMemberAt(t testing.TB, addr, name string, mc memberCfg) *member {
	t.Helper()
	m := &member{name: name, dialer: &cuttableDialer{}, done: make(chan struct{})}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(addr),
		kgo.ClientID(name),
		kgo.Dialer(m.dialer.DialContext),
		kgo.ConsumerGroup(mc.group),
		kgo.ConsumeTopics(mc.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(3 * time.Second),
		kgo.HeartbeatInterval(300 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, a map[string][]int32) {
			_, gen := cl.GroupMetadata()
			// A static member's new instance takes over its
			// assignment at its generation (KIP-345): one member.
			who := name
			if inst, ok := cl.OptValue(kgo.InstanceID).(string); ok {
				who = "instance " + inst
			}
			mc.own.assignedAt(name, who, gen, a[mc.topic])
		}),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, r map[string][]int32) {
			mc.own.released(name, r[mc.topic])
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, l map[string][]int32) {
			mc.own.released(name, l[mc.topic])
		}),
	}, mc.opts...)
	if !mc.autoCommit {
		opts = append(opts, kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll())
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	m.cl = cl
	ctx, cancel := context.WithCancel(context.Background())
	commitCtx, abort := context.WithCancel(context.Background())
	m.cancel, m.abort = cancel, abort
	// A member the test left running stops with the test: its client
	// would otherwise go on dialing its addresses for the rest of the
	// package, and reach a later test's kproxy listening on a reused
	// port (TestGroupSurvivesProxyRestart counted such a member's join
	// as a rebalance of its restart).
	t.Cleanup(func() {
		m.cancel()
		<-m.done
		m.abort()
		m.close()
	})
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			fs := cl.PollRecords(ctx, 200)
			recs := fs.Records()
			for _, r := range recs {
				mc.recs.add(string(r.Value))
			}
			if mc.autoCommit {
				continue
			}
			if len(recs) > 0 {
				// The records count as consumed before their commit
				// lands: a test that waits for them and then leaves
				// must not cancel that commit (it did, and the
				// committed offsets stopped short of the end).
				cctx, done := context.WithTimeout(commitCtx, 15*time.Second)
				if err := cl.CommitRecords(cctx, recs...); err != nil && commitCtx.Err() == nil {
					t.Logf("%s: commit: %v", name, err)
				}
				done()
			}
			cl.AllowRebalance()
		}
	}()
	return m
}

// leave stops the member cleanly: it leaves the group.
func (m *member) leave() {
	m.cancel()
	<-m.done
	m.abort()
	m.close()
}

// kill cuts the member off the network without a goodbye, as a crashed
// process; the coordinator must notice through the session timeout.
func (m *member) kill(own *ownership) {
	m.dialer.kill()
	own.releaseAll(m.name)
	m.cancel()
	m.abort()
	<-m.done
	go m.close() // it cannot reach anyone; do not wait for it
}

// waitOwners waits until exactly the named members own all partitions.
func waitOwners(t testing.TB, own *ownership, partitions int, names ...string) {
	t.Helper()
	waitOwnersWithin(t, own, 30*time.Second, partitions, names...)
}

// waitOwnersWithin is waitOwners with a deadline of its own.
func waitOwnersWithin(t testing.TB, own *ownership, within time.Duration, partitions int, names ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		owners := own.owners()
		total := 0
		for _, ps := range owners {
			total += len(ps)
		}
		ok := total == partitions && len(owners) == len(names)
		for _, n := range names {
			ok = ok && len(owners[n]) > 0
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("partitions never settled on %v: owners %v", names, owners)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitConsumed(t testing.TB, recs *records, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for recs.distinct() < n {
		if time.Now().After(deadline) {
			t.Fatalf("consumed %d of %d records; missing e.g. %v", recs.distinct(), n, head(recs.missing(n), 10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func head(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
