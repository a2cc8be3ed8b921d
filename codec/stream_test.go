package codec

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// lenMap maps node n to a proxy host whose length depends on n, so that
// rewritten endpoints grow, shrink or keep their size.
type lenMap struct{ calls int }

func (m *lenMap) Broker(node int32, host string, port int32) (string, int32) {
	m.calls++
	return "kp" + strings.Repeat("x", int(uint32(node)%40)) + ".test", 30000 + node%1000
}

func randStr(r *rand.Rand, max int) string {
	b := make([]byte, r.IntN(max+1))
	for i := range b {
		b[i] = 'a' + byte(r.IntN(26))
	}
	return string(b)
}

func randNullable(r *rand.Rand) *string {
	if r.IntN(3) == 0 {
		return nil
	}
	s := randStr(r, 20)
	return &s
}

func randTags(r *rand.Rand, t *kmsg.Tags) {
	for range r.IntN(3) {
		t.Set(uint32(1+r.IntN(5)), []byte(randStr(r, 8)))
	}
}

// randRecords is an opaque record set: the proxy never reads it.
func randRecords(r *rand.Rand, max int) []byte {
	if r.IntN(4) == 0 {
		return nil
	}
	b := make([]byte, r.IntN(max+1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

type endpoint struct {
	node       int32
	host       string
	port       int32
	rack       *string
	unknownTag bool
}

func randEndpoints(r *rand.Rand) []endpoint {
	if r.IntN(2) == 0 {
		return nil
	}
	eps := make([]endpoint, 1+r.IntN(4))
	for i := range eps {
		eps[i] = endpoint{node: int32(r.IntN(200)), host: randStr(r, 60), port: int32(r.IntN(65536)), rack: randNullable(r), unknownTag: r.IntN(4) == 0}
	}
	return eps
}

func randShareFetch(r *rand.Rand, version int16, maxRecords int) *kmsg.ShareFetchResponse {
	resp := kmsg.NewPtrShareFetchResponse()
	resp.SetVersion(version)
	resp.ThrottleMillis, resp.ErrorCode, resp.ErrorMessage = r.Int32(), int16(r.IntN(3)), randNullable(r)
	resp.AcquisitionLockTimeoutMillis = r.Int32()
	for range r.IntN(4) {
		t := kmsg.NewShareFetchResponseTopic()
		fill(r, t.TopicID[:])
		for range r.IntN(4) {
			p := kmsg.NewShareFetchResponseTopicPartition()
			p.Partition, p.ErrorCode, p.ErrorMessage = r.Int32(), int16(r.IntN(10)), randNullable(r)
			p.AcknowledgeErrorCode, p.AcknowledgeErrorMessage = int16(r.IntN(3)), randNullable(r)
			p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = r.Int32(), r.Int32()
			randTags(r, &p.CurrentLeader.UnknownTags)
			p.Records = randRecords(r, maxRecords)
			for range r.IntN(3) {
				a := kmsg.NewShareFetchResponseTopicPartitionAcquiredRecord()
				a.FirstOffset, a.LastOffset, a.DeliveryCount = r.Int64(), r.Int64(), int16(r.IntN(5))
				randTags(r, &a.UnknownTags)
				p.AcquiredRecords = append(p.AcquiredRecords, a)
			}
			randTags(r, &p.UnknownTags)
			t.Partitions = append(t.Partitions, p)
		}
		randTags(r, &t.UnknownTags)
		resp.Topics = append(resp.Topics, t)
	}
	for _, e := range randEndpoints(r) {
		ep := kmsg.NewShareFetchResponseNodeEndpoint()
		ep.NodeID, ep.Host, ep.Port, ep.Rack = e.node, e.host, e.port, e.rack
		if e.unknownTag {
			ep.UnknownTags.Set(7, []byte("x"))
		}
		resp.NodeEndpoints = append(resp.NodeEndpoints, ep)
	}
	randTags(r, &resp.UnknownTags)
	return resp
}

func randShareAck(r *rand.Rand, version int16) *kmsg.ShareAcknowledgeResponse {
	resp := kmsg.NewPtrShareAcknowledgeResponse()
	resp.SetVersion(version)
	resp.ThrottleMillis, resp.ErrorCode, resp.ErrorMessage = r.Int32(), int16(r.IntN(3)), randNullable(r)
	resp.AcquisitionLockTimeoutMillis = r.Int32()
	for range r.IntN(4) {
		t := kmsg.NewShareAcknowledgeResponseTopic()
		fill(r, t.TopicID[:])
		for range r.IntN(4) {
			p := kmsg.NewShareAcknowledgeResponseTopicPartition()
			p.Partition, p.ErrorCode, p.ErrorMessage = r.Int32(), int16(r.IntN(10)), randNullable(r)
			p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = r.Int32(), r.Int32()
			randTags(r, &p.UnknownTags)
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	for _, e := range randEndpoints(r) {
		ep := kmsg.NewShareAcknowledgeResponseNodeEndpoint()
		ep.NodeID, ep.Host, ep.Port, ep.Rack = e.node, e.host, e.port, e.rack
		resp.NodeEndpoints = append(resp.NodeEndpoints, ep)
	}
	randTags(r, &resp.UnknownTags)
	return resp
}

func randProduce(r *rand.Rand, version int16) *kmsg.ProduceResponse {
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(version)
	resp.ThrottleMillis = r.Int32()
	for range r.IntN(4) {
		t := kmsg.NewProduceResponseTopic()
		t.Topic = randStr(r, 30)
		fill(r, t.TopicID[:])
		for range r.IntN(4) {
			p := kmsg.NewProduceResponseTopicPartition()
			p.Partition, p.ErrorCode, p.BaseOffset = r.Int32(), int16(r.IntN(10)), r.Int64()
			p.LogAppendTime, p.LogStartOffset, p.ErrorMessage = r.Int64(), r.Int64(), randNullable(r)
			for range r.IntN(3) {
				e := kmsg.NewProduceResponseTopicPartitionErrorRecord()
				e.RelativeOffset, e.ErrorMessage = r.Int32(), randNullable(r)
				p.ErrorRecords = append(p.ErrorRecords, e)
			}
			if r.IntN(2) == 0 {
				p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = r.Int32N(100), r.Int32N(100)
			}
			randTags(r, &p.UnknownTags)
			t.Partitions = append(t.Partitions, p)
		}
		randTags(r, &t.UnknownTags)
		resp.Topics = append(resp.Topics, t)
	}
	for _, e := range randEndpoints(r) {
		b := kmsg.NewProduceResponseBroker()
		b.NodeID, b.Host, b.Port, b.Rack = e.node, e.host, e.port, e.rack
		resp.Brokers = append(resp.Brokers, b)
	}
	randTags(r, &resp.UnknownTags)
	return resp
}

// streamed runs StreamEndpoints over frame (size prefix included) read
// through a reader of bufSize bytes, and returns the rewritten frame.
func streamed(key, version int16, frame []byte, bufSize int, m AddrMap) ([]byte, error) {
	var held bytes.Buffer
	r := bufio.NewReaderSize(bytes.NewReader(frame[4:]), bufSize)
	tail, err := StreamEndpoints(nil, key, version, r, len(frame)-4, &held, m, 1<<20)
	if err != nil {
		return nil, err
	}
	if rest, _ := io.ReadAll(r); len(rest) != 0 {
		return nil, fmt.Errorf("%d bytes of the frame left unread", len(rest))
	}
	out := binary.BigEndian.AppendUint32(nil, uint32(held.Len()+len(tail)))
	out = append(out, held.Bytes()...)
	return append(out, tail...), nil
}

// decodedRewrite is what the whole-frame path gives for frame: kmsg's
// decode, rewrite and encode (RewriteResponse), or the frame as it came
// when the response needs no edit.
func decodedRewrite(t *testing.T, key, version int16, corr int32, frame []byte, m AddrMap) []byte {
	t.Helper()
	body, err := ResponseBody(frame[4:], key, version)
	if err != nil {
		t.Fatalf("ResponseBody: %v", err)
	}
	resp, err := RewriteResponse(key, version, body, m, false)
	if err != nil {
		t.Fatalf("RewriteResponse: %v", err)
	}
	if resp == nil {
		return frame
	}
	return AppendResponse(nil, corr, resp)
}

// TestStreamEndpointsMatchesKmsg: for many generated ShareFetch,
// ShareAcknowledge and Produce responses at every streamed version, with
// and without endpoints, with unknown tagged fields everywhere, the
// streamed rewrite equals kmsg's decode-rewrite-encode byte for byte,
// through a reader whose buffer is smaller than most fields.
func TestStreamEndpointsMatchesKmsg(t *testing.T) {
	r := rand.New(rand.NewPCG(34, 1))
	type gen struct {
		key  int16
		from int16
		make func(int16) kmsg.Response
	}
	gens := []gen{
		{KeyShareFetch, 0, func(v int16) kmsg.Response { return randShareFetch(r, v, 3000) }},
		{KeyShareAcknowledge, 0, func(v int16) kmsg.Response { return randShareAck(r, v) }},
		{KeyProduce, 10, func(v int16) kmsg.Response { return randProduce(r, v) }},
	}
	withEndpoints, rewrites := 0, 0
	for _, g := range gens {
		for v := g.from; v <= MaxVersion(g.key); v++ {
			for i := range 150 {
				resp := g.make(v)
				corr := r.Int32()
				frame := AppendResponse(nil, corr, resp)
				m := &lenMap{}
				want := decodedRewrite(t, g.key, v, corr, frame, m)
				for _, bs := range []int{16, 4096} {
					got, err := streamed(g.key, v, frame, bs, &lenMap{})
					if err != nil {
						t.Fatalf("%s v%d #%d (buffer %d): %v", kmsg.NameForKey(g.key), v, i, bs, err)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("%s v%d #%d (buffer %d): streamed rewrite differs from kmsg's:\n got %x\nwant %x", kmsg.NameForKey(g.key), v, i, bs, got, want)
					}
				}
				if m.calls > 0 {
					withEndpoints++
				}
				if !bytes.Equal(want, frame) {
					rewrites++
				}
			}
		}
	}
	// The generator must have exercised the rewrite, not only the
	// pass-through.
	if withEndpoints < 100 || rewrites < 100 {
		t.Fatalf("only %d responses with endpoints, %d changed by the rewrite", withEndpoints, rewrites)
	}
	t.Logf("%d responses carried endpoints, %d were changed", withEndpoints, rewrites)
}

// TestStreamEndpointsTruncated cuts valid frames short at every byte and
// lies about their size: every cut is an error (the frame ended early, or
// a length beyond it), never a panic or a success.
func TestStreamEndpointsTruncated(t *testing.T) {
	r := rand.New(rand.NewPCG(34, 2))
	for i := range 20 {
		resp := randShareFetch(r, 1, 200)
		if len(resp.NodeEndpoints) == 0 {
			ep := kmsg.NewShareFetchResponseNodeEndpoint()
			ep.NodeID, ep.Host, ep.Port = 1, "broker", 9093
			resp.NodeEndpoints = append(resp.NodeEndpoints, ep)
		}
		frame := AppendResponse(nil, 7, resp)
		body := frame[4:]
		for cut := range len(body) {
			var held bytes.Buffer
			// The frame announces its full size but the stream ends at cut.
			rd := bufio.NewReaderSize(bytes.NewReader(body[:cut]), 16)
			_, err := StreamEndpoints(nil, KeyShareFetch, 1, rd, len(body), &held, &lenMap{}, 1<<20)
			if err == nil {
				t.Fatalf("#%d: a frame cut at %d of %d bytes was accepted", i, cut, len(body))
			}
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("#%d cut at %d: %v, want io.ErrUnexpectedEOF", i, cut, err)
			}
			// The frame announces only cut bytes: the structure runs past it.
			rd = bufio.NewReaderSize(bytes.NewReader(body), 16)
			_, err = StreamEndpoints(nil, KeyShareFetch, 1, rd, cut, &held, &lenMap{}, 1<<20)
			if err == nil {
				t.Fatalf("#%d: a frame announcing %d of its %d bytes was accepted", i, cut, len(body))
			}
			if !errors.Is(err, ErrMalformedResponse) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("#%d announcing %d: %v, want a malformed-response error", i, cut, err)
			}
		}
	}
}

// TestStreamEndpointsLyingLengths: a record set or tagged field claiming
// more bytes than the frame has is refused as malformed before any of it
// is read, and the end beyond maxTail is refused.
func TestStreamEndpointsLyingLengths(t *testing.T) {
	resp := kmsg.NewPtrShareFetchResponse()
	resp.SetVersion(1)
	tp := kmsg.NewShareFetchResponseTopic()
	p := kmsg.NewShareFetchResponseTopicPartition()
	p.Records = make([]byte, 100)
	tp.Partitions = append(tp.Partitions, p)
	resp.Topics = append(resp.Topics, tp)
	frame := AppendResponse(nil, 1, resp)
	i := bytes.Index(frame, append([]byte{101}, make([]byte, 100)...))
	if i < 0 {
		t.Fatal("records length not found in the encoded frame")
	}
	lie := bytes.Clone(frame)
	lie[i] = 0x7f // 126 bytes of records in a frame that has fewer left
	var held bytes.Buffer
	_, err := StreamEndpoints(nil, KeyShareFetch, 1, bufio.NewReader(bytes.NewReader(lie[4:])), len(lie)-4, &held, &lenMap{}, 1<<20)
	if !errors.Is(err, ErrMalformedResponse) || !strings.Contains(err.Error(), "beyond the frame") {
		t.Fatalf("lying records length: %v", err)
	}
	if held.Len() > i {
		t.Fatalf("%d bytes held: the lying record set was read (it starts at %d)", held.Len(), i)
	}
	huge := bytes.Clone(frame)
	huge = append(huge[:i], append(binary.AppendUvarint(nil, 1<<40), huge[i+1:]...)...)
	_, err = StreamEndpoints(nil, KeyShareFetch, 1, bufio.NewReader(bytes.NewReader(huge[4:])), len(huge)-4, &held, &lenMap{}, 1<<20)
	if !errors.Is(err, ErrMalformedResponse) {
		t.Fatalf("a 1 TiB record set: %v", err)
	}
	// An end longer than maxTail: endpoints padded with a large tag.
	resp.UnknownTags.Set(3, make([]byte, 5000))
	frame = AppendResponse(nil, 1, resp)
	_, err = StreamEndpoints(nil, KeyShareFetch, 1, bufio.NewReader(bytes.NewReader(frame[4:])), len(frame)-4, &held, &lenMap{}, 1000)
	if !errors.Is(err, ErrMalformedResponse) || !strings.Contains(err.Error(), "over the 1000 byte limit") {
		t.Fatalf("an end over maxTail: %v", err)
	}
}

// FuzzStreamEndpoints feeds arbitrary frames to the streamed rewrite:
// no panic, nothing read past the announced size, and when the frame is
// one kmsg decodes and re-encodes to the same bytes, the streamed rewrite
// equals kmsg's.
func FuzzStreamEndpoints(f *testing.F) {
	r := rand.New(rand.NewPCG(34, 3))
	for range 8 {
		f.Add(int16(KeyShareFetch), int16(1), AppendResponse(nil, 1, randShareFetch(r, 1, 50))[4:])
		f.Add(int16(KeyShareAcknowledge), int16(1), AppendResponse(nil, 1, randShareAck(r, 1))[4:])
		f.Add(int16(KeyProduce), int16(11), AppendResponse(nil, 1, randProduce(r, 11))[4:])
	}
	f.Fuzz(func(t *testing.T, key, version int16, body []byte) {
		if !Streamable(key, version) {
			return
		}
		rd := bufio.NewReaderSize(bytes.NewReader(append(bytes.Clone(body), 0xff, 0xff)), 16)
		var held bytes.Buffer
		tail, err := StreamEndpoints(nil, key, version, rd, len(body), &held, &lenMap{}, 1<<20)
		if err != nil {
			return
		}
		if rd.Buffered() < 2 {
			if rest, _ := io.ReadAll(rd); len(rest) != 2 {
				t.Fatalf("read past the frame: %d of the 2 bytes after it left", len(rest))
			}
		}
		frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
		frame = append(frame, body...)
		resp := kmsg.ResponseForKey(key)
		resp.SetVersion(version)
		b, err := ResponseBody(frame[4:], key, version)
		if err != nil || resp.ReadFrom(b) != nil {
			return
		}
		corr := int32(binary.BigEndian.Uint32(body))
		if !bytes.Equal(AppendResponse(nil, corr, resp), frame) {
			return // not canonical: kmsg's encoding differs already
		}
		want := decodedRewrite(t, key, version, corr, frame, &lenMap{})
		got := binary.BigEndian.AppendUint32(nil, uint32(held.Len()+len(tail)))
		got = append(append(got, held.Bytes()...), tail...)
		if !bytes.Equal(got, want) {
			t.Fatalf("streamed rewrite differs from kmsg's:\n got %x\nwant %x", got, want)
		}
	})
}

func fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}
