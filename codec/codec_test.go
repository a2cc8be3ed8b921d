package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fakeMap maps node n to proxy.test:30000+n and records what it learned.
type fakeMap struct{ learned map[int32]string }

func (m *fakeMap) Broker(node int32, host string, port int32) (string, int32) {
	if m.learned == nil {
		m.learned = map[int32]string{}
	}
	m.learned[node] = host + ":" + strconv.Itoa(int(port))
	return "proxy.test", 30000 + node
}

// requestFrame encodes req as a client would, returning the frame after
// its size prefix.
func requestFrame(req kmsg.Request, clientID string) []byte {
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID(clientID))
	return f.AppendRequest(nil, req, 42)[4:]
}

func TestParseRequestHeaderEveryKeyAndVersion(t *testing.T) {
	for key := int16(0); key < 100; key++ {
		req := kmsg.RequestForKey(key)
		if req == nil {
			continue
		}
		for v := int16(0); v <= req.MaxVersion(); v++ {
			req := kmsg.RequestForKey(key)
			req.SetVersion(v)
			b := requestFrame(req, "client-"+strconv.Itoa(int(key)))
			h, err := ParseRequestHeader(b)
			if err != nil {
				t.Fatalf("%s v%d: %v", kmsg.NameForKey(key), v, err)
			}
			if h.Key != key || h.Version != v || h.CorrelationID != 42 || h.Flexible != req.IsFlexible() {
				t.Fatalf("%s v%d: parsed %+v", kmsg.NameForKey(key), v, h)
			}
			if !(key == 7 && v == 0) && string(h.ClientID) != "client-"+strconv.Itoa(int(key)) {
				t.Fatalf("%s v%d: client id %q", kmsg.NameForKey(key), v, h.ClientID)
			}
			if key == 7 && v == 0 {
				continue // kmsg writes ControlledShutdown v0 without a body
			}
			// The body starts where the header ends: it decodes.
			back := kmsg.RequestForKey(key)
			back.SetVersion(v)
			if err := back.ReadFrom(b[h.Len:]); err != nil {
				t.Fatalf("%s v%d: body after header does not decode: %v", kmsg.NameForKey(key), v, err)
			}
			// Every strict prefix of the header is reported truncated.
			for i := range h.Len {
				if _, err := ParseRequestHeader(b[:i]); !errors.Is(err, ErrTruncated) {
					t.Fatalf("%s v%d: %d-byte prefix: got %v, want ErrTruncated", kmsg.NameForKey(key), v, i, err)
				}
			}
		}
	}
}

func TestCheckSize(t *testing.T) {
	for _, tc := range []struct {
		prefix [4]byte
		want   error
	}{
		{[4]byte{0, 0, 0, 8}, nil},
		{[4]byte{0, 0, 0, 7}, ErrFrameTooSmall},
		{[4]byte{0xff, 0xff, 0xff, 0xff}, ErrFrameNegative},
		{[4]byte{0x10, 0, 0, 0}, ErrFrameTooLarge},
		{[4]byte{0x16, 0x03, 0x01, 0x00}, ErrTLS},
		{[4]byte{'G', 'E', 'T', ' '}, ErrHTTP},
	} {
		_, err := CheckSize(tc.prefix, DefaultMaxFrame)
		if !errors.Is(err, tc.want) {
			t.Errorf("%x: got %v, want %v", tc.prefix, err, tc.want)
		}
	}
}

// responseFrame encodes resp as a broker would (after the size prefix).
func responseFrame(resp kmsg.Response) []byte {
	return AppendResponse(nil, 7, resp)[4:]
}

