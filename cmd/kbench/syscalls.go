package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Syscalls and context switches of the process behind a path, read from
// /proc without perf or strace (issue 34 asks for syscalls per GB).
//
// /proc/PID/io counts read and write system calls (syscr, syscw: read,
// readv, pread, write, writev, sendfile), not splice, recvmsg/sendmsg,
// epoll_wait or futex: a path that splices (kproxy's large bodies, the Go
// relay) shows fewer than it makes, so the figure compares paths that copy
// alike. Context switches (voluntary and not, summed over the process's
// threads from /proc/PID/task/*/status) count every park and wake-up,
// splice's included.

// procCounts are a process's cumulative I/O syscalls and context switches.
type procCounts struct {
	syscalls int64 // syscr + syscw
	switches int64 // voluntary + nonvoluntary context switches of its live threads
}

// readProcCounts reads pid's counts.
func readProcCounts(pid int) (procCounts, error) {
	var c procCounts
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return c, fmt.Errorf("syscalls: %w", err)
	}
	if c.syscalls, err = parseProcIO(string(b)); err != nil {
		return c, err
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return c, fmt.Errorf("context switches: %w", err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited
		}
		n, err := parseCtxSwitches(string(b))
		if err != nil {
			return c, fmt.Errorf("%s: %w", t, err)
		}
		c.switches += n
	}
	return c, nil
}

// parseProcIO returns syscr+syscw from the text of /proc/PID/io.
func parseProcIO(s string) (int64, error) {
	return sumFields(s, "syscr", "syscw")
}

// parseCtxSwitches returns voluntary_ctxt_switches +
// nonvoluntary_ctxt_switches from the text of /proc/PID/task/TID/status.
func parseCtxSwitches(s string) (int64, error) {
	return sumFields(s, "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
}

// sumFields sums the "name: value" lines of s named in names, each of
// which must appear once.
func sumFields(s string, names ...string) (int64, error) {
	seen := map[string]bool{}
	var sum int64
	for line := range strings.SplitSeq(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		k = strings.TrimSpace(k)
		for _, n := range names {
			if k != n {
				continue
			}
			if seen[n] {
				return 0, fmt.Errorf("%s twice", n)
			}
			x, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || x < 0 {
				return 0, fmt.Errorf("%s: bad value %q", n, strings.TrimSpace(v))
			}
			seen[n] = true
			sum += x
		}
	}
	for _, n := range names {
		if !seen[n] {
			return 0, errors.New("no " + n + " line")
		}
	}
	return sum, nil
}
