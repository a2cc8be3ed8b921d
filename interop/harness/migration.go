package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The java-migration row (issue 11): the online migration of a live group
// between the classic protocol and KIP-848's consumer protocol, as a
// rolling restart does it. Three kafka-clients members start classic
// (cooperative-sticky); one at a time each is stopped cleanly and
// replaced by a member with group.protocol=consumer, until the group is a
// consumer group; then the same way back to classic. Records flow the
// whole time. On both paths: every record is consumed, committed offsets
// reach the end offsets, no partition is held by two members in one
// generation or epoch nor at one instant (checkOwnership), and after each
// roll the group is of the type rolled to: ListGroups v5 names it, a
// consumer group answers ConsumerGroupDescribe Stable with only
// consumer-protocol members, a classic group answers DescribeGroups
// Stable with protocol type consumer.

// migrationProduceEvery spaces the records produced during the rolls
// (ms), so that they flow through most of them.
const migrationProduceEvery = 40

// migrationStep is one roll of the whole group to one protocol.
type migrationStep struct {
	assignor string // the replacements' --assignor
	want     string // the group type once every member is replaced
}

var migrationSteps = []migrationStep{
	{assignor: "server-uniform", want: "consumer"},
	{assignor: "cooperative-sticky", want: "classic"},
}

