package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// answerFrame registers a raw response frame (size prefix included) for
// requests of key at version; its correlation id is overwritten.
func (u *fakeUpstream) answerFrame(key, version int16, frame []byte) {
	u.mu.Lock()
	u.responses[uint32(key)<<16|uint32(uint16(version))] = frame
	u.mu.Unlock()
}

// bigShareFetch is a ShareFetch v1 response with parts partitions of
// partBytes of records each, and NodeEndpoints naming node 0 at upstream
// (the fake broker) and node 5 elsewhere.
func bigShareFetch(t testing.TB, upstream string, parts, partBytes int) *kmsg.ShareFetchResponse {
	t.Helper()
	host, port, _ := net.SplitHostPort(upstream)
	p, _ := strconv.Atoi(port)
	resp := kmsg.NewPtrShareFetchResponse()
	resp.SetVersion(1)
	tp := kmsg.NewShareFetchResponseTopic()
	tp.TopicID[0] = 1
	for i := range parts {
		pp := kmsg.NewShareFetchResponseTopicPartition()
		pp.Partition = int32(i)
		pp.Records = bytes.Repeat([]byte{byte(i + 1)}, partBytes) // opaque to the proxy
		a := kmsg.NewShareFetchResponseTopicPartitionAcquiredRecord()
		a.FirstOffset, a.LastOffset, a.DeliveryCount = 0, 99, 1
		pp.AcquiredRecords = append(pp.AcquiredRecords, a)
		tp.Partitions = append(tp.Partitions, pp)
	}
	moved := kmsg.NewShareFetchResponseTopicPartition()
	moved.Partition, moved.ErrorCode = int32(parts), 6 // NOT_LEADER_OR_FOLLOWER
	moved.CurrentLeader.LeaderID, moved.CurrentLeader.LeaderEpoch = 5, 3
	tp.Partitions = append(tp.Partitions, moved)
	resp.Topics = append(resp.Topics, tp)
	for _, e := range []struct {
		node int32
		host string
		port int32
	}{{0, host, int32(p)}, {5, "broker-5.internal.example", 9093}} {
		ep := kmsg.NewShareFetchResponseNodeEndpoint()
		ep.NodeID, ep.Host, ep.Port = e.node, e.host, e.port
		resp.NodeEndpoints = append(resp.NodeEndpoints, ep)
	}
	return resp
}

func shareFetchReq() *kmsg.ShareFetchRequest {
	req := kmsg.NewPtrShareFetchRequest()
	req.SetVersion(1)
	g := "g"
	req.GroupID = &g
	return req
}

// readResponseFrame reads one response frame from c.
func readResponseFrame(c net.Conn) ([]byte, error) {
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		return nil, err
	}
	size := int(binary.BigEndian.Uint32(buf))
	if cap(buf) < 4+size {
		nb := make([]byte, 4+size)
		copy(nb, buf)
		buf = nb
	}
	buf = buf[:4+size]
	_, err := io.ReadFull(c, buf[4:])
	return buf, err
}

// TestStreamedShareFetchBounded sends a 32 MiB ShareFetch response with
// leader endpoints through the proxy, with max_rewrite_response_bytes at
// 1 MiB: the client gets kmsg's decode-rewrite-encode of it byte for
// byte, and the proxy allocates a small fraction of the response per
// response (it used to read it whole, and to refuse it over the limit).
// With the frame budget spent, the spool spills past its first 64 KiB
// and the response still comes through.
func TestStreamedShareFetchBounded(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	for _, frameMemory := range []int64{0, 1 << 10} {
		t.Run(fmt.Sprintf("frame_memory=%d", frameMemory), func(t *testing.T) { testStreamedBounded(t, frameMemory) })
	}
}

