package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// PeerServerConfig configures a PeerServer.
type PeerServerConfig struct {
	// Listen is the peer listener's address, host:port (port 0 picks
	// one). Required.
	Listen string
	// Coordinator serves the relayed requests: the local engine, never a
	// Router (an owner answers NOT_COORDINATOR for what it does not own;
	// it does not relay again). Required.
	Coordinator Coordinator
	// Logger; nil discards.
	Logger *slog.Logger
	// MaxFrame is the largest envelope frame accepted; default
	// codec.DefaultMaxFrame.
	MaxFrame int32
	// TLS, when set, makes the peer listener serve mutual TLS
	// (peer_tls.go): its ClientCAFile is required, and a peer must
	// present a certificate chaining to it.
	TLS *TLSSource
	// Serving, when set, says whether a group is still served here. A
	// relayed request whose answer waits for the store (an OffsetCommit,
	// a leader's SyncGroup, a KIP-848 heartbeat with a new epoch) is
	// answered COORDINATOR_NOT_AVAILABLE soon after its group stops
	// being served here, as the Router answers a local one (served.go):
	// otherwise an owner cut off from the cluster held it up to the
	// store timeout, past the relaying side's RelayTimeout, and the
	// relaying side answered its client only then. nil: every relayed
	// request waits for the coordinator's answer.
	Serving func(group string) bool
	// Forwarded, when set, reports whether group's requests now go to
	// the cluster's coordinator (a group handed back, docs/anchors.md).
	// A member's request refused for such a group is marked so in its
	// envelope answer (peerTagHandedBack): the relaying side then passes
	// the refusal on at once instead of holding it for a next owner
	// (relay_follow.go), since none comes.
	Forwarded func(group string) bool
	// Messages serves the kproxy messages other kproxies send
	// (peer_message.go); nil answers each PeerUnknownType.
	Messages *PeerMessages
}

// PeerServer is the owner's side of the peer wire (peer.go): it accepts
// connections from other kproxies, unwraps each Envelope request, hands
// the group request inside to the coordinator with the original client's
// id and address, and writes each answer as soon as it is ready, so a
// JoinGroup parked for a rebalance does not hold up the requests behind
// it. Kproxy messages (peer_message.go) go to their handler in
// PeerServerConfig.Messages instead of the coordinator.
type PeerServer struct {
	cfg PeerServerConfig // immutable after NewPeerServer
	log *slog.Logger     // immutable
	ln  net.Listener     // immutable
	wg  sync.WaitGroup   // the accept loop and every connection goroutine
	// ctx ends when Close starts: it aborts TLS handshakes in progress.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[*peerServerConn]struct{} // guarded by mu
	closed bool                         // guarded by mu
}

var errPeerServerClosed = errors.New("peer server closed")

