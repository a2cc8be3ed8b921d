package proxy

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/kproxy/kproxy/codec"
)

// numRoutes bounds the routes requests are counted under: codec's
// Forward, Rewrite and Local. A refused request closes its connection and
// is counted as a refusal, not a request.
const numRoutes = codec.Refuse

// refusal is why a connection or a frame was refused.
type refusal uint8

const (
	refusedNone            refusal = iota
	refusedTooLarge                // a held frame over its API's limit
	refusedBudget                  // the process-wide frame budget is spent
	refusedConnLimit               // over the total connection limit
	refusedHostLimit               // over the per-host connection limit
	refusedReadTimeout             // a request not complete within the read timeout
	refusedIdle                    // a connection idle past the idle timeout
	refusedUnauthenticated         // a group request before SASL completed, where the cluster requires it
	numRefusals
)

var refusalNames = [numRefusals]string{"none", "frame_too_large", "frame_memory", "connection_limit", "host_connection_limit", "read_timeout", "idle_timeout", "unauthenticated"}

// processStart anchors nanotime so that slots carry a plain int64.
var processStart = time.Now()

func nanotime() int64 { return int64(time.Since(processStart)) }

// metrics holds the proxy's instruments. The attribute options for every
// (api, route) pair are built once so that recording does not allocate.
// Immutable after newMetrics; the instruments are safe for concurrent use.
type metrics struct {
	requests metric.Int64ObservableCounter
	duration metric.Float64Histogram
	conns    metric.Int64UpDownCounter
	upErrors metric.Int64Counter
	down     metric.Int64UpDownCounter
	refusals metric.Int64Counter
	acceptEr metric.Int64Counter
	apivLate metric.Int64Counter
	refOpts  [numRefusals][]metric.AddOption
	accOpts  [2][]metric.AddOption // acceptEr by reason: other, file_descriptors

	// Bytes are counted in atomics and read by observable counters at
	// collection time: one atomic add per request instead of an SDK call.
	in, out atomic.Int64

	// counts are the requests by api key and route, read by the
	// kproxy.requests observable counter at collection time: an SDK Add
	// per request (its attribute lookup) was an eighth of kproxy's CPU
	// under a heartbeat load.
	counts     [][numRoutes]atomic.Int64
	obsOpts    [][numRoutes][]metric.ObserveOption // by api key
	recordOpts [][numRoutes][]metric.RecordOption  // by api key
}

func newMetrics(mp metric.MeterProvider) *metrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/kproxy/kproxy/proxy")
	x := &metrics{}
	// Errors from instrument creation only happen for invalid names,
	// which these are not; a failed instrument is a no-op one.
	x.requests, _ = m.Int64ObservableCounter("kproxy.requests", metric.WithDescription("Requests handled, by API and route (forwarded, rewritten, local)."))
	x.duration, _ = m.Float64Histogram("kproxy.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from reading a request to writing its response, by API and route."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
	bin, _ := m.Int64ObservableCounter("kproxy.bytes.in", metric.WithUnit("By"), metric.WithDescription("Request bytes read from clients."))
	bout, _ := m.Int64ObservableCounter("kproxy.bytes.out", metric.WithUnit("By"), metric.WithDescription("Response bytes written to clients."))
	if bin != nil && bout != nil {
		// Registration only fails for instruments of another provider,
		// which these are not.
		_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			o.ObserveInt64(bin, x.in.Load())
			o.ObserveInt64(bout, x.out.Load())
			return nil
		}, bin, bout)
	}
	x.conns, _ = m.Int64UpDownCounter("kproxy.connections.open", metric.WithDescription("Open client connections."))
	x.upErrors, _ = m.Int64Counter("kproxy.upstream.errors", metric.WithDescription("Failed dials and metadata requests to upstream brokers."))
	x.down, _ = m.Int64UpDownCounter("kproxy.brokers.unreachable", metric.WithDescription("Broker listeners closed because their broker cannot be dialled; reopened when it answers."))
	x.refusals, _ = m.Int64Counter("kproxy.refused", metric.WithDescription("Connections closed by kproxy's limits, by reason: frames over their API's limit or the memory budget, connection limits, read and idle timeouts, group requests before SASL authentication."))
	x.acceptEr, _ = m.Int64Counter("kproxy.accept.errors", metric.WithDescription("Failed accepts, by reason: file_descriptors (EMFILE, ENFILE: out of file descriptors) or other; the listener backs off from 5ms to 1s and keeps accepting."))
	x.apivLate, _ = m.Int64Counter("kproxy.apiversions.cached", metric.WithDescription("ApiVersions requests answered from the brokers' last known versions because the broker did not answer within api_versions_timeout."))
	for i, reason := range []string{"other", "file_descriptors"} {
		x.accOpts[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", reason)))}
	}
	for r := range numRefusals {
		x.refOpts[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", refusalNames[r])))}
	}
	x.counts = make([][numRoutes]atomic.Int64, 100)
	x.obsOpts = make([][numRoutes][]metric.ObserveOption, 100)
	x.recordOpts = make([][numRoutes][]metric.RecordOption, 100)
	for k := range x.counts {
		name := kmsg.NameForKey(int16(k))
		for r := range numRoutes {
			set := attribute.NewSet(attribute.String("api", name), attribute.String("route", r.String()))
			x.obsOpts[k][r] = []metric.ObserveOption{metric.WithAttributeSet(set)}
			x.recordOpts[k][r] = []metric.RecordOption{metric.WithAttributeSet(set)}
		}
	}
	if x.requests != nil {
		// As with Add, a series appears with its first request.
		_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			for k := range x.counts {
				for r := range numRoutes {
					if n := x.counts[k][r].Load(); n > 0 {
						o.ObserveInt64(x.requests, n, x.obsOpts[k][r]...)
					}
				}
			}
			return nil
		}, x.requests)
	}
	return x
}

func (x *metrics) request(key int16, r codec.Route, start int64) {
	if key < 0 || int(key) >= len(x.counts) || r >= numRoutes {
		return
	}
	x.counts[key][r].Add(1)
	x.duration.Record(context.Background(), float64(nanotime()-start)/1e9, x.recordOpts[key][r]...)
}

func (x *metrics) bytesIn(n int64)  { x.in.Add(n) }
func (x *metrics) bytesOut(n int64) { x.out.Add(n) }
func (x *metrics) connOpened()      { x.conns.Add(context.Background(), 1) }
func (x *metrics) connClosed()      { x.conns.Add(context.Background(), -1) }

func (x *metrics) upstreamError(ctx context.Context) {
	x.upErrors.Add(ctx, 1)
}

func (x *metrics) brokerDown(n int64) { x.down.Add(context.Background(), n) }

func (x *metrics) apiVersionsCached() { x.apivLate.Add(context.Background(), 1) }

func (x *metrics) refused(r refusal) { x.refusals.Add(context.Background(), 1, x.refOpts[r]...) }

func (x *metrics) acceptError(fds bool) {
	i := 0
	if fds {
		i = 1
	}
	x.acceptEr.Add(context.Background(), 1, x.accOpts[i]...)
}
