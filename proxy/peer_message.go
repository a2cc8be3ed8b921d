package proxy

// Kproxy messages: what one kproxy says to another on the peer wire
// (peer.go) that is not a client's request, such as a takeover report.
// A message has a type (a short name, "takeover.report"), a version of
// its payload, and a payload whose encoding the type defines; its answer
// is an error code and text, and a payload. A type is served by the
// handler registered for it in a PeerMessages, which both the PeerServer
// (messages from other kproxies) and the Router (messages for a group
// owned here) hand messages to; a sender calls Router.SendPeer.
//
// On the wire a message rides in an Envelope like a relayed request,
// on the same multiplexed connection, with the same keepalive and
// unreachable-episode handling. Its RequestData starts with the
// kproxy-private API key keyPeerMessage, negative so that it is outside
// Kafka's range for good (Kafka's API keys are non-negative), then:
//
//	int16  keyPeerMessage
//	int16  frame version (0)
//	int32  correlation id (the envelope's)
//	string type (int16 length, UTF-8)
//	int16  message version
//	bytes  payload (int32 length)
//
// The answer is an Envelope response with ErrorCode 0 whose
// ResponseData is
//
//	int16  code (PeerCode: 0 done)
//	string text (int16 length; empty when code is 0)
//	bytes  payload (int32 length)
//
// A kproxy that knows peer messages but not the type answers
// PeerUnknownType; one whose handler takes versions up to n answers a
// later version PeerUnsupportedVersion; a payload the handler cannot
// read is answered PeerMalformed. None of these closes the connection
// or touches the other requests on it.
//
// Rolling upgrade: a kproxy from before peer messages reads the
// negative key as an API it does not know and refuses the envelope with
// INVALID_REQUEST, without closing the connection (its decodeInner).
// SendPeer returns that as ErrPeerUnknownType too, so a sender treats
// an old owner as it treats a new one that lacks the type: the message
// is not delivered, and the Router logs that once per peer and type. A
// fleet mixing versions therefore runs each message's feature only
// between the kproxies that have it (for takeover reports: no takeover
// of a group whose members are behind an old kproxy until the upgrade
// reaches it; the group stays forwarded to the cluster's coordinator).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// keyPeerMessage is the API key of a kproxy message inside an envelope.
const keyPeerMessage int16 = -0x4b50 // "KP", negated

// peerMessageFrameVersion is the version of the message framing above.
const peerMessageFrameVersion int16 = 0

// PeerCode is the outcome a peer answers a kproxy message with.
type PeerCode int16

const (
	PeerOK                 PeerCode = 0
	PeerUnknownType        PeerCode = 1 // no handler for the type here
	PeerUnsupportedVersion PeerCode = 2 // the message's version is above the handler's
	PeerMalformed          PeerCode = 3 // the frame or the payload does not decode
	PeerFailed             PeerCode = 4 // the handler failed
)

func (c PeerCode) String() string {
	switch c {
	case PeerOK:
		return "ok"
	case PeerUnknownType:
		return "unknown_type"
	case PeerUnsupportedVersion:
		return "unsupported_version"
	case PeerMalformed:
		return "malformed"
	case PeerFailed:
		return "failed"
	}
	return fmt.Sprintf("code_%d", int16(c))
}

// Errors SendPeer returns, to be matched with errors.Is.
var (
	// ErrPeerUnknownType: the owner has no handler for the type (or
	// knows no kproxy messages at all: an older kproxy).
	ErrPeerUnknownType = errors.New("peer does not know the message type")
	// ErrPeerUnsupportedVersion: the owner's handler takes only earlier
	// versions.
	ErrPeerUnsupportedVersion = errors.New("peer does not support the message version")
	// ErrPeerMalformed: the owner could not read the message. Handlers
	// wrap it to refuse a payload they cannot read.
	ErrPeerMalformed = errors.New("malformed peer message")
	// ErrPeerFailed: the owner's handler returned another error.
	ErrPeerFailed = errors.New("peer message failed")
	// ErrPeerUnavailable: the message did not get an answer (no owner,
	// owner unreachable, connection cut, timeout, router closed).
	ErrPeerUnavailable = errors.New("peer unavailable")
)

// PeerError is a kproxy message's answer with a non-zero code.
type PeerError struct {
	Code PeerCode
	Text string
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("peer answered %s: %s", e.Code, e.Text)
}

// Is matches the ErrPeer* error of e's code.
func (e *PeerError) Is(target error) bool {
	return target == codeErr(e.Code)
}

func codeErr(c PeerCode) error {
	switch c {
	case PeerUnknownType:
		return ErrPeerUnknownType
	case PeerUnsupportedVersion:
		return ErrPeerUnsupportedVersion
	case PeerMalformed:
		return ErrPeerMalformed
	}
	return ErrPeerFailed
}