// NewPeerServer listens on cfg.Listen and starts serving.
func NewPeerServer(cfg PeerServerConfig) (*PeerServer, error) {
	var errs []error
	if cfg.Listen == "" {
		errs = append(errs, errors.New("peer server: no listen address"))
	}
	if cfg.Coordinator == nil {
		errs = append(errs, errors.New("peer server: no coordinator"))
	}
	if cfg.TLS != nil && cfg.TLS.cfg.ClientCAFile == "" {
		errs = append(errs, errors.New("peer server: TLS without a CA bundle (peers must present a certificate it signed)"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = codec.DefaultMaxFrame
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("peer listener: %w", err)
	}
	s := &PeerServer{cfg: cfg, log: cfg.Logger.With("component", "peer_server"), ln: ln, conns: make(map[*peerServerConn]struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr is the address the server listens on.
func (s *PeerServer) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, closes every peer connection and waits for the
// server's goroutines. Answers the coordinator gives later are dropped;
// the relaying side answers its clients COORDINATOR_NOT_AVAILABLE.
func (s *PeerServer) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return
	}
	s.closed = true
	s.cancel()
	conns := make([]*peerServerConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.ln.Close()
	for _, c := range conns {
		c.close(errPeerServerClosed)
	}
	s.wg.Wait()
}

func (s *PeerServer) acceptLoop() {
	defer s.wg.Done()
	var ids uint64
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("accepting peer connection", "err", err)
			time.Sleep(50 * time.Millisecond) // e.g. out of file descriptors
			continue
		}
		ids++
		if s.cfg.TLS == nil {
			if !s.serveConn(conn, ids) {
				return
			}
			continue
		}
		// The handshake runs on its own goroutine, so a peer stuck in
		// it holds up no other.
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func(id uint64) {
			defer s.wg.Done()
			if tc, ok := s.peerHandshake(conn); ok {
				s.serveConn(tc, id)
			}
		}(ids)
	}
}

// serveConn starts the reader and writer of an accepted (and, with TLS,
// handshaken) connection; false once the server closed.
func (s *PeerServer) serveConn(conn net.Conn, id uint64) bool {
	c := &peerServerConn{
		s:    s,
		conn: conn,
		log:  s.log.With("peer_conn", id, "remote", conn.RemoteAddr().String()),
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		conn.Close()
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(2)
	s.mu.Unlock()
	go c.readLoop()
	go c.writeLoop()
	return true
}

// peerServerConn is one connection from a relaying kproxy: a reader that
// hands requests to the coordinator in the order they arrive, and a writer
// that sends answers in the order they complete.
type peerServerConn struct {
	s    *PeerServer   // immutable
	conn net.Conn      // immutable
	log  *slog.Logger  // immutable
	wake chan struct{} // buffered(1): answers were queued
	done chan struct{} // closed by close

	mu     sync.Mutex
	out    []peerAnswer // guarded by mu: answers not yet written
	closed bool         // guarded by mu

	// Owned by the reader: rate limit of the envelope-error log.
	lastWarn   time.Time
	suppressed int
}

// peerAnswer is one answer waiting to be written: the coordinator's
// response, or an envelope error code.
type peerAnswer struct {
	corr         int32
	key, version int16
	resp         kmsg.Response
	code         int16
	handedBack   bool // resp refuses a group handed back (peerTagHandedBack)
	keepalive    bool // an answer to a keepalive: no response data
	// message: an answer to a kproxy message, data its ResponseData.
	message bool
	data    []byte
}

// close closes the connection once, logging why unless it is an ordinary
// end.
func (c *peerServerConn) close(reason error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.out = nil
	c.mu.Unlock()
	close(c.done)
	c.conn.Close()
	switch {
	case errors.Is(reason, io.EOF), errors.Is(reason, net.ErrClosed), errors.Is(reason, errPeerServerClosed):
		c.log.Debug("peer connection closed", "reason", reason.Error())
	default:
		c.log.Warn("closing peer connection", "reason", reason.Error())
	}
}

// push queues an answer for the writer; it never blocks (the
// coordinator calls it from its loops).
func (c *peerServerConn) push(a peerAnswer) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.out = append(c.out, a)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *peerServerConn) readLoop() {
	defer c.s.wg.Done()
	defer func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	}()
	c.close(c.read())
}

// read serves envelopes until the connection ends or sends something
// that is not one, returning why.
func (c *peerServerConn) read() error {
	br := bufio.NewReaderSize(c.conn, 32<<10)
	var prefix [4]byte
	for {
		if _, err := io.ReadFull(br, prefix[:]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("truncated frame size: %w", err)
			}
			return err
		}
		n, err := codec.CheckSize(prefix, c.s.cfg.MaxFrame)
		if err != nil {
			return err
		}
		// A fresh buffer per request: the decoded request aliases it
		// and the coordinator keeps it.
		frame := make([]byte, n)
		if _, err := io.ReadFull(br, frame); err != nil {
			return truncated(err)
		}
		h, err := codec.ParseRequestHeader(frame)
		if err != nil {
			return fmt.Errorf("envelope header: %w", err)
		}
		if h.Key != keyEnvelope || h.Version != 0 {
			return fmt.Errorf("expected Envelope v0, got %s v%d", kmsg.NameForKey(h.Key), h.Version)
		}
		env := kmsg.NewPtrEnvelopeRequest()
		if err := env.ReadFrom(frame[h.Len:]); err != nil {
			return fmt.Errorf("malformed Envelope request: %w", err)
		}
		c.serve(h.CorrelationID, env)
	}
}

// serve hands the request inside env to the coordinator, or answers an
// envelope error when there is no group request inside.
func (c *peerServerConn) serve(corr int32, env *kmsg.EnvelopeRequest) {
	if len(env.RequestData) == 0 { // a keepalive (peer.go)
		c.push(peerAnswer{corr: corr, keepalive: true})
		return
	}
	if isPeerMessage(env.RequestData) {
		c.serveMessage(corr, env.RequestData)
		return
	}
	ih, req, code, err := decodeInner(env.RequestData)
	if err != nil {
		c.warnRefused(err)
		c.push(peerAnswer{corr: corr, code: code})
		return
	}
	cl := Client{ID: string(ih.ClientID), Host: hostString(env.ClientHostAddress)}
	key, version := ih.Key, ih.Version
	var once atomic.Bool
	// Copied now: req aliases the connection's read buffer, which is
	// reused once Handle returns.
	mr, _ := memberOf(req)
	memberGroup := strings.Clone(mr.key.group)
	answer := func(resp kmsg.Response) {
		if once.CompareAndSwap(false, true) {
			back := memberGroup != "" && c.s.cfg.Forwarded != nil && notServed(answerCode(resp)) && c.s.cfg.Forwarded(memberGroup)
			c.push(peerAnswer{corr: corr, key: key, version: version, resp: resp, handedBack: back})
		}
	}
	group, watch := storeBound(req)
	if c.s.cfg.Serving == nil || !watch {
		c.s.cfg.Coordinator.Handle(cl, req, answer)
		return
	}
	fallback := codec.GroupErrorResponse(req, errCoordinatorNotAvailable) // req is not read after Handle returns
	whileServed(func() bool { return c.s.cfg.Serving(group) }, func(reply func(kmsg.Response)) {
		c.s.cfg.Coordinator.Handle(cl, req, reply)
	}, answer, func() { answer(fallback) })
}