func TestRewriteResponseRoundTrip(t *testing.T) {
	for v := int16(0); v <= MaxVersion(KeyMetadata); v++ {
		resp := kmsg.NewPtrMetadataResponse()
		resp.Version = v
		for n := range int32(3) {
			b := kmsg.NewMetadataResponseBroker()
			b.NodeID, b.Host, b.Port = n+100, "10.0.0."+strconv.Itoa(int(n)), 9092
			resp.Brokers = append(resp.Brokers, b)
		}
		m := &fakeMap{}
		out := rewrite(t, resp, m).(*kmsg.MetadataResponse)
		for i, b := range out.Brokers {
			if b.Host != "proxy.test" || b.Port != 30000+b.NodeID || b.NodeID != int32(i)+100 {
				t.Fatalf("metadata v%d: broker %+v", v, b)
			}
		}
		if m.learned[101] != "10.0.0.1:9092" {
			t.Fatalf("metadata v%d: learned %v", v, m.learned)
		}
	}
	for v := int16(0); v <= MaxVersion(KeyFindCoordinator); v++ {
		resp := kmsg.NewPtrFindCoordinatorResponse()
		resp.Version = v
		resp.NodeID, resp.Host, resp.Port = 3, "10.0.0.3", 9092
		c := kmsg.NewFindCoordinatorResponseCoordinator()
		c.Key, c.NodeID, c.Host, c.Port = "t", 4, "10.0.0.4", 9092
		none := kmsg.NewFindCoordinatorResponseCoordinator()
		none.Key, none.NodeID, none.Host, none.Port, none.ErrorCode = "u", -1, "", -1, 15
		resp.Coordinators = []kmsg.FindCoordinatorResponseCoordinator{c, none}
		out := rewrite(t, resp, &fakeMap{}).(*kmsg.FindCoordinatorResponse)
		if v < 4 && (out.Host != "proxy.test" || out.Port != 30003) {
			t.Fatalf("find coordinator v%d: %s:%d", v, out.Host, out.Port)
		}
		if v >= 4 {
			if out.Coordinators[0].Host != "proxy.test" || out.Coordinators[0].Port != 30004 {
				t.Fatalf("find coordinator v%d: %+v", v, out.Coordinators[0])
			}
			if out.Coordinators[1].NodeID != -1 || out.Coordinators[1].Host != "" {
				t.Fatalf("find coordinator v%d: node -1 was rewritten: %+v", v, out.Coordinators[1])
			}
		}
	}
	for v := int16(0); v <= MaxVersion(KeyDescribeCluster); v++ {
		resp := kmsg.NewPtrDescribeClusterResponse()
		resp.Version = v
		b := kmsg.NewDescribeClusterResponseBroker()
		b.NodeID, b.Host, b.Port = 5, "10.0.0.5", 9092
		resp.Brokers = append(resp.Brokers, b)
		out := rewrite(t, resp, &fakeMap{}).(*kmsg.DescribeClusterResponse)
		if out.Brokers[0].Host != "proxy.test" || out.Brokers[0].Port != 30005 {
			t.Fatalf("describe cluster v%d: %+v", v, out.Brokers[0])
		}
	}
	for v := int16(10); v <= MaxVersion(KeyProduce); v++ {
		resp := kmsg.NewPtrProduceResponse()
		resp.Version = v
		if got := rewrite(t, resp, &fakeMap{}); got != nil {
			t.Fatalf("produce v%d without endpoints was re-encoded", v)
		}
		b := kmsg.NewProduceResponseBroker()
		b.NodeID, b.Host, b.Port = 6, "10.0.0.6", 9092
		resp.Brokers = append(resp.Brokers, b)
		out := rewrite(t, resp, &fakeMap{}).(*kmsg.ProduceResponse)
		if out.Brokers[0].Host != "proxy.test" || out.Brokers[0].Port != 30006 {
			t.Fatalf("produce v%d: %+v", v, out.Brokers[0])
		}
	}
}

