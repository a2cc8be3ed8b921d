package codec

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Streamed rewriting of responses that carry records or many partitions
// and broker endpoints (Produce v10+, ShareFetch, ShareAcknowledge: their
// EditIfEndpoints rows). The endpoints sit at the end of the body, after
// every partition (and, in ShareFetch, after the records), while the
// frame's size prefix, which their rewrite changes, comes first. So the
// bytes before the endpoints cannot leave before the endpoints are read;
// StreamEndpoints hands them, as they arrive and in chunks no larger than
// the reader's buffer, to a writer the caller chooses (the proxy spills
// them to a file past a small bound), and returns only the rewritten
// end of the body, which is small. The caller then sends the new size,
// the held bytes, and the end.

// ErrMalformedResponse wraps what StreamEndpoints finds wrong in a
// response's encoding (a length beyond the frame, a bad varint, bytes
// left over).
var ErrMalformedResponse = errors.New("malformed response")

// Streamable reports whether responses to key at version are rewritten by
// StreamEndpoints rather than decoded whole: those RouteFor edits only
// when they carry endpoints (Produce v10+, ShareFetch, ShareAcknowledge).
func Streamable(key, version int16) bool {
	switch key {
	case KeyProduce, KeyShareFetch, KeyShareAcknowledge:
		d := RouteFor(key, version, false)
		return d.Route == Rewrite && d.Edit == EditIfEndpoints
	}
	return false
}

// StreamEndpoints reads one response frame to key at version from r:
// size bytes, the frame after its size prefix (the response header
// included). Every byte before the broker endpoints is written to hold
// as read, unchanged; the rest, at most maxTail bytes, is returned with
// the endpoints' addresses replaced through m (as RewriteResponse does).
// When the response carries no endpoints the returned end is the bytes
// as they came. The held bytes plus the end are the rewritten frame,
// equal to decoding the response with kmsg, rewriting it and encoding
// it again. The end is read into dst's array when it fits (and returned
// there when it needs no rewrite). Errors wrap ErrMalformedResponse, io.ErrUnexpectedEOF (the
// frame ended early), or hold's or r's error.
func StreamEndpoints(dst []byte, key, version int16, r *bufio.Reader, size int, hold io.Writer, m AddrMap, maxTail int) (tail []byte, err error) {
	if !Streamable(key, version) {
		return nil, fmt.Errorf("%s v%d responses are not streamed", kmsg.NameForKey(key), version)
	}
	f := frameReader{r: r, left: size, hold: hold}
	f.fixed(4) // correlation id
	f.tags()   // both keys' responses are flexible here: header tags
	switch key {
	case KeyProduce:
		f.produceTopics(version)
		f.fixed(4) // throttle
	default:
		f.shareBody(key, version)
	}
	if f.err != nil {
		return nil, f.wrap(key, version)
	}
	if f.left > maxTail {
		return nil, fmt.Errorf("%w: %s v%d response: %d bytes after its partitions, over the %d byte limit", ErrMalformedResponse, kmsg.NameForKey(key), version, f.left, maxTail)
	}
	end := dst[:0]
	if cap(end) < f.left {
		end = make([]byte, f.left)
	}
	end = end[:f.left]
	if _, err := io.ReadFull(r, end); err != nil {
		f.fail(err)
		return nil, f.wrap(key, version)
	}
	var out []byte
	if key == KeyProduce {
		out, err = rewriteProduceTags(end, m)
	} else {
		out, err = rewriteEndpointsTail(end, m)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s v%d response: %w", ErrMalformedResponse, kmsg.NameForKey(key), version, err)
	}
	return out, nil
}

// frameReader walks a response frame from a bufio.Reader, copying every
// byte it passes to hold. It never holds more than a varint or a fixed
// field itself. The first error sticks.
type frameReader struct {
	r    *bufio.Reader
	left int // frame bytes not yet read
	hold io.Writer
	err  error
}

func (f *frameReader) fail(err error) {
	if f.err == nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		f.err = err
	}
}

func (f *frameReader) wrap(key, version int16) error {
	return fmt.Errorf("%s v%d response: %w", kmsg.NameForKey(key), version, f.err)
}

func (f *frameReader) malformed(format string, args ...any) {
	f.fail(fmt.Errorf("%w: %s", ErrMalformedResponse, fmt.Sprintf(format, args...)))
}

// fixed passes a fixed-width field of n bytes.
func (f *frameReader) fixed(n int) { f.copyN(n) }

