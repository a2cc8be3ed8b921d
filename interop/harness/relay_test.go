package main

import (
	"io"
	"net"
	"testing"
	"time"
)

// echoServer answers every byte with itself.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends one byte through conn and waits up to d for its echo.
func roundTrip(conn net.Conn, d time.Duration) (time.Duration, error) {
	start := time.Now()
	if _, err := conn.Write([]byte{1}); err != nil {
		return 0, err
	}
	conn.SetReadDeadline(time.Now().Add(d))
	defer conn.SetReadDeadline(time.Time{})
	var b [1]byte
	_, err := io.ReadFull(conn, b[:])
	return time.Since(start), err
}

// TestFaultRelay: bytes flow; a blackhole holds them without closing and
// they flow on at heal; a delay is added each way.
func TestFaultRelay(t *testing.T) {
	r, err := listenRelay(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	conn, err := net.Dial("tcp", r.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := roundTrip(conn, 2*time.Second); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	r.set(true, 0)
	if _, err := roundTrip(conn, 300*time.Millisecond); err == nil {
		t.Fatal("a byte came back through the blackhole")
	}
	r.heal()
	var b [1]byte
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		t.Fatalf("the held byte did not flow on at heal: %v", err)
	}
	conn.SetReadDeadline(time.Time{})
	r.set(false, 100*time.Millisecond)
	took, err := roundTrip(conn, 2*time.Second)
	if err != nil || took < 200*time.Millisecond || took > time.Second {
		t.Fatalf("with 100ms each way: round trip %v, %v; want about 200ms", took, err)
	}
}

// TestFaultRelayPipelined: requests written back to back on one
// connection each get the row's delay once. A relay that held one chunk
// per direction besides the one waiting out its delay read a third chunk
// only when the first left, and so delayed it by up to another delay:
// in fault-owner-upstream-slow, kproxy's connection to the broker
// carries both members' commits plus its polls, and its commits' p99
// read up to 285ms where the direct member's, alone on its connection,
// read 210ms.
func TestFaultRelayPipelined(t *testing.T) {
	r, err := listenRelay(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	conn, err := net.Dial("tcp", r.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const delay, n = 100 * time.Millisecond, 5
	r.set(false, delay)
	sent := make(chan time.Time, n)
	go func() {
		for i := range n {
			sent <- time.Now()
			conn.Write([]byte{byte(i)})
			time.Sleep(15 * time.Millisecond) // separate chunks, all within one delay
		}
	}()
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	for i := range n {
		var b [1]byte
		if _, err := io.ReadFull(conn, b[:]); err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}
		if took := time.Since(<-sent); took > 2*delay+40*time.Millisecond {
			t.Fatalf("echo %d came back after %v; want about %v", i, took, 2*delay)
		}
	}
}
