package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

const (
	// bufSize is the read and write buffer of each socket. A request or
	// response header always fits; bodies larger than spliceMin move by
	// splice after the buffered part.
	bufSize   = 64 << 10
	spliceMin = 16 << 10
)

var sessionIDs atomic.Uint64

// Socket buffers are pooled so that the memory of a burst of connections
// goes back to the runtime (sync.Pool drops what stays unused across
// collections) and a new connection does not allocate 256 KiB.
var (
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, bufSize) }}
	writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, bufSize) }}
)

func getReader(rd io.Reader) *bufio.Reader {
	r := readerPool.Get().(*bufio.Reader)
	r.Reset(rd)
	return r
}

func getWriter(c net.Conn) *bufio.Writer {
	w := writerPool.Get().(*bufio.Writer)
	w.Reset(c)
	return w
}

func putReader(r *bufio.Reader) {
	if r != nil {
		r.Reset(nil)
		readerPool.Put(r)
	}
}

func putWriter(w *bufio.Writer) {
	if w != nil {
		w.Reset(nil)
		writerPool.Put(w)
	}
}

// slot holds one request's place in the response order. Forwarded slots
// carry no pointers and cost no allocation.
type slot struct {
	// route is how the writer completes the slot: Forward streams the
	// upstream response, Rewrite reads and edits it, Local waits for
	// reply. It is also the route the request is counted under.
	route   codec.Route
	key     int16
	version int16
	corr    int32
	start   int64       // nanotime the request was read, for latency
	reply   *localReply // Local: delivered once by the coordinator, pooled (localreply.go)
	// watch, when set, is handed the decoded upstream response of a
	// forwarded group request (ForwardWatcher), or nil if the response
	// never came or did not decode. Called once, by the writer.
	watch func(kmsg.Response)
}

// session is one client connection and its upstream connection.
type session struct {
	p    *Proxy
	id   uint64
	node int32 // listener's node id; -1 for bootstrap. Immutable.
	log  *slog.Logger
	rc   Client    // Host immutable; ID, Principal, Authenticated owned by the reader
	sasl saslState // the client's SASL exchange (sasl.go)

	conn net.Conn      // client socket: *net.TCPConn, or *tls.Conn on a TLS listener
	br   *bufio.Reader // client reads, over in; owned by the reader goroutine; nil between requests (buffers.go)
	bw   *bufio.Writer // client writes; owned by the writer goroutine; nil while it has nothing to write
	in   stash         // owned by the reader: the client's first bytes, read while waiting for a request
	upIn stash         // owned by the writer: the upstream's first bytes, read while waiting for a response

	// up and upIn.c are set by the reader before it queues the first
	// forwarded slot (the channel send publishes them to the writer);
	// writing up and reading it from closeConns also hold upMu.
	upMu   sync.Mutex
	closed bool // guarded by upMu: closeConns ran
	up     net.Conn
	upW    *bufio.Writer // owned by the reader; nil between requests
	upR    *bufio.Reader // owned by the writer, over upIn; nil while no response is awaited

	slots      chan slot     // reader -> writer, in request order
	writerDone chan struct{} // closed when the writer exits
	draining   atomic.Bool   // set by Shutdown: read no new request
	idle       atomic.Bool   // the reader is between requests (set by the reader)
	inflight   atomic.Int32  // requests queued and not yet answered: +1 by the reader, -1 by the writer
	closeOnce  sync.Once
	usedShares atomic.Bool // the reader sent a share request to Config.Shares

	reqLR   io.LimitedReader // owned by the reader: splices request bodies
	respLR  io.LimitedReader // owned by the writer: splices response bodies
	late    []int32          // owned by the writer: correlation ids of ApiVersions answered from the cache whose upstream answers are still to drop (apiversions.go)
	respBuf []byte           // owned by the writer: encoded and upstream responses to rewrite; from rw
	outBuf  []byte           // owned by the writer: rewritten responses; from rw
	rw      *rewriteBufs     // owned by the writer: the pooled holder of respBuf and outBuf, nil between uses
	spool   spool            // owned by the writer: the streamed response it is rewriting (spool.go)
}

func newSession(p *Proxy, c net.Conn, node int32) *session {
	id := sessionIDs.Add(1)
	host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
	s := &session{
		p:          p,
		id:         id,
		node:       node,
		log:        p.log.With("conn", id, "remote", c.RemoteAddr().String(), "node", node),
		rc:         clientFor(c, host),
		conn:       c,
		slots:      make(chan slot, p.cfg.MaxInFlight),
		writerDone: make(chan struct{}),
	}
	s.in.c = c
	s.rc.Conn, s.rc.Node = id, node
	return s
}

