//go:build linux

package proxy

import (
	"crypto/tls"
	"net"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kproxy/kproxy/internal/testcert"
)

// idleConnBudget is the most an idle client connection may cost the
// proxy in heap and stacks together (issue 13).
const idleConnBudget = 32 << 10

// idleConnCost opens n client connections through a proxy child in front
// of an in-memory broker, each doing ApiVersions then Metadata and then
// staying quiet, and returns the child's heap+stack growth per connection
// and its goroutines per connection. Warm-up connections opened first
// fill the pools and the broker listener, so the figure is the marginal
// cost of one more idle connection.
func idleConnCost(t testing.TB, n int, wrap func(net.Conn) net.Conn, env ...string) (perConn, stackPerConn, goroutinesPerConn float64) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	ch := startProxyChild(t, c.ListenAddrs()[0], env...)
	open := func(k int) {
		for range k {
			kc, err := dialKafka(ch.addr, wrap)
			if err != nil {
				t.Fatalf("dial proxy: %v", err)
			}
			t.Cleanup(func() { kc.c.Close() })
			if _, err := kc.idleHandshake(); err != nil {
				t.Fatalf("ApiVersions and Metadata through the proxy: %v", err)
			}
			kc.buf = nil // the client's memory is not measured, but keep the test small
		}
	}
	open(20)
	before := ch.mem(t)
	open(n)
	after := ch.mem(t)
	if got := after.Sessions - before.Sessions; got != n {
		t.Fatalf("the proxy has %d more sessions, want %d", got, n)
	}
	grow := float64(after.HeapInuse+after.StackInuse) - float64(before.HeapInuse+before.StackInuse)
	return grow / float64(n), (float64(after.StackInuse) - float64(before.StackInuse)) / float64(n),
		float64(after.Goroutines-before.Goroutines) / float64(n)
}

// TestIdleConnMemory: an idle plaintext client connection costs the
// proxy at most idleConnBudget of heap and stacks.
func TestIdleConnMemory(t *testing.T) {
	const n = 400
	per, stack, gor := idleConnCost(t, n, nil)
	t.Logf("idle connection: %s of heap+stacks (%s of it stacks), %.1f goroutines, measured over %d connections", kib(per), kib(stack), gor, n)
	if raceEnabled() {
		t.Logf("-race: budget %s not checked (the race detector's instrumentation changes the heap)", kib(idleConnBudget))
		return
	}
	if per > idleConnBudget {
		t.Errorf("an idle connection costs %s of the proxy's heap and stacks, want at most %s", kib(per), kib(idleConnBudget))
	}
}

// BenchmarkIdleConnMemory reports the heap and stacks an idle client
// connection costs the proxy, plaintext and TLS (crypto/tls keeps its
// record buffers for the connection's life). b.N is not used: memory,
// not time, is measured.
func BenchmarkIdleConnMemory(b *testing.B) {
	const n = 400
	b.Run("plaintext", func(b *testing.B) {
		for b.Loop() {
			per, stack, gor := idleConnCost(b, n, nil)
			b.ReportMetric(per, "bytes/conn")
			b.ReportMetric(stack, "stack-bytes/conn")
			b.ReportMetric(gor, "goroutines/conn")
		}
	})
	b.Run("tls", func(b *testing.B) {
		ca := testcert.NewCA(b, "kproxy-test-ca")
		cert, key := ca.Issue(b, "127.0.0.1").Write(b, b.TempDir(), "server")
		conf := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
		wrap := func(c net.Conn) net.Conn { return tls.Client(c, conf) }
		for b.Loop() {
			per, stack, gor := idleConnCost(b, n, wrap, childTLSEnv+"="+cert+","+key)
			b.ReportMetric(per, "bytes/conn")
			b.ReportMetric(stack, "stack-bytes/conn")
			b.ReportMetric(gor, "goroutines/conn")
		}
	})
}
