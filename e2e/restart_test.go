package e2e

import (
	"context"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
)

// TestGroupSurvivesProxyRestart restarts kproxy (engine, proxy and store
// client) under a stable franz-go group of two members. The engine
// reloads the group's metadata from the upstream cluster's compacted
// topic: the members keep heartbeating with their member ids and
// generation, nobody rebalances, every partition keeps its owner and no
// record is lost.
func TestGroupSurvivesProxyRestart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		balancer kgo.GroupBalancer
	}{
		{"range", kgo.RangeBalancer()},
		{"cooperative-sticky", kgo.CooperativeStickyBalancer()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRestartableStack(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			const topic, group, parts = "survive", "survive-group", 4
			s.produce(ctx, topic, parts, 200)
			own, recs := newOwnership(t), newRecords()
			mc := memberCfg{group: group, topic: topic, own: own, recs: recs, opts: []kgo.Opt{kgo.Balancers(tc.balancer)}}
			if testing.Verbose() {
				mc.opts = append(mc.opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, nil)))
			}
			a := s.startMember("a", mc)
			b := s.startMember("b", mc)
			waitOwners(t, own, parts, "a", "b")
			waitConsumed(t, recs, 200)
			before, ok := s.engine.Group(group)
			if !ok || before.State != "Stable" || len(before.Members) != 2 {
				t.Fatalf("before the restart: %+v", before)
			}
			owners := own.owners()
			// The syncs were answered after the record was durable, so
			// the owners seen here are what the cluster holds.
			rebalances := len(s.eventsOf(groupstate.EventRebalanceStarted))

			s.stop()
			s.start()

			s.produceRange(ctx, topic, 200, 400)
			waitConsumed(t, recs, 400)
			// The new engine loads the group on its first request (a
			// heartbeat within 300ms, or a commit).
			var after groupstate.GroupSnapshot
			for wait := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if _, ok = s.engine.Group(group); ok {
					break
				}
				if time.Now().After(wait) {
					t.Fatal("the restarted engine never loaded the group")
				}
			}
			// Several session timeouts (3s) pass on the new engine: a
			// member it did not know would have expired by now.
			deadline := time.Now().Add(4 * time.Second)
			for time.Now().Before(deadline) {
				after, ok = s.engine.Group(group)
				if !ok || after.State != "Stable" || after.Generation != before.Generation || len(after.Members) != 2 {
					s.mu.Lock()
					for _, ev := range s.events {
						t.Logf("%s %s gen %d cause %s member %+v", ev.Time.Format("05.000"), ev.Kind, ev.Generation, ev.Cause, ev.Member)
					}
					s.mu.Unlock()
					t.Fatalf("after the restart: %+v (before: generation %d)", after, before.Generation)
				}
				time.Sleep(250 * time.Millisecond)
			}
			ids := func(g groupstate.GroupSnapshot) []string {
				var out []string
				for _, m := range g.Members {
					out = append(out, m.MemberID)
				}
				slices.Sort(out)
				return out
			}
			if !slices.Equal(ids(before), ids(after)) {
				t.Fatalf("members changed: %v → %v", ids(before), ids(after))
			}
			s.assertRestartInvisible(rebalances, own, owners, recs, 400)
			s.assertCommittedAtEnd(ctx, group, topic)
			s.assertBrokersSawNoGroupTraffic()
			a.leave()
			b.leave()
		})
	}
}

// newRestartableStack is newStack whose proxy listens on a port P with
// P+1..P+3 free, so that a restart (which keeps P and serves broker N on
// P+1+N) keeps every broker address: the stack's first proxy serves its
// brokers on ephemeral ports, which a restart would move, as
// `kproxy serve --listen HOST:PORT` never does.
func newRestartableStack(t *testing.T, opts ...stackOpt) *stack {
	t.Helper()
	s := newStack(t, opts...)
	s.moveToPortBlock()
	return s
}

// moveToPortBlock restarts kproxy on a port P with P+1..P+3 free (see
// newRestartableStack).
func (s *stack) moveToPortBlock() {
	s.t.Helper()
	s.stop()
	for attempt := 0; ; attempt++ {
		base, err := freePortBlock(4)
		if err == nil {
			s.listen = base
			err = s.tryStart()
		}
		if err == nil {
			return
		}
		if attempt == 20 {
			s.t.Fatalf("no block of 4 free ports for the proxy: %v", err)
		}
	}
}

// freePortBlock returns 127.0.0.1:P where ports P to P+n-1 were free.
func freePortBlock(n int) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	for i := 1; i < n; i++ {
		li, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+i)))
		if err != nil {
			return "", err
		}
		defer li.Close()
	}
	return l.Addr().String(), nil
}

// equalOwners compares two owner maps.
func equalOwners(x, y map[string][]int32) bool {
	if len(x) != len(y) {
		return false
	}
	for m, ps := range x {
		if !slices.Equal(ps, y[m]) {
			return false
		}
	}
	return true
}
