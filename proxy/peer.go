package proxy

// The peer wire: how one kproxy relays a group request to the kproxy that
// owns the group (docs/fleet.md, "Routing").
//
// A relaying kproxy keeps one connection per owner address, multiplexed:
// any number of requests are in flight on it, and answers come back in
// whatever order the owner finishes them, matched by correlation id. The
// framing is Kafka's: a 4-byte size, a request header v2, and the body of
// an Envelope request (KIP-590, key 58, v0) whose fields carry
//
//   - RequestData: the client's request as a broker would read it off the
//     wire without its size prefix: request header (v1, or v2 when the
//     inner API version is flexible: api key, version, correlation id,
//     client id, tags) followed by the request body. The inner
//     correlation id equals the envelope's;
//   - ClientHostAddress: the client's IP address, 4 or 16 bytes.
//
// The answer is a response header v1 (correlation id, tags) and an
// Envelope response. A non-zero ErrorCode means the owner refused the
// envelope itself (not a group API, a version it cannot read, a request
// that does not decode). Otherwise ResponseData holds the inner response
// body only, without a response header: unlike Kafka's Envelope, which
// carries a full response because a forwarding broker re-frames it, the
// relaying kproxy knows the key and version it sent and re-frames the
// answer for its client with the client's own correlation id.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// keyEnvelope is the Envelope API key (KIP-590).
const keyEnvelope = 58

// relayClientID is the client id in the header of every envelope.
const relayClientID = "kproxy-relay"

// appendEnvelope appends a whole Envelope request frame relaying req from
// client c, with correlation id corr for both the envelope and the inner
// request.
func appendEnvelope(dst []byte, corr int32, c Client, req kmsg.Request) []byte {
	inner := kmsg.NewRequestFormatter(kmsg.FormatterClientID(c.ID)).AppendRequest(nil, req, corr)
	env := kmsg.NewPtrEnvelopeRequest()
	env.RequestData = inner[4:] // without the size prefix
	env.ClientHostAddress = hostBytes(c.Host)
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID(relayClientID)).AppendRequest(dst, env, corr)
}

// hostBytes encodes an IP address as 4 bytes (IPv4) or 16 (IPv6); a host
// that is no IP address encodes as nothing.
func hostBytes(host string) []byte {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return nil
	}
	return a.WithZone("").Unmap().AsSlice()
}

// hostString decodes what hostBytes encoded; anything else decodes as "".
func hostString(b []byte) string {
	a, ok := netip.AddrFromSlice(b)
	if !ok {
		return ""
	}
	return a.Unmap().String()
}

// decodeRelayed decodes an owner's answer frame (after its size prefix)
// to a request of key at version.
func decodeRelayed(frame []byte, key, version int16) (kmsg.Response, outcome, error) {
	body, err := codec.ResponseBody(frame, keyEnvelope, 0)
	if err != nil {
		return nil, outcomeBadResponse, fmt.Errorf("envelope response header: %w", err)
	}
	env := kmsg.NewPtrEnvelopeResponse()
	if err := env.ReadFrom(body); err != nil {
		return nil, outcomeBadResponse, fmt.Errorf("malformed envelope response: %w", err)
	}
	if env.ErrorCode != 0 {
		return nil, outcomeEnvelopeError, fmt.Errorf("owner refused the envelope with error %d", env.ErrorCode)
	}
	resp := kmsg.ResponseForKey(key)
	if resp == nil {
		return nil, outcomeBadResponse, fmt.Errorf("no response type for api key %d", key)
	}
	resp.SetVersion(version)
	if err := resp.ReadFrom(env.ResponseData); err != nil {
		return nil, outcomeBadResponse, fmt.Errorf("malformed %s v%d response: %w", kmsg.NameForKey(key), version, err)
	}
	return resp, outcomeOK, nil
}

// Dialer opens a connection, as net.Dialer.DialContext does.
type Dialer func(ctx context.Context, network, address string) (net.Conn, error)

var errRouterClosed = errors.New("router closed")

// peerPool holds the relaying side's connections, one per owner address.
type peerPool struct {
	dial        Dialer        // immutable
	dialTimeout time.Duration // immutable
	log         *slog.Logger  // immutable

	corr atomic.Int32   // the last correlation id given out, for all connections
	wg   sync.WaitGroup // every connection goroutine

	mu       sync.Mutex
	conns    map[string]*peerConn // guarded by mu: the current connection per address
	lastWarn map[string]time.Time // guarded by mu: when a failure was last logged at warn, per address
	closed   bool                 // guarded by mu
}