// run serves the session until the client or the upstream goes away.
func (s *session) run() {
	s.p.metrics.connOpened()
	defer s.p.metrics.connClosed()
	go s.writeLoop()
	err := s.readLoop()
	close(s.slots)
	if clientGone(err) && !s.draining.Load() {
		// Nobody will read the answers still owed: close the upstream
		// too, or a writer waiting for a broker that stopped answering
		// (a partition) would hold the session, both sockets and their
		// buffers until the broker answered.
		s.closeConns()
	}
	var down *upstreamDownError
	if errors.As(err, &down) {
		// Reset rather than close: a clean close after the client's
		// first request reads as a TLS or SASL problem (see
		// brokerUnreachable); a reset reads as a network failure,
		// which every client retries. The broker's listener then
		// refuses the client's next connection, as the broker would.
		setLinger0(s.conn)
		s.p.brokerUnreachable(s.node, down.err)
	}
	switch {
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), s.draining.Load():
		s.log.Debug("client connection closed", "err", err)
	case errors.Is(err, errIdle):
		s.log.Debug("closing idle client connection", "idle_timeout", s.p.cfg.IdleTimeout)
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.p.metrics.refused(refusedReadTimeout)
		s.log.Warn("closing client connection", "reason", fmt.Sprintf("request not complete within the read timeout of %v (request_timeout): %v", s.p.cfg.RequestTimeout, err))
	default:
		s.log.Warn("closing client connection", "reason", err.Error())
	}
	<-s.writerDone
	s.closeConns()
	s.sharesClosed()
	// Both goroutines are done with the buffers.
	putReader(s.br)
	putWriter(s.bw)
	putReader(s.upR)
	putWriter(s.upW)
	s.br, s.bw, s.upR, s.upW = nil, nil, nil, nil
	if s.rw != nil {
		rewritePool.Put(s.rw)
		s.rw, s.respBuf, s.outBuf = nil, nil, nil
	}
}

// clientGone says whether err, which ended a session's reader, means the
// client closed or lost its connection.
func clientGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET)
}

// drain makes the reader stop at the next request boundary; the writer
// then answers what was read and the session ends. A reader in the middle
// of a request finishes it first: interrupting it would leave half a
// request upstream and its response never coming.
func (s *session) drain() {
	s.draining.Store(true)
	if s.idle.Load() {
		s.conn.SetReadDeadline(time.Now())
	}
}

// closeConns closes both sockets; any goroutine may call it, any number
// of times. An upstream dialled after it is closed at once.
func (s *session) closeConns() {
	s.closeOnce.Do(func() {
		s.upMu.Lock()
		s.closed = true
		up := s.up
		s.upMu.Unlock()
		s.conn.Close()
		if up != nil {
			up.Close()
		}
	})
}

// errIdle ends a connection that sent no request and awaited no answer
// for Config.IdleTimeout.
var errIdle = errors.New("idle connection")

// readLoop reads requests until an error, returning it.
//
// Deadlines: between requests the client has IdleTimeout to start the
// next one (a request in flight, such as a JoinGroup waiting for a
// rebalance, counts as activity, as in Kafka's connections.max.idle.ms);
// once its first byte has arrived a request has RequestTimeout to arrive
// whole. A request already buffered sets no deadline, so pipelined
// requests cost none.
func (s *session) readLoop() error {
	maxFrame := s.p.cfg.MaxFrame
	idle, reqTimeout := s.p.cfg.IdleTimeout, s.p.cfg.RequestTimeout
	for {
		s.idle.Store(true)
		if s.clientBuffered() < 4 && s.upW != nil && s.upW.Buffered() > 0 {
			// About to block on the client: push what is pending.
			if err := s.upW.Flush(); err != nil {
				return fmt.Errorf("writing upstream: %w", err)
			}
		}
		if s.clientBuffered() == 0 {
			// Between requests: wait holding no buffer.
			s.releaseReadBufs()
			// Set before checking draining: drain sets an immediate
			// deadline after setting draining, so one of the two
			// sees the other.
			s.conn.SetReadDeadline(time.Now().Add(idle))
			if s.draining.Load() {
				return nil
			}
			if err := s.in.fill(); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) && !s.draining.Load() {
					if s.inflight.Load() > 0 {
						continue
					}
					s.p.metrics.refused(refusedIdle)
					return errIdle
				}
				return err
			}
		}
		s.idle.Store(false)
		if s.br == nil {
			s.br = getReader(&s.in)
		}
		if s.draining.Load() {
			// drain may have set the read deadline after the request
			// began: stop before any of it is forwarded.
			return nil
		}
		deadline := false // set for this request
		if s.clientBuffered() < 4 {
			s.conn.SetReadDeadline(time.Now().Add(reqTimeout))
			deadline = true
		}
		prefix, err := s.br.Peek(4)
		if err != nil {
			if len(prefix) > 0 && errors.Is(err, io.EOF) {
				return fmt.Errorf("truncated frame size: %w", io.ErrUnexpectedEOF)
			}
			return err
		}
		size, err := codec.CheckSize([4]byte(prefix), maxFrame)
		if err != nil {
			return err
		}
		total := 4 + int(size)
		if !deadline && s.clientBuffered() < total {
			s.conn.SetReadDeadline(time.Now().Add(reqTimeout))
		}
		head, err := s.br.Peek(min(total, bufSize))
		if err != nil {
			return truncated(err)
		}
		h, err := codec.ParseRequestHeader(head[4:])
		if err != nil {
			if errors.Is(err, codec.ErrTruncated) && len(head) == total {
				return fmt.Errorf("malformed request header: %w", err)
			}
			if errors.Is(err, codec.ErrTruncated) {
				return fmt.Errorf("request header larger than %d bytes", bufSize)
			}
			return fmt.Errorf("request header: %w", err)
		}
		if string(h.ClientID) != s.rc.ID {
			s.rc.ID = string(h.ClientID)
		}
		s.p.metrics.bytesIn(int64(total))
		if err := s.route(h, head, total); err != nil {
			return err
		}
	}
}

