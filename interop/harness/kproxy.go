package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

// kproxyProc is the kproxy process the kproxy rows run through. Its fields
// are immutable after startKproxyProc except through the exec.Cmd.
type kproxyProc struct {
	cmd     *exec.Cmd
	addr    string
	logPath string
	done    chan struct{} // closed when the process has exited
}

// startKproxyProc builds (unless bin is given) and starts `kproxy serve` in
// front of the broker, and waits until a Kafka client can reach the
// broker's metadata through it. Any failure is returned: the kproxy rows
// must fail loudly, never skip.
func startKproxyProc(ctx context.Context, h *harness, bin string, port int) (*kproxyProc, error) {
	bin, err := h.kproxyBinary(bin)
	if err != nil {
		return nil, err
	}
	return launchKproxy(ctx, h, bin, filepath.Join(h.logDir, "kproxy.log"), port, h.kproxyArgs)
}

// kproxyBinary returns bin, or when it is empty builds ./cmd/kproxy once
// into the log directory and returns that path.
func (h *harness) kproxyBinary(bin string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	bin = filepath.Join(h.logDir, "kproxy-bin")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := goBuild(h.root, bin, "./cmd/kproxy"); err != nil {
		return "", fmt.Errorf("building kproxy: %w", err)
	}
	return bin, nil
}

// launchKproxy starts `kproxy serve --upstream BROKER --listen
// 127.0.0.1:PORT ARGS...` with its output in logPath and waits until it
// serves metadata.
func launchKproxy(ctx context.Context, h *harness, bin, logPath string, port int, extra []string) (*kproxyProc, error) {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("kproxy log: %w", err)
	}
	args := append([]string{"serve", "--upstream", h.broker, "--listen", addr}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout = lf
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	p := &kproxyProc{cmd: cmd, addr: addr, logPath: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		if !p.alive() {
			return nil, fmt.Errorf("kproxy exited during startup: %s", tail(logPath, 600))
		}
		lastErr = probeMetadata(ctx, addr, h.probeOpts...)
		if lastErr == nil {
			h.log.Info("kproxy up", "addr", addr, "log", logPath)
			return p, nil
		}
		time.Sleep(300 * time.Millisecond)
	}
	p.stop()
	return nil, fmt.Errorf("kproxy on %s never served metadata within 30s: %v; log: %s", addr, lastErr, tail(logPath, 600))
}

// probeMetadata asks for the broker list through addr. The probe caps its
// request versions at Kafka 4.0's, so it tests that kproxy is up and
// forwarding; whether kproxy handles newer client versions is left to the
// rows themselves.
func probeMetadata(ctx context.Context, addr string, opts ...kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr), kgo.RetryTimeout(2 * time.Second), kgo.MaxVersions(kversion.V4_0_0())}, opts...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	bs, err := kadm.NewClient(cl).ListBrokers(cctx)
	if err != nil {
		return err
	}
	if len(bs) == 0 {
		return fmt.Errorf("metadata through kproxy lists no broker")
	}
	return nil
}

// alive reports whether the process still runs.
func (p *kproxyProc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill ends kproxy at once with SIGKILL (a crash: no handover) and waits
// for it to exit.
func (p *kproxyProc) kill() {
	if !p.alive() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// stop ends kproxy with SIGTERM, then SIGKILL after 10s.
func (p *kproxyProc) stop() {
	if !p.alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// requestLog counts the API keys in a broker's kafka.request.logger file.
// It is used only by the harness goroutine.
type requestLog struct {
	path   string
	offset int64
	counts map[int]int
	// late, if set, marks the lines of another row's groups (the direct
	// path's: "-direct-<stamp>"); they are counted in counts and again in
	// lateCounts, so that a kproxy row can leave them out. A direct row's
	// client can still be on its way when the next row starts: a JoinGroup
	// parked at the broker until its dead peers' sessions expire is
	// answered, and logged, seconds after its process was killed.
	late       string
	lateCounts map[int]int
}

// scan reads the lines appended since the last scan.
func (l *requestLog) scan() error {
	if l.counts == nil {
		l.counts, l.lateCounts = map[int]int{}, map[int]int{}
	}
	f, err := os.Open(l.path)
	if err != nil {
		return fmt.Errorf("request log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(l.offset, 0); err != nil {
		return fmt.Errorf("request log seek: %w", err)
	}
	buf, err := readAll(f)
	if err != nil {
		return fmt.Errorf("request log read: %w", err)
	}
	// Only count complete lines; keep a partial tail for the next scan.
	end := strings.LastIndexByte(string(buf), '\n')
	if end < 0 {
		return nil
	}
	const key = `"requestApiKey":`
	for _, line := range strings.Split(string(buf[:end]), "\n") {
		i := strings.Index(line, key)
		if i < 0 || strings.Contains(line, "__kproxy_fleet") || strings.Contains(line, `"clientId":"kproxy"`) {
			// The kproxy fleet's own group (docs/fleet.md) and each
			// served group's anchor (docs/anchors.md) are served by
			// the brokers by design: kproxy's own client sends them
			// (client id kproxy; the broker's log cuts long lines, so
			// the anchor's instance id may be cut off). Only the
			// application members' requests, which kproxy forwards
			// with their own client ids, count.
			continue
		}
		n, j := 0, i+len(key)
		for j < len(line) && line[j] >= '0' && line[j] <= '9' {
			n = n*10 + int(line[j]-'0')
			j++
		}
		l.counts[n]++
		if l.late != "" && strings.Contains(line, l.late) {
			l.lateCounts[n]++
		}
	}
	l.offset += int64(end + 1)
	return nil
}

func readAll(f *os.File) ([]byte, error) {
	var out []byte
	buf := make([]byte, 1<<20)
	for {
		n, err := f.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
	}
}

// countAll scans every log and returns the summed counts per API key,
// and those of them on lines marked late.
func countAll(logs []*requestLog) (total, late map[int]int, err error) {
	total, late = map[int]int{}, map[int]int{}
	for _, l := range logs {
		if err := l.scan(); err != nil {
			return nil, nil, err
		}
		for k, v := range l.counts {
			total[k] += v
		}
		for k, v := range l.lateCounts {
			late[k] += v
		}
	}
	return total, late, nil
}
