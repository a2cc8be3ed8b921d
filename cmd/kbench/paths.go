package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The throughput modes' further paths, beside direct and proxy:
//
//   - relay (--relay): the bare relay of relay.go (io.Copy both ways,
//     which splices) in kproxy's place, the floor of any proxy that
//     terminates TCP. It knows nothing of Kafka, so the broker keeps
//     advertising its own address; the relay path's clients dial the
//     relay whenever they would dial the broker (meter.redirect).
//   - proxy-base (--kproxy-base BIN[,BIN...]): other kproxy builds (older
//     commits), to measure a change before and after in one run.
//   - peer (--peer BIN): grepplabs/kafka-proxy, which rewrites the
//     broker's address in Metadata itself.
const (
	pathRelay = "relay"
	pathBase  = "proxy-base"
	pathPeer  = "peer"
)

// pathOptions are the flags of those paths; immutable once parsed.
type pathOptions struct {
	relay      bool
	baseBin    string
	peerBin    string
	peerBufKiB int
}

func (x *pathOptions) bind(fs *flag.FlagSet) {
	fs.BoolVar(&x.relay, "relay", false, "throughput modes: also measure a bare splice relay (no Kafka awareness) in kproxy's place, on its CPU when pinned: the floor of any proxy that terminates TCP")
	fs.StringVar(&x.baseBin, "kproxy-base", "", "throughput modes: also measure these kproxy binaries (comma-separated; paths proxy-base, proxy-base-2, ...), e.g. builds of older commits")
	fs.StringVar(&x.peerBin, "peer", "", "throughput modes: also measure this grepplabs/kafka-proxy binary (path peer)")
	fs.IntVar(&x.peerBufKiB, "peer-buffer-kib", 64, "the peer's request and response buffer sizes in KiB")
}

// redirector makes the clients of a path dial to instead of from.
func redirector(from, to string) kgo.Opt {
	d := &net.Dialer{Timeout: 10 * time.Second}
	return kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
		if host == from {
			host = to
		}
		return d.DialContext(ctx, network, host)
	})
}

// startMorePaths adds the relay, base and peer paths to e.
func startMorePaths(ctx context.Context, o options, e *extraPaths, broker, tmp string) error {
	cpu := -1
	if o.pin {
		cpu = proxyCPU
	}
	if o.relay {
		r, err := startRelay(broker, cpu)
		if err != nil {
			return err
		}
		e.stops = append(e.stops, r.stop)
		pid := r.cmd.Process.Pid
		e.paths = append(e.paths, extraPath{name: pathRelay, addr: r.addr, m: meter{
			cpu:      func() (time.Duration, error) { return procCPU(pid) },
			redirect: &[2]string{broker, r.addr},
			pid:      pid,
		}})
	}
	for i, bin := range splitList(o.baseBin) {
		cc := childConfigFor(o)
		cc.env = withoutProfile(cc.env)
		ch, err := startChild(ctx, bin, broker, tmp, o.verbose, cc)
		if err != nil {
			return fmt.Errorf("kproxy-base %s: %w", bin, err)
		}
		e.children = append(e.children, ch)
		name := pathBase
		if i > 0 {
			name = fmt.Sprintf("%s-%d", pathBase, i+1)
		}
		e.paths = append(e.paths, extraPath{name: name, addr: ch.addr, m: meter{cpu: ch.cpu, repin: ch.repin, pid: ch.cmd.Process.Pid}})
	}
	if o.peerBin != "" {
		p, err := startPeer(ctx, o, broker, tmp, cpu)
		if err != nil {
			return err
		}
		e.stops = append(e.stops, p.stop)
		e.paths = append(e.paths, extraPath{name: pathPeer, addr: p.addr, m: meter{cpu: p.cpu, repin: p.repin, pid: p.cmd.Process.Pid}})
	}
	return nil
}

// peer is a running kafka-proxy.
type peer struct {
	cmd  *exec.Cmd
	addr string
	cpu  func() (time.Duration, error)
	pin  int
	done chan struct{}
}

func (p *peer) repin() error {
	if p.pin < 0 {
		return nil
	}
	return pinPID(p.cmd.Process.Pid, p.pin)
}

func (p *peer) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// startPeer starts kafka-proxy in front of broker on a free local port.
func startPeer(ctx context.Context, o options, broker, tmp string, cpu int) (*peer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	buf := strconv.Itoa(o.peerBufKiB << 10)
	cmd := exec.Command(o.peerBin, "server",
		"--bootstrap-server-mapping", broker+","+addr,
		"--dynamic-listeners-disable",
		"--http-disable",
		"--proxy-request-buffer-size", buf, "--proxy-response-buffer-size", buf,
		"--log-level", "warning")
	if cpu >= 0 {
		cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	}
	setChildAttrs(cmd)
	logPath := filepath.Join(tmp, fmt.Sprintf("peer-%d.log", time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("peer log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", o.peerBin, err)
	}
	p := &peer{cmd: cmd, addr: addr, pin: cpu, done: make(chan struct{})}
	pid := cmd.Process.Pid
	p.cpu = func() (time.Duration, error) { return procCPU(pid) }
	go func() {
		cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("peer exited before listening; its log: %s", logPath)
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("peer not listening on %s within 20s; its log: %s", addr, logPath)
		}
	}
	if err := p.repin(); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// machineCPU returns the busy time of every CPU of the machine so far, from
// /proc/stat: user, nice, system, irq and softirq (the network stack's
// work, charged to no process, is most of the last), not idle, iowait or
// steal.
func machineCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("machine CPU: %w", err)
	}
	return parseProcStat(string(b))
}

func parseProcStat(s string) (time.Duration, error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, errors.New("malformed /proc/stat: no cpu line")
	}
	var busy uint64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system _ _ irq softirq
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed /proc/stat: %w", err)
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / clockTicks, nil
}
