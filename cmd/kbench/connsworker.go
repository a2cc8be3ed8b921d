package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// idleWorkerArg, as kbench's first argument, makes it the conns mode's
// idle-client worker: a process of its own, so that its descriptors do
// not count against the benchmark's (see runConns).
const idleWorkerArg = "__conns-idle-worker"

// heartbeats is what the worker reports of its idle connections'
// requests since the last report.
type heartbeats struct {
	N      int64   `json:"n"`
	P99Ms  float64 `json:"p99_ms"`
	Errors int64   `json:"errors"`
}

// idleWorkerMain runs the worker: args are the broker listener, the
// first and the end connection index, connections per source address and
// the heartbeat interval. It prints "open" once every connection is
// open, answers each "take" on stdin with a heartbeats line, and closes
// everything at EOF.
func idleWorkerMain(args []string) int {
	if len(args) != 5 {
		fmt.Fprintln(os.Stderr, "idle worker: want addr from to per-ip heartbeat")
		return 2
	}
	from, err1 := strconv.Atoi(args[1])
	to, err2 := strconv.Atoi(args[2])
	perIP, err3 := strconv.Atoi(args[3])
	every, err4 := time.ParseDuration(args[4])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		fmt.Fprintln(os.Stderr, "idle worker:", err)
		return 2
	}
	raiseNofile(uint64(to - from + fdSpare))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := &idleLoad{every: every}
	if err := l.open(ctx, args[0], from, to, perIP); err != nil {
		fmt.Fprintln(os.Stderr, "idle worker:", err)
		return 1
	}
	fmt.Println("open")
	sc := bufio.NewScanner(os.Stdin)
	errs := int64(0)
	for sc.Scan() {
		if sc.Text() != "take" {
			continue
		}
		lats := sortedCopy(l.take())
		e := l.errs.Load()
		b, _ := json.Marshal(heartbeats{N: int64(len(lats)), P99Ms: ms(percentile(lats, 0.99)), Errors: e - errs})
		errs = e
		fmt.Printf("take %s\n", b)
	}
	cancel()
	l.wg.Wait()
	return 0
}

// idleWorker is a running worker process.
type idleWorker struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// startIdleWorker starts a worker holding connections [active, total) to
// addr and waits until they are open.
func startIdleWorker(ctx context.Context, addr string, co connsOptions) (*idleWorker, error) {
	cmd, in, out, err := startWorker("idle worker", nil, idleWorkerArg, addr, strconv.Itoa(co.active), strconv.Itoa(co.total), strconv.Itoa(co.perIP), co.heartbeat.String())
	if err != nil {
		return nil, err
	}
	w := &idleWorker{cmd: cmd, in: in, lines: make(chan string, 4)}
	go func() {
		// Owns out until the worker exits.
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
	}()
	if l, err := w.next(ctx, 5*time.Minute+time.Duration(co.total)*10*time.Millisecond); err != nil || l != "open" {
		w.stop()
		return nil, fmt.Errorf("idle worker did not open its connections (%q, %v)", l, err)
	}
	return w, nil
}

func (w *idleWorker) next(ctx context.Context, d time.Duration) (string, error) {
	select {
	case l, ok := <-w.lines:
		if !ok {
			return "", errors.New("idle worker exited")
		}
		return l, nil
	case <-time.After(d):
		return "", fmt.Errorf("idle worker silent for %v", d)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// take returns the heartbeats since the last take.
func (w *idleWorker) take() (heartbeats, error) {
	var h heartbeats
	if _, err := io.WriteString(w.in, "take\n"); err != nil {
		return h, fmt.Errorf("idle worker: %w", err)
	}
	l, err := w.next(context.Background(), 30*time.Second)
	if err != nil {
		return h, err
	}
	js, ok := strings.CutPrefix(l, "take ")
	if !ok {
		return h, fmt.Errorf("idle worker said %q", l)
	}
	return h, json.Unmarshal([]byte(js), &h)
}

// stop closes the worker's connections and waits for it (killing it
// after 10s).
func (w *idleWorker) stop() {
	w.in.Close()
	done := make(chan struct{})
	go func() { w.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		w.cmd.Process.Kill()
		<-done
	}
}
