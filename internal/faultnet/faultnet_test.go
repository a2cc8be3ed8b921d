package faultnet

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echoTarget is a target that echoes every byte back and counts what it
// received.
func echoTarget(t *testing.T) (addr string, received func() int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan int, 1024)
	var total int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						got <- n
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), func() int64 {
		for {
			select {
			case n := <-got:
				total += int64(n)
			default:
				return total
			}
		}
	}
}

func relayTo(t *testing.T, target string) (*Relay, net.Conn) {
	t.Helper()
	r, err := Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return r, c
}

// roundTrip writes msg and reads it back within d; ok=false on a timeout.
func roundTrip(t *testing.T, c net.Conn, msg string, d time.Duration) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, false
		}
		t.Fatalf("read: %v", err)
	}
	if string(buf) != msg {
		t.Fatalf("read %q, want %q", buf, msg)
	}
	return time.Since(start), true
}

// TestBlackholeHoldsWithoutClosing: a blackhole of both directions
// forwards nothing and closes nothing; on Heal the held bytes arrive.
func TestBlackholeHoldsWithoutClosing(t *testing.T) {
	target, received := echoTarget(t)
	r, c := relayTo(t, target)
	if _, ok := roundTrip(t, c, "ping", 2*time.Second); !ok {
		t.Fatal("no echo before the fault")
	}
	r.Blackhole(Both)
	before := received()
	if _, ok := roundTrip(t, c, "held", 200*time.Millisecond); ok {
		t.Fatal("echo through a blackhole")
	}
	if n := received() - before; n != 0 {
		t.Fatalf("the target received %d bytes through a blackhole", n)
	}
	if s := r.Stats(); s.Live != 1 {
		t.Fatalf("%d live connections during the blackhole, want 1", s.Live)
	}
	r.Heal()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "held" {
		t.Fatalf("after heal: %q, %v; want the held bytes", buf, err)
	}
}

// TestBlackholeOneDirection: blackholing only the answers lets requests
// reach the target while the client hears nothing, and the reverse.
func TestBlackholeOneDirection(t *testing.T) {
	target, received := echoTarget(t)
	r, c := relayTo(t, target)
	roundTrip(t, c, "warm", 2*time.Second)
	r.Blackhole(ToClient)
	before := received()
	if _, ok := roundTrip(t, c, "abcd", 200*time.Millisecond); ok {
		t.Fatal("an answer came through a ToClient blackhole")
	}
	deadline := time.Now().Add(2 * time.Second)
	for received()-before < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := received() - before; n != 4 {
		t.Fatalf("the target received %d bytes with only answers blackholed, want 4", n)
	}
	r.Heal()
	buf := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}

	r.Blackhole(ToTarget)
	before = received()
	if _, ok := roundTrip(t, c, "efgh", 200*time.Millisecond); ok {
		t.Fatal("an answer came through a ToTarget blackhole")
	}
	if n := received() - before; n != 0 {
		t.Fatalf("the target received %d bytes through a ToTarget blackhole", n)
	}
	r.Heal()
}

// TestDelayAddsLatencyKeepingOrder: a delay on one direction adds to
// every round trip, and bytes keep their order.
func TestDelayAddsLatencyKeepingOrder(t *testing.T) {
	target, _ := echoTarget(t)
	r, c := relayTo(t, target)
	r.Delay(ToTarget, 100*time.Millisecond)
	for _, m := range []string{"one", "two", "three"} {
		d, ok := roundTrip(t, c, m, 2*time.Second)
		if !ok || d < 100*time.Millisecond {
			t.Fatalf("round trip %v (ok %v), want at least the 100ms delay", d, ok)
		}
	}
	r.Delay(Both, 0)
	if d, ok := roundTrip(t, c, "fast", 2*time.Second); !ok || d > 90*time.Millisecond {
		t.Fatalf("round trip %v after removing the delay", d)
	}
}

// TestResetClosesBothSides: Reset ends every live connection at once;
// a new connection is relayed again. Refuse closes new connections.
func TestResetClosesBothSides(t *testing.T) {
	target, _ := echoTarget(t)
	r, c := relayTo(t, target)
	roundTrip(t, c, "warm", 2*time.Second)
	r.Reset()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after reset: %v, want the connection closed", err)
	}
	c2, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, ok := roundTrip(t, c2, "again", 2*time.Second); !ok {
		t.Fatal("a new connection after the reset was not relayed")
	}
	r.Refuse(true)
	c3, err := net.Dial("tcp", r.Addr())
	if err != nil { // the reset may come before the dial returns
		r.Close()
		return
	}
	defer c3.Close()
	c3.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c3.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a refused connection: %v, want it closed", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}
