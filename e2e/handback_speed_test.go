package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// TestHandBackAtDirectSpeed: the first member of an application moved
// back off kproxy (docs/anchors.md, "Out (rollback)") against the same
// move made directly, in the same run on the same cluster. Three
// members consume a 6-partition topic, all behind kproxy on one path
// and all on the brokers on the other; c stops (a clean leave; static
// members, with instance ids, stop without one, KIP-345) and restarts
// against the brokers as c-direct (static: under c's instance id, where
// directly it takes c's place without a rebalance). Measured on each path: the
// time from c-direct's start until a, b and c-direct share every
// partition (c-direct consumes again), and how many assign callbacks
// (one per generation a member completes) each member had from c's
// leave until then. Through kproxy the move must cost at most a second
// more than directly and no more callbacks per member. No partition is
// ever owned twice and every record produced is consumed, on both paths.
// KPROXY_HANDBACK_ROUNDS sets the rounds (alternating the paths; 5 by
// default); the assertions take the medians. A round through kproxy
// whose own rebalance for c's leave completed before the hand-back
// began costs two callbacks (docs/anchors.md: 3 of 21 eager rounds on a
// quiet machine; 2 of 3 once with other tests loading both cores, which
// failed a median of three). A static c-direct must also consume again
// through kproxy before a or b rebalanced: kproxy hands it c's
// partitions at once (internal/coexist/anchor_handback.go), where
// before it waited for the others' next heartbeat and the hand-back.
func TestHandBackAtDirectSpeed(t *testing.T) {
	rounds := envCount("KPROXY_HANDBACK_ROUNDS", 5)
	for _, balancer := range []string{"cooperative", "eager", "static"} {
		t.Run(balancer, func(t *testing.T) {
			s := newStack(t)
			var took [2][]time.Duration // [direct, kproxy]
			var calls [2][]int          // the most assign callbacks of one member per move
			var others []int            // through kproxy, the most of a's and b's
			for r := range rounds {
				for path, via := range []string{"direct", "kproxy"} {
					d, c, o := handBackMove(t, s, balancer, via, r)
					took[path] = append(took[path], d)
					calls[path] = append(calls[path], c)
					if via == "kproxy" {
						others = append(others, o)
					}
				}
			}
			direct, through := median(took[0]), median(took[1])
			cd, ck := medianInt(calls[0]), medianInt(calls[1])
			t.Logf("%s, %d rounds: c-direct consumes again after %s directly (%v), %s through kproxy (%v); assign callbacks per member, most: %d directly (%v), %d through kproxy (%v)",
				balancer, rounds, direct, took[0], through, took[1], cd, calls[0], ck, calls[1])
			if through > direct+time.Second {
				t.Errorf("the move back through kproxy took %s, directly %s: more than a second more", through, direct)
			}
			if ck > cd {
				t.Errorf("the move back through kproxy cost a member %d assign callbacks, directly %d", ck, cd)
			}
			if o := medianInt(others); balancer == "static" && o > 0 {
				// The static member takes its place at once; a and b
				// follow later, in the hand-back's own rebalance.
				t.Errorf("through kproxy c-direct, static, consumed again only after a or b rebalanced (%d callbacks, %v)", o, others)
			}
		})
	}
}