// route sends one request where codec.RouteFor says it goes. head holds
// the start of the frame (size prefix included), total its whole length.
func (s *session) route(h codec.RequestHeader, head []byte, total int) error {
	start := nanotime()
	if s.p.cfg.Shares != nil && codec.IsServedShareKey(h.Key) {
		return s.routeShare(h, start, total)
	}
	if s.p.cfg.GroupConfigs != nil && isConfigKey(h.Key) {
		return s.routeGroupConfigs(h, start, head, total)
	}
	d := codec.RouteFor(h.Key, h.Version, s.p.cfg.Coordinator != nil)
	if kind := codec.GroupKind(h.Key); kind != "" && s.p.cfg.Coordinator != nil {
		return s.routeKind(h, kind, start, head, total)
	}
	switch d.Route {
	case codec.Forward, codec.Rewrite:
		if h.Key == codec.KeyApiVersions && s.up == nil {
			if done, err := s.apiVersionsBeforeUpstream(h, start, total); done || err != nil {
				return err
			}
		}
		if d.Edit == codec.EditObserve {
			s.observeSASLRequest(h, head, total)
		}
		return s.forward(h, d.Route, start, head, total)
	case codec.Refuse:
		return d.Refusal(h.Key, h.Version)
	}
	// Local: kproxy answers ApiVersions and FindCoordinator itself and
	// hands the group APIs to the coordinator.
	if h.Key == codec.KeyApiVersions {
		// A version kproxy does not speak. As a broker does: answer in
		// v0 with the versions we speak, so the client retries with one
		// of them.
		if _, err := s.br.Discard(total); err != nil {
			return truncated(err)
		}
		resp := kmsg.NewPtrApiVersionsResponse()
		resp.ErrorCode = kerr.UnsupportedVersion.Code
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MaxVersion = codec.KeyApiVersions, codec.MaxVersion(codec.KeyApiVersions)
		resp.ApiKeys = append(resp.ApiKeys, k)
		return s.queueLocal(h, start, resp)
	}
	req, frame, err := s.readLocal(h, total)
	if err != nil {
		return err
	}
	if fc, ok := req.(*kmsg.FindCoordinatorRequest); ok && fc.CoordinatorType != 0 {
		// Transactions (and anything else that is not a group) belong
		// to the brokers: routed as with groups forwarded.
		return s.forwardBytes(h, codec.RouteFor(h.Key, h.Version, false).Route, start, frame, nil)
	}
	if fw := s.p.cfg.Forwarder; fw != nil {
		if g, rewrite := forwardedGroup(fw, req); g != "" {
			// The cluster's coordinator serves this group (forward.go).
			if rewrite {
				frame = reencoded(frame, int(h.Len), req)
			}
			var watch func(kmsg.Response)
			if w, ok := fw.(ForwardWatcher); ok {
				watch = w.Watch(s.rc, g, req)
			}
			return s.forwardBytes(h, codec.Forward, start, frame, watch)
		}
	}
	return s.queueCoordinator(h, start, req)
}

