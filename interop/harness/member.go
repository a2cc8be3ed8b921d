package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// event is one JSON line printed by a client program.
type event struct {
	TS         int64            `json:"ts"`
	Ev         string           `json:"ev"`
	Member     string           `json:"member"`
	Generation *int64           `json:"generation"`
	Partitions []int32          `json:"partitions"`
	P          int32            `json:"p"`
	O          int64            `json:"o"`
	ID         string           `json:"id"`
	Offsets    map[string]int64 `json:"offsets"`
	Error      string           `json:"error"`
	Count      int              `json:"count"`
}

// ownershipChange reports whether the event carries the member's full owned set.
func (e event) ownershipChange() bool {
	return e.Ev == "assigned" || e.Ev == "revoked" || e.Ev == "lost"
}

// member is one client process of a scenario. Fields after mu are guarded
// by the scenario's mutex (s.mu), written by the member's reader goroutine
// and read by the scenario goroutine.
type member struct {
	name     string
	identity string // owner identity for checks; set by the scenario goroutine before events matter
	cmd      *exec.Cmd
	started  time.Time
	done     chan struct{} // closed when the process has exited and stdout is drained

	// Guarded by scenario.mu.
	owned    []int32
	events   []event
	closed   bool
	stopping bool // the harness asked it to stop (stop or killAll)
	exited   bool
	exitErr  error
	assigns  int
	commits  []int64 // client timestamps (ms) of successful commits
	lastSeen time.Time
}

// live reports whether the member still runs and has not closed its client.
func (m *member) live() bool { return !m.exited && !m.closed }

// startMember launches argv as a member of s and starts reading its output.
func (s *scenario) startMember(name string, argv []string) (*member, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = os.Environ()
	stderr, err := os.Create(s.logPath(name + ".stderr"))
	if err != nil {
		return nil, fmt.Errorf("stderr file for %s: %w", name, err)
	}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stderr.Close()
		return nil, fmt.Errorf("stdout pipe for %s: %w", name, err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		stderr.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, strings.Join(argv, " "), err)
	}
	m := &member{name: name, cmd: cmd, started: time.Now(), done: make(chan struct{})}
	s.mu.Lock()
	s.members = append(s.members, m)
	s.mu.Unlock()
	raw, err := os.Create(s.logPath(name + ".jsonl"))
	if err != nil {
		raw = nil
	}
	go func() {
		defer close(m.done)
		defer stderr.Close()
		if raw != nil {
			defer raw.Close()
		}
		var r io.Reader = stdout
		if raw != nil {
			r = io.TeeReader(stdout, raw)
		}
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<16), 1<<22)
		for sc.Scan() {
			line := sc.Bytes()
			if len(line) == 0 || line[0] != '{' {
				continue
			}
			var e event
			if err := json.Unmarshal(line, &e); err != nil {
				s.note("%s printed a bad JSON line: %.120s", name, line)
				continue
			}
			e.Member = name
			s.observe(m, e)
		}
		werr := cmd.Wait()
		s.mu.Lock()
		m.exited = true
		m.exitErr = werr
		m.owned = nil
		s.mu.Unlock()
	}()
	return m, nil
}

// observe folds one event into the scenario state.
func (s *scenario) observe(m *member, e event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m.lastSeen = time.Now()
	switch {
	case e.ownershipChange():
		parts := append([]int32(nil), e.Partitions...)
		sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
		m.owned = parts
		if e.Ev == "assigned" {
			m.assigns++
		}
		m.events = append(m.events, e)
		s.lastChange = time.Now()
	case e.Ev == "record":
		s.seen[e.ID]++
		s.consumed++
	case e.Ev == "closed":
		m.closed = true
		m.owned = nil
		m.events = append(m.events, e)
		s.lastChange = time.Now()
	case e.Ev == "commit":
		m.commits = append(m.commits, e.TS)
		for k, o := range e.Offsets {
			p, err := strconv.ParseInt(k, 10, 32)
			if err != nil || slices.Contains(m.owned, int32(p)) {
				continue
			}
			s.foreignCommits++
			if len(s.foreignSamples) < 5 {
				s.foreignSamples = append(s.foreignSamples, fmt.Sprintf("%s p%s→%d owning %v", m.name, k, o, m.owned))
			}
		}
	case e.Ev == "dropped":
		s.dropped += e.Count
	case e.Ev == "error":
		s.errorsSeen++
		if len(s.errorSamples) < 5 {
			s.errorSamples = append(s.errorSamples, m.name+": "+e.Error)
		}
	case e.Ev == "produced":
		s.produced += e.Count
	}
}

// stop asks the member to close cleanly (SIGTERM) and waits for it to exit,
// killing its process group after the timeout.
func (s *scenario) stop(m *member, timeout time.Duration) error {
	if m.cmd.Process == nil {
		return nil
	}
	s.mu.Lock()
	if m.exited && !m.stopping {
		err := s.exitedLocked(m)
		s.mu.Unlock()
		return err
	}
	m.stopping = true
	s.mu.Unlock()
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
		<-m.done
		return fmt.Errorf("%s did not exit within %s of SIGTERM", m.name, timeout)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var ee *exec.ExitError
	if m.exitErr != nil {
		// A JVM ends with 143 when SIGTERM ran its shutdown hooks; that is a clean close.
		if errors.As(m.exitErr, &ee) && ee.ExitCode() == 143 && m.closed {
			return nil
		}
		return fmt.Errorf("%s exited with %v (stderr in %s)", m.name, m.exitErr, s.logPath(m.name+".stderr"))
	}
	if !m.closed {
		return fmt.Errorf("%s exited without reporting a clean close", m.name)
	}
	return nil
}

// kill ends every member that still runs; used on the failure path. When
// dumpStacks is set, Python members (which register faulthandler on
// SIGUSR1) are first asked to print their thread stacks to stderr.
func (s *scenario) killAll(dumpStacks bool) {
	s.mu.Lock()
	ms := append([]*member(nil), s.members...)
	for _, m := range ms {
		m.stopping = true
	}
	s.mu.Unlock()
	if dumpStacks {
		for _, m := range ms {
			if m.cmd.Process != nil && isPython(m.cmd.Args) {
				_ = m.cmd.Process.Signal(syscall.SIGUSR1)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, m := range ms {
		select {
		case <-m.done:
		default:
			if m.cmd.Process != nil {
				_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
			}
			<-m.done
		}
	}
}

// isPython reports whether argv runs the Python client.
func isPython(argv []string) bool {
	for _, a := range argv {
		if strings.HasSuffix(a, "client.py") {
			return true
		}
	}
	return false
}

// runOnce runs a short-lived client (a producer) and waits for it.
func (s *scenario) runOnce(name string, argv []string, timeout time.Duration) error {
	m, err := s.startMember(name, argv)
	if err != nil {
		return err
	}
	select {
	case <-m.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
		<-m.done
		return fmt.Errorf("%s did not finish within %s", name, timeout)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.exitErr != nil {
		var last string
		for _, e := range s.errorSamples {
			if strings.HasPrefix(e, name+": ") {
				last = e
			}
		}
		return fmt.Errorf("%s failed: %v; last error event: %q; stderr tail: %s", name, m.exitErr, last, tail(s.logPath(name+".stderr"), 400))
	}
	return nil
}

// tail returns the last n bytes of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
