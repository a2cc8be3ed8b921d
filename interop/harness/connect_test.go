package main

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestReadSink: whole numbered lines count with their copies; an
// unterminated last line is not read yet; anything else is garbled.
func TestReadSink(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sink.txt")
	if sf, err := readSink(p); err != nil || sf.total != 0 || len(sf.missing(2)) != 2 {
		t.Fatalf("missing file: %+v, %v; want empty", sf, err)
	}
	body := connectLine(0) + "\n" + connectLine(1) + "\n" + connectLine(1) + "\nline-00x\n" + connectLine(7) + "\n" + "line-0000"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	sf, err := readSink(p)
	if err != nil {
		t.Fatal(err)
	}
	if sf.total != 4 || sf.copies[0] != 1 || sf.copies[1] != 2 || sf.copies[7] != 1 {
		t.Fatalf("copies %v total %d; want 0:1 1:2 7:1, total 4", sf.copies, sf.total)
	}
	if len(sf.garbled) != 1 || sf.garbled[0] != "line-00x" {
		t.Fatalf("garbled %q; want [line-00x] (the unterminated tail is not read yet)", sf.garbled)
	}
	if m := sf.missing(8); len(m) != 5 || m[0] != 2 || m[4] != 6 {
		t.Fatalf("missing(8) = %v; want [2 3 4 5 6]", m)
	}
}

// TestLoopbackOnly: a socket on 127.0.0.1 passes; one on every address
// (0.0.0.0, what a worker's REST server binds by default) and a port
// nobody listens on fail.
func TestLoopbackOnly(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := loopbackOnly(port); err != nil {
		t.Fatalf("listening on 127.0.0.1:%d: %v", port, err)
	}
	l.Close()
	if err := loopbackOnly(port); err == nil {
		t.Fatalf("port %d closed, yet loopbackOnly passed", port)
	}
	any, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer any.Close()
	if err := loopbackOnly(any.Addr().(*net.TCPAddr).Port); err == nil {
		t.Fatal("a socket on 0.0.0.0 passed as 127.0.0.1")
	}
}