// PeerHandler serves one kproxy message type: it gets the message's
// version (at most the version it registered with) and payload, and
// returns the answer's payload. An error wrapping ErrPeerMalformed is
// answered PeerMalformed, any other PeerFailed. It runs on a goroutine
// of its own and must be safe for concurrent use; ctx ends when the
// server closes.
type PeerHandler func(ctx context.Context, version int16, payload []byte) ([]byte, error)

// PeerMessages is the registry of kproxy message handlers by type. Safe
// for concurrent use.
type PeerMessages struct {
	mu       sync.RWMutex
	handlers map[string]peerHandler // guarded by mu
}

type peerHandler struct {
	maxVersion int16
	fn         PeerHandler
}

// NewPeerMessages returns an empty registry.
func NewPeerMessages() *PeerMessages {
	return &PeerMessages{handlers: make(map[string]peerHandler)}
}

// Handle registers fn for messages of typ up to maxVersion, replacing
// any earlier handler of typ.
func (m *PeerMessages) Handle(typ string, maxVersion int16, fn PeerHandler) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.handlers[typ] = peerHandler{maxVersion: maxVersion, fn: fn}
}

// lookup finds typ's handler; a non-nil PeerError when there is none or
// version is above it. m may be nil (no handlers).
func (m *PeerMessages) lookup(typ string, version int16) (PeerHandler, *PeerError) {
	var h peerHandler
	var ok bool
	if m != nil {
		m.mu.RLock()
		h, ok = m.handlers[typ]
		m.mu.RUnlock()
	}
	switch {
	case !ok:
		return nil, &PeerError{Code: PeerUnknownType, Text: fmt.Sprintf("no handler for message type %q", typ)}
	case version < 0 || version > h.maxVersion:
		return nil, &PeerError{Code: PeerUnsupportedVersion, Text: fmt.Sprintf("message %q v%d: this kproxy reads v0 to v%d", typ, version, h.maxVersion)}
	}
	return h.fn, nil
}

// serve runs typ's handler and returns its answer.
func (m *PeerMessages) serve(ctx context.Context, typ string, version int16, payload []byte) ([]byte, *PeerError) {
	fn, perr := m.lookup(typ, version)
	if perr != nil {
		return nil, perr
	}
	return runPeerHandler(ctx, fn, version, payload)
}

// runPeerHandler runs fn and turns its error into the answer's code.
func runPeerHandler(ctx context.Context, fn PeerHandler, version int16, payload []byte) ([]byte, *PeerError) {
	out, err := fn(ctx, version, payload)
	switch {
	case err == nil:
		return out, nil
	case errors.Is(err, ErrPeerMalformed):
		return nil, &PeerError{Code: PeerMalformed, Text: err.Error()}
	default:
		return nil, &PeerError{Code: PeerFailed, Text: err.Error()}
	}
}

// peerMessage is a decoded kproxy message.
type peerMessage struct {
	typ     string
	version int16
	payload []byte
}

// appendPeerMessage appends a whole Envelope request frame carrying
// message m with correlation id corr.
func appendPeerMessage(dst []byte, corr int32, m peerMessage) []byte {
	env := kmsg.NewPtrEnvelopeRequest()
	env.RequestData = peerMessageData(corr, m)
	return kmsg.NewRequestFormatter(kmsg.FormatterClientID(relayClientID)).AppendRequest(dst, env, corr)
}

// peerMessageData is the RequestData of an envelope carrying m.
func peerMessageData(corr int32, m peerMessage) []byte {
	b := make([]byte, 0, 16+len(m.typ)+len(m.payload))
	key := keyPeerMessage
	b = binary.BigEndian.AppendUint16(b, uint16(key))
	b = binary.BigEndian.AppendUint16(b, uint16(peerMessageFrameVersion))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = appendString16(b, m.typ)
	b = binary.BigEndian.AppendUint16(b, uint16(m.version))
	return appendBytes32(b, m.payload)
}

// isPeerMessage says whether an envelope's RequestData holds a kproxy
// message.
func isPeerMessage(b []byte) bool {
	return len(b) >= 2 && int16(binary.BigEndian.Uint16(b)) == keyPeerMessage
}

// parsePeerMessage decodes the RequestData of a kproxy message. The
// payload aliases b.
func parsePeerMessage(b []byte) (peerMessage, error) {
	var m peerMessage
	if len(b) < 8 {
		return m, fmt.Errorf("peer message header: %w", codec.ErrTruncated)
	}
	if v := int16(binary.BigEndian.Uint16(b[2:])); v != peerMessageFrameVersion {
		return m, fmt.Errorf("peer message frame version %d, this kproxy reads %d", v, peerMessageFrameVersion)
	}
	r := wireReader{b: b[8:]}
	m.typ = r.string16()
	m.version = r.int16()
	m.payload = r.bytes32()
	if r.err != nil {
		return m, fmt.Errorf("peer message: %w", r.err)
	}
	if len(r.b) != 0 {
		return m, fmt.Errorf("peer message: %d bytes after the payload", len(r.b))
	}
	return m, nil
}