// rewrite encodes resp as a broker would, runs it through the rewriter
// and decodes the result as a client would.
func rewrite(t *testing.T, resp kmsg.Response, m AddrMap) kmsg.Response {
	t.Helper()
	key, v := resp.Key(), resp.GetVersion()
	body, err := ResponseBody(responseFrame(resp), key, v)
	if err != nil {
		t.Fatalf("%s v%d: %v", kmsg.NameForKey(key), v, err)
	}
	out, err := RewriteResponse(key, v, body, m, true)
	if err != nil {
		t.Fatalf("%s v%d: %v", kmsg.NameForKey(key), v, err)
	}
	if out == nil {
		return nil
	}
	wire := AppendResponse(nil, 7, out)
	if int(binary.BigEndian.Uint32(wire)) != len(wire)-4 || int32(binary.BigEndian.Uint32(wire[4:])) != 7 {
		t.Fatalf("%s v%d: bad frame header", kmsg.NameForKey(key), v)
	}
	back := kmsg.RequestForKey(key).ResponseKind()
	back.SetVersion(v)
	b, err := ResponseBody(wire[4:], key, v)
	if err != nil {
		t.Fatal(err)
	}
	if err := back.ReadFrom(b); err != nil {
		t.Fatalf("%s v%d: rewritten response does not decode: %v", kmsg.NameForKey(key), v, err)
	}
	return back
}

