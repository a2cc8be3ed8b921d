package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var osHostname = os.Hostname

// Proxy is a running kproxy data path: a bootstrap listener plus one
// listener per upstream broker.
type Proxy struct {
	cfg        Config // immutable after New
	log        *slog.Logger
	metrics    *metrics
	budget     budget // bytes of held frames, process-wide (see memory.go)
	listenHost string // immutable after New
	listenPort int    // immutable after New; 0 means ephemeral ports
	bootPort   int32  // the bootstrap listener's actual port; set by Start before any other listener

	disco *kgo.Client      // discovers brokers; owned by the discovery loop
	apiv  apiVersionsCache // the brokers' last ApiVersions answers (apiversions.go); safe for concurrent use

	tlsSrc    *TLSSource         // nil: plaintext listeners; immutable
	tlsServer *tls.Config        // built from tlsSrc; immutable
	ctx       context.Context    // cancelled by Shutdown: aborts TLS handshakes
	cancel    context.CancelFunc // cancels ctx

	mu        sync.Mutex
	brokers   map[int32]string      // node id -> upstream host:port; guarded by mu
	listeners map[int32]*listener   // node id -> listener (-1 is bootstrap); guarded by mu
	sessions  map[*session]struct{} // guarded by mu
	perHost   map[string]int        // open client connections by peer IP; guarded by mu
	open      int                   // client connections accepted and not closed, handshaking ones included; guarded by mu
	lastLimit atomic.Int64          // nanotime of the last connection-limit log line
	limited   atomic.Int64          // connections refused by a limit since that line
	closing   bool                  // guarded by mu

	// lastAcceptLog is the nanotime of the last failed-accept log line,
	// acceptFails the failures since (see acceptFailed).
	lastAcceptLog, acceptFails atomic.Int64

	spillWarned atomic.Bool // set once a failed spill of a streamed response is logged (spool.go)

	wg   sync.WaitGroup // accept loops, sessions, discovery
	stop chan struct{}  // closed by Shutdown
}

// listener is one TCP listener standing for an upstream broker (node >= 0)
// or for the cluster as a whole (the bootstrap listener, node -1).
//
// While its broker is unreachable a broker listener is closed (down), so
// that clients get a refused connection exactly as they would from the
// dead broker itself; a probe reopens it at the same address once the
// broker accepts connections again (see brokerUnreachable).
type listener struct {
	node  int32
	port  int32  // advertised port; immutable
	bound string // host:port actually listened on; immutable, reused on reopen

	ln   net.Listener // guarded by Proxy.mu; replaced when the listener reopens
	down bool         // guarded by Proxy.mu: closed while the broker is unreachable
}

// New validates cfg and returns a Proxy that is not yet listening.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	host, port, _ := net.SplitHostPort(cfg.Listen)
	p := &Proxy{
		cfg:        cfg,
		log:        cfg.Logger,
		metrics:    newMetrics(cfg.MeterProvider),
		listenHost: host,
		budget:     budget{limit: cfg.FrameMemory},
		brokers:    make(map[int32]string),
		listeners:  make(map[int32]*listener),
		sessions:   make(map[*session]struct{}),
		perHost:    make(map[string]int),
		stop:       make(chan struct{}),
	}
	p.listenPort, _ = strconv.Atoi(port)
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if cfg.TLS != nil {
		p.tlsSrc, p.tlsServer = cfg.TLS, cfg.TLS.ServerConfig()
	}
	return p, nil
}

// Start opens the bootstrap listener, learns the upstream brokers (opening
// a listener for each) and starts accepting. It returns once clients can
// connect; the proxy then runs until Shutdown.
func (p *Proxy) Start(ctx context.Context) error {
	if _, err := p.listen(-1, p.listenPort); err != nil {
		return err
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(p.cfg.Upstreams...), kgo.DialTimeout(p.cfg.DialTimeout)}, p.cfg.UpstreamClientOpts...)
	if p.cfg.Dial != nil {
		opts = append(opts, kgo.Dialer(p.cfg.Dial))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("upstream client: %w", err)
	}
	p.disco = cl
	if err := p.discover(ctx); err != nil {
		// Clients can still connect through the bootstrap listener;
		// the discovery loop keeps trying.
		p.log.Warn("upstream metadata not available yet", "err", err)
	}
	p.wg.Add(1)
	go p.discoveryLoop()
	return nil
}

// Addr returns the bootstrap listener's address.
func (p *Proxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.listeners[-1]; l != nil {
		return net.JoinHostPort(p.cfg.AdvertiseHost, strconv.Itoa(int(l.port)))
	}
	return ""
}

// discover asks the upstream cluster for its brokers and opens a listener
// for each new one.
func (p *Proxy) discover(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{} // brokers only
	resp, err := req.RequestWith(ctx, p.disco)
	if err != nil {
		p.metrics.upstreamError(ctx)
		return fmt.Errorf("metadata from %v: %w", p.cfg.Upstreams, err)
	}
	for _, b := range resp.Brokers {
		p.Broker(b.NodeID, b.Host, b.Port)
	}
	return nil
}