func newPeerPool(dial Dialer, dialTimeout time.Duration, log *slog.Logger) *peerPool {
	return &peerPool{
		dial:        dial,
		dialTimeout: dialTimeout,
		log:         log,
		conns:       make(map[string]*peerConn),
		lastWarn:    make(map[string]time.Time),
	}
}

// relayCall is one request relayed to a peer. done is called exactly once,
// by whoever removes the call from its connection's pending set: the
// reader (an answer), the timer (timeout) or fail (connection lost).
type relayCall struct {
	corr         int32
	key, version int16
	frame        []byte // the envelope frame; owned by the writer once queued
	done         func(kmsg.Response, outcome)
	timer        *time.Timer // guarded by the connection's mu
}

// do relays req from c to the owner at addr. done gets the owner's answer
// with outcomeOK, or nil and the reason there is none, after at most
// timeout. The request is encoded before do returns: req may alias the
// caller's buffers.
func (p *peerPool) do(addr string, c Client, req kmsg.Request, timeout time.Duration, done func(kmsg.Response, outcome)) {
	corr := p.corr.Add(1)
	call := &relayCall{corr: corr, key: req.Key(), version: req.GetVersion(), frame: appendEnvelope(nil, corr, c, req), done: done}
	// A connection can fail between get and enqueue; the call was not
	// sent, so it may go on the replacement.
	for range 3 {
		pc := p.get(addr)
		if pc == nil {
			done(nil, outcomeClosed)
			return
		}
		if pc.enqueue(call, timeout) {
			return
		}
	}
	done(nil, outcomeUnreachable)
}

// get returns the live connection to addr, starting one if there is none;
// nil once the pool closed.
func (p *peerPool) get(addr string) *peerConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if pc := p.conns[addr]; pc != nil && !pc.isFailed() {
		return pc
	}
	ctx, cancel := context.WithCancel(context.Background())
	pc := &peerConn{
		pool:    p,
		addr:    addr,
		ctx:     ctx,
		cancel:  cancel,
		wake:    make(chan struct{}, 1),
		pending: make(map[int32]*relayCall),
	}
	p.conns[addr] = pc
	p.wg.Add(1)
	go pc.writeLoop()
	return pc
}

// remove forgets pc if it is still addr's current connection.
func (p *peerPool) remove(pc *peerConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns[pc.addr] == pc {
		delete(p.conns, pc.addr)
	}
}

// warnAllowed reports whether a failure of addr may be logged at warn: at
// most one per address every ten seconds, so that a dead owner does not
// flood the log.
func (p *peerPool) warnAllowed(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if last, ok := p.lastWarn[addr]; ok && now.Sub(last) < 10*time.Second {
		return false
	}
	p.lastWarn[addr] = now
	return true
}

// close fails every connection (their calls get outcomeClosed) and waits
// for their goroutines.
func (p *peerPool) close() {
	p.mu.Lock()
	p.closed = true
	conns := make([]*peerConn, 0, len(p.conns))
	for _, pc := range p.conns {
		conns = append(conns, pc)
	}
	p.mu.Unlock()
	for _, pc := range conns {
		pc.fail(errRouterClosed, outcomeClosed)
	}
	p.wg.Wait()
}

// peerConn is one multiplexed connection to an owner. The writer
// goroutine dials, then writes queued calls in the order they were
// queued; the reader goroutine matches answers to calls by correlation
// id. Either failing fails the connection and every call on it.
type peerConn struct {
	pool   *peerPool          // immutable
	addr   string             // immutable
	ctx    context.Context    // cancelled by fail: aborts the dial
	cancel context.CancelFunc // immutable
	wake   chan struct{}      // buffered(1): calls were queued

	mu      sync.Mutex
	pending map[int32]*relayCall // guarded by mu: queued or sent, not answered
	queue   []*relayCall         // guarded by mu: not yet written
	conn    net.Conn             // guarded by mu: nil until dialled
	failed  bool                 // guarded by mu
}

func (pc *peerConn) isFailed() bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.failed
}

// enqueue adds call to the connection, arming its timeout; false if the
// connection already failed.
func (pc *peerConn) enqueue(call *relayCall, timeout time.Duration) bool {
	pc.mu.Lock()
	if pc.failed {
		pc.mu.Unlock()
		return false
	}
	pc.pending[call.corr] = call
	pc.queue = append(pc.queue, call)
	corr := call.corr
	call.timer = time.AfterFunc(timeout, func() {
		if c := pc.take(corr); c != nil {
			c.done(nil, outcomeTimeout)
		}
	})
	pc.mu.Unlock()
	select {
	case pc.wake <- struct{}{}:
	default:
	}
	return true
}

