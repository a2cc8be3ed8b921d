package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// logBuffer is a concurrency-safe sink for the proxy's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func frame(body []byte) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(len(body)))
}

// TestBadInputClosesOnlyThatConnection sends each kind of bad input on a
// connection of its own: that connection is closed with one log line
// naming the peer and the reason, while a client on another connection
// carries on.
func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	c := newCluster(t)
	logs := &logBuffer{}
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
		cfg.MaxFrame = 1 << 20
	})
	good := newClient(t, p.Addr())
	adm := kadm.NewClient(good)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.BrokerMetadata(ctx); err != nil {
		t.Fatalf("metadata before: %v", err)
	}

	unknownKey := binary.BigEndian.AppendUint16(nil, 999)
	unknownKey = append(unknownKey, 0, 0, 0, 0, 0, 1, 0xff, 0xff)
	badClientID := []byte{0, 3, 0, 0, 0, 0, 0, 1, 0x7f, 0xff} // client id longer than the frame
	cases := []struct {
		name   string
		send   []byte
		reason string
	}{
		{"frame over the limit", frame(make([]byte, 2<<20))[:4], "frame larger than the limit"},
		{"negative size", []byte{0xff, 0xff, 0xff, 0xf0}, "negative frame size"},
		{"size too small", []byte{0, 0, 0, 3, 1, 2, 3}, "frame too small"},
		{"truncated frame", append(frame(make([]byte, 100)), 0, 3, 0, 4), "truncated frame"},
		{"unknown api key", append(frame(unknownKey), unknownKey...), "unknown api key 999"},
		{"garbage header", append(frame(badClientID), badClientID...), "malformed request header"},
		{"TLS handshake", []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}, "TLS sent to a plaintext listener"},
		{"HTTP request", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP sent to a Kafka listener"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			local := conn.LocalAddr().String()
			if _, err := conn.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			if tc.name == "truncated frame" {
				conn.(*net.TCPConn).CloseWrite()
			}
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := io.Copy(io.Discard, conn)
			if err != nil {
				t.Fatalf("connection not closed by the proxy: %v (read %d bytes)", err, n)
			}
			waitFor(t, 5*time.Second, "the log line", func() bool {
				for _, line := range strings.Split(logs.String(), "\n") {
					if strings.Contains(line, local) && strings.Contains(line, tc.reason) {
						return true
					}
				}
				return false
			})
			if _, err := adm.BrokerMetadata(ctx); err != nil {
				t.Fatalf("the good client was disturbed: %v", err)
			}
		})
	}
	if t.Failed() {
		t.Logf("proxy log:\n%s", logs.String())
	}
}

// TestUnreachableBrokerClosesConnection points a proxy at an address
// where nothing listens: a client's request gets no answer and its
// connection is reset, not closed cleanly (which franz-go reads as "is
// TLS misconfigured?" and does not retry), and not left hanging.
func TestUnreachableBrokerClosesConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p := startProxy(t, []string{dead}, func(cfg *Config) { cfg.DialTimeout = 2 * time.Second })
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 3
	req.ClientSoftwareName, req.ClientSoftwareVersion = "test", "1"
	if _, err := conn.Write(kmsg.NewRequestFormatter().AppendRequest(nil, req, 1)); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, conn)
	if n != 0 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read %d bytes, err %v; want no byte and a connection reset", n, err)
	}
}