func (p *Proxy) discoveryLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.MetadataInterval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			if err := p.discover(context.Background()); err != nil {
				p.log.Warn("broker discovery failed", "err", err)
			}
		}
	}
}

// Broker records the upstream address of node and returns the proxy
// address that stands for it, opening its listener if it has none. It
// implements codec.AddrMap.
func (p *Proxy) Broker(node int32, host string, port int32) (string, int32) {
	addr := net.JoinHostPort(host, strconv.Itoa(int(port)))
	p.mu.Lock()
	old, known := p.brokers[node]
	p.brokers[node] = addr
	l := p.listeners[node]
	closing := p.closing
	p.mu.Unlock()
	if known && old != addr {
		p.log.Info("broker moved", "node", node, "from", old, "to", addr)
	}
	if l == nil && !closing {
		var err error
		l, err = p.listen(node, p.brokerPort(node))
		if err != nil {
			// The mapping must never leak an upstream address, so the
			// client is told the port the rule gives; it will fail to
			// connect and retry, and this line says why.
			p.log.Error("cannot open broker listener", "node", node, "upstream", addr, "err", err)
			return p.cfg.AdvertiseHost, int32(p.brokerPort(node))
		}
	}
	if l == nil {
		return p.cfg.AdvertiseHost, int32(p.brokerPort(node))
	}
	return p.cfg.AdvertiseHost, l.port
}

// brokerPort is the stable rule mapping a node id to its listen port:
// pinned in Config.BrokerPorts, else listenPort+1+node, else (ephemeral
// mode, or a node id the rule cannot map) 0.
func (p *Proxy) brokerPort(node int32) int {
	if port, ok := p.cfg.BrokerPorts[node]; ok {
		return port
	}
	if p.listenPort == 0 || node < 0 {
		return 0
	}
	port := p.listenPort + 1 + int(node)
	if port > 65535 {
		return 0
	}
	return port
}

// listen opens the listener for node (-1: bootstrap) and starts its
// accept loop. Two callers racing for the same node get the same
// listener.
func (p *Proxy) listen(node int32, port int) (*listener, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(p.listenHost, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen for node %d: %w", node, err)
	}
	actual := int32(ln.Addr().(*net.TCPAddr).Port)
	if node < 0 {
		p.bootPort = actual
	}
	l := &listener{node: node, ln: ln, port: actual, bound: ln.Addr().String()}
	if p.cfg.AdvertisePort > 0 {
		l.port = int32(p.cfg.AdvertisePort) + actual - p.bootPort
	}
	p.mu.Lock()
	if have := p.listeners[node]; have != nil || p.closing {
		p.mu.Unlock()
		ln.Close()
		if have == nil {
			return nil, errors.New("proxy is shutting down")
		}
		return have, nil
	}
	p.listeners[node] = l
	p.wg.Add(1)
	p.mu.Unlock()
	if node >= 0 {
		p.log.Info("broker listener open", "node", node, "listen", ln.Addr().String(), "advertised_port", l.port)
	} else {
		p.log.Info("bootstrap listener open", "listen", ln.Addr().String())
	}
	go p.accept(l, ln)
	return l, nil
}

// accept runs one accept loop of l over ln until ln is closed (shutdown,
// or the broker became unreachable).
func (p *Proxy) accept(l *listener, ln net.Listener) {
	defer p.wg.Done()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and similar: back off, keep
			// going (the pending connection keeps the listener
			// readable, so retrying at once would spin).
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			p.acceptFailed(l.node, err, delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		p.mu.Lock()
		if p.closing {
			p.mu.Unlock()
			c.Close()
			continue
		}
		if why, limit := p.overLimit(host); why != 0 {
			p.mu.Unlock()
			c.Close()
			p.refuseConn(why, limit, c.RemoteAddr().String())
			continue
		}
		p.perHost[host]++
		p.open++
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serveConn(c, host, l.node)
	}
}

// serveConn runs one accepted client connection: its TLS handshake when
// the listener is a TLS one, then its session. The connection counts
// against host's limit from accept to close.
func (p *Proxy) serveConn(c net.Conn, host string, node int32) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		p.open--
		if p.perHost[host]--; p.perHost[host] <= 0 {
			delete(p.perHost, host)
		}
		p.mu.Unlock()
	}()
	if p.tlsSrc != nil {
		var ok bool
		if c, ok = p.handshake(c); !ok {
			return
		}
	}
	s := newSession(p, c, node)
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.sessions[s] = struct{}{}
	p.mu.Unlock()
	s.run()
	p.mu.Lock()
	delete(p.sessions, s)
	p.mu.Unlock()
}

// overLimit says whether one more connection from host would exceed a
// connection limit, and which. Called with mu held.
func (p *Proxy) overLimit(host string) (refusal, int) {
	if n := p.cfg.MaxConnections; p.open >= n {
		return refusedConnLimit, n
	}
	if n := p.cfg.MaxConnectionsPerHost; p.perHost[host] >= n {
		return refusedHostLimit, n
	}
	return 0, 0
}

