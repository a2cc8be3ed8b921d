package main

import (
	"errors"
	"flag"
	"strings"
	"time"
)

// extraOptions are the settings of the pinned, open-loop latency, TLS and
// groups runs; immutable once parsed.
type extraOptions struct {
	pin           bool   // kproxy on CPU 1, kbench on CPU 0
	pinSpin       bool   // with pin: SCHED_IDLE spinners keep both CPUs from halting (spin_linux.go)
	kproxyProfile string // CPU profile of the kproxy child
	tls           bool   // a third path: kproxy with a TLS listener

	rate        int           // open-loop requests per second; 0: no open-loop run
	rateDur     time.Duration // per path, idle and loaded each
	rateBGConns int           // connections per path of the loaded run's background load
	rateRelay   bool          // the open-loop runs also measure a bare relay (relay.go)
	rateBGMBps  float64       // that load's pace in MB/s of records, the same on both paths; 0: full speed

	groupCount     int      // groups of groupSize members
	groupSize      int      // members of each of those
	bigGroup       int      // members of the one big group; 0: none
	groupConns     int      // connections the members share, per target
	groupTargets   []string // engine, local, distributed: split from targetsFlag by check
	targetsFlag    *string
	groupHBDur     time.Duration // heartbeat measurement per target per scenario
	groupInitDelay time.Duration // --group-initial-rebalance-delay
}

func (x *extraOptions) bind(fs *flag.FlagSet) {
	fs.BoolVar(&x.pin, "pin", false, "pin kproxy to CPU 1 and kbench (clients, broker) to CPU 0, in the direct run as in the proxied one")
	fs.BoolVar(&x.pinSpin, "pin-spin", true, "with --pin: keep both CPUs from halting with a SCHED_IDLE spinner each (on a VM, waking a halted vCPU adds about 1 ms to requests that cross CPUs, which only the proxied path does)")
	fs.StringVar(&x.kproxyProfile, "kproxy-cpuprofile", "", "write kproxy's CPU profile to this file (go tool pprof FILE); with several modes the last one's")
	fs.BoolVar(&x.tls, "tls", false, "also run kproxy with a TLS listener (self-signed certificate) and measure through it")
	fs.IntVar(&x.rate, "rate", 0, "open-loop latency run at this many requests/s, idle and under background load, latency counted from each request's queueing, which never waits for answers (0 skips it)")
	fs.DurationVar(&x.rateDur, "rate-duration", 5*time.Second, "time per path of each open-loop run")
	fs.IntVar(&x.rateBGConns, "rate-load-conns", 1, "connections per path of the background load of the loaded open-loop run (Kafka clients with --rate-load-mbps 0)")
	fs.BoolVar(&x.rateRelay, "rate-relay", true, "the open-loop runs also measure a bare TCP relay in kproxy's place (on its CPU when pinned): the floor any user-space hop has here")
	fs.Float64Var(&x.rateBGMBps, "rate-load-mbps", 50, "pace of that background load in MB/s per path, the same on every path so that they carry the same work (0: Kafka clients as fast as each path goes, no relay)")
	fs.IntVar(&x.groupCount, "groups", 5000, "groups mode: number of small groups")
	fs.IntVar(&x.groupSize, "group-size", 3, "groups mode: members of each small group")
	fs.IntVar(&x.bigGroup, "big-group", 1000, "groups mode: members of the one large group (0 skips it)")
	fs.IntVar(&x.groupConns, "group-conns", 16, "groups mode: connections the members share (each member's requests carry their own correlation ids)")
	targets := fs.String("group-targets", "engine,local,distributed", "groups mode: engine (in this process, no wire), local (kproxy --groups local), distributed (kproxy --groups distributed, a fleet of one)")
	fs.DurationVar(&x.groupHBDur, "group-heartbeat-duration", 5*time.Second, "groups mode: measured heartbeat time per target")
	fs.DurationVar(&x.groupInitDelay, "group-initial-delay", 300*time.Millisecond, "groups mode: the coordinator's initial rebalance delay, within which a new group's members all join (0: none, and each join of a new group's members rebalances again)")
	x.targetsFlag = targets
}

// check validates the options and splits the target list.
func (x *extraOptions) check() []error {
	var errs []error
	x.groupTargets = nil
	for _, t := range splitList(*x.targetsFlag) {
		switch t {
		case targetEngine, targetLocal, targetDistributed:
			x.groupTargets = append(x.groupTargets, t)
		default:
			errs = append(errs, errors.New("--group-targets: unknown target "+t))
		}
	}
	if x.rate < 0 || x.rate > 100000 || x.rateBGConns < 0 || x.rateBGMBps < 0 || x.rateDur < 0 || x.rateDur > time.Hour {
		errs = append(errs, errors.New("--rate must be in [0, 100000], --rate-load-conns >= 0, --rate-load-mbps >= 0, --rate-duration in [0, 1h]"))
	}
	if x.groupCount < 0 || x.groupSize < 1 || x.bigGroup < 0 || x.groupConns < 1 || x.groupConns > 1024 {
		errs = append(errs, errors.New("--groups >= 0, --group-size >= 1, --big-group >= 0, --group-conns in [1, 1024]"))
	}
	if x.groupHBDur < 100*time.Millisecond || x.groupHBDur > time.Hour {
		errs = append(errs, errors.New("--group-heartbeat-duration must be between 100ms and 1h"))
	}
	return errs
}

// limit is how much longer than the throughput modes the whole run may
// take.
func (x *extraOptions) limit() time.Duration {
	d := 8 * x.rateDur
	d += time.Duration(len(x.groupTargets)) * 2 * (x.groupHBDur + 5*time.Minute)
	return d
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