// readLocal reads and decodes a request kproxy serves itself, once the
// client may send it (authGate) and if it is within MaxGroupRequest; it
// returns the decoded request and its frame, which the request aliases.
func (s *session) readLocal(h codec.RequestHeader, total int) (kmsg.Request, []byte, error) {
	if err := s.authGate(h); err != nil {
		return nil, nil, err
	}
	if limit := s.p.cfg.MaxGroupRequest; total-4 > int(limit) {
		s.p.metrics.refused(refusedTooLarge)
		return nil, nil, fmt.Errorf("%w: %s request of %d bytes, over the %d byte limit for requests kproxy serves itself (max_group_request_bytes)",
			codec.ErrFrameTooLarge, kmsg.NameForKey(h.Key), total-4, limit)
	}
	frame, done, err := s.readFrame(total)
	if err != nil {
		return nil, nil, err
	}
	req := kmsg.RequestForKey(h.Key)
	req.SetVersion(h.Version)
	err = req.ReadFrom(frame[4+h.Len:])
	done()
	if err != nil {
		return nil, nil, fmt.Errorf("malformed %s v%d request: %w", kmsg.NameForKey(h.Key), h.Version, err)
	}
	return req, frame, nil
}

func truncated(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("truncated frame: %w", io.ErrUnexpectedEOF)
	}
	return err
}

// readFrame reads a whole request frame that kproxy serves itself into
// a buffer of its own: the decoded request aliases it (kmsg's byte
// fields are sub-slices of the frame) and the coordinator may hold it
// after the reader has moved on. The frame's size is reserved from the
// process budget while it is read and decoded; the caller calls done
// once the request is decoded.
func (s *session) readFrame(total int) (frame []byte, done func(), err error) {
	if err := s.p.reserveFrame(total); err != nil {
		return nil, nil, err
	}
	done = func() { s.p.budget.release(int64(total)) }
	b, err := readGrowing(s.br, nil, total)
	if err != nil {
		done()
		return nil, nil, truncated(err)
	}
	return b, done, nil
}

// push queues a slot, or fails when the writer is gone.
func (s *session) push(sl slot) error {
	s.inflight.Add(1)
	select {
	case s.slots <- sl:
		return nil
	default:
	}
	// The queue is full: the writer waits for the responses to requests
	// still in the upstream buffer, so send them before blocking (a
	// client pipelining more than MaxInFlight small requests would
	// otherwise stall for good).
	if s.upW != nil && s.upW.Buffered() > 0 {
		if err := s.upW.Flush(); err != nil {
			s.inflight.Add(-1)
			return fmt.Errorf("writing upstream: %w", err)
		}
	}
	select {
	case s.slots <- sl:
		// The client waited on our queue, not the other way round:
		// the rest of its request gets a full read timeout.
		s.conn.SetReadDeadline(time.Now().Add(s.p.cfg.RequestTimeout))
		return nil
	case <-s.writerDone:
		s.inflight.Add(-1)
		return errWriterGone
	}
}

var errWriterGone = errors.New("client writer stopped")

// queueLocal queues a response the proxy already has, at the version
// it carries.
func (s *session) queueLocal(h codec.RequestHeader, start int64, resp kmsg.Response) error {
	r := getReply()
	r.deliver(resp)
	return s.push(slot{route: codec.Local, key: h.Key, version: h.Version, corr: h.CorrelationID, start: start, reply: r})
}

// queueCoordinator hands a decoded group request to the coordinator (or,
// for FindCoordinator, answers it) and queues its place.
func (s *session) queueCoordinator(h codec.RequestHeader, start int64, req kmsg.Request) error {
	if fc, ok := req.(*kmsg.FindCoordinatorRequest); ok {
		return s.queueFindCoordinator(h, start, fc)
	}
	r := getReply()
	if err := s.push(slot{route: codec.Local, key: h.Key, version: h.Version, corr: h.CorrelationID, start: start, reply: r}); err != nil {
		return err
	}
	reply := r.deliver
	switch req := req.(type) {
	case *kmsg.ConsumerGroupHeartbeatRequest:
		if req.MemberEpoch < 0 {
			reply = s.leaveRefused(req, reply)
		}
	case *kmsg.JoinGroupRequest:
		reply = s.joinRefused(req, reply)
	}
	s.p.cfg.Coordinator.Handle(s.rc, req, reply)
	return nil
}

// leaveRefused returns deliver, preceded by a report to the forward
// watcher of a KIP-848 leave the coordinator refused NOT_COORDINATOR
// while its group went to the cluster's coordinator (a hand-back
// unloaded it as the leave arrived): the member goes away, and the
// cluster never hears of its leave. Watched as a leave forwarded, it
// counts as one: the hand-back need not wait for the member, which holds
// nothing (docs/anchors.md, "Out (rollback)").
func (s *session) leaveRefused(req *kmsg.ConsumerGroupHeartbeatRequest, deliver func(kmsg.Response)) func(kmsg.Response) {
	fw := s.p.cfg.Forwarder
	w, ok := fw.(ForwardWatcher)
	if !ok {
		return deliver
	}
	return func(resp kmsg.Response) {
		if hr, ok := resp.(*kmsg.ConsumerGroupHeartbeatResponse); ok && hr.ErrorCode == kerr.NotCoordinator.Code && fw.Forwarded(req.Group) {
			if answered := w.Watch(s.rc, req.Group, req); answered != nil {
				answered(resp)
			}
		}
		deliver(resp)
	}
}

