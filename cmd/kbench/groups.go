package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/loadgen"
)

// The targets of the groups mode.
const (
	targetEngine      = "engine"      // groupstate.Engine in this process: no wire, no proxy
	targetLocal       = "local"       // kproxy serve --groups local
	targetDistributed = "distributed" // kproxy serve --groups distributed (a fleet of one)
)

// groupsResult is the groups mode: each scenario on each target.
type groupsResult struct {
	Conns     int              `json:"conns"`
	Scenarios []groupsScenario `json:"scenarios"`
}

// groupsScenario is one shape of groups (5000 x 3, 1 x 1000) on each
// target.
type groupsScenario struct {
	Groups  int            `json:"groups"`
	Members int            `json:"members_per_group"`
	Targets []groupsTarget `json:"targets"`
}

// groupsTarget is one scenario on one target.
type groupsTarget struct {
	Target    string  `json:"target"`
	Error     string  `json:"error,omitempty"`
	SettleSec float64 `json:"settle_s"` // all groups Stable, every member synced
	// SettleCPUSec is the serving side's CPU while settling: kproxy's, or
	// for the engine this whole process's (load generator included).
	SettleCPUSec float64 `json:"settle_cpu_s"`
	HBPerSec     float64 `json:"heartbeats_per_s"`
	// HBCores is the serving side's CPU seconds per second under the
	// heartbeat load; HBCPUPerM is CPU seconds per million heartbeats.
	HBCores   float64 `json:"heartbeat_cores"`
	HBCPUPerM float64 `json:"cpu_s_per_million_heartbeats"`
	// RSSMB is kproxy's resident memory after the heartbeat load; for the
	// engine, the Go heap in use.
	RSSMB    float64 `json:"rss_mb"`
	Failures int64   `json:"heartbeat_failures"`
}

// runGroups runs every scenario on every target of o.
func runGroups(ctx context.Context, o options, bin, tmp string) (*groupsResult, error) {
	res := &groupsResult{Conns: o.groupConns}
	type shape struct{ groups, size int }
	var shapes []shape
	if o.groupCount > 0 {
		shapes = append(shapes, shape{o.groupCount, o.groupSize})
	}
	if o.bigGroup > 0 {
		shapes = append(shapes, shape{1, o.bigGroup})
	}
	for _, sh := range shapes {
		sc := groupsScenario{Groups: sh.groups, Members: sh.size}
		for _, target := range o.groupTargets {
			slog.Info("groups", "groups", sh.groups, "members", sh.size, "target", target)
			t, err := groupsOn(ctx, o, bin, tmp, target, sh.groups, sh.size)
			if err != nil {
				if ctx.Err() != nil {
					return nil, err
				}
				// A target that cannot take the scale is a result.
				slog.Warn("groups target failed", "target", target, "err", err)
				t = groupsTarget{Target: target, Error: err.Error()}
			}
			sc.Targets = append(sc.Targets, t)
		}
		res.Scenarios = append(res.Scenarios, sc)
	}
	return res, nil
}

