package main

import (
	"context"
	"net"
	"testing"
)

func TestParseDialVia(t *testing.T) {
	m, err := parseDialVia([]string{"127.0.0.1:9092=127.0.0.1:1", "b:2=c:3"})
	if err != nil {
		t.Fatal(err)
	}
	if m["127.0.0.1:9092"] != "127.0.0.1:1" || m["b:2"] != "c:3" || len(m) != 2 {
		t.Fatalf("parsed %v", m)
	}
	for _, bad := range []string{"a:1", "a:1=b", "a=b:1"} {
		if _, err := parseDialVia([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if m, err := parseDialVia(nil); m != nil || err != nil {
		t.Errorf("no pairs: %v, %v", m, err)
	}
}

// TestDialViaDials: a mapped address is dialled at its target, others as
// they are.
func TestDialViaDials(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	m := dialVia{"kafka.invalid:9092": ln.Addr().String()}
	c, err := m.dial(context.Background(), "tcp", "kafka.invalid:9092")
	if err != nil {
		t.Fatalf("mapped address: %v", err)
	}
	c.Close()
	if c, err := m.dial(context.Background(), "tcp", ln.Addr().String()); err != nil {
		t.Fatalf("unmapped address: %v", err)
	} else {
		c.Close()
	}
}
