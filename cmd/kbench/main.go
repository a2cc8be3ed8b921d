// Command kbench measures kproxy's data path against the broker behind it.
//
// It starts an in-memory single-broker kfake cluster (discarding produced
// records, or serving a canned batch to every fetch, so the broker is not
// the bottleneck), starts `kproxy serve` in front of it as a child process
// and drives the same franz-go load direct to the broker and through the
// proxy, alternating slices of each so that noise from a shared machine
// falls on both. It prints throughput, request latency at a moderate
// fixed rate, the proxy's CPU seconds per GB moved, and the ratios. The
// conns mode (conns.go) instead holds many connections through kproxy,
// most of them idle, and compares the active clients' figures and
// kproxy's RSS with and without the idle ones.
//
// Further modes (README.md beside this file): --mode groups drives
// thousands of consumer groups whose members share a few raw
// connections (internal/loadgen), beside the engine alone; --pin puts
// kproxy on its own CPU; --rate runs an open-loop latency test idle and
// under load; --tls adds a path through a TLS listener.
//
// Run it from the module root: go run ./cmd/kbench --duration 10s.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

const (
	modeProduce  = "produce"
	modeFetch    = "fetch"
	modeBoth     = "both"   // produce and fetch at once, on the same path
	modeGroups   = "groups" // groups.go
	produceTopic = "kbench-produce"
	fetchTopic   = "kbench-fetch"
)

