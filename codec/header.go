package codec

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultMaxFrame is the default limit on one request or response frame,
// the same as a broker's socket.request.max.bytes.
const DefaultMaxFrame = 100 << 20

// minRequestHeader is the fixed part of every request header: api key,
// api version and correlation id.
const minRequestHeader = 8

// keyControlledShutdown is ControlledShutdown's api key. Its v0 request
// header (request header v0) is the only one without a client id.
const keyControlledShutdown = int16(kmsg.ControlledShutdown)

// Framing errors. Each one means the connection must be closed.
var (
	ErrFrameTooLarge = errors.New("frame larger than the limit")
	ErrFrameNegative = errors.New("negative frame size")
	ErrFrameTooSmall = errors.New("frame too small for a request header")
	ErrTLS           = errors.New("TLS sent to a plaintext listener")
	ErrHTTP          = errors.New("HTTP sent to a Kafka listener")
	ErrUnknownAPI    = errors.New("unknown api key")
	ErrBadVersion    = errors.New("unsupported api version")
	ErrTruncated     = errors.New("truncated header")
)

// CheckSize validates the 4-byte size prefix of a frame, returning the body
// length. The first bytes of a TLS ClientHello or an HTTP request decode to
// sizes over any sane limit; they are recognised and named.
func CheckSize(prefix [4]byte, max int32) (int32, error) {
	if prefix[0] == 0x16 && prefix[1] == 0x03 && prefix[2] <= 0x04 {
		return 0, ErrTLS
	}
	switch string(prefix[:]) {
	case "GET ", "POST", "PUT ", "HEAD", "PRI ":
		return 0, ErrHTTP
	}
	n := int32(binary.BigEndian.Uint32(prefix[:]))
	switch {
	case n < 0:
		return 0, fmt.Errorf("%w: %d", ErrFrameNegative, n)
	case n > max:
		return 0, fmt.Errorf("%w: %d > %d bytes", ErrFrameTooLarge, n, max)
	case n < minRequestHeader:
		return 0, fmt.Errorf("%w: %d bytes", ErrFrameTooSmall, n)
	}
	return n, nil
}

// RequestHeader is the parsed header of one request.
type RequestHeader struct {
	Key           int16
	Version       int16
	CorrelationID int32
	// ClientID aliases the input buffer; copy it to keep it.
	ClientID []byte
	// Len is the header's length in bytes; the body starts there.
	Len int
	// Flexible is whether the request body is flexible (KIP-482) at
	// this version.
	Flexible bool
}

// FixedHeader reads the api key, version and correlation id from the first
// eight bytes of a request. It is enough to know how many more header bytes
// to read (see HeaderNeed).
func FixedHeader(b []byte) (key, version int16, corr int32) {
	return int16(binary.BigEndian.Uint16(b)), int16(binary.BigEndian.Uint16(b[2:])), int32(binary.BigEndian.Uint32(b[4:]))
}

// ParseRequestHeader parses a request header from the start of b, which
// holds the frame after its size prefix (possibly only its beginning).
// It returns ErrTruncated when b is too short to hold the whole header,
// in which case the caller may read more and retry.
func ParseRequestHeader(b []byte) (RequestHeader, error) {
	var h RequestHeader
	if len(b) < minRequestHeader {
		return h, ErrTruncated
	}
	h.Key, h.Version, h.CorrelationID = FixedHeader(b)
	flexible, ok := Flexible(h.Key, h.Version)
	if !ok {
		return h, fmt.Errorf("%w %d", ErrUnknownAPI, h.Key)
	}
	if h.Version < 0 {
		return h, fmt.Errorf("%w: %s v%d", ErrBadVersion, kmsg.NameForKey(h.Key), h.Version)
	}
	h.Flexible = flexible
	i := minRequestHeader
	if h.Key == keyControlledShutdown && h.Version == 0 {
		h.Len = i
		return h, nil
	}
	if len(b) < i+2 {
		return h, ErrTruncated
	}
	idLen := int(int16(binary.BigEndian.Uint16(b[i:])))
	i += 2
	if idLen > 0 {
		if len(b) < i+idLen {
			return h, ErrTruncated
		}
		h.ClientID = b[i : i+idLen]
		i += idLen
	} else if idLen < -1 {
		return h, fmt.Errorf("invalid client id length %d", idLen)
	}
	if flexible {
		n, err := skipTags(b[i:])
		if err != nil {
			return h, err
		}
		i += n
	}
	h.Len = i
	return h, nil
}

