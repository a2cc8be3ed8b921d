package main

import (
	"bufio"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestDevServesAndStopsOnSIGTERM builds kproxy, runs `kproxy dev` on
// ephemeral ports, joins a consumer group through it (leaving a JoinGroup
// to be parked when the second member arrives), then sends SIGTERM: the
// process drains and exits 0 within its shutdown budget.
func TestDevServesAndStopsOnSIGTERM(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kproxy")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "dev", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--group-initial-rebalance-delay", "0s")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "bootstrap:" {
				addr <- f[1]
			}
		}
	}()
	var bootstrap string
	select {
	case bootstrap = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatalf("kproxy dev printed no bootstrap address; stderr:\n%s", stderr.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prod, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.DefaultProduceTopic("sig"), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatalf("produce through kproxy dev: %v", err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.ConsumerGroup("sig-group"), kgo.ConsumeTopics("sig"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	if fs := cons.PollFetches(ctx); len(fs.Records()) != 1 {
		t.Fatalf("consumed %d records, errors %v", len(fs.Records()), fs.Errors())
	}
	begin := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("kproxy exited with %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(12 * time.Second):
		// Well past the 2s after which parked group requests are
		// answered: dump every goroutine to show what holds the drain.
		cmd.Process.Signal(syscall.SIGQUIT)
		<-done
		t.Fatalf("kproxy did not exit within 12s of SIGTERM; stderr with goroutines:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "shutdown complete") {
		t.Fatalf("no 'shutdown complete' line; stderr:\n%s", stderr.String())
	}
	t.Logf("stopped %v after SIGTERM", time.Since(begin).Round(time.Millisecond))
}
