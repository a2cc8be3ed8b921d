package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The fleet row (docs/fleet.md): fleetSize kproxies in distributed mode in
// front of the one broker form a fleet; the row's group has one member per
// kproxy on all but the kproxy that owns the group's partition of the
// groups topic, which has none. Mid-stream that owner is killed with
// SIGKILL. Its members lose nothing (none connect to it), so the group
// must not rebalance: the survivors take the partition over, load the
// group at its stored generation, and the members keep consuming and
// committing. The row runs on the kproxy path only; directly there is no
// fleet to kill.
const (
	fleetSize         = 4
	fleetSession      = "6s"
	fleetHeartbeat    = "500ms"
	fleetProduceEvery = 20 // ms between records of the second half
)

// fleetNode is one kproxy of the fleet row; immutable after start except
// through proc.
type fleetNode struct {
	name  string
	proc  *kproxyProc
	admin string // host:port of its admin server
}

// fleetView is the part of GET /api/fleet the row reads.
type fleetView struct {
	ID         string  `json:"id"`
	Partitions int     `json:"partitions"`
	Serving    []int32 `json:"serving"`
}

// fleetStatus reads a kproxy's /api/fleet.
func fleetStatus(ctx context.Context, admin string) (fleetView, error) {
	var v fleetView
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+admin+"/api/fleet", nil)
	if err != nil {
		return v, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return v, fmt.Errorf("GET /api/fleet on %s: %w", admin, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET /api/fleet on %s: %s", admin, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return v, fmt.Errorf("GET /api/fleet on %s: %w", admin, err)
	}
	return v, nil
}

// groupSummary is the part of an entry of GET /api/groups the row reads:
// the groups this kproxy's engine serves.
type groupSummary struct {
	Group      string `json:"group"`
	State      string `json:"state"`
	Generation int32  `json:"generation"`
	Members    int    `json:"members"`
}

// groupOn returns group's entry in a kproxy's /api/groups, if listed.
func groupOn(ctx context.Context, admin, group string) (groupSummary, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+admin+"/api/groups", nil)
	if err != nil {
		return groupSummary{}, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return groupSummary{}, false, fmt.Errorf("GET /api/groups on %s: %w", admin, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return groupSummary{}, false, fmt.Errorf("GET /api/groups on %s: %s", admin, resp.Status)
	}
	var gs []groupSummary
	if err := json.NewDecoder(resp.Body).Decode(&gs); err != nil {
		return groupSummary{}, false, fmt.Errorf("GET /api/groups on %s: %w", admin, err)
	}
	for _, g := range gs {
		if g.Group == group {
			return g, true, nil
		}
	}
	return groupSummary{}, false, nil
}

