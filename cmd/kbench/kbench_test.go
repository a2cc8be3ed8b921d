package main

import (
	"bytes"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and a parenthesis must not shift the
	// fields: utime (14th) is 250 ticks and stime (15th) 50.
	stat := "4242 (k proxy) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 7 0 100 1000000 500 18446744073709551615"
	got, err := parseStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * time.Second; got != want {
		t.Fatalf("cpu = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "4242 kproxy S 1", "4242 (kproxy) S 1 2 3", "4242 (kproxy) S 1 2 3 4 5 6 7 8 9 10 x 50"} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q) succeeded", bad)
		}
	}
}

func TestProcCPUOfSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Fatalf("kbench needs /proc (Linux): %v", err)
	}
	// Burn some CPU so the counter cannot stay at zero.
	deadline := time.Now().Add(50 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	got, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got <= 0 || got > selfCPU()+time.Second {
		t.Fatalf("procCPU(self) = %v, rusage says %v (spun %d times)", got, selfCPU(), x)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	s := sortedCopy(d)
	if d[0] != 100*time.Millisecond {
		t.Fatal("sortedCopy modified its input")
	}
	if p := percentile(s, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(s, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if p := percentile(nil, 0.99); p != 0 {
		t.Errorf("p99 of nothing = %v", p)
	}
}

func TestParseOptions(t *testing.T) {
	o, err := parseOptions([]string{"--duration", "2s", "--mode", "fetch", "--conns", "3", "--record-size", "100"})
	if err != nil {
		t.Fatal(err)
	}
	if o.duration != 2*time.Second || len(o.modes) != 1 || o.modes[0] != modeFetch || o.conns != 3 || o.recordSize != 100 {
		t.Fatalf("options = %+v", o)
	}
	o, err = parseOptions([]string{"--mode", "produce, both"})
	if err != nil || len(o.modes) != 2 || o.modes[1] != modeBoth {
		t.Fatalf("--mode produce,both: %v, %v", o.modes, err)
	}
	for _, args := range [][]string{
		{"--mode", "consume"},
		{"--mode", "both,bth"},
		{"--mode", ""},
		{"--conns", "0"},
		{"--record-size", "0"},
		{"--duration", "1ms"},
		{"--latency-rate", "0"},
	} {
		if _, err := parseOptions(args); err == nil {
			t.Errorf("parseOptions(%s) accepted", strings.Join(args, " "))
		}
	}
}

func TestModeRatios(t *testing.T) {
	m := modeResult{Paths: []pathResult{
		{Path: "direct", MBps: 500, LatP50Ms: 0.1, LatP99Ms: 0.5},
		{Path: "proxy", MBps: 400, LatP50Ms: 0.15, LatP99Ms: 0.6},
	}}
	m.ratios()
	if m.Ratio != 0.8 {
		t.Errorf("ratio = %v, want 0.8", m.Ratio)
	}
	if d := m.AddedP99Ms - 0.1; d > 1e-9 || d < -1e-9 {
		t.Errorf("added p99 = %v, want 0.1", m.AddedP99Ms)
	}
}

// TestRelayConn: the relay baseline copies both ways and passes a
// half-close on, as a Kafka connection through kproxy would see it.
func TestRelayConn(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		c, err := echo.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // until the relay passes the client's half-close on
	}()
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	go func() {
		c, err := front.Accept()
		if err != nil {
			return
		}
		relayConn(c, echo.Addr().String())
	}()
	c, err := net.Dial("tcp", front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	want := bytes.Repeat([]byte("kafka"), 100000) // larger than a socket buffer: both directions stream
	go func() {
		c.Write(want)
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading through the relay: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("relay returned %d bytes, want the %d sent", len(got), len(want))
	}
}