func TestMergeApiVersions(t *testing.T) {
	resp := kmsg.NewPtrApiVersionsResponse()
	add := func(key, min, max int16) {
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = key, min, max
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	add(KeyProduce, 3, 99)
	add(KeyFetch, 4, 99)
	add(KeyJoinGroup, 2, 3)
	add(KeyConsumerGroupHeartbeat, 0, 1)
	add(KeyShareFetch, 0, 1)
	add(999, 0, 1) // unknown to kmsg
	add(KeyListOffsetsForTest, 1, 5)
	MergeApiVersions(resp, true)
	got := map[int16][2]int16{}
	for _, k := range resp.ApiKeys {
		got[k.ApiKey] = [2]int16{k.MinVersion, k.MaxVersion}
	}
	want := map[int16][2]int16{
		KeyProduce:                {3, MaxVersion(KeyProduce)},
		KeyFetch:                  {4, 15},
		KeyJoinGroup:              {0, 3}, // forwardable: the broker's max
		KeyListOffsetsForTest:     {1, 5},
		KeyConsumerGroupHeartbeat: {0, min(1, MaxVersion(KeyConsumerGroupHeartbeat))},
		KeyConsumerGroupDescribe:  {0, MaxVersion(KeyConsumerGroupDescribe)},
		KeyShareFetch:             {0, 1}, // the cluster's
	}
	for key, w := range want {
		if got[key] != w {
			t.Errorf("key %d: got %v, want %v", key, got[key], w)
		}
	}
	for _, key := range []int16{999} {
		if _, ok := got[key]; ok {
			t.Errorf("key %d advertised", key)
		}
	}
	// Keys the broker lacks: the engine's versions.
	for _, key := range []int16{KeySyncGroup, KeyHeartbeat, KeyOffsetCommit, KeyOffsetFetch, KeyDeleteGroups, KeyFindCoordinator} {
		if got[key][1] != MaxVersion(key) {
			t.Errorf("group key %d not advertised at the engine's versions: %v", key, got[key])
		}
	}
	if !reflect.DeepEqual(resp.ApiKeys, sortedCopy(resp.ApiKeys)) {
		t.Errorf("keys not sorted")
	}
}

const KeyListOffsetsForTest = 2

func sortedCopy(in []kmsg.ApiVersionsResponseApiKey) []kmsg.ApiVersionsResponseApiKey {
	out := append([]kmsg.ApiVersionsResponseApiKey(nil), in...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j].ApiKey < out[i].ApiKey {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestProduceAcks(t *testing.T) {
	for v := int16(0); v <= MaxVersion(KeyProduce); v++ {
		for _, txn := range []*string{nil, kmsg.StringPtr(""), kmsg.StringPtr("a-transactional-id")} {
			for _, acks := range []int16{0, 1, -1} {
				req := kmsg.NewPtrProduceRequest()
				req.Version, req.Acks, req.TransactionID = v, acks, txn
				b := requestFrame(req, "c")
				h, err := ParseRequestHeader(b)
				if err != nil {
					t.Fatal(err)
				}
				got, ok := ProduceAcks(b[h.Len:], v)
				if !ok || got != acks {
					t.Fatalf("v%d txn=%v: got acks %d ok=%v, want %d", v, txn, got, ok, acks)
				}
			}
		}
	}
}

// TestApiVersionsErrorAnswerIsNotRewritten covers a client asking for a
// newer ApiVersions than the broker speaks: the broker answers in v0 with
// UNSUPPORTED_VERSION and only its ApiVersions range, and that answer
// must reach the client as it is (no group keys merged into it).
func TestApiVersionsErrorAnswerIsNotRewritten(t *testing.T) {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.Version = 0
	resp.ErrorCode = kerr.UnsupportedVersion.Code
	k := kmsg.NewApiVersionsResponseApiKey()
	k.ApiKey, k.MaxVersion = KeyApiVersions, 4
	resp.ApiKeys = append(resp.ApiKeys, k)
	body := resp.AppendTo(nil)
	out, err := RewriteResponse(KeyApiVersions, 5, body, &fakeMap{}, true)
	if err != nil {
		t.Fatalf("reading a v0 UNSUPPORTED_VERSION answer to a v5 request: %v", err)
	}
	if out != nil {
		t.Fatalf("the error answer was rewritten into %+v", out)
	}
}

func TestKproxyTopicsAreInternal(t *testing.T) {
	for v := int16(0); v <= MaxVersion(KeyMetadata); v++ {
		resp := kmsg.NewPtrMetadataResponse()
		resp.Version = v
		for _, name := range []string{"__kproxy_groups", "orders"} {
			tp := kmsg.NewMetadataResponseTopic()
			tp.Topic = kmsg.StringPtr(name)
			resp.Topics = append(resp.Topics, tp)
		}
		out := rewrite(t, resp, &fakeMap{}).(*kmsg.MetadataResponse)
		if v >= 1 && (!out.Topics[0].IsInternal || out.Topics[1].IsInternal) {
			t.Fatalf("v%d: internal flags %v %v", v, out.Topics[0].IsInternal, out.Topics[1].IsInternal)
		}
	}
}

// TestRewriteShareResponses: a ShareFetch or ShareAcknowledge response
// naming new leaders gets kproxy's addresses for them, everything else
// (records, acquired ranges, leader ids) as the broker sent it; one
// without endpoints is passed as it came.
func TestRewriteShareResponses(t *testing.T) {
	for _, key := range []int16{KeyShareFetch, KeyShareAcknowledge} {
		for v := int16(0); v <= MaxVersion(key); v++ {
			plain := shareResponse(key, v, false).AppendTo(nil)
			if out, err := RewriteResponse(key, v, plain, &fakeMap{}, true); err != nil || out != nil {
				t.Fatalf("%s v%d without endpoints: edited (%v, %v)", kmsg.NameForKey(key), v, out, err)
			}
			in := shareResponse(key, v, true)
			m := &fakeMap{}
			out := rewrite(t, in, m)
			want := shareResponse(key, v, true)
			switch r := want.(type) {
			case *kmsg.ShareFetchResponse:
				r.NodeEndpoints[0].Host, r.NodeEndpoints[0].Port = "proxy.test", 30003
			case *kmsg.ShareAcknowledgeResponse:
				r.NodeEndpoints[0].Host, r.NodeEndpoints[0].Port = "proxy.test", 30003
			}
			if got, w := out.AppendTo(nil), want.AppendTo(nil); !bytes.Equal(got, w) {
				t.Fatalf("%s v%d: rewritten response differs from the broker's beyond the endpoints", kmsg.NameForKey(key), v)
			}
			if m.learned[3] != "upstream:9092" {
				t.Fatalf("%s v%d: learned %v", kmsg.NameForKey(key), v, m.learned)
			}
		}
	}
}