func testStreamedBounded(t *testing.T, frameMemory int64) {
	const parts, partBytes = 4, 8 << 20
	up := startFakeUpstream(t)
	resp := bigShareFetch(t, up.addr, parts, partBytes)
	up.answer(codec.KeyShareFetch, 1, resp)
	p := startProxy(t, []string{up.addr}, func(cfg *Config) {
		cfg.MetadataInterval = time.Hour
		cfg.MaxRewriteResponse = 1 << 20
		cfg.FrameMemory = frameMemory
	})
	c := dialRaw(t, p.Addr())
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("stream-test"))
	c.c.SetDeadline(time.Now().Add(60 * time.Second))

	upFrame := codec.AppendResponse(nil, 1, resp)
	body, err := codec.ResponseBody(upFrame[4:], codec.KeyShareFetch, 1)
	if err != nil {
		t.Fatal(err)
	}
	rewritten, err := codec.RewriteResponse(codec.KeyShareFetch, 1, body, p, false)
	if err != nil || rewritten == nil {
		t.Fatalf("kmsg's rewrite: %v, %v", rewritten, err)
	}
	want := codec.AppendResponse(nil, 1, rewritten)
	if _, err := c.c.Write(f.AppendRequest(nil, shareFetchReq(), 1)); err != nil {
		t.Fatal(err)
	}
	got, err := readResponseFrame(c.c)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the client got %d bytes, not kmsg's %d byte rewrite", len(got), len(want))
	}
	if bytes.Contains(got, []byte("broker-5.internal.example")) {
		t.Fatal("an upstream address reached the client")
	}

	// Allocations per response, the client discarding what it reads.
	const rounds = 3
	run := func() {
		for i := range rounds {
			if _, err := c.c.Write(f.AppendRequest(nil, shareFetchReq(), int32(2+i))); err != nil {
				t.Fatal(err)
			}
			var hdr [4]byte
			if _, err := io.ReadFull(c.c, hdr[:]); err != nil {
				t.Fatal(err)
			}
			if n := binary.BigEndian.Uint32(hdr[:]); int(n) != len(want)-4 {
				t.Fatalf("response of %d bytes, want %d", n, len(want)-4)
			}
			if _, err := io.CopyN(io.Discard, c.c, int64(len(want)-4)); err != nil {
				t.Fatal(err)
			}
		}
	}
	run() // warm up: the fake broker's frame buffer
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	run()
	runtime.ReadMemStats(&after)
	per := (after.TotalAlloc - before.TotalAlloc) / rounds
	t.Logf("%d KiB allocated per %d MiB streamed response (proxy, fake broker and client together)", per>>10, len(want)>>20)
	if per > 2<<20 { // the spool's 1 MiB of memory, if the pool dropped it, and small change
		t.Errorf("%d KiB allocated per %d MiB response: the response is held, not streamed", per>>10, len(want)>>20)
	}
	if used := p.budget.used.Load(); used != 0 {
		t.Errorf("%d bytes of the frame budget still reserved", used)
	}
}

// TestStreamedShareFetchMalformed: a ShareFetch response whose record set
// claims more bytes than its frame holds closes that client's connection
// with a log line saying why; another client of the proxy carries on.
func TestStreamedShareFetchMalformed(t *testing.T) {
	up := startFakeUpstream(t)
	resp := bigShareFetch(t, up.addr, 1, 100)
	frame := codec.AppendResponse(nil, 1, resp)
	i := bytes.Index(frame, append([]byte{101}, bytes.Repeat([]byte{1}, 100)...))
	if i < 0 {
		t.Fatal("records not found in the encoded frame")
	}
	frame[i] = 0x7f // 126 bytes of records: past the frame's end
	up.answerFrame(codec.KeyShareFetch, 1, frame)
	up.answer(codec.KeyProduce, 9, produceResp())
	logs := &logBuffer{}
	p := startProxy(t, []string{up.addr}, func(cfg *Config) {
		cfg.MetadataInterval = time.Hour
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("stream-test"))
	good := dialRaw(t, p.Addr())
	if err := good.roundTrip(f.AppendRequest(nil, produceReq(9, 1, 100), 1), 1); err != nil {
		t.Fatalf("good client before: %v", err)
	}
	bad := dialRaw(t, p.Addr())
	if _, err := bad.c.Write(f.AppendRequest(nil, shareFetchReq(), 1)); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, bad.c, 5*time.Second)
	peer := bad.c.LocalAddr().String()
	waitFor(t, 5*time.Second, "the malformed-response log line", func() bool {
		return hasLine(logs, peer, "malformed response") && hasLine(logs, peer, "beyond the frame")
	})
	if err := good.roundTrip(f.AppendRequest(nil, produceReq(9, 1, 100), 2), 1); err != nil {
		t.Fatalf("good client after: %v", err)
	}
}