// joinRefused returns deliver, or, when the forwarder can join members
// at the cluster (ClusterJoiner), deliver preceded by a turn for a
// JoinGroup the coordinator refused NOT_COORDINATOR as its group went to
// the cluster's coordinator (a hand-back began while it waited in a
// rebalance): the member is answered MEMBER_ID_REQUIRED with a member id
// the cluster's coordinator handed out for it, and joins there at once
// with it, on this connection, which FindCoordinator pointed at that
// coordinator's broker. Answered NOT_COORDINATOR, it would look its
// coordinator up first, and librdkafka joins again no sooner than a
// second after its last join (rkcg_join_intvl), where
// MEMBER_ID_REQUIRED skips that wait (docs/anchors.md, "Out
// (rollback)"). The ask runs on a goroutine of its own: deliver is
// called on the coordinator's.
func (s *session) joinRefused(req *kmsg.JoinGroupRequest, deliver func(kmsg.Response)) func(kmsg.Response) {
	cj, ok := s.p.cfg.Forwarder.(ClusterJoiner)
	if !ok {
		return deliver
	}
	c := s.rc // the reader's; copied here, on it
	return func(resp kmsg.Response) {
		jr, ok := resp.(*kmsg.JoinGroupResponse)
		if !ok || jr.ErrorCode != kerr.NotCoordinator.Code {
			deliver(resp)
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(s.p.ctx, lookupTimeout)
			defer cancel()
			id, ok := cj.JoinAtCluster(ctx, c, req)
			if !ok {
				deliver(resp)
				return
			}
			out := kmsg.NewPtrJoinGroupResponse()
			out.SetVersion(req.Version)
			out.ErrorCode, out.MemberID = kerr.MemberIDRequired.Code, id
			deliver(out)
		}()
	}
}

// findCoordinator answers FindCoordinator for groups with a kproxy
// address: every listener serves group APIs.
func (s *session) findCoordinator(req *kmsg.FindCoordinatorRequest) *kmsg.FindCoordinatorResponse {
	resp := req.ResponseKind().(*kmsg.FindCoordinatorResponse)
	node, host, port, ok := s.p.coordinatorNode(s.node)
	code := int16(0)
	if !ok {
		node, host, port, code = -1, "", -1, kerr.CoordinatorNotAvailable.Code
	}
	if req.Version < 4 {
		if denied := s.findCoordinatorCode(req.CoordinatorKey); denied != 0 {
			node, host, port, code = -1, "", -1, denied
		}
		resp.NodeID, resp.Host, resp.Port, resp.ErrorCode = node, host, port, code
		return resp
	}
	for _, key := range req.CoordinatorKeys {
		c := kmsg.NewFindCoordinatorResponseCoordinator()
		c.Key, c.NodeID, c.Host, c.Port, c.ErrorCode = key, node, host, port, code
		if denied := s.findCoordinatorCode(key); denied != 0 {
			c.NodeID, c.Host, c.Port, c.ErrorCode = -1, "", -1, denied
		}
		resp.Coordinators = append(resp.Coordinators, c)
	}
	return resp
}

// ensureUpstream dials the broker this session stands for.
func (s *session) ensureUpstream() error { return s.ensureUpstreamWithin(s.p.cfg.DialTimeout) }

// ensureUpstreamWithin is ensureUpstream with timeout bounding each dial.
func (s *session) ensureUpstreamWithin(timeout time.Duration) error {
	if s.up != nil {
		if s.upW == nil {
			s.upW = getWriter(s.up)
		}
		return nil
	}
	addrs := s.p.upstreamFor(s.node)
	if len(addrs) == 0 {
		return fmt.Errorf("no known address for broker %d", s.node)
	}
	var errs []error
	for _, a := range addrs {
		c, err := s.p.dialUpstreamWithin(a, timeout)
		if tlsErr := (*upstreamTLSError)(nil); errors.As(err, &tlsErr) {
			return err // reachable: its listener stays open
		}
		if err != nil {
			s.p.metrics.upstreamError(context.Background())
			errs = append(errs, err)
			continue
		}
		s.upMu.Lock()
		if s.closed {
			s.upMu.Unlock()
			c.Close()
			return net.ErrClosed
		}
		s.up = c
		s.upMu.Unlock()
		s.upIn.c = c
		s.upW = getWriter(s.up)
		return nil
	}
	return &upstreamDownError{errors.Join(errs...)}
}