// serveMessage hands a kproxy message to its handler on a goroutine of
// its own (a handler may wait, and the requests behind it must not) and
// queues the answer. A message that does not decode, or that no handler
// takes, is answered with an error code at once; the connection and the
// other requests on it go on.
func (c *peerServerConn) serveMessage(corr int32, b []byte) {
	m, err := parsePeerMessage(b)
	if err != nil {
		c.warnRefused(err)
		c.push(peerAnswer{corr: corr, message: true, data: appendPeerAnswer(nil, PeerMalformed, err.Error(), nil)})
		return
	}
	fn, perr := c.s.cfg.Messages.lookup(m.typ, m.version)
	if perr != nil {
		c.warnRefused(perr)
		c.push(peerAnswer{corr: corr, message: true, data: appendPeerAnswer(nil, perr.Code, perr.Text, nil)})
		return
	}
	c.s.wg.Add(1) // the reader is one of s.wg's: Close has not begun waiting
	go func() {
		defer c.s.wg.Done()
		out, perr := runPeerHandler(c.s.ctx, fn, m.version, m.payload)
		if perr != nil {
			c.push(peerAnswer{corr: corr, message: true, data: appendPeerAnswer(nil, perr.Code, perr.Text, nil)})
			return
		}
		c.push(peerAnswer{corr: corr, message: true, data: appendPeerAnswer(nil, PeerOK, "", out)})
	}()
}

// decodeInner decodes the request an envelope carries. A request that is
// not a group API, or does not decode, gets the returned envelope error
// code.
func decodeInner(b []byte) (codec.RequestHeader, kmsg.Request, int16, error) {
	h, err := codec.ParseRequestHeader(b)
	switch {
	case errors.Is(err, codec.ErrUnknownAPI):
		return h, nil, errInvalidRequest, fmt.Errorf("inner request: %w", err)
	case err != nil:
		return h, nil, errInvalidRequest, fmt.Errorf("inner request header: %w", err)
	case codec.IsShareCoordinatorKey(h.Key): // share groups' membership and offsets
		if !codec.ServedShareVersion(h.Key, h.Version) {
			return h, nil, errUnsupportedVersion, fmt.Errorf("inner request %s v%d: %w", kmsg.NameForKey(h.Key), h.Version, codec.ErrBadVersion)
		}
	case !codec.IsGroupKey(h.Key): // an envelope carries only group APIs
		return h, nil, errInvalidRequest, fmt.Errorf("inner request %s is not a group API", kmsg.NameForKey(h.Key))
	case h.Version > codec.MaxVersion(h.Key):
		return h, nil, errUnsupportedVersion, fmt.Errorf("inner request %s v%d: %w", kmsg.NameForKey(h.Key), h.Version, codec.ErrBadVersion)
	}
	req := kmsg.RequestForKey(h.Key)
	req.SetVersion(h.Version)
	if err := req.ReadFrom(b[h.Len:]); err != nil {
		return h, nil, errInvalidRequest, fmt.Errorf("malformed inner %s v%d request: %w", kmsg.NameForKey(h.Key), h.Version, err)
	}
	return h, req, 0, nil
}

// warnRefused logs a refused envelope, at most once a second per
// connection.
func (c *peerServerConn) warnRefused(err error) {
	now := time.Now()
	if now.Sub(c.lastWarn) < time.Second {
		c.suppressed++
		return
	}
	c.log.Warn("refusing relayed request", "reason", err.Error(), "suppressed", c.suppressed)
	c.lastWarn, c.suppressed = now, 0
}

func (c *peerServerConn) writeLoop() {
	defer c.s.wg.Done()
	bw := bufio.NewWriterSize(c.conn, 32<<10)
	var buf []byte
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		c.mu.Lock()
		batch := c.out
		c.out = nil
		c.mu.Unlock()
		for _, a := range batch {
			buf = c.encode(buf[:0], a)
			if _, err := bw.Write(buf); err != nil {
				c.close(fmt.Errorf("writing to peer: %w", err))
				return
			}
		}
		if err := bw.Flush(); err != nil {
			c.close(fmt.Errorf("writing to peer: %w", err))
			return
		}
	}
}

// encode appends the envelope answer frame for a.
func (c *peerServerConn) encode(dst []byte, a peerAnswer) []byte {
	env := kmsg.NewPtrEnvelopeResponse()
	switch {
	case a.keepalive:
	case a.message:
		env.ResponseData = a.data
	case a.code != 0:
		env.ErrorCode = a.code
	case a.resp == nil || a.resp.Key() != a.key:
		c.log.Error("coordinator answered with the wrong response type", "api", kmsg.NameForKey(a.key))
		env.ErrorCode = -1 // UNKNOWN_SERVER_ERROR
	default:
		a.resp.SetVersion(a.version)
		env.ResponseData = a.resp.AppendTo(nil)
		if a.handedBack {
			env.UnknownTags.Set(peerTagHandedBack, nil)
		}
	}
	return codec.AppendResponse(dst, a.corr, env)
}
