package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The broker-kill row (issue 12): on a cluster of three brokers, an
// idempotent franz-go producer (acks=all, replication 3, min.insync 2)
// and a franz-go group member (autocommit) run while the JVM of a broker
// that leads partitions of the topic is killed with SIGKILL and, later,
// started again. Counted on each path: failed produces, commit errors,
// connections closed during ApiVersions (which franz-go reads as TLS or
// SASL trouble and does not retry), the longest gap between produce
// acknowledgements, and the time until records produced after the kill
// are consumed from the partitions the dead broker led. Every path must
// see no failed produce and no commit error, consume every acknowledged
// record, and kproxy's stall must stay within a few seconds of the
// direct path's.
//
// The victim is never the coordinator of the row's group, of kproxy's
// fleet group or of kproxy's transactional store for the group: those are
// coordinator failovers, not the data-path fault this row measures.
const (
	killBefore   = 2 * time.Second  // producing before the kill
	killDown     = 10 * time.Second // the broker stays dead this long
	killAfter    = 3 * time.Second  // producing after the broker is back
	killSlack    = 5 * time.Second  // kproxy's stall may exceed the direct one by this much (broker fencing takes 4 s; a loaded runner adds up to ~3 s either way)
	killProduceE = 5 * time.Millisecond
)

// brokerOutage is what one path of the row measured.
type brokerOutage struct {
	victim          int32
	moved           []int32
	produced        int64
	failedProduces  int64
	commitErrors    int64
	apiVersionsEOFs int64
	consumed        int
	maxAckGap       time.Duration
	gapEnd          time.Duration // when the longest gap ended, from the kill
	resumed         time.Duration // -1: never
	restartTook     time.Duration
}

func (o brokerOutage) String() string {
	return fmt.Sprintf("killed broker %d (led %v): %d produced, %d failed, %d commit errors, %d ApiVersions EOFs, %d consumed, longest produce stall %s (ended %s after the kill), moved partitions consumed again %s after the kill, restart took %s",
		o.victim, o.moved, o.produced, o.failedProduces, o.commitErrors, o.apiVersionsEOFs, o.consumed,
		fmtDur(o.maxAckGap), fmtDur(o.gapEnd), fmtDur(o.resumed), fmtDur(o.restartTook))
}

// eofHook counts ApiVersions reads that ended in a clean EOF.
type eofHook struct{ n atomic.Int64 }

func (h *eofHook) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e kgo.BrokerE2E) {
	if key == 18 && errors.Is(e.ReadErr, io.EOF) {
		h.n.Add(1)
	}
}