// appendPeerAnswer appends the ResponseData of an answer to a kproxy
// message.
func appendPeerAnswer(dst []byte, code PeerCode, text string, payload []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(code))
	dst = appendString16(dst, text)
	return appendBytes32(dst, payload)
}

// decodePeerAnswer decodes an owner's answer frame (after its size
// prefix) to a kproxy message: the answer's payload, or why there is
// none.
func decodePeerAnswer(frame []byte) ([]byte, error) {
	body, err := codec.ResponseBody(frame, keyEnvelope, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: envelope response header: %w", ErrPeerUnavailable, err)
	}
	env := kmsg.NewPtrEnvelopeResponse()
	if err := env.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("%w: malformed envelope response: %w", ErrPeerUnavailable, err)
	}
	if env.ErrorCode != 0 {
		// A kproxy from before peer messages (see the top of this file).
		return nil, &PeerError{Code: PeerUnknownType, Text: fmt.Sprintf("the peer refused the envelope with error %d: it knows no kproxy messages", env.ErrorCode)}
	}
	r := wireReader{b: env.ResponseData}
	code := PeerCode(r.int16())
	text := r.string16()
	payload := r.bytes32()
	if r.err != nil {
		return nil, fmt.Errorf("%w: malformed answer to a peer message: %w", ErrPeerUnavailable, r.err)
	}
	if code != PeerOK {
		return nil, &PeerError{Code: code, Text: text}
	}
	return payload, nil
}

func appendString16(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

func appendBytes32(dst []byte, b []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(b)))
	return append(dst, b...)
}

// wireReader reads big-endian fields off b; the first failure sticks in
// err and every later read returns zero values.
type wireReader struct {
	b   []byte
	err error
}

func (r *wireReader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.b) < n {
		r.err = codec.ErrTruncated
		return false
	}
	return true
}

func (r *wireReader) int16() int16 {
	if !r.need(2) {
		return 0
	}
	v := int16(binary.BigEndian.Uint16(r.b))
	r.b = r.b[2:]
	return v
}

func (r *wireReader) string16() string {
	n := int(r.int16())
	if !r.need(n) {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *wireReader) bytes32() []byte {
	if !r.need(4) {
		return nil
	}
	n := int(int32(binary.BigEndian.Uint32(r.b)))
	r.b = r.b[4:]
	if !r.need(n) {
		return nil
	}
	b := r.b[:n:n]
	r.b = r.b[n:]
	return b
}

// SendPeer sends a kproxy message of typ at version to the owner of
// group and returns the answer's payload. A group owned here is served
// by RouterConfig.Messages directly; otherwise the message goes over
// the peer wire to the owner, bounded by ctx and RelayTimeout. Errors
// match ErrPeerUnknownType (logged once per owner and type: an owner of
// an older version), ErrPeerUnsupportedVersion, ErrPeerMalformed,
// ErrPeerFailed or ErrPeerUnavailable.
func (r *Router) SendPeer(ctx context.Context, group, typ string, version int16, payload []byte) ([]byte, error) {
	d, ok := r.locate(group)
	if !ok {
		return nil, fmt.Errorf("%w: group %q has no owner", ErrPeerUnavailable, group)
	}
	if d.local {
		out, perr := r.cfg.Messages.serve(ctx, typ, version, payload)
		if perr != nil {
			return nil, perr
		}
		return out, nil
	}
	timeout := r.cfg.RelayTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	type result struct {
		payload []byte
		err     error
	}
	ch := make(chan result, 1)
	corr := r.pool.corr.Add(1)
	m := peerMessage{typ: typ, version: version, payload: payload}
	r.pool.call(d.addr, corr, timeout, func() []byte { return appendPeerMessage(nil, corr, m) }, func(frame []byte, o outcome) {
		if o != outcomeOK {
			ch <- result{err: fmt.Errorf("%w: message %q to %s: %s", ErrPeerUnavailable, typ, d.addr, o)}
			return
		}
		out, err := decodePeerAnswer(frame)
		ch <- result{payload: out, err: err}
	})
	select {
	case res := <-ch:
		if errors.Is(res.err, ErrPeerUnknownType) {
			r.logUnknownOnce(d.addr, typ, res.err)
		}
		return res.payload, res.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: message %q to %s: %w", ErrPeerUnavailable, typ, d.addr, ctx.Err())
	}
}

// logUnknownOnce logs, once per peer address and message type, that
// the peer does not know the type.
func (r *Router) logUnknownOnce(addr, typ string, err error) {
	if _, seen := r.unknownTypes.LoadOrStore(addr+"\x00"+typ, struct{}{}); seen {
		return
	}
	r.log.Info("peer does not know a kproxy message type (a kproxy of another version): such messages to it are not delivered",
		"peer", addr, "type", typ, "reason", err.Error())
}
