package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The relay baseline of the open-loop run (--rate-relay): a process that
// does nothing but copy bytes between each client connection and one to
// the broker (io.Copy, which splices on Linux), on kproxy's CPU when
// pinned. Its latency is the floor any user-space hop has on this machine
// (two more socket hops, the wake-ups of another process, on a VM the
// hypervisor's part in both), so kproxy's own share is what it adds over
// the relay. It serves raw connections only: a Kafka client that
// bootstraps through it is told the broker's own address and leaves it,
// so the relay is measured with raw connections alone (the open-loop
// requests and the paced background load).

const relayWorkerArg = "__relay"

// relayWorkerMain relays 127.0.0.1:<any> to args[0]; args[1] is the CPU
// to pin itself to, -1 for none. It prints its address and runs until
// its standard input closes.
func relayWorkerMain(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "relay: want upstream and CPU")
		return 2
	}
	cpu, err := strconv.Atoi(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 2
	}
	if cpu >= 0 {
		if err := pinPID(os.Getpid(), cpu); err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			return 1
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	fmt.Printf("listening %s\n", ln.Addr())
	go func() {
		io.Copy(io.Discard, os.Stdin) // the parent closed it, or died
		os.Exit(0)
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "relay:", err)
			return 1
		}
		go relayConn(c, args[0])
	}
}

// relayConn copies both ways between c and a new connection to upstream
// until either side closes.
func relayConn(c net.Conn, upstream string) {
	defer c.Close()
	u, err := net.DialTimeout("tcp", upstream, 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return
	}
	defer u.Close()
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(u, c)
		u.(*net.TCPConn).CloseWrite()
	})
	io.Copy(c, u)
	c.(*net.TCPConn).CloseWrite()
	wg.Wait()
}

// relay is a running relay worker.
type relay struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	addr string
}

// startRelay starts a relay to upstream, pinned to cpu unless it is -1.
func startRelay(upstream string, cpu int) (*relay, error) {
	var env []string
	if cpu >= 0 {
		env = []string{"GOMAXPROCS=1"} // as the pinned kproxy
	}
	cmd, in, out, err := startWorker("relay", env, relayWorkerArg, upstream, strconv.Itoa(cpu))
	if err != nil {
		return nil, err
	}
	r := &relay{cmd: cmd, in: in}
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		r.stop()
		return nil, fmt.Errorf("relay did not start (%q, %v)", line, err)
	}
	r.addr = addr
	return r, nil
}

func (r *relay) stop() {
	r.in.Close()
	done := make(chan struct{})
	go func() { r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		r.cmd.Process.Kill()
		<-done
	}
}
