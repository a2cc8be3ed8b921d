package loadgen

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// maxKey bounds the api keys a Conn keeps versions for.
const maxKey = 100

// ErrClosed is the error of requests on a Conn that closed or failed.
var ErrClosed = errors.New("loadgen: connection closed")

// DialConfig configures Dial. The zero value dials plaintext TCP.
type DialConfig struct {
	// TLS, when set, speaks TLS over the connection.
	TLS *tls.Config
	// ClientID is the client id of every request header; default
	// "kbench".
	ClientID string
}

// Conn is one Kafka connection shared by any number of goroutines. Each
// request gets the next correlation id and is appended to a write buffer
// that one writer goroutine flushes (requests queued while a write is in
// progress go out together in the next one); one reader goroutine matches
// the answers, which a broker sends in request order, to their callbacks.
// Requests are sent at the highest version both kmsg and the peer speak,
// learnt from ApiVersions at Dial.
type Conn struct {
	c        net.Conn               // immutable
	format   *kmsg.RequestFormatter // immutable
	versions [maxKey]int16          // immutable after Dial: -1 where the peer lacks the key

	mu      sync.Mutex
	out     []byte // guarded by mu: encoded requests the writer has not taken
	scratch []byte // guarded by mu: the request being encoded
	queue   []call // guarded by mu: requests sent and not answered, in order
	corr    int32  // guarded by mu: the last correlation id used
	err     error  // guarded by mu: set once the connection failed
	kick    chan struct{}
	readEnd chan struct{} // closed when the reader exits
}

// call is one request awaiting its answer.
type call struct {
	corr    int32
	key     int16
	version int16
	req     kmsg.Request
	done    func(kmsg.Response, error)
	raw     func(n int, err error) // DoRaw: frame size only, nothing decoded
}

// Dial connects to addr and learns the versions it speaks.
func Dial(ctx context.Context, addr string, cfg DialConfig) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	if cfg.TLS != nil {
		tc := tls.Client(nc, cfg.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
		}
		nc = tc
	}
	if cfg.ClientID == "" {
		cfg.ClientID = "kbench"
	}
	c := &Conn{
		c:       nc,
		format:  kmsg.NewRequestFormatter(kmsg.FormatterClientID(cfg.ClientID)),
		kick:    make(chan struct{}, 1),
		readEnd: make(chan struct{}),
	}
	for k := range c.versions {
		c.versions[k] = -1
	}
	c.versions[kmsg.ApiVersions] = 3
	go c.writeLoop()
	go c.readLoop()
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName, req.ClientSoftwareVersion = "kbench", "0"
	resp, err := Request(ctx, c, req)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("ApiVersions from %s: %w", addr, err)
	}
	av := resp.(*kmsg.ApiVersionsResponse)
	if av.ErrorCode != 0 {
		c.Close()
		return nil, fmt.Errorf("ApiVersions from %s: error code %d", addr, av.ErrorCode)
	}
	// The writer reads versions only for requests queued after this:
	// the mutex taken by Do orders these writes before those reads.
	c.mu.Lock()
	for _, k := range av.ApiKeys {
		if k.ApiKey < 0 || int(k.ApiKey) >= maxKey {
			continue
		}
		r := kmsg.RequestForKey(k.ApiKey)
		if r == nil {
			continue
		}
		c.versions[k.ApiKey] = min(k.MaxVersion, r.MaxVersion())
	}
	c.mu.Unlock()
	return c, nil
}

// Close closes the connection; requests in flight fail with ErrClosed.
func (c *Conn) Close() error {
	err := c.c.Close()
	<-c.readEnd
	return err
}