// take removes and returns the call waiting for corr, nil if there is
// none (answered, timed out or failed already).
func (pc *peerConn) take(corr int32) *relayCall {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	c := pc.pending[corr]
	if c != nil {
		delete(pc.pending, corr)
		c.timer.Stop()
	}
	return c
}

// fail closes the connection once and answers every call still on it
// with o. Calls queued but not yet written fail too: the client retries
// after looking the coordinator up again, which is cheaper to reason
// about than resending some calls and not others.
func (pc *peerConn) fail(err error, o outcome) {
	pc.mu.Lock()
	if pc.failed {
		pc.mu.Unlock()
		return
	}
	pc.failed = true
	calls := make([]*relayCall, 0, len(pc.pending))
	for _, c := range pc.pending {
		c.timer.Stop()
		calls = append(calls, c)
	}
	pc.pending, pc.queue = nil, nil
	conn := pc.conn
	pc.mu.Unlock()
	pc.cancel()
	if conn != nil {
		conn.Close()
	}
	pc.pool.remove(pc)
	switch {
	case errors.Is(err, errRouterClosed):
		pc.pool.log.Debug("peer connection closed", "peer", pc.addr, "in_flight", len(calls))
	case pc.pool.warnAllowed(pc.addr):
		pc.pool.log.Warn("peer connection failed", "peer", pc.addr, "in_flight", len(calls), "reason", err.Error())
	default:
		pc.pool.log.Debug("peer connection failed", "peer", pc.addr, "in_flight", len(calls), "reason", err.Error())
	}
	for _, c := range calls {
		c.done(nil, o)
	}
}

func (pc *peerConn) writeLoop() {
	defer pc.pool.wg.Done()
	ctx, cancel := context.WithTimeout(pc.ctx, pc.pool.dialTimeout)
	conn, err := pc.pool.dial(ctx, "tcp", pc.addr)
	cancel()
	if err != nil {
		pc.fail(fmt.Errorf("dialling peer: %w", err), outcomeUnreachable)
		return
	}
	pc.mu.Lock()
	if pc.failed {
		pc.mu.Unlock()
		conn.Close()
		return
	}
	pc.conn = conn
	pc.mu.Unlock()
	pc.pool.wg.Add(1)
	go pc.readLoop(conn)

	bw := bufio.NewWriterSize(conn, 32<<10)
	for {
		select {
		case <-pc.wake:
		case <-pc.ctx.Done():
			return
		}
		pc.mu.Lock()
		batch := pc.queue
		pc.queue = nil
		// Calls that timed out while queued are not sent at all.
		n := 0
		for _, c := range batch {
			if pc.pending[c.corr] == c {
				batch[n] = c
				n++
			}
		}
		batch = batch[:n]
		pc.mu.Unlock()
		for _, c := range batch {
			frame := c.frame
			c.frame = nil
			if _, err := bw.Write(frame); err != nil {
				pc.fail(fmt.Errorf("writing to peer: %w", err), outcomeCut)
				return
			}
		}
		if err := bw.Flush(); err != nil {
			pc.fail(fmt.Errorf("writing to peer: %w", err), outcomeCut)
			return
		}
	}
}

func (pc *peerConn) readLoop(conn net.Conn) {
	defer pc.pool.wg.Done()
	br := bufio.NewReaderSize(conn, 32<<10)
	var size [4]byte
	for {
		if _, err := io.ReadFull(br, size[:]); err != nil {
			pc.fail(fmt.Errorf("reading from peer: %w", err), outcomeCut)
			return
		}
		n := int32(binary.BigEndian.Uint32(size[:]))
		if n < 4 || n > codec.DefaultMaxFrame {
			pc.fail(fmt.Errorf("peer sent a %d byte frame", n), outcomeCut)
			return
		}
		// A fresh buffer per answer: the decoded response aliases it.
		frame := make([]byte, n)
		if _, err := io.ReadFull(br, frame); err != nil {
			pc.fail(fmt.Errorf("reading from peer: %w", truncated(err)), outcomeCut)
			return
		}
		corr := int32(binary.BigEndian.Uint32(frame))
		c := pc.take(corr)
		if c == nil {
			pc.pool.log.Debug("peer answered a request that is no longer waiting", "peer", pc.addr, "correlation_id", corr)
			continue
		}
		resp, o, err := decodeRelayed(frame, c.key, c.version)
		if err != nil && o == outcomeBadResponse {
			pc.pool.log.Warn("bad answer from peer", "peer", pc.addr, "api", kmsg.NameForKey(c.key), "reason", err.Error())
		}
		c.done(resp, o)
	}
}
