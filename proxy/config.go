package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/metric"

	"github.com/kproxy/kproxy/codec"
)

// Coordinator serves the consumer-group APIs (cmd/kproxy adapts
// groupstate.Engine to it). Handle must call reply exactly once, from any
// goroutine, possibly much later (a JoinGroup waits for the rebalance).
type Coordinator interface {
	Handle(c Client, req kmsg.Request, reply func(kmsg.Response))
}

// CloneRequest deep-copies req, whose byte fields may alias a buffer the
// proxy reuses once Handle returns: a Coordinator that keeps req past
// Handle keeps the copy. A request of a key kmsg does not know is
// returned as is.
func CloneRequest(req kmsg.Request) kmsg.Request {
	c := kmsg.RequestForKey(req.Key())
	if c == nil {
		return req
	}
	c.SetVersion(req.GetVersion())
	if err := c.ReadFrom(req.AppendTo(nil)); err != nil {
		return req // cannot happen: kmsg decodes what it encodes
	}
	return c
}

// Client describes the connection a request arrived on.
type Client struct {
	ID   string // client id from the request header
	Host string // peer IP address
	// Principal is the client's Kafka principal, as the brokers name
	// it: "User:<name>" once the broker accepted the client's SASL
	// exchange (PLAIN, SCRAM, OAUTHBEARER's sub claim), or from the
	// subject of its verified certificate on an mTLS listener without
	// SASL (sasl.go). Empty when unknown: no SASL and no client
	// certificate, or a mechanism whose principal only the broker can
	// map (GSSAPI).
	Principal string
	// Authenticated says the broker accepted the client's SASL exchange
	// or the client presented a verified certificate.
	Authenticated bool
	// Conn is the connection's id, unique in the process; Node the
	// broker its listener stands for (-1: the bootstrap listener).
	Conn uint64
	Node int32
}

// FindCoordinatorAuthorizer is implemented by a Coordinator that
// authorizes group requests (package authz): the proxy answers
// FindCoordinator for groups itself and asks it for each group key.
// The answer is 0 or the error code the key gets
// (GROUP_AUTHORIZATION_FAILED).
type FindCoordinatorAuthorizer interface {
	AuthorizeFindCoordinator(c Client, group string) int16
}