// Version is the version requests of key are sent at, -1 if the peer
// does not speak key.
func (c *Conn) Version(key int16) int16 {
	if key < 0 || int(key) >= maxKey {
		return -1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.versions[key]
}

// Do implements Doer: it sends req at the connection's version and
// decodes the answer.
func (c *Conn) Do(req kmsg.Request, done func(kmsg.Response, error)) {
	c.send(call{req: req, done: done})
}

// DoRaw sends req and reports the size of its answer without decoding
// it, for large answers (fetches) whose content does not matter.
func (c *Conn) DoRaw(req kmsg.Request, done func(n int, err error)) {
	c.send(call{req: req, raw: done})
}

func (c *Conn) send(cl call) {
	key := cl.req.Key()
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		cl.fail(err)
		return
	}
	if key < 0 || int(key) >= maxKey || c.versions[key] < 0 {
		c.mu.Unlock()
		cl.fail(fmt.Errorf("loadgen: the peer does not speak %s", kmsg.NameForKey(key)))
		return
	}
	cl.req.SetVersion(c.versions[key])
	c.corr++
	cl.corr, cl.key, cl.version = c.corr, key, c.versions[key]
	// AppendRequest writes the size at the start of the slice it is
	// given, so each request is encoded alone and then appended.
	c.scratch = c.format.AppendRequest(c.scratch[:0], cl.req, cl.corr)
	c.out = append(c.out, c.scratch...)
	c.queue = append(c.queue, cl)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (cl call) fail(err error) {
	if cl.raw != nil {
		cl.raw(0, err)
	} else {
		cl.done(nil, err)
	}
}

// writeLoop writes what send queued until the connection fails. It owns
// spare, the buffer it swaps with out.
func (c *Conn) writeLoop() {
	var spare []byte
	for {
		select {
		case <-c.kick:
		case <-c.readEnd:
			return
		}
		c.mu.Lock()
		buf := c.out
		c.out = spare[:0]
		c.mu.Unlock()
		if len(buf) == 0 {
			spare = buf
			continue
		}
		if _, err := c.c.Write(buf); err != nil {
			c.c.Close() // the reader fails every call
			return
		}
		spare = buf
	}
}

// readLoop matches answers to calls in order; on any error it fails every
// call in flight and every later one.
func (c *Conn) readLoop() {
	defer close(c.readEnd)
	br := bufio.NewReaderSize(c.c, 64<<10)
	var discard []byte // frames of DoRaw calls land here; owned by the reader
	err := func() error {
		var size [4]byte
		for {
			if _, err := io.ReadFull(br, size[:]); err != nil {
				return err
			}
			n := int(binary.BigEndian.Uint32(size[:]))
			if n < 4 || n > codec.DefaultMaxFrame {
				return fmt.Errorf("loadgen: %d byte response frame", n)
			}
			c.mu.Lock()
			if len(c.queue) == 0 {
				c.mu.Unlock()
				return errors.New("loadgen: answer to no request")
			}
			cl := c.queue[0]
			c.queue[0] = call{}
			c.queue = c.queue[1:]
			c.mu.Unlock()
			var frame []byte
			if cl.raw != nil {
				if cap(discard) < n {
					discard = make([]byte, n)
				}
				frame = discard[:n]
			} else {
				frame = make([]byte, n) // the decoded answer aliases it
			}
			if _, err := io.ReadFull(br, frame); err != nil {
				cl.fail(err)
				return err
			}
			if corr := int32(binary.BigEndian.Uint32(frame)); corr != cl.corr {
				err := fmt.Errorf("loadgen: answer for correlation id %d, expected %d", corr, cl.corr)
				cl.fail(err)
				return err
			}
			if cl.raw != nil {
				cl.raw(4+n, nil)
				continue
			}
			body, err := codec.ResponseBody(frame, cl.key, cl.version)
			if err != nil {
				cl.fail(err)
				return err
			}
			resp := cl.req.ResponseKind()
			resp.SetVersion(cl.version)
			if err := resp.ReadFrom(body); err != nil {
				err = fmt.Errorf("loadgen: decoding %s v%d answer: %w", kmsg.NameForKey(cl.key), cl.version, err)
				cl.fail(err)
				return err
			}
			cl.done(resp, nil)
		}
	}()
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		err = ErrClosed
	}
	c.c.Close()
	c.mu.Lock()
	c.err = err
	q := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, cl := range q {
		cl.fail(err)
	}
}
