package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// ApiVersions when the brokers stop answering (issue 20).
//
// A client's first request on every connection is ApiVersions, and kproxy
// forwards it to the broker the listener stands for, because only the
// broker knows its versions and features. When that broker accepts
// connections but answers nothing (a network partition, or kproxy's own
// path to the cluster blackholed) the client waits for the answer until
// its request timeout (10s for franz-go, 30s for the Java client) and
// then does it again, on a connection to the same kproxy: nothing else it
// sends on that connection reaches kproxy meanwhile, not even the group
// requests kproxy answers itself (a heartbeat that the router would
// answer UNKNOWN_MEMBER_ID to a member cut off from its owner, see
// docs/fleet.md).
//
// So a forwarded ApiVersions that the broker has not answered within
// Config.ApiVersionsTimeout is answered from the last merged ApiVersions
// answer the same broker (else any broker) gave through this kproxy,
// encoded at the client's version, and the broker's late answer, when it
// comes, is read and dropped before the next response on the connection.
// The client's request still went to the broker (KIP-511: the broker sees
// the client's software name and version), every later request goes
// there as it would directly, and on a healthy link nothing changes.
// Answering from the cache is harmless where the broker is merely slow:
// it is the answer that broker gave last.

// apiVersionsCache is the last merged ApiVersions answer by broker; safe
// for concurrent use.
type apiVersionsCache struct {
	mu     sync.Mutex
	byNode map[int32]*kmsg.ApiVersionsResponse // guarded by mu: read-only once stored
	late   map[int32]bool                      // guarded by mu: answered from here since the broker last answered in time
}

// remember records resp, a merged answer of node's broker without error.
// It returns whether node's broker had been late before.
func (c *apiVersionsCache) remember(node int32, resp *kmsg.ApiVersionsResponse) (wasLate bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byNode == nil {
		c.byNode, c.late = make(map[int32]*kmsg.ApiVersionsResponse), make(map[int32]bool)
	}
	c.byNode[node] = resp
	wasLate = c.late[node]
	delete(c.late, node)
	return wasLate
}

// answer returns the cached answer for node (any broker's if node has
// none) at version, or nil when nothing is cached, and whether this is
// the first answer from the cache since node's broker last answered.
func (c *apiVersionsCache) answer(node int32, version int16) (resp *kmsg.ApiVersionsResponse, first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cached := c.byNode[node]
	if cached == nil {
		// Brokers of a cluster normally answer alike; the lowest node
		// id makes the choice stable.
		for n, r := range c.byNode {
			if cached == nil || n < node {
				cached, node = r, n
			}
		}
	}
	if cached == nil {
		return nil, false
	}
	first = !c.late[node]
	c.late[node] = true
	cp := *cached // ApiKeys and the features are shared, read-only
	cp.Version = version
	cp.ThrottleMillis = 0
	return &cp, first
}

// has says whether any answer is cached.
func (c *apiVersionsCache) has() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byNode) > 0
}

// rememberApiVersions records a merged ApiVersions answer that the
// session's broker gave; called by the writer.
func (s *session) rememberApiVersions(resp kmsg.Response) {
	r, ok := resp.(*kmsg.ApiVersionsResponse)
	if !ok || r.ErrorCode != 0 {
		return
	}
	if s.p.apiv.remember(s.node, r) {
		s.log.Info("broker answers ApiVersions again")
	}
}

// awaitApiVersions bounds the wait for the first bytes of the broker's
// answer to a forwarded ApiVersions (sl) by Config.ApiVersionsTimeout,
// when an answer is cached to fall back on. It returns done=true when it
// answered the client from the cache instead; the broker's answer is then
// dropped when it comes (dropLate). Called by the writer.
func (s *session) awaitApiVersions(sl slot) (done bool, err error) {
	if s.upR != nil && s.upR.Buffered() > 0 || s.upIn.buffered() > 0 || !s.p.apiv.has() {
		return false, nil
	}
	timeout := s.p.cfg.ApiVersionsTimeout
	if err := s.up.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return false, nil
	}
	_, err = s.upstreamReader()
	if clearErr := s.up.SetReadDeadline(time.Time{}); clearErr != nil && err == nil {
		return false, fmt.Errorf("clearing the upstream read deadline: %w", clearErr)
	}
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false, fmt.Errorf("reading ApiVersions response from upstream: %w", truncated(err))
	}
	resp := s.cachedApiVersions(sl.version, "broker did not answer ApiVersions in time: answered from its last known versions; its late answer will be dropped")
	if resp == nil {
		return false, nil // cannot happen: has() was true and nothing is dropped
	}
	s.late = append(s.late, sl.corr)
	s.respBuf = codec.AppendResponse(s.respBuf[:0], sl.corr, resp)
	_, err = s.bw.Write(s.respBuf)
	n := len(s.respBuf)
	s.respBuf = keep(s.respBuf)
	if err != nil {
		return true, fmt.Errorf("writing to client: %w", err)
	}
	s.p.metrics.bytesOut(int64(n))
	s.p.metrics.request(sl.key, codec.Local, sl.start)
	return true, nil
}