// groupsOn settles groups x size members on target, then keeps one
// heartbeat in flight per member and measures.
func groupsOn(ctx context.Context, o options, bin, tmp, target string, groups, size int) (groupsTarget, error) {
	res := groupsTarget{Target: target}
	var (
		doers []loadgen.Doer
		cpu   func() (time.Duration, error)
		rss   func() int64
		repin = func() error { return nil }
	)
	// Small groups share o.groupConns connections and settle in waves;
	// a single large group gets one connection per member, as real
	// consumers have. Answers on a connection come in request order, so
	// a large group's JoinGroups parked for a rebalance would hold back
	// the answers its other members wait for (a heartbeat telling one to
	// rejoin), and a rebalance restarted once could not complete before
	// its timeout.
	nconns := o.groupConns
	if groups == 1 {
		nconns = min(size, 1024)
	}
	switch target {
	case targetEngine:
		eng, err := groupstate.New(groupstate.Config{
			Store:                 groupstate.NewMemoryStore(),
			InitialRebalanceDelay: initialDelay(o.groupInitDelay),
		})
		if err != nil {
			return res, fmt.Errorf("engine: %w", err)
		}
		defer eng.Close()
		d := engineDoer(eng)
		for range nconns {
			doers = append(doers, d)
		}
		cpu = func() (time.Duration, error) { return selfCPU(), nil }
		rss = func() int64 {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return int64(ms.HeapInuse)
		}
	default:
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "bench"))
		if err != nil {
			return res, fmt.Errorf("kfake: %w", err)
		}
		defer cluster.Close()
		cc := childConfigFor(o, "--groups", target, "--group-initial-rebalance-delay", initialDelay(o.groupInitDelay).String())
		ch, err := startChild(ctx, bin, cluster.ListenAddrs()[0], tmp, o.verbose, cc)
		if err != nil {
			return res, err
		}
		defer func() {
			if err := ch.stop(); err != nil {
				slog.Warn("stopping kproxy", "err", err)
			}
		}()
		if target == targetDistributed {
			if err := waitForCoordinator(ctx, ch.addr); err != nil {
				return res, fmt.Errorf("%w (kproxy log: %s)", err, ch.logPath)
			}
		}
		for range nconns {
			c, err := loadgen.Dial(ctx, ch.addr, loadgen.DialConfig{})
			if err != nil {
				return res, fmt.Errorf("%w (kproxy log: %s)", err, ch.logPath)
			}
			defer c.Close()
			doers = append(doers, c)
		}
		cpu = ch.cpu
		rss = func() int64 { return rssBytes(ch.cmd.Process.Pid) }
		repin = ch.repin
	}
	if err := repin(); err != nil {
		return res, err
	}
	members := make([]*loadgen.Member, 0, groups*size)
	for g := range groups {
		for range size {
			// Round robin: a group's members land on different
			// connections, and every connection carries many groups.
			members = append(members, &loadgen.Member{Group: fmt.Sprintf("kbench-%d-%d", size, g), D: doers[len(members)%len(doers)]})
		}
	}

	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c0, err := cpu()
	if err != nil {
		return res, err
	}
	start := time.Now()
	// About 100 members per connection at once: under kproxy's
	// in-flight limit of 128 (see loadgen.SettleConfig.GroupsAtOnce).
	atOnce := max(1, len(doers)*100/size)
	// A short rebalance timeout: a group whose join missed the initial
	// delay rebalances within it rather than the default minute.
	if err := loadgen.Settle(sctx, members, loadgen.SettleConfig{GroupsAtOnce: atOnce, RebalanceTimeout: 10 * time.Second}); err != nil {
		return res, fmt.Errorf("settling: %w", err)
	}
	res.SettleSec = time.Since(start).Seconds()
	c1, err := cpu()
	if err != nil {
		return res, err
	}
	res.SettleCPUSec = (c1 - c0).Seconds()

	l := loadgen.StartHeartbeats(members)
	if err := sleepCtx(ctx, warmup); err != nil {
		l.Stop(10 * time.Second)
		return res, err
	}
	a0, c0, t0 := l.Answered(), must(cpu()), time.Now()
	if err := sleepCtx(ctx, o.groupHBDur); err != nil {
		l.Stop(10 * time.Second)
		return res, err
	}
	a1, c1, elapsed := l.Answered(), must(cpu()), time.Since(t0)
	res.RSSMB = float64(rss()) / 1e6
	stopErr := l.Stop(30 * time.Second)
	res.Failures = l.Failed()
	n := float64(a1 - a0)
	res.HBPerSec = n / elapsed.Seconds()
	res.HBCores = (c1 - c0).Seconds() / elapsed.Seconds()
	if n > 0 {
		res.HBCPUPerM = (c1 - c0).Seconds() / n * 1e6
	}
	if stopErr != nil {
		res.Error = stopErr.Error()
	}
	return res, nil
}