// runMigration runs the java-migration row on s.path.
func (s *scenario) runMigration(ctx context.Context) (res result) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	defer func() {
		s.killAll(!res.pass)
		res.elapsed = time.Since(start)
		s.mu.Lock()
		res.notes = append(res.notes, s.notes...)
		if s.errorsSeen > 0 {
			res.notes = append(res.notes, fmt.Sprintf("%d client error events, e.g. %s", s.errorsSeen, strings.Join(s.errorSamples, " | ")))
		}
		s.mu.Unlock()
	}()
	fail := func(format string, args ...any) result {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	n, half, parts := s.h.records, s.h.records/2, s.h.partitions
	if err := s.h.createTopic(ctx, s.topic, parts); err != nil {
		return fail("%v", err)
	}
	if err := s.runOnce("producer-1", s.clientArgs("produce", "producer-1", "--count", fmt.Sprint(half), "--start", "0"), 90*time.Second); err != nil {
		return fail("produce first half: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.bootstrap))
	if err != nil {
		return fail("admin client via %s: %v", s.bootstrap, err)
	}
	defer cl.Close()

	next := 0
	startAs := func(assignor string) (*member, error) {
		next++
		name := fmt.Sprintf("m%d", next)
		m, err := s.startMember(name, s.clientArgs("consume", name, "--assignor", assignor))
		if err != nil {
			return nil, err
		}
		m.identity = s.identity(name)
		return m, nil
	}
	var ms []*member
	for range s.h.membersN {
		m, err := startAs(s.r.assignor)
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
	if _, err := s.waitFor(s.h.consumeTimeout, "the first half to be consumed", func() bool { return s.distinctLocked(0, half) == half }); err != nil {
		return fail("%v (consumed %d distinct)", err, s.distinctLocked(0, half))
	}
	if err := s.waitGroupType(ctx, cl, "classic", len(ms)); err != nil {
		return fail("before the rolls: %v", err)
	}

	prod, err := s.startMember("producer-2", s.clientArgs("produce", "producer-2",
		"--count", fmt.Sprint(n-half), "--start", fmt.Sprint(half), "--interval-ms", fmt.Sprint(migrationProduceEvery)))
	if err != nil {
		return fail("%v", err)
	}
	var types []string
	for _, step := range migrationSteps {
		rolled := time.Now()
		for i := range ms {
			if err := s.stop(ms[i], 30*time.Second); err != nil {
				return fail("stopping %s: %v", ms[i].name, err)
			}
			m, err := startAs(step.assignor)
			if err != nil {
				return fail("%v", err)
			}
			ms[i] = m
			if _, err := s.waitFor(s.h.settleTimeout, "the group to settle after "+m.name+" joined with "+step.assignor, func() bool { return s.stableLocked(ms) }); err != nil {
				return fail("rolling to %s: %v; %s", step.want, err, s.ownersSummary())
			}
		}
		if err := s.waitGroupType(ctx, cl, step.want, len(ms)); err != nil {
			return fail("after the roll to %s: %v", step.want, err)
		}
		types = append(types, step.want)
		settles = append(settles, fmtDur(time.Since(rolled)))
	}
	res.settle = strings.Join(settles, "/") // initial join/roll to consumer/roll back

	select {
	case <-prod.done:
	case <-time.After(90 * time.Second):
		return fail("producer-2 did not finish")
	}
	if s.prodFailed(prod) {
		return fail("producer-2 failed: %s", tail(s.logPath("producer-2.stderr"), 400))
	}
	if _, err := s.waitFor(s.h.consumeTimeout, "every record to be consumed", func() bool { return s.distinctLocked(0, n) == n }); err != nil {
		return fail("%v (consumed %d distinct of %d)", err, s.distinctLocked(0, n), n)
	}
	if err := s.h.waitCommitted(ctx, s); err != nil {
		return fail("%v", err)
	}
	for _, m := range ms {
		if err := s.stop(m, 30*time.Second); err != nil {
			return fail("closing members: %v", err)
		}
	}
	s.mu.Lock()
	res.records = s.distinctLocked(0, n)
	dups := s.consumed - res.records
	s.mu.Unlock()
	if dups > 0 {
		res.notes = append(res.notes, fmt.Sprintf("%d records delivered more than once (allowed: at-least-once)", dups))
	}
	rebalances, err := s.checkOwnership()
	res.rebalances = rebalances
	if err != nil {
		return fail("%v", err)
	}
	res.notes = append(res.notes, "group type: classic → "+strings.Join(types, " → ")+", each roll one member at a time while records flowed")
	res.pass = true
	return res
}

// prodFailed reports whether the producer process exited with an error.
func (s *scenario) prodFailed(m *member) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return m.exitErr != nil
}

// waitGroupType waits until the group is a Stable group of type want
// ("classic" or "consumer") with members members, as the path answers.
func (s *scenario) waitGroupType(ctx context.Context, cl *kgo.Client, want string, members int) error {
	deadline := time.Now().Add(s.h.settleTimeout)
	var last string
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		last = groupTypeMismatch(cctx, cl, s.group, want, members)
		cancel()
		if last == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the group is not a Stable %s group of %d members: %s", want, members, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// groupTypeMismatch says how group differs from a Stable group of type
// want with members members, or "" when it does not.
func groupTypeMismatch(ctx context.Context, cl *kgo.Client, group, want string, members int) string {
	lg := kmsg.NewPtrListGroupsRequest()
	lg.Version = 5
	lresp, err := lg.RequestWith(ctx, cl)
	if err != nil {
		return "ListGroups: " + err.Error()
	}
	listed := ""
	for _, g := range lresp.Groups {
		if g.Group == group {
			listed = g.GroupType
		}
	}
	if listed != want {
		return fmt.Sprintf("ListGroups names its type %q", listed)
	}
	switch want {
	case "consumer":
		req := kmsg.NewPtrConsumerGroupDescribeRequest()
		req.Version = 1
		req.Groups = []string{group}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return "ConsumerGroupDescribe: " + err.Error()
		}
		g := resp.Groups[0]
		if g.ErrorCode != 0 || g.State != "Stable" || len(g.Members) != members {
			return fmt.Sprintf("ConsumerGroupDescribe: %v, state %q, %d members", kerr.ErrorForCode(g.ErrorCode), g.State, len(g.Members))
		}
		for _, m := range g.Members {
			if m.MemberType != 1 {
				return fmt.Sprintf("member %s is of type %d, not a consumer-protocol member", m.MemberID, m.MemberType)
			}
		}
	case "classic":
		req := kmsg.NewPtrDescribeGroupsRequest()
		req.Groups = []string{group}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return "DescribeGroups: " + err.Error()
		}
		g := resp.Groups[0]
		if g.ErrorCode != 0 || g.State != "Stable" || g.ProtocolType != "consumer" || len(g.Members) != members {
			return fmt.Sprintf("DescribeGroups: %v, state %q, protocol type %q, %d members", kerr.ErrorForCode(g.ErrorCode), g.State, g.ProtocolType, len(g.Members))
		}
	}
	return ""
}