// upstreamDownError says that the session's broker (or, for the
// bootstrap listener, every seed) could not be dialled.
type upstreamDownError struct{ err error }

func (e *upstreamDownError) Error() string { return "upstream unreachable: " + e.err.Error() }
func (e *upstreamDownError) Unwrap() error { return e.err }

// forward streams one request frame upstream as it arrived; r (Forward
// or Rewrite) says what becomes of the response.
func (s *session) forward(h codec.RequestHeader, r codec.Route, start int64, head []byte, total int) error {
	if err := s.ensureUpstream(); err != nil {
		return err
	}
	expectResponse := true
	if h.Key == codec.KeyProduce {
		acks, ok := codec.ProduceAcks(head[4+h.Len:], h.Version)
		if !ok {
			return errors.New("malformed produce request: no acks")
		}
		expectResponse = acks != 0
	}
	if expectResponse {
		var watch func(kmsg.Response)
		if s.p.cfg.ConfigsAltered != nil && (h.Key == codec.KeyAlterConfigs || h.Key == codec.KeyIncrementalAlterConfigs) {
			watch = s.p.cfg.ConfigsAltered
		}
		if err := s.push(slot{route: r, key: h.Key, version: h.Version, corr: h.CorrelationID, start: start, watch: watch}); err != nil {
			return err
		}
	}
	if err := pipe(s.upW, s.up, s.br, s.conn, total, &s.reqLR); err != nil {
		return fmt.Errorf("forwarding %s: %w", kmsg.NameForKey(h.Key), err)
	}
	if !expectResponse {
		s.p.metrics.request(h.Key, codec.Forward, start)
	}
	return nil
}

// forwardBytes sends a frame already read into memory upstream; r is as
// for forward. watch, if not nil, gets the response (ForwardWatcher), or
// nil if the request never went.
func (s *session) forwardBytes(h codec.RequestHeader, r codec.Route, start int64, frame []byte, watch func(kmsg.Response)) error {
	err := s.ensureUpstream()
	if err == nil {
		err = s.push(slot{route: r, key: h.Key, version: h.Version, corr: h.CorrelationID, start: start, watch: watch})
	}
	if err != nil {
		if watch != nil {
			watch(nil)
		}
		return err
	}
	if _, err := s.upW.Write(frame); err != nil {
		return fmt.Errorf("forwarding %s: %w", kmsg.NameForKey(h.Key), err)
	}
	return nil
}

// pipe moves n bytes from r (buffered over src) to w (buffered over dst).
// What r has buffered is copied; a large remainder is spliced from src to
// dst by the kernel.
func pipe(w *bufio.Writer, dst net.Conn, r *bufio.Reader, src net.Conn, n int, lr *io.LimitedReader) error {
	for n > 0 && r.Buffered() > 0 {
		b, _ := r.Peek(min(r.Buffered(), n))
		if _, err := w.Write(b); err != nil {
			return err
		}
		r.Discard(len(b))
		n -= len(b)
	}
	if n == 0 {
		return nil
	}
	if n < spliceMin {
		for n > 0 {
			if r.Buffered() == 0 {
				if _, err := r.Peek(1); err != nil {
					return truncated(err)
				}
			}
			b, _ := r.Peek(min(r.Buffered(), n))
			if _, err := w.Write(b); err != nil {
				return err
			}
			r.Discard(len(b))
			n -= len(b)
		}
		return nil
	}
	if err := w.Flush(); err != nil {
		return err
	}
	*lr = io.LimitedReader{R: src, N: int64(n)}
	for lr.N > 0 {
		m, err := readFrom(dst, lr)
		if err != nil {
			return err
		}
		if m == 0 {
			return io.ErrUnexpectedEOF
		}
	}
	return nil
}

// writeLoop answers the slots in order until the reader closes the queue
// or a write fails.
func (s *session) writeLoop() {
	defer close(s.writerDone)
	for {
		var sl slot
		var ok bool
		select {
		case sl, ok = <-s.slots:
		default:
			if s.bw != nil {
				if err := s.bw.Flush(); err != nil {
					s.fail(fmt.Errorf("writing to client: %w", err))
					return
				}
			}
			// Nothing to answer: wait holding no buffer.
			s.releaseWriteBufs()
			sl, ok = <-s.slots
		}
		if !ok {
			if s.bw != nil {
				if err := s.bw.Flush(); err != nil {
					s.log.Debug("final flush failed", "err", err)
				}
			}
			return
		}
		if s.bw == nil {
			s.bw = getWriter(s.conn)
		}
		if sl.route != codec.Forward {
			s.takeRewriteBufs()
		}
		var err error
		if sl.route == codec.Local {
			err = s.writeLocal(sl)
		} else {
			err = s.writeForwarded(sl)
		}
		s.inflight.Add(-1)
		if err != nil {
			s.fail(err)
			return
		}
	}
}

