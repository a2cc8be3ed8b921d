package proxy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// recordingCoordinator answers every group request with an empty
// response of the right version, after an optional delay, and records
// what it was given.
type recordingCoordinator struct {
	delay time.Duration
	mu    sync.Mutex
	got   []kmsg.Request
	from  []Client
}

func (c *recordingCoordinator) Handle(cl Client, req kmsg.Request, reply func(kmsg.Response)) {
	c.mu.Lock()
	c.got = append(c.got, req)
	c.from = append(c.from, cl)
	c.mu.Unlock()
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	if c.delay > 0 {
		time.AfterFunc(c.delay, func() { reply(resp) })
		return
	}
	reply(resp)
}

func rawRequest(t *testing.T, conn net.Conn, req kmsg.Request, corr int32, clientID string) {
	t.Helper()
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID(clientID))
	if _, err := conn.Write(f.AppendRequest(nil, req, corr)); err != nil {
		t.Fatal(err)
	}
}

// readResponse reads one response frame and decodes it for req.
func readResponse(t *testing.T, conn net.Conn, req kmsg.Request) (int32, kmsg.Response) {
	t.Helper()
	b := readFrame(t, conn)
	corr := int32(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))
	b = b[4:]
	resp := req.ResponseKind()
	resp.SetVersion(req.GetVersion())
	if resp.IsFlexible() && req.Key() != 18 {
		b = b[1:] // empty header tags
	}
	if err := resp.ReadFrom(b); err != nil {
		t.Fatalf("decoding %s response: %v", kmsg.NameForKey(req.Key()), err)
	}
	return corr, resp
}

// readFrame reads one response frame and returns it without its size.
func readFrame(t *testing.T, conn net.Conn) []byte {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		t.Fatalf("reading response: %v", err)
	}
	b := make([]byte, int(uint32(size[0])<<24|uint32(size[1])<<16|uint32(size[2])<<8|uint32(size[3])))
	if _, err := io.ReadFull(conn, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGroupRequestsStayInOrder pipelines forwarded requests around a slow
// local one on one connection: responses come back in request order, and
// the coordinator sees the client id and host.
func TestGroupRequestsStayInOrder(t *testing.T) {
	c := newCluster(t)
	co := &recordingCoordinator{delay: 200 * time.Millisecond}
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) { cfg.Coordinator = co })
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var reqs []kmsg.Request
	for i := range 9 {
		var req kmsg.Request
		switch i % 3 {
		case 0:
			req = kmsg.NewPtrMetadataRequest()
		case 1:
			hb := kmsg.NewPtrHeartbeatRequest()
			hb.Group = "g"
			req = hb
		case 2:
			req = kmsg.NewPtrApiVersionsRequest()
		}
		req.SetVersion(min(req.MaxVersion(), 3))
		rawRequest(t, conn, req, int32(100+i), "order-test")
		reqs = append(reqs, req)
	}
	for i, req := range reqs {
		corr, _ := readResponse(t, conn, req)
		if corr != int32(100+i) {
			t.Fatalf("response %d has correlation id %d", i, corr)
		}
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	if len(co.got) != 3 || co.from[0].ID != "order-test" || co.from[0].Host != "127.0.0.1" {
		t.Fatalf("coordinator got %d requests from %+v", len(co.got), co.from)
	}
}

// TestFindCoordinatorForGroupsIsLocal asks for a group coordinator at every
// version, single and batched: the answer is a kproxy listener, never an
// upstream broker, and transaction keys still go upstream.
func TestFindCoordinatorForGroupsIsLocal(t *testing.T) {
	c := newCluster(t)
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) { cfg.Coordinator = &recordingCoordinator{} })
	upstream := strings.Join(c.ListenAddrs(), ",")
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for v := int16(0); v <= kmsg.NewPtrFindCoordinatorRequest().MaxVersion(); v++ {
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.Version = v
		req.CoordinatorKey = "my-group"
		req.CoordinatorKeys = []string{"my-group", "other-group"}
		rawRequest(t, conn, req, int32(v), "fc")
		_, r := readResponse(t, conn, req)
		resp := r.(*kmsg.FindCoordinatorResponse)
		type co struct {
			node       int32
			host       string
			port, code int32
		}
		var got []co
		if v < 4 {
			got = append(got, co{resp.NodeID, resp.Host, resp.Port, int32(resp.ErrorCode)})
		} else {
			for _, x := range resp.Coordinators {
				got = append(got, co{x.NodeID, x.Host, x.Port, int32(x.ErrorCode)})
			}
			if len(got) != 2 {
				t.Fatalf("v%d: %d coordinators for 2 keys", v, len(got))
			}
		}
		for _, g := range got {
			addr := g.host + ":" + strconv.Itoa(int(g.port))
			if g.code != 0 || g.node < 0 || strings.Contains(upstream, addr) || g.host != "127.0.0.1" {
				t.Fatalf("v%d: coordinator %+v", v, g)
			}
		}
	}
}

