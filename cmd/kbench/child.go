package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat.
// It is 100 on every Linux architecture Go supports.
const clockTicks = 100

// buildKproxy compiles ./cmd/kproxy into dir and returns the binary's path.
func buildKproxy(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "kproxy")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/kproxy")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/kproxy (run kbench from the module root, or pass --kproxy): %w", err)
	}
	return bin, nil
}

// child is a kproxy serve process in front of one upstream broker. Its
// fields are set by startChild and read-only afterwards.
type child struct {
	cmd     *exec.Cmd
	addr    string // bootstrap address printed by the child
	logPath string // the child's stderr
	exited  chan struct{}
	waitErr error // set before exited is closed
	cpuPin  int   // the CPU the child is pinned to; -1 when not pinned
}

// startChild starts `kproxy serve` in front of upstream and waits until
// it prints its bootstrap address. A mode may pass one childConfig
// (childConfigFor); without one the child is neither pinned nor profiled.
func startChild(ctx context.Context, bin, upstream, logDir string, verbose bool, ccs ...childConfig) (*child, error) {
	cc := childConfig{cpu: -1}
	if len(ccs) > 0 {
		cc = ccs[0]
	}
	return startChildWith(ctx, bin, upstream, logDir, verbose, cc)
}

// childConfig is what a mode adds to the child's command line and
// environment (childcfg.go).
type childConfig struct {
	args []string // more flags; --groups forward unless they set --groups
	env  []string // more KEY=VALUE
	cpu  int      // pin the child to this CPU; -1: no pinning
}

// startChildWith is startChild with its configuration.
func startChildWith(ctx context.Context, bin, upstream, logDir string, verbose bool, cc childConfig) (*child, error) {
	args := []string{"serve", "--upstream", upstream, "--listen", "127.0.0.1:0", "--log-level", "warn"}
	if !cc.setsGroups() && hasFlag(ctx, bin, "--groups") {
		args = append(args, "--groups", "forward")
	}
	cmd := exec.Command(bin, append(args, cc.args...)...)
	cmd.Env = append(os.Environ(), cc.env...)
	setChildAttrs(cmd)
	logPath := filepath.Join(logDir, fmt.Sprintf("kproxy-%d.log", time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("child log: %w", err)
	}
	if verbose {
		cmd.Stderr = io.MultiWriter(logf, os.Stderr)
	} else {
		cmd.Stderr = logf
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("child stdout: %w", err)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	c := &child{cmd: cmd, logPath: logPath, exited: make(chan struct{}), cpuPin: cc.cpu}
	addrc := make(chan string, 1)
	go func() {
		// The reader goroutine owns out; it keeps draining stdout so
		// the child never blocks on a full pipe.
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			if a, ok := strings.CutPrefix(line, "kproxy listening on "); ok {
				select {
				case addrc <- strings.TrimSpace(a):
				default:
				}
			}
		}
		c.waitErr = cmd.Wait()
		logf.Close()
		close(c.exited)
	}()
	select {
	case c.addr = <-addrc:
		if cc.cpu >= 0 {
			if err := c.pin(cc.cpu); err != nil {
				c.stop()
				return nil, err
			}
		}
		return c, nil
	case <-c.exited:
		return nil, fmt.Errorf("kproxy exited before listening (%v); its log: %s", c.waitErr, logPath)
	case <-time.After(20 * time.Second):
		c.stop()
		return nil, fmt.Errorf("kproxy did not print its address within 20s; its log: %s", logPath)
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
}

// hasFlag reports whether `bin serve --help` mentions flag.
func hasFlag(ctx context.Context, bin, flag string) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "serve", "--help").CombinedOutput()
	return err == nil && strings.Contains(string(out), flag+" ")
}

// cpu returns the child's user+system CPU time so far.
func (c *child) cpu() (time.Duration, error) {
	return procCPU(c.cmd.Process.Pid)
}

// stop asks the child to shut down gracefully and kills it after 10s.
func (c *child) stop() error {
	select {
	case <-c.exited:
		return nil
	default:
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		c.cmd.Process.Kill()
	}
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
		return fmt.Errorf("kproxy did not stop within 10s of SIGTERM; killed (log: %s)", c.logPath)
	}
	return nil
}

// procCPU reads utime+stime of pid from /proc. They cover every thread of
// the process.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading kproxy CPU time: %w", err)
	}
	return parseStatCPU(string(b))
}

// parseStatCPU extracts utime+stime from the text of /proc/PID/stat. The
// command name (field 2) may hold spaces and parentheses, so fields are
// counted from the last ')'.
func parseStatCPU(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat: no ')'")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed /proc stat: %d fields after the name", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("malformed /proc stat: %w", err)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// selfCPU returns this process's user+system CPU time (clients and the
// in-process broker).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg returns the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
