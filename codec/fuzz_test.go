package codec

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzFrame runs the whole request framing path, size prefix then header,
// over arbitrary bytes: no panic, and a parsed header never claims more
// bytes than it was given.
func FuzzFrame(f *testing.F) {
	for key := int16(0); key < 100; key++ {
		req := kmsg.RequestForKey(key)
		if req == nil {
			continue
		}
		req.SetVersion(req.MaxVersion())
		f.Add(kmsg.NewRequestFormatter(kmsg.FormatterClientID("fuzz")).AppendRequest(nil, req, 1))
	}
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0xff})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 4 {
			return
		}
		n, err := CheckSize([4]byte(b), 1<<20)
		if err != nil {
			return
		}
		if n < minRequestHeader || n > 1<<20 {
			t.Fatalf("CheckSize accepted %d", n)
		}
		body := b[4:]
		if len(body) > int(n) {
			body = body[:n]
		}
		h, err := ParseRequestHeader(body)
		if err != nil {
			return
		}
		if h.Len > len(body) || h.Len < minRequestHeader {
			t.Fatalf("header length %d outside [8, %d]", h.Len, len(body))
		}
		if h.Key == KeyProduce {
			ProduceAcks(body[h.Len:], h.Version)
		}
	})
}

// FuzzRewriteResponse feeds arbitrary bodies to every rewriter at every
// version: no panic; what a rewriter returns encodes, decodes back, and
// holds proxy addresses only.
func FuzzRewriteResponse(f *testing.F) {
	for _, key := range []int16{KeyProduce, KeyMetadata, KeyFindCoordinator, KeyDescribeCluster, KeyApiVersions} {
		for v := int16(0); v <= MaxVersion(key); v++ {
			resp := kmsg.RequestForKey(key).ResponseKind()
			resp.SetVersion(v)
			switch r := resp.(type) {
			case *kmsg.MetadataResponse:
				b := kmsg.NewMetadataResponseBroker()
				b.Host, b.Port = "upstream", 9092
				r.Brokers = append(r.Brokers, b)
			case *kmsg.ProduceResponse:
				b := kmsg.NewProduceResponseBroker()
				b.Host, b.Port = "upstream", 9092
				r.Brokers = append(r.Brokers, b)
			case *kmsg.FindCoordinatorResponse:
				r.Host, r.Port = "upstream", 9092
			}
			f.Add(key, v, resp.AppendTo(nil))
		}
	}
	for _, key := range []int16{KeyShareFetch, KeyShareAcknowledge} {
		for v := int16(0); v <= MaxVersion(key); v++ {
			for _, withEP := range []bool{false, true} {
				f.Add(key, v, shareResponse(key, v, withEP).AppendTo(nil))
			}
		}
	}
	f.Fuzz(func(t *testing.T, key, v int16, body []byte) {
		if RouteFor(key, v, true).Edit == EditNone || v < 0 {
			return
		}
		out, err := RewriteResponse(key, v, body, &fakeMap{}, true)
		if err != nil || out == nil {
			return
		}
		enc := out.AppendTo(nil)
		back := kmsg.RequestForKey(key).ResponseKind()
		back.SetVersion(v)
		if err := back.ReadFrom(enc); err != nil {
			t.Fatalf("%s v%d: rewritten response does not decode: %v", kmsg.NameForKey(key), v, err)
		}
		switch r := back.(type) {
		case *kmsg.MetadataResponse:
			for _, b := range r.Brokers {
				if b.Host != "proxy.test" {
					t.Fatalf("metadata broker host %q survived", b.Host)
				}
			}
		case *kmsg.ProduceResponse:
			for _, b := range r.Brokers {
				if b.Host != "proxy.test" {
					t.Fatalf("produce broker host %q survived", b.Host)
				}
			}
		case *kmsg.DescribeClusterResponse:
			for _, b := range r.Brokers {
				if b.Host != "proxy.test" {
					t.Fatalf("describe cluster host %q survived", b.Host)
				}
			}
		case *kmsg.ShareFetchResponse:
			for _, b := range r.NodeEndpoints {
				if b.Host != "proxy.test" {
					t.Fatalf("share fetch endpoint host %q survived", b.Host)
				}
			}
		case *kmsg.ShareAcknowledgeResponse:
			for _, b := range r.NodeEndpoints {
				if b.Host != "proxy.test" {
					t.Fatalf("share acknowledge endpoint host %q survived", b.Host)
				}
			}
		}
	})
}