func must(d time.Duration, err error) time.Duration {
	if err != nil {
		slog.Warn("reading CPU time", "err", err)
	}
	return d
}

// initialDelay maps kbench's flag (0: none) to the engine's convention
// (negative: none).
func initialDelay(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// engineDoer calls the engine directly, at the versions kproxy serves.
func engineDoer(e *groupstate.Engine) loadgen.Doer {
	rc := groupstate.RequestContext{ClientID: "kbench", ClientHost: "127.0.0.1"}
	return loadgen.DoerFunc(func(req kmsg.Request, done func(kmsg.Response, error)) {
		req.SetVersion(codec.MaxVersion(req.Key()))
		e.Handle(rc, req, func(resp kmsg.Response) { done(resp, nil) })
	})
}

// waitForCoordinator waits until a distributed kproxy has taken the
// groups partitions (its fleet of one formed): FindCoordinator for a
// group then answers without error.
func waitForCoordinator(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := loadgen.Dial(ctx, addr, loadgen.DialConfig{})
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.CoordinatorKey = "kbench-probe"
		req.CoordinatorKeys = []string{"kbench-probe"}
		resp, err := loadgen.Request(ctx, c, req)
		if err != nil {
			return fmt.Errorf("waiting for the fleet: %w", err)
		}
		fc := resp.(*kmsg.FindCoordinatorResponse)
		code := fc.ErrorCode
		if len(fc.Coordinators) > 0 {
			code = fc.Coordinators[0].ErrorCode
		}
		if code == 0 {
			return nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("waiting for the fleet: %w", err)
		}
	}
}

// printExtra writes the pinning line and the groups table.
func (r *results) printExtra(w io.Writer) {
	if r.Pinned {
		spin := "no idle spinners (--pin-spin=false): halted vCPUs wake through the hypervisor"
		if r.PinSpin {
			spin = "a SCHED_IDLE spinner on each CPU keeps it from halting (--pin-spin)"
		}
		fmt.Fprintf(w, "pinned: kproxy on CPU %d (GOMAXPROCS=1), kbench (clients and broker) on CPU %d, in the direct and the proxied runs; %s\n\n", proxyCPU, benchCPU, spin)
	}
	g := r.Groups
	if g == nil {
		return
	}
	fmt.Fprintf(w, "groups: classic members, one heartbeat in flight per member; small groups share %d connections per kproxy target, a single large group has one per member\n", g.Conns)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "groups x members\ttarget\tsettle s\tsettle CPU s\theartbeats/s\tcores\tCPU s/M hb\tRSS MB\tfailures\t")
	for _, sc := range g.Scenarios {
		for _, t := range sc.Targets {
			if t.Error != "" && t.HBPerSec == 0 {
				fmt.Fprintf(tw, "%dx%d\t%s\tfailed: %s\t\t\t\t\t\t\t\n", sc.Groups, sc.Members, t.Target, firstLine(t.Error))
				continue
			}
			fmt.Fprintf(tw, "%dx%d\t%s\t%.2f\t%.2f\t%.0f\t%.2f\t%.2f\t%.0f\t%d\t\n",
				sc.Groups, sc.Members, t.Target, t.SettleSec, t.SettleCPUSec, t.HBPerSec, t.HBCores, t.HBCPUPerM, t.RSSMB, t.Failures)
		}
	}
	tw.Flush()
	fmt.Fprintln(w, strings.TrimSpace(`
engine: groupstate.Engine called in this process (no wire; CPU and "RSS" are
this process's CPU, load generator included, and Go heap in use). local and
distributed: kproxy serve --groups local|distributed in front of an in-memory
broker, CPU and RSS of the kproxy process.`))
	fmt.Fprintln(w)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}