// skipTags returns the length of the tagged-field section at the start of
// b.
func skipTags(b []byte) (int, error) {
	num, n := binary.Uvarint(b)
	if n == 0 {
		return 0, ErrTruncated
	}
	if n < 0 || num > 1<<16 {
		return 0, errors.New("invalid tagged field count")
	}
	i := n
	for range num {
		_, n := binary.Uvarint(b[i:])
		if n <= 0 {
			return 0, ErrTruncated
		}
		i += n
		size, n := binary.Uvarint(b[i:])
		if n <= 0 {
			return 0, ErrTruncated
		}
		i += n
		if size > uint64(len(b)-i) {
			return 0, ErrTruncated
		}
		i += int(size)
	}
	return i, nil
}

// Flexible reports whether key at version uses flexible (tagged) encoding,
// and whether the key is known at all.
func Flexible(key, version int16) (flexible, known bool) {
	if key < 0 || int(key) >= len(flexibleFrom) {
		return false, false
	}
	from := flexibleFrom[key]
	if from == unknownKey {
		return false, false
	}
	return version >= from, true
}

// ResponseHeaderFlexible reports whether the response header for key at
// version carries a tag section after the correlation id. Flexible
// responses do, except ApiVersions, whose response header is always v0 so
// that a client can parse it before it knows the broker's versions.
func ResponseHeaderFlexible(key, version int16) bool {
	f, _ := Flexible(key, version)
	return f && key != KeyApiVersions
}

// apiKeys bounds the api keys kproxy's per-key tables hold: every key
// kmsg knows is below it.
const apiKeys = 100

const (
	unknownKey = int16(-1)
	never      = int16(1 << 14)
)

// flexibleFrom is, per api key, the first flexible version, computed once
// from kmsg so the per-request lookup does not allocate.
var flexibleFrom = func() []int16 {
	t := make([]int16, apiKeys)
	for k := range t {
		t[k] = unknownKey
		r := kmsg.RequestForKey(int16(k))
		if r == nil {
			continue
		}
		t[k] = never
		for v := int16(0); v <= r.MaxVersion(); v++ {
			r.SetVersion(v)
			if r.IsFlexible() {
				t[k] = v
				break
			}
		}
	}
	return t
}()

// MaxVersion returns the highest version of key that kmsg can parse, or -1
// for an unknown key.
func MaxVersion(key int16) int16 {
	if key < 0 || int(key) >= len(maxVersions) {
		return -1
	}
	return maxVersions[key]
}

var maxVersions = func() []int16 {
	t := make([]int16, apiKeys)
	for k := range t {
		t[k] = -1
		if r := kmsg.RequestForKey(int16(k)); r != nil {
			t[k] = r.MaxVersion()
		}
	}
	return t
}()

// AppendResponse appends a whole response frame (size, header, body) for
// resp, answering the request with correlation id corr.
func AppendResponse(dst []byte, corr int32, resp kmsg.Response) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(corr))
	if ResponseHeaderFlexible(resp.Key(), resp.GetVersion()) {
		dst = append(dst, 0)
	}
	dst = resp.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

// ResponseBody strips the response header from b (the frame after its
// size prefix) for a response to key at version.
func ResponseBody(b []byte, key, version int16) ([]byte, error) {
	if len(b) < 4 {
		return nil, ErrTruncated
	}
	b = b[4:]
	if ResponseHeaderFlexible(key, version) {
		n, err := skipTags(b)
		if err != nil {
			return nil, fmt.Errorf("response header: %w", err)
		}
		b = b[n:]
	}
	return b, nil
}