// refuseConn counts a connection closed at accept by a limit and logs
// it, at most one line a second (a flood would otherwise flood the log).
func (p *Proxy) refuseConn(why refusal, limit int, remote string) {
	p.metrics.refused(why)
	n := p.limited.Add(1)
	now := nanotime()
	last := p.lastLimit.Load()
	if (last != 0 && now-last < int64(time.Second)) || !p.lastLimit.CompareAndSwap(last, now) {
		return
	}
	p.limited.Add(-n)
	p.log.Warn("connection refused: limit reached", "limit", refusalNames[why], "max", limit, "remote", remote, "refused_since_last_line", n)
}

// upstreamFor returns the addresses to dial for a session of node: the
// broker's own address, or every seed for the bootstrap listener.
func (p *Proxy) upstreamFor(node int32) []string {
	if node < 0 {
		return p.cfg.Upstreams
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.brokers[node]; ok {
		return []string{a}
	}
	return nil
}

// coordinatorNode picks the node a client is sent to for group APIs: the
// broker the request came through, else the lowest known broker. Every
// listener serves group APIs, so any node is correct.
func (p *Proxy) coordinatorNode(node int32) (int32, string, int32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.listeners[node]; node >= 0 && l != nil {
		return node, p.cfg.AdvertiseHost, l.port, true
	}
	ids := make([]int32, 0, len(p.listeners))
	for id := range p.listeners {
		if id >= 0 {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return -1, "", 0, false
	}
	id := slices.Min(ids)
	return id, p.cfg.AdvertiseHost, p.listeners[id].port, true
}

// Shutdown stops accepting, lets every session answer the requests it
// has already read until ctx ends, then closes everything.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return nil
	}
	p.closing = true
	close(p.stop)
	p.cancel()
	for _, l := range p.listeners {
		l.ln.Close()
	}
	sessions := make([]*session, 0, len(p.sessions))
	for s := range p.sessions {
		sessions = append(sessions, s)
	}
	p.mu.Unlock()
	for _, s := range sessions {
		s.drain()
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("shutdown: %w", ctx.Err())
		p.mu.Lock()
		for s := range p.sessions {
			s.closeConns()
		}
		p.mu.Unlock()
		<-done
	}
	if p.disco != nil {
		p.disco.Close()
	}
	return err
}

// Backoff of the probe that waits for an unreachable broker.
const (
	probeMin = 50 * time.Millisecond
	probeMax = time.Second
)

// brokerUnreachable is called when dialling node's broker failed. It
// closes node's listener so that clients see what they see when the
// broker itself is down, a refused connection, and starts a probe that
// reopens the listener once the broker answers again.
//
// Why not keep accepting: a client whose connection is accepted and then
// dropped during its first request (ApiVersions) reads that as a
// misconfiguration, not as a dead broker. franz-go turns an EOF there
// into ErrFirstReadEOF ("is TLS misconfigured?"), which is not retried
// and fails buffered records when a metadata request hits it; librdkafka
// logs "Disconnected while requesting ApiVersion: might be caused by
// incorrect security.protocol"; the Java client only reconnects with
// backoff. A refused connection is the one outcome all three handle as
// the broker being down: franz-go refreshes metadata and moves produce
// and fetch to the new leaders, re-resolves a coordinator, and the Java
// client and librdkafka mark the node down and back off.
func (p *Proxy) brokerUnreachable(node int32, cause error) {
	if node < 0 {
		return // the bootstrap listener stands for every seed
	}
	p.mu.Lock()
	l := p.listeners[node]
	if l == nil || l.down || p.closing {
		p.mu.Unlock()
		return
	}
	l.down = true
	l.ln.Close()
	p.wg.Add(1)
	p.mu.Unlock()
	p.metrics.brokerDown(1)
	p.log.Warn("broker unreachable: its listener refuses connections until the broker answers again",
		"node", node, "listen", l.bound, "err", cause)
	go p.probe(l)
}

// probe dials l's broker with backoff until it answers, then reopens l
// at the same address.
func (p *Proxy) probe(l *listener) {
	defer p.wg.Done()
	t := time.NewTimer(probeMin)
	defer t.Stop()
	delay := probeMin
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		delay = min(2*delay, probeMax)
		t.Reset(delay)
		addrs := p.upstreamFor(l.node)
		if len(addrs) == 0 {
			continue
		}
		c, err := net.DialTimeout("tcp", addrs[0], min(p.cfg.DialTimeout, probeMax))
		if err != nil {
			continue
		}
		c.Close()
		ln, err := net.Listen("tcp", l.bound)
		if err != nil {
			p.log.Error("broker answers again but its listener cannot reopen", "node", l.node, "listen", l.bound, "err", err)
			continue
		}
		p.mu.Lock()
		if p.closing {
			p.mu.Unlock()
			ln.Close()
			return
		}
		l.ln, l.down = ln, false
		p.wg.Add(1)
		p.mu.Unlock()
		p.metrics.brokerDown(-1)
		p.log.Info("broker reachable again: listener reopened", "node", l.node, "listen", l.bound, "upstream", addrs[0])
		go p.accept(l, ln)
		return
	}
}
