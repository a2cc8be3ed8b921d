package main

import (
	"os"
	"testing"
)

func TestParseProcIO(t *testing.T) {
	const io = "rchar: 101539498\nwchar: 104857708\nsyscr: 12459\nsyscw: 157\nread_bytes: 0\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n"
	n, err := parseProcIO(io)
	if err != nil || n != 12459+157 {
		t.Fatalf("parseProcIO = %d, %v; want %d", n, err, 12459+157)
	}
	for _, bad := range []string{"", "syscr: 1\n", "syscr: x\nsyscw: 2\n", "syscr: 1\nsyscw: 2\nsyscw: 3\n", "syscr: -1\nsyscw: 2\n"} {
		if _, err := parseProcIO(bad); err == nil {
			t.Errorf("parseProcIO(%q) accepted", bad)
		}
	}
}

func TestParseCtxSwitches(t *testing.T) {
	const status = "Name:\tkproxy\nState:\tS (sleeping)\nThreads:\t7\nvoluntary_ctxt_switches:\t1500\nnonvoluntary_ctxt_switches:\t23\n"
	n, err := parseCtxSwitches(status)
	if err != nil || n != 1523 {
		t.Fatalf("parseCtxSwitches = %d, %v; want 1523", n, err)
	}
	if _, err := parseCtxSwitches("Name:\tx\nvoluntary_ctxt_switches:\t1\n"); err == nil {
		t.Error("a status without nonvoluntary_ctxt_switches was accepted")
	}
}

// TestReadProcCounts reads this process's counts, which grow with a read.
func TestReadProcCounts(t *testing.T) {
	a, err := readProcCounts(os.Getpid())
	if err != nil {
		t.Fatalf("kbench needs /proc (Linux): %v", err)
	}
	for range 10 {
		if _, err := os.ReadFile("/proc/self/stat"); err != nil {
			t.Fatal(err)
		}
	}
	b, err := readProcCounts(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if b.syscalls < a.syscalls+10 {
		t.Fatalf("syscalls went from %d to %d over 10 file reads", a.syscalls, b.syscalls)
	}
	if b.switches < a.switches {
		t.Fatalf("context switches went down: %d to %d", a.switches, b.switches)
	}
}
