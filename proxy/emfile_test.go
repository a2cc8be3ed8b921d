//go:build linux

package proxy

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestAcceptOutOfFiles: a proxy whose open-file limit is spent fails its
// accepts with EMFILE; it logs one clear line for it, counts the
// failures in kproxy.accept.errors{reason=file_descriptors}, backs off
// instead of spinning (measured: its CPU time), and accepts again once
// connections close. The proxy runs in a child process whose limit is
// lowered after it starts.
func TestAcceptOutOfFiles(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	const spare = 8 // descriptors left to the child once started
	ch := startProxyChild(t, c.ListenAddrs()[0], childLogEnv+"=warn", fmt.Sprintf("%s=%d", childNofileEnv, spare))

	// More connections than descriptors: the kernel completes them
	// into the listen backlog, the proxy cannot accept them all.
	var conns []net.Conn
	for range 3 * spare {
		cn, err := net.DialTimeout("tcp", ch.addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial proxy: %v", err)
		}
		conns = append(conns, cn)
	}
	waitFor(t, 10*time.Second, "an accept to fail with EMFILE", func() bool { return ch.mem(t).AcceptFDErrors > 0 })
	cpu0, err := procCPUTime(ch.pid)
	if err != nil {
		t.Fatal(err)
	}
	const window = 2 * time.Second
	time.Sleep(window)
	cpu1, err := procCPUTime(ch.pid)
	if err != nil {
		t.Fatal(err)
	}
	fails := ch.mem(t).AcceptFDErrors
	log := ch.stderr.String()
	lines := strings.Count(log, "accept failed: out of file descriptors")
	t.Logf("out of descriptors for %v: %d failed accepts counted, %d log line(s), %v of CPU", window, fails, lines, cpu1-cpu0)
	if lines != 1 {
		t.Errorf("%d log lines for the failed accepts, want 1 (rate-limited); log:\n%s", lines, log)
	}
	if !strings.Contains(log, "open_file_limit=") {
		t.Errorf("the log line does not name the open-file limit:\n%s", log)
	}
	// Backoff reaches 1s: a few retries per second, not a spin. A
	// spinning accept loop burns a whole CPU.
	if busy := cpu1 - cpu0; busy > window/5 {
		t.Errorf("the proxy used %v of CPU in %v while out of descriptors: the accept loop spins", busy, window)
	}
	if fails > 50 {
		t.Errorf("%d failed accepts in about %v: the accept loop does not back off", fails, window+time.Second)
	}

	// Descriptors come back: the proxy serves new clients again.
	for _, cn := range conns {
		cn.Close()
	}
	var kc *kafkaConn
	waitFor(t, 10*time.Second, "the proxy to accept again", func() bool {
		if kc, err = dialKafka(ch.addr, nil); err != nil {
			return false
		}
		if _, err = kc.idleHandshake(); err != nil {
			kc.c.Close()
			return false
		}
		return true
	})
	kc.c.Close()
}

// procCPUTime returns user+system CPU time of pid from /proc (fields 14
// and 15 of /proc/PID/stat, in clock ticks of 10ms).
func procCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	var ut, st int64
	if _, err := fmt.Sscan(f[11]+" "+f[12], &ut, &st); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