// groupHolders waits until exactly one of nodes lists group with want
// members in its engine and returns that node and its entry.
func groupHolders(ctx context.Context, nodes []*fleetNode, group string, want int, timeout time.Duration) (*fleetNode, groupSummary, error) {
	start := time.Now()
	var last string
	for {
		var holders []*fleetNode
		var entry groupSummary
		var err error
		for _, n := range nodes {
			g, ok, e := groupOn(ctx, n.admin, group)
			if e != nil {
				err = e
				break
			}
			if ok {
				holders = append(holders, n)
				entry = g
			}
		}
		switch {
		case err != nil:
			last = err.Error()
		case len(holders) == 1 && entry.Members == want:
			return holders[0], entry, nil
		default:
			var names []string
			for _, h := range holders {
				names = append(names, h.name)
			}
			last = fmt.Sprintf("held by %v, last entry %+v", names, entry)
		}
		if time.Since(start) > timeout {
			return nil, groupSummary{}, fmt.Errorf("group %s not served by exactly one kproxy with %d members within %s: %s", group, want, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fleetCoverage reads every node's /api/fleet and reports who serves each
// partition. complete is true when every partition of the groups topic is
// served by exactly one node and, if each is set, the nodes serve equal
// shares (within one), which the fleet's sticky assignor ends at: a share
// still moving would move the group's owner under the row.
func fleetCoverage(ctx context.Context, nodes []*fleetNode, each bool) (servedBy map[int32]string, parts int, complete bool, err error) {
	servedBy = map[int32]string{}
	complete = true
	least, most := -1, 0
	for _, n := range nodes {
		v, err := fleetStatus(ctx, n.admin)
		if err != nil {
			return nil, 0, false, err
		}
		parts = v.Partitions
		if least < 0 || len(v.Serving) < least {
			least = len(v.Serving)
		}
		most = max(most, len(v.Serving))
		for _, p := range v.Serving {
			if _, dup := servedBy[p]; dup {
				complete = false
			}
			servedBy[p] = n.name
		}
	}
	if parts == 0 || len(servedBy) != parts || (each && (least == 0 || most-least > 1)) {
		complete = false
	}
	return servedBy, parts, complete, nil
}

// waitFleet polls the nodes until fleetCoverage is complete.
func waitFleet(ctx context.Context, nodes []*fleetNode, each bool, timeout time.Duration) (map[int32]string, int, time.Duration, error) {
	start := time.Now()
	var last string
	for {
		servedBy, parts, ok, err := fleetCoverage(ctx, nodes, each)
		if err == nil && ok {
			return servedBy, parts, time.Since(start), nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("served %v of %d partitions", servedBy, parts)
		}
		if time.Since(start) > timeout {
			return nil, 0, time.Since(start), fmt.Errorf("fleet did not serve every groups-topic partition once within %s: %s", timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// groupPartition is the groups-topic partition of group: murmur2 of the
// name modulo the partition count, Kafka's default key partitioner, as
// kproxy's groupstate/kafkastore.GroupPartition computes it.
func groupPartition(group string, parts int) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(group)}, parts))
}

// runFleet executes the fleet row and returns its table line. bin is the
// kproxy binary (empty: build it); the nodes listen on basePort+10*i (their
// broker ports follow, see `kproxy serve --listen`) with admin servers on
// basePort+10*i+9.
func (s *scenario) runFleet(ctx context.Context, bin string, basePort int) (res result) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	var nodes []*fleetNode
	defer func() {
		s.killAll(!res.pass)
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Add(1)
			go func(n *fleetNode) { defer wg.Done(); n.proc.stop() }(n)
		}
		wg.Wait()
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
	if len(s.r.members) != fleetSize-1 {
		return fail("fleet row needs %d member clients, has %d", fleetSize-1, len(s.r.members))
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fail("log dir: %v", err)
	}
	bin, err := s.h.kproxyBinary(bin)
	if err != nil {
		return fail("%v", err)
	}

	// The fleet: its own name, so the tier's other kproxy (a fleet of one
	// under the default name) stays out of it.
	fleetName := strings.TrimPrefix(s.group, "interop-")
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		startErr []string
	)
	nodes = make([]*fleetNode, fleetSize)
	for i := range nodes {
		port := basePort + 10*(i+1)
		n := &fleetNode{name: fmt.Sprintf("kproxy-%d", i+1), admin: fmt.Sprintf("127.0.0.1:%d", port+9)}
		args := append(append([]string(nil), s.h.kproxyArgs...),
			"--fleet-name", fleetName, "--fleet-session-timeout", fleetSession,
			"--fleet-heartbeat-interval", fleetHeartbeat, "--group-initial-rebalance-delay", "0s",
			"--admin-listen", n.admin)
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
	if len(startErr) > 0 {
		var up []*fleetNode
		for _, n := range nodes {
			if n != nil {
				up = append(up, n)
			}
		}
		nodes = up
		return fail("fleet kproxies did not start: %s", strings.Join(startErr, "; "))
	}
	servedBy, parts, formed, err := waitFleet(ctx, nodes, true, 60*time.Second)
	if err != nil {
		return fail("%v", err)
	}
	gp := groupPartition(s.group, parts)
	var owner *fleetNode
	var hosts []*fleetNode
	for _, n := range nodes {
		if servedBy[gp] == n.name {
			owner = n
		} else {
			hosts = append(hosts, n)
		}
	}
	if owner == nil {
		return fail("no kproxy serves partition %d of the group", gp)
	}
	s.note("fleet of %d formed in %s; group %s lives in groups-topic partition %d of %d, owned by %s, which has no member; members m1..m3 bootstrap at %s, %s, %s",
		fleetSize, fmtDur(formed), s.group, gp, parts, owner.name, hosts[0].name, hosts[1].name, hosts[2].name)

	n := s.h.records
	half := n / 2
	if err := s.h.createTopic(ctx, s.topic, s.h.partitions); err != nil {
		return fail("%v", err)
	}
	if err := s.runOnce("producer-1", s.argsFor(s.r.producer, hosts[2].proc.addr, "produce", "producer-1", "--count", fmt.Sprint(half), "--start", "0"), 90*time.Second); err != nil {
		return fail("produce first half: %v", err)
	}
	var ms []*member
	for i, client := range s.r.members {
		name := fmt.Sprintf("m%d", i+1)
		m, err := s.startMember(name, s.argsFor(client, hosts[i].proc.addr, "consume", name))
		if err != nil {
			return fail("%v", err)
		}
		m.identity = s.identity(name)
		ms = append(ms, m)
	}
	d, err := s.waitFor(s.h.settleTimeout, "the first assignment of all members", func() bool { return s.stableLocked(ms) })
	if err != nil {
		return fail("initial join: %v; %s", err, s.ownersSummary())
	}
	settle := fmtDur(d)
	if _, err := s.waitFor(s.h.consumeTimeout, "the first half to be consumed", func() bool { return s.distinctLocked(0, half) == half }); err != nil {
		return fail("%v (consumed %d distinct)", err, s.distinctLocked(0, half))
	}

	// The second half flows one record every fleetProduceEvery ms through
	// a survivor while the owner dies.
	prod, err := s.startMember("producer-2", s.argsFor(s.r.producer, hosts[0].proc.addr, "produce", "producer-2",
		"--count", fmt.Sprint(n-half), "--start", fmt.Sprint(half), "--interval-ms", fmt.Sprint(fleetProduceEvery)))
	if err != nil {
		return fail("%v", err)
	}
	if _, err := s.waitFor(30*time.Second, "records of the second half to be consumed", func() bool { return s.distinctLocked(half, n) >= 50 }); err != nil {
		return fail("%v", err)
	}
	// The group lives in the owner's engine, and nowhere else.
	holder, before, err := groupHolders(ctx, nodes, s.group, len(ms), 10*time.Second)
	if err != nil {
		return fail("before the kill: %v", err)
	}
	if holder != owner {
		return fail("group %s is served by %s, not by %s, the owner of its partition %d", s.group, holder.name, owner.name, gp)
	}
	s.mu.Lock()
	eventsBefore := map[*member]int{}
	for _, m := range ms {
		eventsBefore[m] = len(m.events)
	}
	s.mu.Unlock()
	killAt := time.Now()
	owner.proc.kill()
	s.h.log.Info("fleet row: killed the group's owner", "kproxy", owner.name, "partition", gp)
	servedAfter, _, _, err := waitFleet(ctx, hosts, false, 60*time.Second)
	failover := time.Since(killAt)
	if err != nil {
		return fail("after SIGKILL of %s: %v", owner.name, err)
	}
	// The new owner serves the group at the generation it had: loaded
	// from the groups topic, not rebuilt by a rebalance.
	holder, after, err := groupHolders(ctx, hosts, s.group, len(ms), 30*time.Second)
	if err != nil {
		return fail("after the kill: %v", err)
	}
	if holder.name != servedAfter[gp] {
		return fail("after the kill group %s is served by %s, its partition %d by %s", s.group, holder.name, gp, servedAfter[gp])
	}
	if after.Generation != before.Generation {
		return fail("the group's generation went from %d on %s to %d on %s", before.Generation, owner.name, after.Generation, holder.name)
	}
	s.note("group %s: generation %d, %d members, state %s on %s before the kill; generation %d, state %s on %s after",
		s.group, before.Generation, before.Members, before.State, owner.name, after.Generation, after.State, holder.name)
	select {
	case <-prod.done:
	case <-time.After(90 * time.Second):
		return fail("producer-2 did not finish within 90s")
	}
	s.mu.Lock()
	prodErr := prod.exitErr
	s.mu.Unlock()
	if prodErr != nil {
		return fail("producer-2 failed: %v; stderr tail: %s", prodErr, tail(s.logPath("producer-2.stderr"), 400))
	}
	if _, err := s.waitFor(s.h.consumeTimeout, "every record to be consumed", func() bool { return s.distinctLocked(0, n) == n }); err != nil {
		return fail("%v (consumed %d distinct of %d)", err, s.distinctLocked(0, n), n)
	}
	if err := s.h.waitCommitted(ctx, s); err != nil {
		return fail("%v", err)
	}

	// The group must not have noticed: no member's assignment changed, and
	// every member committed again after the kill.
	s.mu.Lock()
	var changed, resumed []string
	var slowest time.Duration
	for _, m := range ms {
		if k := len(m.events) - eventsBefore[m]; k > 0 {
			changed = append(changed, fmt.Sprintf("%s saw %d assignment events", m.name, k))
		}
		first := int64(-1)
		for _, ts := range m.commits {
			if ts > killAt.UnixMilli() {
				first = ts
				break
			}
		}
		if first < 0 {
			resumed = append(resumed, m.name+" never committed after the kill")
			continue
		}
		if d := time.UnixMilli(first).Sub(killAt); d > slowest {
			slowest = d
		}
	}
	s.mu.Unlock()
	if len(changed) > 0 {
		return fail("the group rebalanced after SIGKILL of %s: %s", owner.name, strings.Join(changed, ", "))
	}
	if len(resumed) > 0 {
		return fail("%s", strings.Join(resumed, ", "))
	}
	for _, n := range hosts {
		if !n.proc.alive() {
			return fail("%s died: %s", n.name, tail(n.proc.logPath, 300))
		}
	}
	res.settle = fmt.Sprintf("%s/%s/%s", settle, fmtDur(failover), fmtDur(slowest))
	var moved []string
	for p, who := range servedBy {
		if who == owner.name {
			moved = append(moved, fmt.Sprintf("%d→%s", p, servedAfter[p]))
		}
	}
	sort.Strings(moved)
	s.note("SIGKILL of %s: the 3 survivors served all %d partitions %s later (moved %s); every member committed again within %s; no member's assignment changed; settle column = initial/failover/commits resumed",
		owner.name, parts, fmtDur(failover), strings.Join(moved, " "), fmtDur(slowest))

	var stopErrs []string
	var emu sync.Mutex
	for _, m := range ms {
		wg.Add(1)
		go func(m *member) {
			defer wg.Done()
			if err := s.stop(m, 30*time.Second); err != nil {
				emu.Lock()
				stopErrs = append(stopErrs, err.Error())
				emu.Unlock()
			}
		}(m)
	}
	wg.Wait()
	if len(stopErrs) > 0 {
		return fail("closing members: %s", strings.Join(stopErrs, "; "))
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
	res.pass = true
	return res
}