// kafkaSh runs interop/kafka.sh with args (kill N, restart N); run.sh
// exports KPROXY_CACHE, which names the cluster's state directory.
func (h *harness) kafkaSh(args ...string) error {
	cmd := exec.Command("bash", append([]string{h.root + "/interop/kafka.sh"}, args...)...)
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kafka.sh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// coordinatorOf asks the broker (directly) which node coordinates key.
func (h *harness) coordinatorOf(ctx context.Context, key string, typ int8) (int32, error) {
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorType = typ
	req.CoordinatorKeys = []string{key}
	req.CoordinatorKey = key
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		resp, err := req.RequestWith(cctx, h.cl)
		if err != nil {
			return -1, fmt.Errorf("find coordinator %q: %w", key, err)
		}
		code, node := resp.ErrorCode, resp.NodeID
		if len(resp.Coordinators) > 0 {
			code, node = resp.Coordinators[0].ErrorCode, resp.Coordinators[0].NodeID
		}
		if code == 0 {
			return node, nil
		}
		if !kerr.IsRetriable(kerr.ErrorForCode(code)) {
			return -1, fmt.Errorf("find coordinator %q: %w", key, kerr.ErrorForCode(code))
		}
		select {
		case <-cctx.Done():
			return -1, fmt.Errorf("find coordinator %q: %w", key, kerr.ErrorForCode(code))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// leaders returns the leader of every partition of topic, and checks
// that every partition has its full replica set in sync.
func (h *harness) leaders(ctx context.Context, topic string) (map[int32]int32, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tds, err := h.adm.ListTopicsWithInternal(cctx, topic)
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	td, ok := tds[topic]
	if !ok || td.Err != nil {
		return nil, fmt.Errorf("metadata of %s: %v", topic, td.Err)
	}
	out := map[int32]int32{}
	for _, pd := range td.Partitions {
		if pd.Err != nil || len(pd.ISR) < len(pd.Replicas) {
			return nil, fmt.Errorf("%s/%d: leader %d, replicas %v, in sync %v, err %v", topic, pd.Partition, pd.Leader, pd.Replicas, pd.ISR, pd.Err)
		}
		out[pd.Partition] = pd.Leader
	}
	return out, nil
}

// restorePreferredLeaders hands the leadership of every partition of the
// cluster back to its preferred replica (the first listed), retrying
// within the given time while a replica catches up, and returns how
// many partitions it moved. Left to the controller's periodic election
// (every leader.imbalance.check.interval.seconds, 300 s by default), the
// killed broker's partitions, coordinators of __consumer_offsets among
// them, would move back in the middle of a later row (interop/README.md,
// py-confluent-adoption).
func (h *harness) restorePreferredLeaders(ctx context.Context, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	moved := 0
	var last error // the last election's refusal, for the error
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		tds, err := h.adm.ListTopicsWithInternal(cctx)
		cancel()
		if err != nil {
			return moved, fmt.Errorf("listing the topics to restore their preferred leaders: %w", err)
		}
		off, n := make(kadm.TopicsSet), 0
		for _, td := range tds {
			for _, pd := range td.Partitions {
				if pd.Err == nil && len(pd.Replicas) > 0 && pd.Leader != pd.Replicas[0] {
					off.Add(td.Topic, pd.Partition)
					n++
				}
			}
		}
		if n == 0 {
			return moved, nil
		}
		if time.Now().After(deadline) {
			return moved, fmt.Errorf("%d partitions still not led by their preferred replica after %s (last refusal: %v): %v", n, within, last, off.Sorted())
		}
		cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		rs, err := h.adm.ElectLeaders(cctx, kadm.ElectPreferredReplica, off)
		cancel()
		if err != nil {
			last = err
		}
		for _, ps := range rs {
			for _, r := range ps {
				if r.Err == nil {
					moved++
				} else {
					last = fmt.Errorf("%s/%d: %w", r.Topic, r.Partition, r.Err)
				}
			}
		}
		// A replica not yet in sync refuses the election
		// (PREFERRED_LEADER_NOT_AVAILABLE); the next turn asks again.
		select {
		case <-ctx.Done():
			return moved, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// pickVictim chooses the broker to kill and the group name: the victim
// leads at least one partition of the topic and coordinates none of the
// group, kproxy's fleet group, or (on the kproxy path) the groups-topic
// partition the group lives in and its transactional id.
func (s *scenario) pickVictim(ctx context.Context, leaders map[int32]int32) (int32, string, error) {
	avoid := map[int32]string{}
	if s.path == "kproxy" {
		// The tier's kproxy runs under the default fleet name.
		c, err := s.h.coordinatorOf(ctx, "__kproxy_fleet", 0)
		if err != nil {
			return -1, "", err
		}
		avoid[c] = "the fleet group's coordinator"
	}
	var groupsLeaders map[int32]int32
	if s.path == "kproxy" {
		var err error
		if groupsLeaders, err = s.h.leaders(ctx, "__kproxy_groups"); err != nil {
			return -1, "", err
		}
	}
	var last string
	for i := range 20 {
		group := fmt.Sprintf("%s-%d", s.group, i)
		bad := map[int32]string{}
		for k, v := range avoid {
			bad[k] = v
		}
		c, err := s.h.coordinatorOf(ctx, group, 0)
		if err != nil {
			return -1, "", err
		}
		bad[c] = "the group's coordinator"
		if s.path == "kproxy" {
			gp := groupPartition(group, len(groupsLeaders))
			bad[groupsLeaders[gp]] = fmt.Sprintf("the leader of __kproxy_groups/%d", gp)
			t, err := s.h.coordinatorOf(ctx, fmt.Sprintf("kproxy/__kproxy_groups/%d", gp), 1)
			if err != nil {
				return -1, "", err
			}
			bad[t] = "the store's transaction coordinator"
		}
		for p := int32(0); p < int32(len(leaders)); p++ {
			if _, no := bad[leaders[p]]; !no {
				return leaders[p], group, nil
			}
		}
		last = fmt.Sprint(bad)
	}
	return -1, "", fmt.Errorf("no broker leads a partition of %s without coordinating something the row needs (last try: %s)", s.topic, last)
}

// runBrokerKill runs the row on s.path and returns its line; prior, when
// set, is the direct path's outcome to compare with.
func (s *scenario) runBrokerKill(ctx context.Context, prior *brokerOutage) (res result, out *brokerOutage) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	defer func() { res.elapsed = time.Since(start) }()
	fail := func(format string, args ...any) (result, *brokerOutage) {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res, out
	}
	bs, err := s.h.adm.ListBrokers(ctx)
	if err != nil {
		return fail("list brokers: %v", err)
	}
	if len(bs) < 3 {
		return fail("needs a cluster of 3 brokers (KPROXY_INTEROP_BROKERS=3, or run.sh's broker-kill phase); this one has %d", len(bs))
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	resp, err := s.h.adm.CreateTopic(cctx, int32(s.h.partitions), 3, map[string]*string{"min.insync.replicas": kmsg.StringPtr("2")}, s.topic)
	cancel()
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fail("create topic %s: %v", s.topic, err)
	}
	var leaders map[int32]int32
	var lerr error
	if _, err := s.waitFor(30*time.Second, "the topic's replicas to be in sync", func() bool {
		leaders, lerr = s.h.leaders(ctx, s.topic)
		return lerr == nil && len(leaders) == s.h.partitions
	}); err != nil {
		return fail("%v: %v", err, lerr)
	}
	victim, group, err := s.pickVictim(ctx, leaders)
	if err != nil {
		return fail("%v", err)
	}
	o := &brokerOutage{victim: victim, resumed: -1}
	out = o
	for p := int32(0); p < int32(len(leaders)); p++ {
		if leaders[p] == victim {
			o.moved = append(o.moved, p)
		}
	}
	movedSet := map[int32]bool{}
	for _, p := range o.moved {
		movedSet[p] = true
	}

	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	eofs := &eofHook{}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	clog, err := os.Create(s.logPath("clients.log"))
	if err != nil {
		return fail("client log: %v", err)
	}
	defer clog.Close()
	logger := func(name string) kgo.Opt {
		return kgo.WithLogger(kgo.BasicLogger(clog, kgo.LogLevelInfo, func() string {
			return name + " " + time.Since(start).Round(time.Millisecond).String() + " "
		}))
	}
	var (
		mu        sync.Mutex
		seen      = map[string]bool{}
		killedAt  atomic.Int64 // ns since start, 0 before the kill
		resumedAt atomic.Int64
		lastAck   atomic.Int64
		maxGap    atomic.Int64
		gapEnd    atomic.Int64 // when the longest gap ended, ns since start
		acked     atomic.Int64
		samples   []string
	)
	sample := func(what string) {
		mu.Lock()
		defer mu.Unlock()
		if len(samples) < 4 {
			samples = append(samples, what)
		}
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(s.bootstrap), kgo.ConsumerGroup(group), kgo.ConsumeTopics(s.topic),
		kgo.FetchMaxWait(200*time.Millisecond), kgo.AutoCommitInterval(300*time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithHooks(eofs), logger("consumer"),
		kgo.AutoCommitCallback(func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				if !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
					atomic.AddInt64(&o.commitErrors, 1)
					sample("commit: " + err.Error())
				}
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						atomic.AddInt64(&o.commitErrors, 1)
						sample(fmt.Sprintf("commit %d: %v", p.Partition, err))
					}
				}
			}
		}))
	if err != nil {
		return fail("consumer: %v", err)
	}
	consDone := make(chan struct{})
	go func() {
		defer close(consDone)
		for rctx.Err() == nil {
			fs := cons.PollFetches(rctx)
			fs.EachRecord(func(r *kgo.Record) {
				mu.Lock()
				seen[string(r.Value)] = true
				mu.Unlock()
				if k := killedAt.Load(); k != 0 && movedSet[r.Partition] && r.Timestamp.Sub(start) > time.Duration(k) {
					resumedAt.CompareAndSwap(0, int64(time.Since(start)))
				}
			})
		}
	}()
	defer func() { rcancel(); <-consDone; cons.Close() }()

	prod, err := kgo.NewClient(kgo.SeedBrokers(s.bootstrap), kgo.DefaultProduceTopic(s.topic),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.WithHooks(eofs), logger("producer"))
	if err != nil {
		return fail("producer: %v", err)
	}
	defer prod.Close()
	produceFor := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			n := atomic.AddInt64(&o.produced, 1)
			prod.Produce(rctx, &kgo.Record{Value: []byte(strconv.FormatInt(n, 10))}, func(_ *kgo.Record, err error) {
				if err != nil {
					atomic.AddInt64(&o.failedProduces, 1)
					sample("produce: " + err.Error())
					return
				}
				acked.Add(1)
				now := int64(time.Since(start))
				if prev := lastAck.Swap(now); prev != 0 && now-prev > maxGap.Load() {
					maxGap.Store(now - prev)
					gapEnd.Store(now)
				}
			})
			time.Sleep(killProduceE)
		}
	}
	produceFor(killBefore)
	// The stall is measured between acknowledgements, so they must be
	// flowing before the kill (a fresh cluster can take seconds to hand
	// out the first producer id).
	for ready := time.Now().Add(30 * time.Second); acked.Load() < 100 || time.Duration(int64(time.Since(start))-lastAck.Load()) > 200*time.Millisecond; {
		if time.Now().After(ready) {
			return fail("produce acknowledgements are not flowing before the kill: %d acknowledged", acked.Load())
		}
		produceFor(100 * time.Millisecond)
	}
	killedAt.Store(int64(time.Since(start)))
	// kafka.sh kill waits for the JVM to exit, which takes a while:
	// records keep flowing meanwhile.
	killed := make(chan error, 1)
	go func() { killed <- s.h.kafkaSh("kill", fmt.Sprint(victim)) }()
	s.h.log.Info("broker-kill row: killing", "broker", victim, "path", s.path, "led", o.moved)
	produceFor(killDown)
	if err := <-killed; err != nil {
		return fail("%v", err)
	}
	restartAt := time.Now()
	restarted := make(chan error, 1)
	go func() { restarted <- s.h.kafkaSh("restart", fmt.Sprint(victim)) }()
	// Records keep flowing while the broker starts; its start is bounded
	// by kafka.sh (90 s).
	for {
		produceFor(500 * time.Millisecond)
		select {
		case err := <-restarted:
			if err != nil {
				return fail("%v", err)
			}
			o.restartTook = time.Since(restartAt)
		default:
			continue
		}
		break
	}
	produceFor(killAfter)
	fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
	err = prod.Flush(fctx)
	fcancel()
	if err != nil {
		return fail("flush: %v", err)
	}
	want := int(o.produced - o.failedProduces)
	_, _ = s.waitFor(30*time.Second, "every acknowledged record to be consumed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) >= want
	})
	mu.Lock()
	o.consumed = len(seen)
	errs := append([]string(nil), samples...)
	mu.Unlock()
	o.maxAckGap = time.Duration(maxGap.Load())
	o.gapEnd = time.Duration(gapEnd.Load() - killedAt.Load())
	o.apiVersionsEOFs = eofs.n.Load()
	if r := resumedAt.Load(); r != 0 {
		o.resumed = time.Duration(r - killedAt.Load())
	}
	// The next path needs the victim's replicas back in sync.
	if _, err := s.waitFor(60*time.Second, "the restarted broker to rejoin every ISR", func() bool {
		_, err := s.h.leaders(ctx, s.topic)
		return err == nil
	}); err != nil {
		res.notes = append(res.notes, "after the row: "+err.Error())
	}
	// Then the cluster as the row found it: every partition led by its
	// preferred replica (restorePreferredLeaders).
	restoring := time.Now()
	if n, err := s.h.restorePreferredLeaders(ctx, 60*time.Second); err != nil {
		res.notes = append(res.notes, "after the row: "+err.Error())
	} else if n > 0 {
		res.notes = append(res.notes, fmt.Sprintf("after the row: %d partitions' leadership handed back to their preferred replicas in %s", n, fmtDur(time.Since(restoring))))
	}

	res.records = o.consumed
	res.settle = fmt.Sprintf("stall %s", fmtDur(o.maxAckGap))
	res.notes = append(res.notes, o.String())
	if len(errs) > 0 {
		res.notes = append(res.notes, "errors: "+strings.Join(errs, " | "))
	}
	var problems []string
	if o.failedProduces != 0 || o.commitErrors != 0 || o.apiVersionsEOFs != 0 {
		problems = append(problems, fmt.Sprintf("%d failed produces, %d commit errors, %d connections closed during ApiVersions; want none", o.failedProduces, o.commitErrors, o.apiVersionsEOFs))
	}
	if o.consumed != want {
		problems = append(problems, fmt.Sprintf("consumed %d distinct records of %d acknowledged", o.consumed, want))
	}
	if o.resumed < 0 {
		problems = append(problems, "nothing produced after the kill was consumed from the partitions the dead broker led")
	}
	if prior != nil {
		if o.maxAckGap > prior.maxAckGap+killSlack {
			problems = append(problems, fmt.Sprintf("produce stall %s, directly %s", fmtDur(o.maxAckGap), fmtDur(prior.maxAckGap)))
		}
		if o.resumed > prior.resumed+killSlack {
			problems = append(problems, fmt.Sprintf("moved partitions consumed again after %s, directly %s", fmtDur(o.resumed), fmtDur(prior.resumed)))
		}
	} else if s.path == "kproxy" {
		res.notes = append(res.notes, "no direct run to compare with (-paths)")
	}
	if len(problems) > 0 {
		return fail("%s", strings.Join(problems, "; "))
	}
	res.pass = true
	return res, out
}

// clusterSize returns how many brokers the cluster has.
func (h *harness) clusterSize(ctx context.Context) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	bs, err := h.adm.ListBrokers(cctx)
	if err != nil {
		return 0, err
	}
	return len(bs), nil
}
