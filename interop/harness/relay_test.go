package main

import (
	"errors"
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

// acceptOne listens on loopback and hands over the first connection
// accepted, the target's side of a relayed connection.
func acceptOne(t *testing.T) (addr string, conns <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { c.Close() })
		ch <- c
	}()
	return ln.Addr().String(), ch
}

// readFor reads from conn for d and returns what arrived.
func readFor(conn net.Conn, d time.Duration) []byte {
	var got []byte
	conn.SetReadDeadline(time.Now().Add(d))
	defer conn.SetReadDeadline(time.Time{})
	for {
		b := make([]byte, 64)
		n, err := conn.Read(b)
		got = append(got, b[:n]...)
		if err != nil {
			return got
		}
	}
}

// readN reads exactly n bytes from conn within d.
func readN(conn net.Conn, n int, d time.Duration) ([]byte, error) {
	conn.SetReadDeadline(time.Now().Add(d))
	defer conn.SetReadDeadline(time.Time{})
	b := make([]byte, n)
	_, err := io.ReadFull(conn, b)
	return b, err
}

// TestFaultRelayOneWay: a one-way hole holds exactly its direction while
// the other keeps flowing, and at heal the held bytes, written as
// separate chunks during the hole, flow on whole and in order; then the
// same the other way round on the same connection.
func TestFaultRelayOneWay(t *testing.T) {
	target, accepted := acceptOne(t)
	r, err := listenRelay(target)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	client, err := net.Dial("tcp", r.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var server net.Conn
	select {
	case server = <-accepted:
	case <-time.After(2 * time.Second):
		t.Fatal("the relay did not connect to its target")
	}

	for _, tc := range []struct {
		held            direction
		heldSide, other net.Conn // the sender of the held direction, the other side
	}{{toTarget, client, server}, {toClient, server, client}} {
		r.setHoles(tc.held, 0)
		// The held direction: chunks written apart, so that the relay
		// reads (or would read) each on its own.
		held := []byte("held-" + tc.held.String() + "|")
		for i := range 3 {
			if _, err := tc.heldSide.Write(append(held, byte('0'+i))); err != nil {
				t.Fatalf("%v: write: %v", tc.held, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The other direction flows while the hole holds.
		for i := range 3 {
			msg := []byte{'f', byte('0' + i)}
			if _, err := tc.other.Write(msg); err != nil {
				t.Fatalf("%v: write the other way: %v", tc.held, err)
			}
			got, err := readN(tc.heldSide, len(msg), time.Second)
			if err != nil || string(got) != string(msg) {
				t.Fatalf("hole %v: the other direction carried %q, %v; want %q", tc.held, got, err, msg)
			}
		}
		if got := readFor(tc.other, 300*time.Millisecond); len(got) > 0 {
			t.Fatalf("hole %v: %q came through it", tc.held, got)
		}
		r.heal()
		var want []byte
		for i := range 3 {
			want = append(append(want, held...), byte('0'+i))
		}
		got, err := readN(tc.other, len(want), 2*time.Second)
		if err != nil || string(got) != string(want) {
			t.Fatalf("hole %v: at heal %q, %v; want %q", tc.held, got, err, want)
		}
	}

	// Both ways still work after both one-way holes.
	for _, p := range [][2]net.Conn{{client, server}, {server, client}} {
		if _, err := p[0].Write([]byte("ok")); err != nil {
			t.Fatal(err)
		}
		if got, err := readN(p[1], 2, time.Second); err != nil || string(got) != "ok" {
			t.Fatalf("healed: %q, %v", got, err)
		}
	}
}

// TestFaultRelayOneWayClose: a client's close still reaches the target
// through a hole toClient (its FIN travels the flowing direction), and
// not through a hole toTarget until heal.
func TestFaultRelayOneWayClose(t *testing.T) {
	for _, held := range []direction{toClient, toTarget} {
		target, accepted := acceptOne(t)
		r, err := listenRelay(target)
		if err != nil {
			t.Fatal(err)
		}
		client, err := net.Dial("tcp", r.addr())
		if err != nil {
			t.Fatal(err)
		}
		server := <-accepted
		r.setHoles(held, 0)
		client.Close()
		server.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = server.Read(make([]byte, 1))
		var ne net.Error
		timedOut := errors.As(err, &ne) && ne.Timeout()
		if held == toClient && timedOut {
			t.Fatalf("hole %v: the client's close did not reach the target", held)
		}
		if held == toTarget && !timedOut {
			t.Fatalf("hole %v: the client's close went through it (%v)", held, err)
		}
		r.close()
	}
}
