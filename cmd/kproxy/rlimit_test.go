//go:build unix

package main

import (
	"bytes"
	"log/slog"
	"strings"
	"syscall"
	"testing"
)

// TestRaiseFileLimitLogs: the limit kproxy got is logged, at Warn with
// what to raise when it cannot hold max_connections, at Info when it can.
func TestRaiseFileLimitLogs(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	raiseFileLimit(log, 1<<30)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if lim.Cur != lim.Max {
		t.Errorf("soft limit %d left below the hard limit %d", lim.Cur, lim.Max)
	}
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "client_connections_at_most=") || !strings.Contains(out, "max_connections=1073741824") {
		t.Errorf("a limit too small for max_connections logged:\n%s", out)
	}
	buf.Reset()
	raiseFileLimit(log, 1)
	if out := buf.String(); !strings.Contains(out, "level=INFO") || !strings.Contains(out, "soft=") {
		t.Errorf("a sufficient limit logged:\n%s", out)
	}
}