// fail logs why the writer stopped and closes both sockets, which stops
// the reader too.
func (s *session) fail(err error) {
	if !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
		s.log.Warn("closing client connection", "reason", err.Error())
	}
	s.closeConns()
}

// writeLocal waits for a coordinator reply and writes it.
func (s *session) writeLocal(sl slot) error {
	var resp kmsg.Response
	select {
	case resp = <-sl.reply.ch:
	default:
		if err := s.bw.Flush(); err != nil {
			return fmt.Errorf("writing to client: %w", err)
		}
		resp = <-sl.reply.ch
	}
	putReply(sl.reply)
	s.respBuf = codec.AppendResponse(s.respBuf[:0], sl.corr, resp)
	_, err := s.bw.Write(s.respBuf)
	n := len(s.respBuf)
	s.respBuf = keep(s.respBuf)
	if err != nil {
		return fmt.Errorf("writing to client: %w", err)
	}
	s.p.metrics.bytesOut(int64(n))
	s.p.metrics.request(sl.key, codec.Local, sl.start)
	return nil
}

// writeForwarded reads the next upstream response and writes it to the
// client, streamed as is or rewritten.
func (s *session) writeForwarded(sl slot) error {
	if s.upR == nil || s.upR.Buffered()+s.upIn.buffered() < 8 {
		if err := s.bw.Flush(); err != nil {
			return fmt.Errorf("writing to client: %w", err)
		}
	}
	if len(s.late) > 0 {
		if err := s.dropLate(); err != nil {
			return err
		}
	}
	if sl.key == codec.KeyApiVersions {
		if done, err := s.awaitApiVersions(sl); done || err != nil {
			return err
		}
	}
	upR, err := s.upstreamReader()
	if err != nil {
		return fmt.Errorf("reading %s response from upstream: %w", kmsg.NameForKey(sl.key), truncated(err))
	}
	hdr, err := upR.Peek(8)
	if err != nil {
		return fmt.Errorf("reading %s response from upstream: %w", kmsg.NameForKey(sl.key), truncated(err))
	}
	size := int32(binary.BigEndian.Uint32(hdr))
	corr := int32(binary.BigEndian.Uint32(hdr[4:]))
	if size < 4 || size > s.p.cfg.MaxFrame {
		return fmt.Errorf("upstream sent a %d byte frame", size)
	}
	if corr != sl.corr {
		return fmt.Errorf("upstream answered correlation id %d, expected %d (%s)", corr, sl.corr, kmsg.NameForKey(sl.key))
	}
	total := 4 + int(size)
	if sl.watch != nil {
		return s.writeWatched(sl, upR, total)
	}
	if sl.route != codec.Rewrite {
		s.p.metrics.bytesOut(int64(total))
		if err := pipe(s.bw, s.conn, s.upR, s.up, total, &s.respLR); err != nil {
			return fmt.Errorf("streaming %s response: %w", kmsg.NameForKey(sl.key), err)
		}
		s.p.metrics.request(sl.key, codec.Forward, sl.start)
		return nil
	}
	if codec.Streamable(sl.key, sl.version) {
		return s.writeStreamed(sl, total)
	}
	if limit := s.p.cfg.MaxRewriteResponse; size > limit {
		s.p.metrics.refused(refusedTooLarge)
		return fmt.Errorf("%w: upstream %s response of %d bytes, over the %d byte limit for responses kproxy rewrites (max_rewrite_response_bytes)",
			codec.ErrFrameTooLarge, kmsg.NameForKey(sl.key), size, limit)
	}
	if err := s.p.reserveFrame(total); err != nil {
		return err
	}
	defer s.p.budget.release(int64(total))
	frame, err := readGrowing(s.upR, s.respBuf, total)
	if err != nil {
		return fmt.Errorf("reading %s response from upstream: %w", kmsg.NameForKey(sl.key), truncated(err))
	}
	defer func() { s.respBuf = keep(frame[:0]) }()
	body, err := codec.ResponseBody(frame[4:], sl.key, sl.version)
	if err != nil {
		return err
	}
	s.observeSASLResponse(sl.key, sl.version, body)
	resp, err := codec.RewriteResponse(sl.key, sl.version, body, s.p, s.p.cfg.Coordinator != nil)
	if err != nil {
		return err
	}
	if sl.key == codec.KeyApiVersions && resp != nil {
		if av, ok := resp.(*kmsg.ApiVersionsResponse); ok && s.p.cfg.Shares != nil && av.ErrorCode == 0 {
			codec.AddShareApis(av)
		}
		s.rememberApiVersions(resp)
	}
	out := frame
	if resp != nil {
		s.outBuf = codec.AppendResponse(s.outBuf[:0], sl.corr, resp)
		out = s.outBuf
		defer func() { s.outBuf = keep(s.outBuf) }()
	}
	if _, err := s.bw.Write(out); err != nil {
		return fmt.Errorf("writing to client: %w", err)
	}
	// Count what the client got: a rewritten response differs in size.
	s.p.metrics.bytesOut(int64(len(out)))
	s.p.metrics.request(sl.key, codec.Rewrite, sl.start)
	return nil
}