// options are the command-line settings; immutable once parsed.
type options struct {
	duration     time.Duration // measured time per mode per path
	rounds       int
	recordSize   int
	modes        []string
	conns        int
	partitions   int
	batchBytes   int // bytes of records per synthetic fetch batch
	latDuration  time.Duration
	latRate      int
	jsonOut      bool
	kproxyBin    string
	verbose      bool
	batchMax     int           // producers' batch size limit in bytes; 0: franz-go's default
	linger       time.Duration // producers' linger; 0: franz-go's default
	connsOpts    connsOptions  // the conns mode (conns.go)
	extraOptions               // pin, rate, TLS and groups modes (flags.go)
	pathOptions                // relay, base and peer paths (paths.go)
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("kbench", flag.ContinueOnError)
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured throughput time per mode and per path, split into --rounds alternating slices")
	fs.IntVar(&o.rounds, "rounds", 3, "alternations of direct and proxy slices per mode")
	fs.IntVar(&o.recordSize, "record-size", 1024, "record value size in bytes")
	mode := fs.String("mode", "produce,fetch", "comma-separated modes: produce, fetch, both (produce and fetch at once), conns (many connections, most idle: see the --conns-* flags)")
	addConnsFlags(fs, &o.connsOpts)
	fs.IntVar(&o.conns, "conns", 1, "concurrent clients (one connection each to the broker) per path")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of the benchmark topics")
	fs.IntVar(&o.batchBytes, "fetch-batch-bytes", 16<<10, "record bytes in each batch the synthetic broker serves")
	fs.IntVar(&o.batchMax, "producer-batch-bytes", 0, "producers' batch size limit (Java's batch.size); 0: franz-go's default (1 MB); producers always use acks=all")
	fs.DurationVar(&o.linger, "linger", 0, "producers' linger (Java's linger.ms); 0: franz-go's default")
	fs.DurationVar(&o.latDuration, "latency-duration", 4*time.Second, "time per path per mode of the fixed-rate latency run (0 skips it)")
	fs.IntVar(&o.latRate, "latency-rate", 500, "requests per second of the latency run, one at a time")
	fs.BoolVar(&o.jsonOut, "json", false, "also print the results as JSON")
	fs.StringVar(&o.kproxyBin, "kproxy", "", "kproxy binary to run (default: go build ./cmd/kproxy into a temporary directory)")
	fs.BoolVar(&o.verbose, "v", false, "copy kproxy's log to stderr")
	o.extraOptions.bind(fs)
	o.pathOptions.bind(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var errs []error
	for m := range strings.SplitSeq(*mode, ",") {
		switch m = strings.TrimSpace(m); m {
		case modeProduce, modeFetch, modeBoth, modeGroups:
			o.modes = append(o.modes, m)
		case modeConns:
			o.modes = append(o.modes, m)
			if err := o.connsOpts.validate(); err != nil {
				errs = append(errs, err)
			}
		case "":
		default:
			errs = append(errs, fmt.Errorf("--mode: unknown mode %q", m))
		}
	}
	if len(o.modes) == 0 {
		errs = append(errs, errors.New("--mode: no mode given"))
	}
	if o.duration < 100*time.Millisecond || o.duration > time.Hour {
		errs = append(errs, errors.New("--duration must be between 100ms and 1h"))
	}
	if o.rounds < 1 || o.conns < 1 || o.conns > 256 || o.partitions < 1 {
		errs = append(errs, errors.New("--rounds, --conns (<= 256) and --partitions must be positive"))
	}
	if o.recordSize < 1 || o.recordSize > 16<<20 {
		errs = append(errs, errors.New("--record-size must be between 1 and 16 MiB"))
	}
	if o.batchMax < 0 || o.batchMax > 16<<20 || o.linger < 0 || o.linger > time.Minute {
		errs = append(errs, errors.New("--producer-batch-bytes must be in [0, 16 MiB] and --linger in [0, 1m]"))
	}
	if o.batchBytes < 1 || o.batchBytes > 16<<20 {
		errs = append(errs, errors.New("--fetch-batch-bytes must be between 1 and 16 MiB"))
	}
	if o.latDuration < 0 || o.latDuration > time.Hour || o.latRate < 1 || o.latRate > 100000 {
		errs = append(errs, errors.New("--latency-duration must be in [0, 1h] and --latency-rate in [1, 100000]"))
	}
	errs = append(errs, o.extraOptions.check()...)
	return o, errors.Join(errs...)
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == idleWorkerArg {
		os.Exit(idleWorkerMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == relayWorkerArg {
		os.Exit(relayWorkerMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == spinWorkerArg {
		os.Exit(spinWorkerMain(os.Args[2:]))
	}
	o, err := parseOptions(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "kbench:", err)
		os.Exit(2)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	// Every phase is bounded; this bounds the whole run too, with room
	// for builds and startup.
	limit := time.Duration(len(o.modes))*(2*o.duration+time.Duration(2*o.rounds)*(warmup+2*time.Second)+2*o.latDuration+time.Minute) + 3*time.Minute + o.extraOptions.limit()
	if slices.Contains(o.modes, modeConns) {
		limit += o.connsOpts.timeLimit()
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	res, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kbench:", err)
		os.Exit(1)
	}
	res.print(os.Stdout)
	if o.jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, "kbench: json:", err)
			os.Exit(1)
		}
	}
}

func run(ctx context.Context, o options) (*results, error) {
	tmp, err := os.MkdirTemp("", "kbench-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	bin := o.kproxyBin
	if bin == "" {
		slog.Info("building kproxy")
		if bin, err = buildKproxy(ctx, tmp); err != nil {
			return nil, err
		}
	}
	res := &results{
		RecordSize:  o.recordSize,
		Conns:       o.conns,
		Partitions:  o.partitions,
		Rounds:      o.rounds,
		DurationSec: o.duration.Seconds(),
		LatencyRate: o.latRate,
		CPUs:        runtime.NumCPU(),
		LoadStart:   loadAvg(),
		GoVersion:   runtime.Version(),
		Pinned:      o.pin,
	}
	if o.pin {
		if err := pinSelf(); err != nil {
			return nil, err
		}
		if o.pinSpin {
			stop, err := startSpinners(benchCPU, proxyCPU)
			if err != nil {
				return nil, err
			}
			defer stop()
			res.PinSpin = true
		}
	}
	for _, mode := range o.modes {
		if mode == modeConns {
			if res.ManyConns, err = runConns(ctx, o, bin, tmp); err != nil {
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
			continue
		}
		if mode == modeGroups {
			gr, err := runGroups(ctx, o, bin, tmp)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
			res.Groups = gr
			continue
		}
		mr, err := runMode(ctx, o, bin, tmp, mode)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		res.Modes = append(res.Modes, mr)
	}
	res.LoadEnd = loadAvg()
	return res, nil
}

// runMode benchmarks one mode against its own cluster and kproxy child.
func runMode(ctx context.Context, o options, bin, tmp, mode string) (modeResult, error) {
	kopts := []kfake.Opt{kfake.NumBrokers(1), kfake.BlackholeProduce()}
	topics := []string{produceTopic}
	if mode == modeFetch || mode == modeBoth {
		topics = []string{fetchTopic}
		if mode == modeBoth {
			topics = append(topics, produceTopic)
		}
		kopts = append(kopts, kfake.SyntheticFetch(kfake.SyntheticBatch{
			RecordBytes: o.recordSize,
			Records:     max(1, o.batchBytes/o.recordSize),
		}))
	}
	kopts = append(kopts, kfake.SeedTopics(int32(o.partitions), topics...))
	cluster, err := kfake.NewCluster(kopts...)
	if err != nil {
		return modeResult{}, fmt.Errorf("kfake: %w", err)
	}
	defer cluster.Close()
	broker := cluster.ListenAddrs()[0]

	ch, err := startChild(ctx, bin, broker, tmp, o.verbose, childConfigFor(o))
	if err != nil {
		return modeResult{}, err
	}
	defer func() {
		if err := ch.stop(); err != nil {
			slog.Warn("stopping kproxy", "err", err)
		}
	}()
	extra, err := startExtraPaths(ctx, o, bin, broker, tmp) // tls.go: --tls
	if err != nil {
		return modeResult{}, err
	}
	defer extra.stop()
	slog.Info("measuring", "mode", mode, "broker", broker, "kproxy", ch.addr, "kproxy_pid", ch.cmd.Process.Pid)

	slice := o.duration / time.Duration(o.rounds)
	paths := []struct {
		name string
		addr string
		m    meter
	}{
		{"direct", broker, meter{}},
		{"proxy", ch.addr, meter{cpu: ch.cpu, repin: ch.repin, pid: ch.cmd.Process.Pid}},
	}
	for _, e := range extra.paths {
		paths = append(paths, struct {
			name string
			addr string
			m    meter
		}{e.name, e.addr, e.m})
	}
	agg := map[string]*sample{}
	for _, p := range paths {
		agg[p.name] = &sample{}
	}
	for round := range o.rounds {
		for _, p := range paths {
			for _, q := range paths {
				if q.m.repin == nil {
					continue
				}
				if err := q.m.repin(); err != nil {
					return modeResult{}, err
				}
			}
			var s sample
			switch mode {
			case modeProduce:
				s, err = produceSlice(ctx, o, p.addr, slice, p.m)
			case modeFetch:
				s, err = fetchSlice(ctx, o, p.addr, slice, p.m)
			default:
				s, err = bothSlice(ctx, o, p.addr, slice, p.m)
			}
			if err != nil {
				return modeResult{}, fmt.Errorf("%s round %d: %w", p.name, round, err)
			}
			if s.payload == 0 {
				return modeResult{}, fmt.Errorf("%s round %d moved no data (%d client errors; kproxy log: %s)", p.name, round, s.errs, ch.logPath)
			}
			slog.Info("slice", "mode", mode, "path", p.name, "round", round, "MB/s", fmt.Sprintf("%.1f", mbps(s.payload, s.elapsed)))
			a := agg[p.name]
			a.payload += s.payload
			a.wire += s.wire
			a.elapsed += s.elapsed
			a.proxyCPU += s.proxyCPU
			a.selfCPU += s.selfCPU
			a.machCPU += s.machCPU
			a.proc.syscalls += s.proc.syscalls
			a.proc.switches += s.proc.switches
			a.rounds = append(a.rounds, s.round())
			a.errs += s.errs
			a.lats = append(a.lats, s.lats...)
		}
	}
	lat := map[string][]time.Duration{}
	if o.latDuration > 0 && mode != modeBoth {
		// Two alternations of half the time each.
		for range 2 {
			for _, p := range paths {
				if p.m.tls != nil {
					continue // the latency runs compare plaintext paths
				}
				l, err := latencyRun(ctx, o, p.addr, mode, o.latDuration/2, p.m)
				if err != nil {
					return modeResult{}, fmt.Errorf("%s latency run: %w (kproxy log: %s)", p.name, err, ch.logPath)
				}
				lat[p.name] = append(lat[p.name], l...)
			}
		}
	}
	mr := modeResult{Mode: mode}
	for _, p := range paths {
		mr.Paths = append(mr.Paths, pathResultFrom(p.name, agg[p.name], lat[p.name]))
	}
	mr.ratios()
	if o.rate > 0 && mode != modeBoth {
		// rate.go: open-loop latency at --rate, idle and loaded.
		if mr.OpenLoop, err = openLoopRuns(ctx, o, mode, broker, ch); err != nil {
			return modeResult{}, fmt.Errorf("open-loop latency: %w (kproxy log: %s)", err, ch.logPath)
		}
	}
	return mr, nil
}

func mbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / 1e6 / d.Seconds()
}