// pass writes b, peeked from r, to hold and consumes it.
func (f *frameReader) pass(b []byte) {
	if _, err := f.hold.Write(b); err != nil {
		f.fail(err)
		return
	}
	f.r.Discard(len(b))
	f.left -= len(b)
}

// copyN passes n bytes in chunks of what r has buffered: a record set is
// never held whole.
func (f *frameReader) copyN(n int) {
	if f.err != nil {
		return
	}
	if n > f.left {
		f.malformed("a %d byte field beyond the frame's %d remaining bytes", n, f.left)
		return
	}
	for n > 0 && f.err == nil {
		if f.r.Buffered() == 0 {
			if _, err := f.r.Peek(1); err != nil {
				f.fail(err)
				return
			}
		}
		b, _ := f.r.Peek(min(n, f.r.Buffered()))
		f.pass(b)
		n -= len(b)
	}
}

// uvarint passes an unsigned varint and returns its value.
func (f *frameReader) uvarint() uint64 {
	if f.err != nil {
		return 0
	}
	b, err := f.r.Peek(min(f.left, binary.MaxVarintLen64))
	if len(b) == 0 && err == nil {
		f.malformed("a varint beyond the frame")
		return 0
	}
	v, n := binary.Uvarint(b)
	if n <= 0 {
		if err != nil {
			f.fail(err)
		} else {
			f.malformed("bad varint")
		}
		return 0
	}
	f.pass(b[:n])
	return v
}

// compactLen passes a compact length (stored +1) and returns it; null
// (0) is returned as 0.
func (f *frameReader) compactLen() int {
	v := f.uvarint()
	if v == 0 || f.err != nil {
		return 0
	}
	if v-1 > uint64(f.left) {
		f.malformed("a length of %d beyond the frame's %d remaining bytes", v-1, f.left)
		return 0
	}
	return int(v - 1)
}

// compactBytes passes a compact (nullable) string or bytes field.
func (f *frameReader) compactBytes() { f.copyN(f.compactLen()) }

// tags passes a tagged-field section.
func (f *frameReader) tags() {
	for n := f.uvarint(); n > 0 && f.err == nil; n-- {
		f.uvarint() // tag
		size := f.uvarint()
		if size > uint64(f.left) {
			f.malformed("a tagged field of %d bytes beyond the frame's %d remaining bytes", size, f.left)
			return
		}
		f.copyN(int(size))
	}
}

// array passes a compact array, calling each for every element.
func (f *frameReader) array(each func()) {
	for n := f.compactLen(); n > 0 && f.err == nil; n-- {
		each()
	}
}

// produceTopics passes a Produce response's topics (flexible versions).
func (f *frameReader) produceTopics(version int16) {
	f.array(func() {
		if version >= 13 {
			f.fixed(16) // topic id
		} else {
			f.compactBytes() // topic name
		}
		f.array(func() {
			f.fixed(4 + 2 + 8 + 8 + 8) // partition, error, base offset, append time, log start
			f.array(func() {           // record errors
				f.fixed(4)
				f.compactBytes()
				f.tags()
			})
			f.compactBytes() // error message
			f.tags()         // CurrentLeader (tag 0): id and epoch, no address
		})
		f.tags()
	})
}

// shareBody passes a ShareFetch or ShareAcknowledge response up to its
// NodeEndpoints (KIP-932; both flexible from v0).
func (f *frameReader) shareBody(key, version int16) {
	f.fixed(4 + 2)   // throttle, error code
	f.compactBytes() // error message
	if (key == KeyShareFetch && version >= 1) || (key == KeyShareAcknowledge && version >= 2) {
		f.fixed(4) // acquisition lock timeout
	}
	f.array(func() {
		f.fixed(16) // topic id
		f.array(func() {
			f.fixed(4 + 2)   // partition, error code
			f.compactBytes() // error message
			if key == KeyShareFetch {
				f.fixed(2)       // acknowledge error code
				f.compactBytes() // acknowledge error message
			}
			f.fixed(4 + 4) // current leader: id and epoch
			f.tags()
			if key == KeyShareFetch {
				f.compactBytes() // records, in chunks
				f.array(func() { // acquired records
					f.fixed(8 + 8 + 2)
					f.tags()
				})
			}
			f.tags()
		})
		f.tags()
	})
}