// Config configures a Proxy. The zero value of every field but Upstreams
// is usable.
type Config struct {
	// Upstreams are the seed brokers, host:port.
	Upstreams []string
	// Listen is the bootstrap listener's address; default 127.0.0.1:9092.
	// With port 0 every listener takes an ephemeral port (tests).
	Listen string
	// AdvertiseHost is the host clients are told to connect to; default
	// the listen host, or the machine's hostname when that is a
	// wildcard.
	AdvertiseHost string
	// AdvertisePort is the bootstrap port clients are told, for a proxy
	// behind a port mapping; every broker port is shifted by the same
	// amount. Default: the ports kproxy listens on.
	AdvertisePort int
	// BrokerPorts pins the listen port of given broker node ids,
	// overriding the rule listenPort+1+nodeID.
	BrokerPorts map[int32]int
	// MaxFrame is the largest request or response frame accepted; default
	// codec.DefaultMaxFrame (100 MiB).
	MaxFrame int32
	// MaxGroupRequest is the largest request kproxy reads whole to serve
	// itself (group APIs, FindCoordinator); a larger one closes the
	// connection when its size prefix arrives. Default 8 MiB: a
	// SyncGroup from the leader of a large group carries every
	// member's assignment.
	MaxGroupRequest int32
	// MaxRewriteResponse is the largest upstream response kproxy reads
	// whole to rewrite broker addresses in (Metadata, ApiVersions,
	// FindCoordinator, DescribeCluster). Responses rewritten as they
	// stream (Produce v10+, ShareFetch, ShareAcknowledge; spool.go) are
	// not held whole: for them it bounds the end after their partitions,
	// and the whole response only when no temporary file can be made.
	// Default MaxFrame: a large cluster's Metadata is tens of MiB.
	MaxRewriteResponse int32
	// FrameMemory bounds, process-wide, the bytes of the frames above
	// held at once. A frame reserves its announced size before its body
	// is read; one that does not fit is refused and its connection
	// closed. Default 256 MiB.
	FrameMemory int64
	// MaxInFlight bounds the requests in flight on one client connection;
	// a full queue stops reading from the client. Default 128.
	MaxInFlight int
	// RequestTimeout bounds the time from a request's first byte to its
	// last; a client slower than that is disconnected. Default 30s.
	RequestTimeout time.Duration
	// IdleTimeout closes a connection that sent no request and awaits
	// no response for that long (Kafka's connections.max.idle.ms).
	// Default 10m.
	IdleTimeout time.Duration
	// MaxConnections bounds the client connections open at once, over
	// every listener; a connection beyond it is closed at accept.
	// Default 50,000 (each takes two file descriptors).
	MaxConnections int
	// MaxConnectionsPerHost bounds the client connections from one IP
	// address (Kafka's max.connections.per.ip). Default 10,000.
	MaxConnectionsPerHost int
	// DialTimeout bounds connecting to a broker; default 10s.
	DialTimeout time.Duration
	// ApiVersionsTimeout bounds the wait for a broker's answer to a
	// forwarded ApiVersions request; past it the client is answered from
	// the last ApiVersions answer a broker gave through this kproxy
	// (apiversions.go). Default 1s.
	ApiVersionsTimeout time.Duration
	// Dial, when set, connects to a broker instead of net.Dial (tests
	// put a fault relay between kproxy and the brokers with it); TLS, if
	// configured, runs over the connection it returns.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MetadataInterval is how often the proxy refreshes the broker list
	// on its own to open listeners for new brokers; default 30s.
	MetadataInterval time.Duration
	// TLS, when set, makes every client listener (bootstrap and per
	// broker) a TLS listener served from these files (see tls.go).
	TLS *TLSSource
	// UpstreamTLS, when set, makes each session's upstream connection a
	// TLS client connection with this configuration (a ServerName left
	// empty is the broker's host). The client's SASL passes through it.
	UpstreamTLS *tls.Config
	// UpstreamClientOpts are added to the options of the proxy's own
	// upstream client, which discovers brokers: TLS and SASL for a
	// cluster that requires them.
	UpstreamClientOpts []kgo.Opt
	// Coordinator serves group APIs. Nil forwards them to the brokers
	// (FindCoordinator responses are then rewritten like any other).
	Coordinator Coordinator
	// Forwarder, when set with Coordinator, names the groups the
	// cluster's own coordinator serves: their requests are forwarded
	// upstream on the client's connection (forward.go).
	Forwarder GroupForwarder
	// Shares, when set, serves share groups (KIP-932) in kproxy: the
	// share-group APIs are served locally (membership by Coordinator,
	// ShareFetch and ShareAcknowledge by Shares) and advertised at the
	// versions kproxy speaks, whatever the brokers support. nil
	// forwards them to the cluster.
	Shares ShareService
	// ConfigsAltered, when set, is handed each AlterConfigs and
	// IncrementalAlterConfigs response forwarded to a client, decoded
	// (nil when it could not be), before the client gets it: kproxy
	// reads a group's GROUP configs again once the cluster changed them.
	// It runs on the session's response path and must not block.
	ConfigsAltered func(kmsg.Response)
	// GroupConfigs, when set, answers the DescribeConfigs, AlterConfigs
	// and IncrementalAlterConfigs requests whose resources are all GROUP
	// configs (kproxy keeps them for a cluster that has none,
	// groupconfig.Service); a request naming any other resource goes to
	// the brokers unchanged (groupconfigs.go). Its Handle must not block.
	GroupConfigs Coordinator
	// RequireSASL says the cluster requires SASL (kproxy's own client
	// is configured with it): a group request, or FindCoordinator, on a
	// connection that has not completed a SASL exchange the broker
	// accepted closes the connection, as a broker closes one that sends
	// anything but ApiVersions, SaslHandshake and SaslAuthenticate
	// before authenticating. No group state is touched.
	RequireSASL bool
	// Logger; nil discards.
	Logger *slog.Logger
	// MeterProvider records request, byte and connection metrics; nil
	// records nothing.
	MeterProvider metric.MeterProvider
}

func (c *Config) setDefaults() error {
	var errs []error
	if len(c.Upstreams) == 0 {
		errs = append(errs, errors.New("no upstream broker given"))
	}
	for _, u := range c.Upstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			errs = append(errs, fmt.Errorf("upstream %q: %w", u, err))
		}
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:9092"
	}
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %w", c.Listen, err))
	} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		errs = append(errs, fmt.Errorf("listen %q: bad port", c.Listen))
	}
	if c.AdvertiseHost == "" {
		c.AdvertiseHost = host
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			if h, err := osHostname(); err == nil {
				c.AdvertiseHost = h
			}
		}
	}
	if c.MaxFrame <= 0 {
		c.MaxFrame = codec.DefaultMaxFrame
	}
	if c.MaxGroupRequest <= 0 {
		c.MaxGroupRequest = min(8<<20, c.MaxFrame)
	}
	if c.MaxRewriteResponse <= 0 {
		c.MaxRewriteResponse = c.MaxFrame
	}
	if c.FrameMemory <= 0 {
		c.FrameMemory = 256 << 20
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 128
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = 50000
	}
	if c.MaxConnectionsPerHost <= 0 {
		c.MaxConnectionsPerHost = 10000
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.ApiVersionsTimeout <= 0 {
		c.ApiVersionsTimeout = time.Second
	}
	if c.MetadataInterval <= 0 {
		c.MetadataInterval = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return errors.Join(errs...)
}
