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