// cachedApiVersions returns the cached ApiVersions answer at version, or
// nil when there is none, logging why (at WARN once per episode of the
// broker's) and counting it.
func (s *session) cachedApiVersions(version int16, why string) *kmsg.ApiVersionsResponse {
	resp, first := s.p.apiv.answer(s.node, version)
	if resp == nil {
		return nil
	}
	if first {
		s.log.Warn(why, "api_versions_timeout", s.p.cfg.ApiVersionsTimeout)
	}
	s.p.metrics.apiVersionsCached()
	return resp
}

// apiVersionsBeforeUpstream serves an ApiVersions request arriving on a
// session without an upstream connection yet, when an answer is cached:
// it dials the broker within Config.ApiVersionsTimeout and, when that
// times out (a partition that drops the connection attempt, or a TLS
// handshake that gets no answer), answers the client from the cache
// instead of making it wait for the whole dial timeout. done is false
// when the request is to be forwarded as usual (dialled in time, nothing
// cached, or the dial refused: ensureUpstream then reports the broker
// down as before). The next forwarded request dials again with the full
// Config.DialTimeout. Called by the reader.
func (s *session) apiVersionsBeforeUpstream(h codec.RequestHeader, start int64, total int) (done bool, err error) {
	if !s.p.apiv.has() {
		return false, nil
	}
	err = s.ensureUpstreamWithin(s.p.cfg.ApiVersionsTimeout)
	var ne net.Error
	if err == nil || !(errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded)) {
		return false, nil
	}
	resp := s.cachedApiVersions(h.Version, "broker not dialled within api_versions_timeout: ApiVersions answered from its last known versions")
	if resp == nil {
		return false, nil
	}
	if _, err := s.br.Discard(total); err != nil {
		return true, truncated(err)
	}
	return true, s.queueLocal(h, start, resp)
}

// dropLate reads and drops the broker's late answers to ApiVersions
// requests answered from the cache, which come before the response the
// writer waits for next. Called by the writer.
func (s *session) dropLate() error {
	for len(s.late) > 0 {
		corr := s.late[0]
		upR, err := s.upstreamReader()
		if err != nil {
			return fmt.Errorf("reading a late ApiVersions response from upstream: %w", truncated(err))
		}
		frame, err := s.readResponseFrame(upR, corr, codec.KeyApiVersions)
		if err != nil {
			return err
		}
		s.log.Debug("dropped a late ApiVersions answer", "bytes", len(frame))
		s.respBuf = keep(frame[:0])
		s.late = s.late[1:]
	}
	s.late = s.late[:0]
	return nil
}

// readResponseFrame reads one whole upstream response frame, which must
// carry correlation id corr, into the writer's response buffer.
func (s *session) readResponseFrame(upR *bufio.Reader, corr int32, key int16) ([]byte, error) {
	hdr, err := upR.Peek(8)
	if err != nil {
		return nil, fmt.Errorf("reading %s response from upstream: %w", kmsg.NameForKey(key), truncated(err))
	}
	size := int32(binary.BigEndian.Uint32(hdr))
	got := int32(binary.BigEndian.Uint32(hdr[4:]))
	if size < 4 || size > s.p.cfg.MaxRewriteResponse {
		return nil, fmt.Errorf("upstream sent a %d byte %s frame", size, kmsg.NameForKey(key))
	}
	if got != corr {
		return nil, fmt.Errorf("upstream answered correlation id %d, expected %d (%s)", got, corr, kmsg.NameForKey(key))
	}
	frame, err := readGrowing(upR, s.respBuf, 4+int(size))
	if err != nil {
		return nil, fmt.Errorf("reading %s response from upstream: %w", kmsg.NameForKey(key), truncated(err))
	}
	return frame, nil
}
