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
// RequestData may instead hold a kproxy message, one kproxy's word to
// another (a takeover report): it starts with the kproxy-private API
// key keyPeerMessage, and peer_message.go describes its framing, its
// versions and what a kproxy of an earlier version answers it.
//
// The answer is a response header v1 (correlation id, tags) and an
// Envelope response. A non-zero ErrorCode means the owner refused the
// envelope itself (not a group API, a version it cannot read, a request
// that does not decode). Otherwise ResponseData holds the inner response
// body only, without a response header: unlike Kafka's Envelope, which
// carries a full response because a forwarding broker re-frames it, the
// relaying kproxy knows the key and version it sent and re-frames the
// answer for its client with the client's own correlation id.
//
// An Envelope whose RequestData is empty is a keepalive: the owner's
// reader answers it at once with ErrorCode 0 and no ResponseData,
// without the coordinator (an owner of an earlier version answers it
// with an envelope error, which proves it alive just as well). The
// relaying side sends one when a connection has been silent for half
// its keepalive (RouterConfig.PeerKeepalive) and closes a connection on
// which one stays unanswered for the whole keepalive: a peer that stops
// answering (a partition, a paused process) is found within the relay
// timeout instead of costing every request the full timeout. The
// address then has an unreachable episode: requests for it fail at once
// (outcome owner_down, COORDINATOR_NOT_AVAILABLE for the client) while
// a reconnection, with backoff, waits for an answer to its keepalive;
// the first answer ends the episode. The backoff follows the clients'
// reconnect.backoff.ms and reconnect.backoff.max.ms (KIP-144).

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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

