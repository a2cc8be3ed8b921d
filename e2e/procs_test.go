package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// This file runs kproxy as the processes an operator runs: `kproxy serve`
// children of the test, which the fleet tests kill, pause and stop.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// kproxyBinary builds ./cmd/kproxy once per test binary.
func kproxyBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kproxy-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "kproxy")
		out, err := exec.Command("go", "build", "-o", binPath, "../cmd/kproxy").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ../cmd/kproxy: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// kproxyProc is one `kproxy serve` child. Its fields are set by
// startKproxy and read-only afterwards, except logs (guarded by mu).
type kproxyProc struct {
	name   string
	cmd    *exec.Cmd
	addr   string // bootstrap address
	admin  string // admin server address
	exited chan struct{}
	err    error // the exit status, set before exited closes

	mu   sync.Mutex
	logs strings.Builder // stderr, guarded by mu
}

var adminLine = regexp.MustCompile(`msg="admin server listening" addr=(\S+)`)

// startKproxy starts `kproxy serve` in front of upstream with args, and
// waits until it listens.
func startKproxy(t testing.TB, name string, upstream []string, args ...string) *kproxyProc {
	t.Helper()
	all := append([]string{"serve", "--upstream", strings.Join(upstream, ","), "--listen", "127.0.0.1:0",
		// Group authorization stays at its default (auto): kfake without
		// ACLs answers DescribeAcls with an empty list to an anonymous
		// kproxy, which then allows every group request, as the cluster
		// does (authz.Set.AnonymousCluster; e2e/authz_test.go tests
		// authorization with ACLs).
		"--admin-listen", "127.0.0.1:0", "--log-level", "info"}, args...)
	k := &kproxyProc{name: name, cmd: exec.Command(kproxyBinary(t), all...), exited: make(chan struct{})}
	stdout, err := k.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := k.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr, admin := make(chan string, 1), make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "kproxy listening on "); ok {
				addr <- a
			}
		}
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			k.mu.Lock()
			k.logs.WriteString(line + "\n")
			k.mu.Unlock()
			if m := adminLine.FindStringSubmatch(line); m != nil {
				admin <- m[1]
			}
		}
	}()
	go func() {
		wg.Wait()
		k.err = k.cmd.Wait()
		close(k.exited)
	}()
	t.Cleanup(func() {
		k.cmd.Process.Signal(syscall.SIGCONT)
		k.cmd.Process.Kill()
		<-k.exited
		if t.Failed() {
			t.Logf("--- %s stderr:\n%s", k.name, k.log())
		}
		// $KPROXY_E2E_KEEP_LOGS names a directory that keeps every
		// child's log, for reading a passing run (a benchmark's, say,
		// with --log-level debug among its args).
		if dir := os.Getenv("KPROXY_E2E_KEEP_LOGS"); dir != "" {
			if err := os.WriteFile(filepath.Join(dir, k.name+".log"), []byte(k.log()), 0o644); err != nil {
				t.Logf("keep %s's log: %v", k.name, err)
			}
		}
	})
	deadline := time.After(60 * time.Second)
	for k.addr == "" || k.admin == "" {
		select {
		case k.addr = <-addr:
		case k.admin = <-admin:
		case <-k.exited:
			t.Fatalf("%s exited before listening (%v):\n%s", name, k.err, k.log())
		case <-deadline:
			t.Fatalf("%s did not start listening within 60s:\n%s", name, k.log())
		}
	}
	return k
}

func (k *kproxyProc) log() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.logs.String()
}

func (k *kproxyProc) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := k.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: %v: %v", k.name, sig, err)
	}
}

// fleetView is the part of /api/fleet the tests read.
type fleetView struct {
	ID      string  `json:"id"`
	Serving []int32 `json:"serving"`
	Fenced  int64   `json:"fenced"`
	Member  struct {
		Generation int32 `json:"generation"`
	} `json:"member"`
}

// fleet reads the kproxy's /api/fleet; ok is false when it does not
// answer (stopped, paused, gone).
func (k *kproxyProc) fleet() (fleetView, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+k.admin+"/api/fleet", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fleetView{}, false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return fleetView{}, false
	}
	var v fleetView
	if err := json.Unmarshal(b, &v); err != nil {
		return fleetView{}, false
	}
	return v, true
}