// TestStreamedSpillFallback: with no usable temporary directory a
// streamed response is held in memory within max_rewrite_response_bytes,
// with one warning; over the limit its connection is closed.
func TestStreamedSpillFallback(t *testing.T) {
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing"))
	up := startFakeUpstream(t)
	resp := bigShareFetch(t, up.addr, 2, 1<<20)
	up.answer(codec.KeyShareFetch, 1, resp)
	for _, limit := range []int32{4 << 20, 1 << 20} {
		t.Run(fmt.Sprintf("limit=%dMiB", limit>>20), func(t *testing.T) {
			logs := &logBuffer{}
			p := startProxy(t, []string{up.addr}, func(cfg *Config) {
				cfg.MetadataInterval = time.Hour
				cfg.MaxRewriteResponse = limit
				cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
			})
			c := dialRaw(t, p.Addr())
			c.c.SetDeadline(time.Now().Add(30 * time.Second))
			f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("stream-test"))
			if _, err := c.c.Write(f.AppendRequest(nil, shareFetchReq(), 1)); err != nil {
				t.Fatal(err)
			}
			got, err := readResponseFrame(c.c)
			if limit < 2<<20 {
				if err == nil {
					t.Fatalf("a %d MiB response over a %d MiB limit came through", len(got)>>20, limit>>20)
				}
				peer := c.c.LocalAddr().String()
				waitFor(t, 5*time.Second, "the limit log line", func() bool { return hasLine(logs, peer, "max_rewrite_response_bytes") })
				return
			}
			if err != nil {
				t.Fatalf("reading the response: %v", err)
			}
			r := kmsg.NewPtrShareFetchResponse()
			r.SetVersion(1)
			b, _ := codec.ResponseBody(got[4:], codec.KeyShareFetch, 1)
			if err := r.ReadFrom(b); err != nil {
				t.Fatalf("decoding the response: %v", err)
			}
			if len(r.Topics) != 1 || len(r.Topics[0].Partitions) != 3 || !bytes.Equal(r.Topics[0].Partitions[1].Records, resp.Topics[0].Partitions[1].Records) {
				t.Fatal("the records did not come through intact")
			}
			if len(r.NodeEndpoints) != 2 || r.NodeEndpoints[1].Host == "broker-5.internal.example" {
				t.Fatalf("endpoints not rewritten: %+v", r.NodeEndpoints)
			}
			if n := strings.Count(logs.String(), "cannot spill streamed responses"); n != 1 {
				t.Fatalf("%d spill warnings, want 1:\n%s", n, logs)
			}
			waitFor(t, 5*time.Second, "the fallback's reservation to be released", func() bool { return p.budget.used.Load() == 0 })
		})
	}
}

// BenchmarkStreamedResponse compares a ShareFetch response rewritten as
// it streams (spooled, past 64 KiB in a temporary file) with a Fetch
// response of the same size spliced untouched, one round trip at a time.
func BenchmarkStreamedResponse(b *testing.B) {
	for _, size := range []int{256 << 10, 4 << 20} {
		up := startFakeUpstream(b)
		sf := bigShareFetch(b, up.addr, 1, size)
		up.answer(codec.KeyShareFetch, 1, sf)
		up.answer(codec.KeyFetch, 12, fetchResp(size))
		p := startProxy(b, []string{up.addr}, func(cfg *Config) { cfg.MetadataInterval = time.Hour })
		f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("stream-bench"))
		for _, c := range []struct {
			name string
			req  kmsg.Request
		}{{"sharefetch-streamed", shareFetchReq()}, {"fetch-v12-spliced", fetchReq(12)}} {
			b.Run(fmt.Sprintf("%s-%dKiB", c.name, size>>10), func(b *testing.B) {
				rc := dialRaw(b, p.Addr())
				frame := f.AppendRequest(nil, c.req, 1)
				b.SetBytes(int64(size))
				for b.Loop() {
					if _, err := rc.c.Write(frame); err != nil {
						b.Fatal(err)
					}
					var hdr [4]byte
					if _, err := io.ReadFull(rc.c, hdr[:]); err != nil {
						b.Fatal(err)
					}
					if _, err := io.CopyN(io.Discard, rc.c, int64(binary.BigEndian.Uint32(hdr[:]))); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