// appendKeepalive appends a keepalive frame: an Envelope with empty
// RequestData.
func appendKeepalive(dst []byte, corr int32) []byte {
	env := kmsg.NewPtrEnvelopeRequest()
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

// peerTagHandedBack is a kproxy-private tagged field of an
// EnvelopeResponse (far above the tags Kafka numbers from 0): the owner
// refused the member's request inside because the group went back to
// the cluster's coordinator (PeerServerConfig.Forwarded), not because it
// lost the group to another kproxy. An owner from before it sets none,
// and a relay from before it ignores it, as Kafka's readers ignore tags
// they do not know.
const peerTagHandedBack = 0x4b500001

// decodeRelayed decodes an owner's answer frame (after its size prefix)
// to a request of key at version; handedBack reports peerTagHandedBack.
func decodeRelayed(frame []byte, key, version int16) (resp kmsg.Response, o outcome, handedBack bool, err error) {
	body, err := codec.ResponseBody(frame, keyEnvelope, 0)
	if err != nil {
		return nil, outcomeBadResponse, false, fmt.Errorf("envelope response header: %w", err)
	}
	env := kmsg.NewPtrEnvelopeResponse()
	if err := env.ReadFrom(body); err != nil {
		return nil, outcomeBadResponse, false, fmt.Errorf("malformed envelope response: %w", err)
	}
	if env.ErrorCode != 0 {
		return nil, outcomeEnvelopeError, false, fmt.Errorf("owner refused the envelope with error %d", env.ErrorCode)
	}
	resp = kmsg.ResponseForKey(key)
	if resp == nil {
		return nil, outcomeBadResponse, false, fmt.Errorf("no response type for api key %d", key)
	}
	resp.SetVersion(version)
	if err := resp.ReadFrom(env.ResponseData); err != nil {
		return nil, outcomeBadResponse, false, fmt.Errorf("malformed %s v%d response: %w", kmsg.NameForKey(key), version, err)
	}
	env.UnknownTags.Each(func(tag uint32, _ []byte) { handedBack = handedBack || tag == peerTagHandedBack })
	return resp, outcomeOK, handedBack, nil
}

// Dialer opens a connection, as net.Dialer.DialContext does.
type Dialer func(ctx context.Context, network, address string) (net.Conn, error)

var errRouterClosed = errors.New("router closed")

// Reconnection backoff of an unreachable peer, the clients' defaults of
// reconnect.backoff.ms and reconnect.backoff.max.ms (KIP-144: 50ms
// doubling to 1s): the first reconnection is immediate, then
// peerBackoffMin doubling up to peerBackoffMax, each ±20%. The cap
// bounds how long after a heal the relay still fails requests at once:
// no longer than a directly connected client takes to reconnect.
const (
	peerBackoffMin = 50 * time.Millisecond
	peerBackoffMax = time.Second
	// peerForget ends the reconnections to an address no request asked
	// for this long (an owner that left the fleet); the next request
	// dials it afresh.
	peerForget = time.Minute
)

// peerBackoff is the wait before reconnection attempt n (0-based) of an
// unreachable episode.
func peerBackoff(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	d := peerBackoffMax
	if n < 7 {
		d = min(peerBackoffMax, peerBackoffMin<<(n-1))
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// peerPool holds the relaying side's connections, one per owner address.
type peerPool struct {
	dial        Dialer        // immutable
	dialTimeout time.Duration // immutable
	keepalive   time.Duration // immutable: see RouterConfig.PeerKeepalive
	log         *slog.Logger  // immutable
	metrics     *relayMetrics // immutable

	corr atomic.Int32   // the last correlation id given out, for all connections
	wg   sync.WaitGroup // every connection goroutine

	mu     sync.Mutex
	conns  map[string]*peerConn   // guarded by mu: the current connection per address
	health map[string]*peerHealth // guarded by mu: addresses in an unreachable episode
	closed bool                   // guarded by mu
}

// peerHealth is an unreachable episode of one address: from the failure
// of a connection to it until a reconnection's keepalive is answered.
// Every field is guarded by the pool's mu.
type peerHealth struct {
	since    time.Time // when the episode began
	reason   string    // why: silent, cut, unreachable
	attempts int       // reconnections tried so far
	wanted   time.Time // when a request last asked for the address
	failed   int       // requests failed at once during the episode
	// ended is closed when the episode ends (answered, forgotten or
	// the pool closed), by whoever removes it from the pool's health.
	ended chan struct{}
}

func newPeerPool(dial Dialer, dialTimeout, keepalive time.Duration, log *slog.Logger, metrics *relayMetrics) *peerPool {
	return &peerPool{
		dial:        dial,
		dialTimeout: dialTimeout,
		keepalive:   keepalive,
		log:         log,
		metrics:     metrics,
		conns:       make(map[string]*peerConn),
		health:      make(map[string]*peerHealth),
	}
}

// relayCall is one request relayed to a peer, a kproxy message
// (peer_message.go), or a keepalive. answer is called exactly once, by
// whoever removes the call from its connection's pending set: the reader
// (with the answer frame after its size prefix, and outcomeOK), the timer
// (timeout) or fail (connection lost), both with a nil frame. A
// keepalive has no answer and no timer: the watchdog watches it.
type relayCall struct {
	corr      int32
	keepalive bool
	frame     []byte // the envelope frame; owned by the writer once queued
	answer    func(frame []byte, o outcome)
	timer     *time.Timer // guarded by the connection's mu
}

// do relays req from c to the owner at addr. done gets the owner's answer
// with outcomeOK (and whether the owner marked it peerTagHandedBack), or
// nil and the reason there is none, after at most
// timeout; at once with outcomeOwnerDown while addr is unreachable. The
// request is encoded before do returns: req may alias the caller's
// buffers.
func (p *peerPool) do(addr string, c Client, req kmsg.Request, timeout time.Duration, done func(resp kmsg.Response, o outcome, handedBack bool)) {
	corr := p.corr.Add(1)
	key, version := req.Key(), req.GetVersion()
	p.call(addr, corr, timeout, func() []byte { return appendEnvelope(nil, corr, c, req) }, func(frame []byte, o outcome) {
		if o != outcomeOK {
			done(nil, o, false)
			return
		}
		resp, o, back, err := decodeRelayed(frame, key, version)
		if err != nil && o == outcomeBadResponse {
			p.log.Warn("bad answer from peer", "peer", addr, "api", kmsg.NameForKey(key), "reason", err.Error())
		}
		done(resp, o, back)
	})
}

// call sends the frame encode builds (with correlation id corr) to the
// peer at addr; answer gets the answer frame with outcomeOK, or nil and
// the reason there is none, after at most timeout; at once with
// outcomeOwnerDown while addr is unreachable. encode runs before call
// returns, or not at all.
func (p *peerPool) call(addr string, corr int32, timeout time.Duration, encode func() []byte, answer func([]byte, outcome)) {
	call := &relayCall{corr: corr, answer: answer}
	// A connection can fail between get and enqueue; the call was not
	// sent, so it may go on the replacement.
	for range 3 {
		pc, down := p.get(addr)
		switch {
		case down:
			answer(nil, outcomeOwnerDown)
			return
		case pc == nil:
			answer(nil, outcomeClosed)
			return
		}
		if call.frame == nil {
			call.frame = encode()
		}
		if pc.enqueue(call, timeout) {
			return
		}
	}
	answer(nil, outcomeUnreachable)
}

// get returns the live connection to addr, starting one if there is none;
// down=true while addr is in an unreachable episode; nil once the pool
// closed.
func (p *peerPool) get(addr string) (pc *peerConn, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, false
	}
	if h := p.health[addr]; h != nil {
		h.wanted = time.Now()
		h.failed++
		return nil, true
	}
	if pc := p.conns[addr]; pc != nil && !pc.isFailed() {
		return pc, false
	}
	return p.startLocked(addr, false, 0), false
}

// startLocked starts a connection to addr: a reconnection of an
// unreachable episode (probe) after delay, or an ordinary one. p.mu is
// held.
func (p *peerPool) startLocked(addr string, probe bool, delay time.Duration) *peerConn {
	ctx, cancel := context.WithCancel(context.Background())
	pc := &peerConn{
		pool:    p,
		addr:    addr,
		probe:   probe,
		delay:   delay,
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

// connFailed is told by pc.fail that pc ended: pc is forgotten and,
// unless the pool closed, addr's unreachable episode begins (logged at
// WARN and counted once) or goes on, with a reconnection after the
// backoff.
func (p *peerPool) connFailed(pc *peerConn, err error, o outcome, inFlight int) {
	now := time.Now()
	p.mu.Lock()
	if p.conns[pc.addr] == pc {
		delete(p.conns, pc.addr)
	}
	if p.closed || errors.Is(err, errRouterClosed) {
		p.mu.Unlock()
		p.log.Debug("peer connection closed", "peer", pc.addr, "in_flight", inFlight)
		return
	}
	h := p.health[pc.addr]
	begins := h == nil
	if begins {
		h = &peerHealth{since: now, reason: o.String(), wanted: now, ended: make(chan struct{})}
		p.health[pc.addr] = h
	} else {
		h.attempts++
	}
	if now.Sub(h.wanted) > peerForget {
		delete(p.health, pc.addr)
		close(h.ended)
		p.mu.Unlock()
		p.log.Info("peer still unreachable and no longer asked for: reconnections stop", "peer", pc.addr,
			"down_for", now.Sub(h.since).Round(time.Millisecond).String(), "reason", err.Error())
		return
	}
	attempt, failed := h.attempts, h.failed
	delay := peerBackoff(attempt)
	if pc.probe && o == outcomeSilent {
		// The reconnection was accepted and its keepalive held: the
		// next one starts at once, so that one always waits for an
		// answer and the episode ends the moment the link heals
		// (held bytes flow on) instead of up to a backoff later.
		// Refused or reset reconnections still back off.
		delay = 0
	}
	p.startLocked(pc.addr, true, delay)
	p.mu.Unlock()
	if begins {
		p.metrics.peerDown(o)
		p.log.Warn("peer unreachable: relayed requests for the groups it owns fail at once with COORDINATOR_NOT_AVAILABLE until it answers again",
			"peer", pc.addr, "outcome", o.String(), "in_flight", inFlight, "reason", err.Error())
		return
	}
	p.log.Debug("peer reconnection failed", "peer", pc.addr, "attempt", attempt, "failed_at_once", failed, "reason", err.Error())
}

// connUp is told by a reconnection's reader that the peer answered: the
// unreachable episode ends, logged once.
func (p *peerPool) connUp(pc *peerConn) {
	p.mu.Lock()
	h := p.health[pc.addr]
	if h == nil || p.conns[pc.addr] != pc {
		p.mu.Unlock()
		return
	}
	delete(p.health, pc.addr)
	close(h.ended)
	p.mu.Unlock()
	p.log.Info("peer reachable again", "peer", pc.addr, "outcome", h.reason, "down_for", time.Since(h.since).Round(time.Millisecond).String(),
		"reconnections", h.attempts+1, "failed_at_once", h.failed)
}

// episode returns a channel closed when addr's unreachable episode
// ends, and whether addr is in one now.
func (p *peerPool) episode(addr string) (ended <-chan struct{}, down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h := p.health[addr]; h != nil {
		return h.ended, true
	}
	return nil, false
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
// id; the watchdog goroutine sends keepalives and closes the connection
// when one stays unanswered. Any of them failing fails the connection
// and every call on it.
type peerConn struct {
	pool   *peerPool          // immutable
	addr   string             // immutable
	probe  bool               // immutable: a reconnection of an unreachable episode
	delay  time.Duration      // immutable: the backoff before dialling
	ctx    context.Context    // cancelled by fail: aborts the dial
	cancel context.CancelFunc // immutable
	wake   chan struct{}      // buffered(1): calls were queued

	// lastRead is the nanotime of the last frame read, or of the dial;
	// written by the reader (and by the writer before it starts), read
	// by the watchdog.
	lastRead atomic.Int64
	// answered is set by the reader on a probe's first answer.
	answered atomic.Bool

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
	if !call.keepalive {
		call.timer = time.AfterFunc(timeout, func() {
			if c := pc.take(corr); c != nil {
				c.answer(nil, outcomeTimeout)
			}
		})
	}
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
		if c.timer != nil {
			c.timer.Stop()
		}
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
		if c.keepalive {
			continue
		}
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
	pc.pool.connFailed(pc, err, o, len(calls))
	for _, c := range calls {
		c.answer(nil, o)
	}
}

// sendKeepalive queues a keepalive; false if the connection failed.
func (pc *peerConn) sendKeepalive() bool {
	corr := pc.pool.corr.Add(1)
	return pc.enqueue(&relayCall{corr: corr, keepalive: true, frame: appendKeepalive(nil, corr)}, 0)
}

// watchdog sends a keepalive after half the keepalive period without a
// frame read, and fails the connection when one stays unanswered for the
// whole period, or, on a probe, as soon as it dialled. Its only state,
// pinged, is its own.
func (pc *peerConn) watchdog() {
	defer pc.pool.wg.Done()
	k := int64(pc.pool.keepalive)
	t := time.NewTicker(pc.pool.keepalive / 4)
	defer t.Stop()
	var pinged int64 // nanotime the unanswered keepalive was queued; 0: none
	if pc.probe {
		pinged = nanotime()
		if !pc.sendKeepalive() {
			return
		}
	}
	for {
		select {
		case <-pc.ctx.Done():
			return
		case <-t.C:
		}
		now, last := nanotime(), pc.lastRead.Load()
		if pinged != 0 && last >= pinged {
			pinged = 0
		}
		switch {
		case pinged != 0 && now-pinged >= k:
			pc.fail(fmt.Errorf("peer silent: a keepalive unanswered for %v, nothing read for %v",
				time.Duration(now-pinged).Round(time.Millisecond), time.Duration(now-last).Round(time.Millisecond)), outcomeSilent)
			return
		case pinged == 0 && now-last >= k/2:
			pinged = now
			if !pc.sendKeepalive() {
				return
			}
		}
	}
}

func (pc *peerConn) writeLoop() {
	defer pc.pool.wg.Done()
	if pc.delay > 0 {
		t := time.NewTimer(pc.delay)
		select {
		case <-t.C:
		case <-pc.ctx.Done():
			t.Stop()
			return
		}
	}
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
	pc.lastRead.Store(nanotime())
	pc.pool.wg.Add(2)
	go pc.readLoop(conn)
	go pc.watchdog()

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
		pc.lastRead.Store(nanotime())
		if pc.probe && pc.answered.CompareAndSwap(false, true) {
			pc.pool.connUp(pc)
		}
		corr := int32(binary.BigEndian.Uint32(frame))
		c := pc.take(corr)
		if c != nil && c.keepalive {
			continue
		}
		if c == nil {
			pc.pool.log.Debug("peer answered a request that is no longer waiting", "peer", pc.addr, "correlation_id", corr)
			continue
		}
		c.answer(frame, outcomeOK)
	}
}