// TestGroupAPIsAdvertisedWhateverTheBroker runs against brokers that
// support no group API at all: kproxy still advertises them, at the
// versions the engine serves.
func TestGroupAPIsAdvertisedWhateverTheBroker(t *testing.T) {
	vs := kversion.Stable()
	for _, key := range []int16{8, 9, 11, 12, 13, 14, 15, 16, 42, 47} {
		vs.SetMaxKeyVersion(key, -1)
	}
	c := newCluster(t, kfake.MaxVersions(vs))
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) { cfg.Coordinator = &recordingCoordinator{} })
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 3
	req.ClientSoftwareName, req.ClientSoftwareVersion = "t", "1"
	rawRequest(t, conn, req, 1, "av")
	_, r := readResponse(t, conn, req)
	got := map[int16]int16{}
	for _, k := range r.(*kmsg.ApiVersionsResponse).ApiKeys {
		got[k.ApiKey] = k.MaxVersion
	}
	for _, key := range []int16{8, 9, 10, 11, 12, 13, 14, 15, 16, 42, 47, 68, 69} {
		if got[key] != kmsg.RequestForKey(key).MaxVersion() {
			t.Errorf("%s advertised at v%d, want v%d", kmsg.NameForKey(key), got[key], kmsg.RequestForKey(key).MaxVersion())
		}
	}
}

// TestMalformedGroupRequestClosesConnection sends a group request whose
// body does not decode: that connection closes with a log line, the
// coordinator never sees it, other connections carry on.
func TestMalformedGroupRequestClosesConnection(t *testing.T) {
	c := newCluster(t)
	logs := &logBuffer{}
	co := &recordingCoordinator{}
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) {
		cfg.Coordinator = co
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	bad, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	body := []byte{0, 11, 0, 5, 0, 0, 0, 1, 0xff, 0xff, 0, 3, 'a'} // JoinGroup v5 cut short
	bad.Write(append(frame(body), body...))
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, bad); err != nil {
		t.Fatalf("not closed: %v", err)
	}
	waitFor(t, 5*time.Second, "the log line", func() bool {
		return strings.Contains(logs.String(), "malformed JoinGroup v5 request") && strings.Contains(logs.String(), bad.LocalAddr().String())
	})
	good := newClient(t, p.Addr())
	hb := kmsg.NewPtrHeartbeatRequest()
	hb.Group = "g"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := hb.RequestWith(ctx, good); err != nil {
		t.Fatalf("heartbeat on a good connection: %v", err)
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	for _, r := range co.got {
		if r.Key() == 11 {
			t.Fatalf("the coordinator saw the malformed JoinGroup")
		}
	}
}

// TestApiVersionsNewerThanTheBroker has the client ask for a newer
// ApiVersions than the broker speaks (franz-go v5 against Kafka 4.1's v4):
// the broker's v0 UNSUPPORTED_VERSION answer reaches the client, which
// retries lower and goes on.
func TestApiVersionsNewerThanTheBroker(t *testing.T) {
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(18, 3)
	c := newCluster(t, kfake.MaxVersions(vs))
	p := startProxy(t, c.ListenAddrs(), func(cfg *Config) { cfg.Coordinator = &recordingCoordinator{} })
	cl := newClient(t, p.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	if _, err := req.RequestWith(ctx, cl); err != nil {
		t.Fatalf("metadata after the ApiVersions downgrade: %v", err)
	}
}

// readRawResponse reads one response frame and returns what follows the
// correlation id.
func readRawResponse(t *testing.T, conn net.Conn) []byte {
	t.Helper()
	return readFrame(t, conn)[4:]
}

// TestApiVersionsErrorAnswersPassUntouched asks every ApiVersions version
// of upstreams capped at older ApiVersions versions, directly and through
// kproxy. Where the broker answers UNSUPPORTED_VERSION (in v0, with only
// its ApiVersions range), the client must get exactly that answer: group
// keys merged into it would be taken for the broker's whole table.
// Successful answers are merged and carry the group keys.
func TestApiVersionsErrorAnswersPassUntouched(t *testing.T) {
	top := kmsg.NewPtrApiVersionsRequest().MaxVersion()
	errorAnswers := 0
	for cap := int16(0); cap <= top; cap++ {
		vs := kversion.Stable()
		vs.SetMaxKeyVersion(codecKeyApiVersions, cap)
		c := newCluster(t, kfake.MaxVersions(vs), kfake.NumBrokers(1))
		p := startProxy(t, c.ListenAddrs(), func(cfg *Config) { cfg.Coordinator = &recordingCoordinator{} })
		for v := int16(0); v <= top; v++ {
			req := kmsg.NewPtrApiVersionsRequest()
			req.Version = v
			req.ClientSoftwareName, req.ClientSoftwareVersion = "t", "1"
			ask := func(addr string) []byte {
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				rawRequest(t, conn, req, 7, "av")
				return readRawResponse(t, conn)
			}
			direct, through := ask(c.ListenAddrs()[0]), ask(p.Addr())
			code := int16(uint16(direct[0])<<8 | uint16(direct[1]))
			if code != 0 {
				errorAnswers++
				if string(direct) != string(through) {
					t.Errorf("upstream ApiVersions<=v%d, request v%d: error answer %d rewritten:\n direct  %x\n through %x", cap, v, code, direct, through)
				}
				continue
			}
			resp := kmsg.NewPtrApiVersionsResponse()
			resp.Version = v
			if err := resp.ReadFrom(through); err != nil {
				t.Fatalf("upstream ApiVersions<=v%d, request v%d: %v", cap, v, err)
			}
			groups := 0
			for _, k := range resp.ApiKeys {
				if k.ApiKey == 11 || k.ApiKey == 68 {
					groups++
				}
			}
			if resp.ErrorCode != 0 || groups != 2 {
				t.Errorf("upstream ApiVersions<=v%d, request v%d: error %d, %d of JoinGroup/ConsumerGroupHeartbeat advertised", cap, v, resp.ErrorCode, groups)
			}
		}
	}
	if want := int(top) * (int(top) + 1) / 2; errorAnswers != want {
		t.Fatalf("%d error answers from the capped upstreams, want %d (one per version above each cap)", errorAnswers, want)
	}
}

const codecKeyApiVersions = 18