// rewriteEndpointsTail rewrites the end of a share response: its
// NodeEndpoints array, then the top-level tags, which pass unchanged.
// b must be consumed exactly.
func rewriteEndpointsTail(b []byte, m AddrMap) ([]byte, error) {
	if len(b) > 0 && b[0] <= 1 {
		// No endpoints (an empty or null array): the end goes as it came.
		if t, err := skipTags(b[1:]); err != nil || 1+t != len(b) {
			return nil, errTrailing(b, err)
		}
		return b, nil
	}
	out, n, err := rewriteEndpoints(nil, b, m)
	if err != nil {
		return nil, err
	}
	t, err := skipTags(b[n:])
	if err != nil || n+t != len(b) {
		return nil, errTrailing(b, err)
	}
	return append(out, b[n:]...), nil
}

func errTrailing(b []byte, err error) error {
	if err != nil {
		return fmt.Errorf("top-level tags: %w", err)
	}
	return fmt.Errorf("bytes after the top-level tags (%d byte end)", len(b))
}

// rewriteProduceTags rewrites a Produce response's top-level tagged
// fields: NodeEndpoints (tag 0, KIP-951) is rewritten, the others pass.
// A response without tag 0 comes back as it was.
func rewriteProduceTags(b []byte, m AddrMap) ([]byte, error) {
	num, i := binary.Uvarint(b)
	if i <= 0 {
		return nil, errors.New("top-level tag count")
	}
	var out []byte
	for range num {
		tag, n := binary.Uvarint(b[i:])
		if n <= 0 {
			return nil, errors.New("tag number")
		}
		size, n2 := binary.Uvarint(b[i+n:])
		if n2 <= 0 || size > uint64(len(b)-i-n-n2) {
			return nil, fmt.Errorf("tag %d: bad size", tag)
		}
		start, data := i, i+n+n2
		i = data + int(size)
		if tag != 0 {
			if out != nil {
				out = append(out, b[start:i]...)
			}
			continue
		}
		eps, used, err := rewriteEndpoints(nil, b[data:i], m)
		if err != nil {
			return nil, fmt.Errorf("NodeEndpoints: %w", err)
		}
		if used != int(size) {
			return nil, errors.New("NodeEndpoints: bytes after the array")
		}
		out = append(out, b[:start]...)
		out = binary.AppendUvarint(out, tag)
		out = binary.AppendUvarint(out, uint64(len(eps)))
		out = append(out, eps...)
	}
	if i != len(b) {
		return nil, errTrailing(b, nil)
	}
	if out == nil {
		return b, nil
	}
	return out, nil
}

// rewriteEndpoints appends to dst the compact array of node endpoints at
// the start of b ({NodeID int32, Host string, Port int32, Rack nullable
// string, tags}, as in ShareFetch, ShareAcknowledge, Produce and Fetch)
// with each host and port replaced through m, and returns the bytes of b
// it used. A null array stays null.
func rewriteEndpoints(dst, b []byte, m AddrMap) (out []byte, used int, err error) {
	s := skimmer{b: b, ok: true}
	count := s.uvarint()
	if !s.ok {
		return nil, 0, errors.New("NodeEndpoints: array length")
	}
	dst = binary.AppendUvarint(dst, count)
	if count > 0 {
		count--
	}
	for ; count > 0 && s.ok; count-- {
		if len(s.b) < 4 {
			s.ok = false
			break
		}
		node := int32(binary.BigEndian.Uint32(s.b))
		s.skip(4)
		hl := s.compactLen()
		if !s.ok || len(s.b) < hl {
			s.ok = false
			break
		}
		host := string(s.b[:hl])
		s.skip(hl)
		if len(s.b) < 4 {
			s.ok = false
			break
		}
		port := int32(binary.BigEndian.Uint32(s.b))
		s.skip(4)
		rest := s.b
		s.skip(s.compactLen()) // rack
		s.skipTags()
		if !s.ok {
			break
		}
		ph, pp := m.Broker(node, host, port)
		dst = binary.BigEndian.AppendUint32(dst, uint32(node))
		dst = binary.AppendUvarint(dst, uint64(len(ph))+1)
		dst = append(dst, ph...)
		dst = binary.BigEndian.AppendUint32(dst, uint32(pp))
		dst = append(dst, rest[:len(rest)-len(s.b)]...)
	}
	if !s.ok {
		return nil, 0, errors.New("NodeEndpoints: truncated or bad lengths")
	}
	return dst, len(b) - len(s.b), nil
}
