package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
)

// The CPUs of a --pin run: kproxy alone on one, kbench (load generator
// and in-memory broker) on the other, in the direct run as in the
// proxied one, so that the ratio measures kproxy and not two processes
// fighting over shared cores.
const (
	benchCPU = 0
	proxyCPU = 1
)

// setsGroups reports whether cc chooses the groups mode itself.
func (cc childConfig) setsGroups() bool { return slices.Contains(cc.args, "--groups") }

// childConfigFor is the child configuration every mode starts from:
// pinned with --pin, profiled with --kproxy-cpuprofile.
func childConfigFor(o options, extra ...string) childConfig {
	cc := childConfig{cpu: -1, args: extra}
	if o.pin {
		cc.cpu = proxyCPU
		// One CPU: a second P would only add preemption.
		cc.env = append(cc.env, "GOMAXPROCS=1")
	}
	if o.kproxyProfile != "" {
		cc.env = append(cc.env, "KPROXY_CPUPROFILE="+o.kproxyProfile)
	}
	return cc
}

// pin pins the child to cpu.
func (c *child) pin(cpu int) error {
	if err := pinPID(c.cmd.Process.Pid, cpu); err != nil {
		return fmt.Errorf("pinning kproxy: %w", err)
	}
	return nil
}

// repin pins again the threads the child started since it was pinned
// (see pinPID); a no-op for an unpinned child.
func (c *child) repin() error {
	if c.cpuPin < 0 {
		return nil
	}
	return c.pin(c.cpuPin)
}

// pinSelf pins kbench to benchCPU with one P.
func pinSelf() error {
	if runtime.NumCPU() < 2 {
		return fmt.Errorf("--pin needs 2 CPUs, this machine has %d", runtime.NumCPU())
	}
	runtime.GOMAXPROCS(1)
	if err := pinPID(os.Getpid(), benchCPU); err != nil {
		return fmt.Errorf("pinning kbench: %w", err)
	}
	return nil
}

// rssBytes reads VmRSS of pid from /proc; 0 if it cannot.
func rssBytes(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	return 0
}