// writeStreamed rewrites a response whose endpoints follow its partitions
// (codec.Streamable) as it arrives: what precedes the endpoints waits in a
// spool (spool.go), never decoded, then the new size, the spool and the
// rewritten end go to the client. A malformed response ends this
// connection only.
func (s *session) writeStreamed(sl slot, total int) error {
	sp := &s.spool
	*sp = spool{p: s.p, total: total, mem: s.respBuf[:0]}
	defer func() {
		s.respBuf = keep(sp.mem[:0])
		sp.close()
		sp.mem = nil
	}()
	s.upR.Discard(4) // the size prefix, peeked by writeForwarded: the new one goes in its place
	tail, err := codec.StreamEndpoints(s.outBuf[:0], sl.key, sl.version, s.upR, total-4, sp, s.p, int(s.p.cfg.MaxRewriteResponse))
	if err != nil {
		return fmt.Errorf("rewriting %s response from upstream: %w", kmsg.NameForKey(sl.key), err)
	}
	s.outBuf = keep(tail[:0])
	size := sp.len() + len(tail)
	binary.BigEndian.PutUint32(sp.prefix[:], uint32(size))
	if _, err := s.bw.Write(sp.prefix[:]); err != nil {
		return fmt.Errorf("writing to client: %w", err)
	}
	if err := sp.writeTo(s.bw); err != nil {
		return fmt.Errorf("writing %s response to client: %w", kmsg.NameForKey(sl.key), err)
	}
	if _, err := s.bw.Write(tail); err != nil {
		return fmt.Errorf("writing to client: %w", err)
	}
	s.p.metrics.bytesOut(int64(4 + size))
	s.p.metrics.request(sl.key, codec.Rewrite, sl.start)
	return nil
}

// writeWatched reads a forwarded group response of total bytes whole,
// hands it decoded to the slot's watcher and writes it to the client as
// it came. Group responses are small; one over the rewrite limit is not
// watched (the watcher gets nil) but still streamed.
func (s *session) writeWatched(sl slot, upR *bufio.Reader, total int) error {
	watch := sl.watch
	if total-4 > int(s.p.cfg.MaxRewriteResponse) {
		watch(nil)
		sl.watch = nil
		s.p.metrics.bytesOut(int64(total))
		if err := pipe(s.bw, s.conn, s.upR, s.up, total, &s.respLR); err != nil {
			return fmt.Errorf("streaming %s response: %w", kmsg.NameForKey(sl.key), err)
		}
		s.p.metrics.request(sl.key, codec.Forward, sl.start)
		return nil
	}
	if err := s.p.reserveFrame(total); err != nil {
		watch(nil)
		return err
	}
	defer s.p.budget.release(int64(total))
	frame, err := readGrowing(upR, s.respBuf, total)
	if err != nil {
		watch(nil)
		return fmt.Errorf("reading %s response from upstream: %w", kmsg.NameForKey(sl.key), truncated(err))
	}
	defer func() { s.respBuf = keep(frame[:0]) }()
	var resp kmsg.Response
	var body []byte
	if b, err := codec.ResponseBody(frame[4:], sl.key, sl.version); err == nil {
		r := kmsg.ResponseForKey(sl.key)
		r.SetVersion(sl.version)
		if r.ReadFrom(b) == nil {
			resp, body = r, b
		}
	}
	hb, _ := resp.(*kmsg.ConsumerGroupHeartbeatResponse)
	var interval int32
	if hb != nil {
		interval = hb.HeartbeatIntervalMillis
	}
	watch(resp)
	if hb != nil && hb.HeartbeatIntervalMillis != interval {
		// The watcher paced the member (ForwardWatcher.Watch): the
		// answer goes re-encoded, its header as it came.
		frame = reencodedResponse(frame[:len(frame)-len(body)], hb)
	}
	if _, err := s.bw.Write(frame); err != nil {
		return fmt.Errorf("writing to client: %w", err)
	}
	s.p.metrics.bytesOut(int64(total))
	s.p.metrics.request(sl.key, codec.Forward, sl.start)
	return nil
}