// handBackMove makes the move of TestHandBackAtDirectSpeed once, the
// members behind kproxy (via "kproxy") or on the brokers ("direct"), and
// returns how long c-direct took to consume again, the most assign
// callbacks one member had meanwhile, and the most a or b had.
func handBackMove(t *testing.T, s *stack, balancer, via string, round int) (took time.Duration, most, others int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	name := fmt.Sprintf("speed-%s-%s-%d", balancer, via, round)
	tr := startTrio(ctx, t, s, name, balancer, via)
	own := tr.mc.own
	before := map[string]int{"a": own.assignCalls("a"), "b": own.assignCalls("b")}

	tr.c.leave()
	own.releaseAll("c")
	moved := time.Now()
	if testing.Verbose() {
		// The cluster's group as it changes, for the log.
		tctx, stop := context.WithCancel(ctx)
		defer stop()
		go traceGroup(tctx, t, directAdmin(t, s), name, moved)
	}
	c2 := tr.start(t, s.cluster.ListenAddrs()[0], "c-direct", "c")
	defer c2.leave()
	waitOwners(t, own, 6, "a", "b", "c-direct")
	took = time.Since(moved)
	for _, m := range []string{"a", "b"} {
		others = max(others, own.assignCalls(m)-before[m])
	}
	most = max(others, own.assignCalls("c-direct"))
	t.Logf("%s: c-direct consumes again %s after it started; assign callbacks a %d, b %d, c-direct %d",
		name, took.Round(time.Millisecond), own.assignCalls("a")-before["a"], own.assignCalls("b")-before["b"], own.assignCalls("c-direct"))
	if via == "kproxy" {
		// The hand-back ends: a and b follow c-direct into the
		// cluster's group and the anchor leaves (a static c-direct
		// consumes before that).
		waitDirect(ctx, t, directAdmin(t, s), name, "a, b and c-direct in the cluster's group, the anchor gone", func(d kadm.DescribedGroup) bool {
			return len(d.Members) == 3 && d.State == "Stable" && !slices.ContainsFunc(d.Members, isAnchorMember)
		})
	}
	tr.finish(ctx, t, s)
	return took, most, others
}

func medianInt(xs []int) int {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestStaticMovesBackDuringHandBack: two static members moved back off
// kproxy one right after the other, as a rolling restart moves the next
// member once the one before consumes again, against the same two moves
// made directly. The second one reaches the cluster while the hand-back
// the first one began still waits for a (behind kproxy) to follow at
// its next heartbeat, so it waits for the hand-back's rebalance. On
// Kafka each restart takes its instance id's place without a rebalance
// directly; kfake rebalances when a static member rejoins with other
// metadata (a restart owns nothing), so directly the second one often
// waits for a rebalance too. Through kproxy each must consume again
// within a second of the same move made directly (the medians of
// KPROXY_HANDBACK_ROUNDS rounds, 3 by default). No partition is ever
// owned twice and every record produced is consumed.
func TestStaticMovesBackDuringHandBack(t *testing.T) {
	rounds := envCount("KPROXY_HANDBACK_ROUNDS", 3)
	s := newStack(t)
	var took [2][2][]time.Duration // [direct, kproxy][c, b]
	for r := range rounds {
		for path, via := range []string{"direct", "kproxy"} {
			c, b := staticMovesBack(t, s, via, r)
			took[path][0] = append(took[path][0], c)
			took[path][1] = append(took[path][1], b)
		}
	}
	for i, who := range []string{"c", "b"} {
		direct, through := median(took[0][i]), median(took[1][i])
		t.Logf("%s-direct consumes again after %s directly (%v), %s through kproxy (%v)", who, direct, took[0][i], through, took[1][i])
		if through > direct+time.Second {
			t.Errorf("moving %s back through kproxy took %s, directly %s: more than a second more", who, through, direct)
		}
	}
}

// staticMovesBack makes the moves of TestStaticMovesBackDuringHandBack
// once and returns how long c-direct, then b-direct, took to consume
// again.
func staticMovesBack(t *testing.T, s *stack, via string, round int) (c, b time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	name := fmt.Sprintf("static-two-%s-%d", via, round)
	tr := startTrio(ctx, t, s, name, "static", via)
	own := tr.mc.own
	broker := s.cluster.ListenAddrs()[0]

	tr.c.leave()
	own.releaseAll("c")
	at := time.Now()
	c2 := tr.start(t, broker, "c-direct", "c")
	defer c2.leave()
	waitOwners(t, own, 6, "a", "b", "c-direct")
	c = time.Since(at)

	tr.b.leave()
	own.releaseAll("b")
	at = time.Now()
	tr.b = tr.start(t, broker, "b-direct", "b") // finish makes it leave
	waitOwners(t, own, 6, "a", "b-direct", "c-direct")
	b = time.Since(at)
	t.Logf("%s: c-direct consumes again %s after it started, b-direct %s", name, c.Round(time.Millisecond), b.Round(time.Millisecond))
	tr.finish(ctx, t, s)
	return c, b
}
