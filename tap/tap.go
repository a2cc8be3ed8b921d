// Package tap makes the coordinator engine's rebalances visible. It turns
// engine events into OpenTelemetry traces (one trace per rebalance) and
// metrics (exposed in Prometheus format), keeps a live stream of the events
// for the group API, the web view and `kproxy tap`, and serves them over
// HTTP (NewHTTPHandler: health.go, api.go, api_fleet.go, webview.go; the
// page itself is in webview/static). It consumes engine events and
// snapshots and never calls back into the engine's state machines.
package tap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/kproxy/kproxy/groupstate"
)

// instrumentationName is the OpenTelemetry scope of everything tap records.
const instrumentationName = "github.com/kproxy/kproxy/tap"

// GroupSource is what tap reads group snapshots from: the engine
// (groupstate.Engine) satisfies it.
type GroupSource interface {
	// Groups returns a snapshot of every group the engine knows.
	Groups() []groupstate.GroupSnapshot
	// Group returns a snapshot of one group and whether it exists.
	Group(id string) (groupstate.GroupSnapshot, bool)
}

// ShareSource is what tap reads share groups' figures from (KIP-932),
// when its GroupSource provides them too: the engine
// (groupstate.Engine) does.
type ShareSource interface {
	// ShareCounters returns the engine's share-group counters.
	ShareCounters() groupstate.ShareCounters
	// ShareGroupStats sums each share group's share-partitions.
	ShareGroupStats() []groupstate.ShareGroupStat
	// ShareStates returns one share group's share-partitions.
	ShareStates(group string) ([]groupstate.ShareStats, bool)
}

// The engine provides share groups' figures.
var _ ShareSource = (*groupstate.Engine)(nil)

// Config configures a Tap. Every field has a usable zero value.
type Config struct {
	// ServiceName is the service.name resource attribute, "kproxy" when
	// empty. OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it.
	ServiceName string
	// ServiceVersion is the service.version resource attribute.
	ServiceVersion string
	// InstanceID names this kproxy (its fleet id): the
	// service.instance.id resource attribute and the kproxy.owner
	// attribute of every rebalance trace.
	InstanceID string
	// Traces chooses where rebalance traces go.
	Traces TracesConfig
	// Groups feeds the group gauges. It may be nil here and set later
	// with SetGroupSource, since the engine usually needs the Tap's sink
	// before it exists.
	Groups GroupSource
	// EventBuffer is the capacity of the queue between OnEvent and the
	// tap goroutine, 4096 when zero. Events arriving while it is full are
	// dropped and counted.
	EventBuffer int
	// RecentEvents is how many recent events the live stream keeps and
	// replays to a new subscriber, 512 when zero.
	RecentEvents int
	// SubscriberBuffer is how many events each live-stream subscriber
	// may fall behind before it loses events, 256 when zero.
	SubscriberBuffer int
	// Logger receives tap's logs; slog.New(slog.DiscardHandler) when nil.
	Logger *slog.Logger
	// SpanExporter, when set, replaces the exporter chosen from Traces
	// and the environment (tests pass a tracetest.InMemoryExporter).
	SpanExporter sdktrace.SpanExporter
	// SyncExport exports every span as it ends instead of batching; for
	// tests and debugging.
	SyncExport bool
	// Getenv reads the environment; os.Getenv when nil.
	Getenv func(string) string
}

// TracesConfig chooses the trace exporter. The OTEL_* environment
// variables take precedence over it, as the OpenTelemetry specification
// describes; when neither names an exporter or an endpoint, no trace is
// exported.
type TracesConfig struct {
	// Exporter is "otlp", "otlp-grpc", "otlp-http" (the last two also
	// set Protocol), "console" (or "stdout") or "none". Empty means
	// "otlp" when an endpoint is configured (here or in
	// OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
	// and "none" otherwise. OTEL_TRACES_EXPORTER overrides it.
	Exporter string `yaml:"exporter" json:"exporter"`
	// Protocol is "grpc" or "http/protobuf" (the default).
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL and OTEL_EXPORTER_OTLP_PROTOCOL
	// override it.
	Protocol string `yaml:"protocol" json:"protocol"`
	// Endpoint is the collector's base URL, for example
	// http://collector:4318 (HTTP; /v1/traces is appended when the URL
	// has no path) or http://collector:4317 (gRPC). An http:// scheme
	// means plain text. The OTEL_EXPORTER_OTLP_*ENDPOINT variables
	// override it.
	Endpoint string `yaml:"endpoint" json:"endpoint"`
	// Headers are sent with every export (for example an API key).
	// OTEL_EXPORTER_OTLP_HEADERS and OTEL_EXPORTER_OTLP_TRACES_HEADERS
	// override them.
	Headers map[string]string `yaml:"headers" json:"headers"`
	// Stdout is where the console exporter writes, os.Stdout when nil.
	Stdout io.Writer `yaml:"-" json:"-"`
}

// Tap turns engine events into traces, metrics and a live event stream.
// Create it with New, hand OnEvent to the engine as its event sink, and
// call Shutdown when done.
type Tap struct {
	// Immutable after New.
	log      *slog.Logger
	tracer   trace.Tracer
	sdkTP    *sdktrace.TracerProvider // nil when traces are off
	mp       *sdkmetric.MeterProvider
	registry *prometheus.Registry
	inst     *instruments
	hub      *hub
	exporter string       // the trace exporter in use, for logs and tests
	target   exportTarget // where an OTLP exporter sends

	queue   chan queued   // written by OnEvent/Flush, read by run
	quit    chan struct{} // closed by Shutdown
	done    chan struct{} // closed when run returns
	stopped sync.Once

	shutdownOnce sync.Once
	shutdownErr  error // written once inside shutdownOnce

	dropped atomic.Int64                // events OnEvent could not queue
	groups  atomic.Pointer[groupSource] // set by New or SetGroupSource
	// forwarded lists the groups kproxy forwards to the cluster's
	// coordinator; set by SetForwardedSource.
	forwarded atomic.Pointer[func() []ForwardedGroup]

	// rebalances is the per-group trace state; owned by the run goroutine.
	rebalances *rebalanceTracker
}

// groupSource boxes a GroupSource so it fits in an atomic.Pointer.
type groupSource struct{ GroupSource }

// queued is one item on the tap queue: an event or a flush marker.
type queued struct {
	ev    groupstate.Event
	flush chan struct{} // non-nil for a flush marker; closed when reached
}

// New sets up OpenTelemetry tracing and metrics for kproxy and starts the
// goroutine that consumes engine events. The context bounds setup only.
func New(ctx context.Context, cfg Config) (*Tap, error) {
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	if cfg.ServiceName == "" {
		cfg.ServiceName = "kproxy"
	}
	if cfg.EventBuffer <= 0 {
		cfg.EventBuffer = 4096
	}
	if cfg.RecentEvents <= 0 {
		cfg.RecentEvents = 512
	}
	if cfg.SubscriberBuffer <= 0 {
		cfg.SubscriberBuffer = 256
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}

	res, err := newResource(ctx, cfg)
	if err != nil {
		return nil, err
	}

	t := &Tap{
		log:   log,
		queue: make(chan queued, cfg.EventBuffer),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
		hub:   newHub(cfg.RecentEvents, cfg.SubscriberBuffer),
	}
	if cfg.Groups != nil {
		t.groups.Store(&groupSource{cfg.Groups})
	}

	// Traces.
	exp, name, target, err := newSpanExporterTarget(ctx, cfg)
	if err != nil {
		return nil, err
	}
	t.exporter, t.target = name, target
	if exp != nil {
		// Export failures reach kproxy's log, rate-limited, instead of
		// the SDK's default (Go's log package, one line per failure).
		// The handler is process-wide: the latest Tap's logger gets them.
		otel.SetErrorHandler(newExportErrors(log, target))
	}
	if exp != nil {
		opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
		if cfg.SyncExport {
			opts = append(opts, sdktrace.WithSyncer(exp))
		} else {
			opts = append(opts, sdktrace.WithBatcher(exp))
		}
		t.sdkTP = sdktrace.NewTracerProvider(opts...)
		t.tracer = t.sdkTP.Tracer(instrumentationName)
	} else {
		t.tracer = noop.NewTracerProvider().Tracer(instrumentationName)
	}

	// Metrics: a private registry, so that nothing else in the process
	// leaks into kproxy's /metrics and tests can run Taps side by side.
	t.registry = prometheus.NewRegistry()
	if err := t.registry.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("tap: registering go collector: %w", err)
	}
	if err := t.registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("tap: registering process collector: %w", err)
	}
	promExp, err := otelprom.New(otelprom.WithRegisterer(t.registry), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("tap: prometheus exporter: %w", err)
	}
	t.mp = sdkmetric.NewMeterProvider(
		sdkmetric.WithResource(res),
		sdkmetric.WithReader(promExp),
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Unit: "s"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: secondsBuckets}},
		)),
	)
	t.inst, err = newInstruments(t.mp.Meter(instrumentationName), t)
	if err != nil {
		_ = t.mp.Shutdown(ctx)
		if t.sdkTP != nil {
			_ = t.sdkTP.Shutdown(ctx)
		}
		return nil, err
	}

	t.rebalances = newRebalanceTracker(t.tracer, t.inst, cfg.InstanceID)
	go t.run()
	startAttrs := []any{"trace_exporter", name}
	if target.Endpoint != "" {
		startAttrs = append(startAttrs, "endpoint", target.Endpoint, "protocol", target.Protocol)
	}
	log.Info("tap started", startAttrs...)
	if target.Hint != "" {
		log.Warn("tap: the traces endpoint's port does not match the OTLP protocol", "endpoint", target.Endpoint, "protocol", target.Protocol, "hint", target.Hint)
	}
	return t, nil
}

// newResource describes this process to OpenTelemetry: service.name,
// service.version (Config.ServiceVersion, else the module version the
// binary was built from), service.instance.id, host.name, process.pid and
// the SDK; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (for example
// service.namespace=payments) override them.
func newResource(ctx context.Context, cfg Config) (*resource.Resource, error) {
	attrs := []resource.Option{
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(cfg.ServiceName)),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
	}
	version := cfg.ServiceVersion
	if version == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			version = bi.Main.Version
		}
	}
	if version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(version)))
	}
	if cfg.InstanceID != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceInstanceID(cfg.InstanceID)))
	}
	attrs = append(attrs, resource.WithFromEnv()) // last: the environment overrides the defaults above
	res, err := resource.New(ctx, attrs...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tap: building resource: %w", err)
	}
	return res, nil
}

// ForwardedGroup is a group kproxy does not serve: the cluster's own
// coordinator does, and kproxy forwards its requests there (groups with
// members on the brokers, share groups, streams groups).
type ForwardedGroup struct {
	Group string `json:"group"`
	// Kind is the group's type on the cluster ("classic", "consumer",
	// "share", "streams"), as ListGroups names it; empty when kproxy
	// learned the cluster serves it without reading its type.
	Kind string `json:"kind"`
	// Since is when kproxy last decided.
	Since time.Time `json:"decided_at"`
}

// SetForwardedSource sets where the forwarded-groups gauge and
// /api/forwarded read from; fn must be safe to call from any goroutine.
func (t *Tap) SetForwardedSource(fn func() []ForwardedGroup) {
	t.forwarded.Store(&fn)
}

// forwardedGroups returns the groups forwarded now; nil without a source.
func (t *Tap) forwardedGroups() []ForwardedGroup {
	if fn := t.forwarded.Load(); fn != nil {
		return (*fn)()
	}
	return nil
}

// SetGroupSource sets where the group gauges read snapshots from. It is
// safe to call at any time.
func (t *Tap) SetGroupSource(g GroupSource) {
	if g == nil {
		t.groups.Store(nil)
		return
	}
	t.groups.Store(&groupSource{g})
}

// groupSource returns the current GroupSource or nil.
func (t *Tap) groupSource() GroupSource {
	if g := t.groups.Load(); g != nil {
		return g.GroupSource
	}
	return nil
}

// MeterProvider returns the provider whose instruments appear on /metrics.
// The proxy records its request, byte and connection metrics with it.
func (t *Tap) MeterProvider() metric.MeterProvider { return t.mp }

// TracerProvider returns the provider rebalance spans are created with (a
// no-op provider when traces are off).
func (t *Tap) TracerProvider() trace.TracerProvider {
	if t.sdkTP == nil {
		return noop.NewTracerProvider()
	}
	return t.sdkTP
}

// TraceExporter names the trace exporter in use: "otlp-grpc",
// "otlp-http", "console", "custom" or "none".
func (t *Tap) TraceExporter() string { return t.exporter }

// TraceTarget returns where an OTLP exporter sends spans (its URL or
// host:port) and with which protocol; empty for other exporters.
func (t *Tap) TraceTarget() (endpoint, protocol string) {
	return t.target.Endpoint, t.target.Protocol
}

// Registry returns the private Prometheus registry behind /metrics.
func (t *Tap) Registry() *prometheus.Registry { return t.registry }

// DroppedEvents returns how many engine events were dropped because the
// tap queue was full.
func (t *Tap) DroppedEvents() int64 { return t.dropped.Load() }

// OnEvent is the engine's event sink. It never blocks: when the queue is
// full (or the Tap is shut down) the event is dropped and counted. It is
// safe for concurrent use.
func (t *Tap) OnEvent(ev groupstate.Event) {
	// Copy the member slices: the engine may reuse them once we return.
	if ev.Member != nil {
		m := *ev.Member
		ev.Member = &m
	}
	if ev.Members != nil {
		ev.Members = append([]groupstate.Member(nil), ev.Members...)
	}
	select {
	case t.queue <- queued{ev: ev}:
	default:
		t.dropped.Add(1)
	}
}

// Flush waits until every event queued before the call has been
// processed, then exports pending spans.
func (t *Tap) Flush(ctx context.Context) error {
	marker := make(chan struct{})
	select {
	case t.queue <- queued{flush: marker}:
	case <-t.done:
		return errors.New("tap: shut down")
	case <-ctx.Done():
		return fmt.Errorf("tap: flush: %w", ctx.Err())
	}
	select {
	case <-marker:
	case <-t.done:
		return errors.New("tap: shut down")
	case <-ctx.Done():
		return fmt.Errorf("tap: flush: %w", ctx.Err())
	}
	if t.sdkTP != nil {
		if err := t.sdkTP.ForceFlush(ctx); err != nil {
			return fmt.Errorf("tap: flushing spans: %w", err)
		}
	}
	return nil
}

// run is the tap goroutine: it owns the rebalance trace state and is the
// only publisher to the live stream.
func (t *Tap) run() {
	defer close(t.done)
	for {
		select {
		case q := <-t.queue:
			t.handle(q)
		case <-t.quit:
			// Drain what is already queued, then close open rebalances.
			for {
				select {
				case q := <-t.queue:
					t.handle(q)
				default:
					t.rebalances.closeAll()
					t.hub.close()
					return
				}
			}
		}
	}
}

// handle processes one queue item on the tap goroutine.
func (t *Tap) handle(q queued) {
	if q.flush != nil {
		// Export what waits for a later event, so that a flush shows
		// everything that happened before it.
		t.rebalances.settle()
		close(q.flush)
		return
	}
	ev := q.ev
	t.inst.recordEvent(ev)
	t.rebalances.handle(ev)
	t.hub.publish(toStreamEvent(ev))
}

// Shutdown stops consuming events, ends the spans of rebalances still in
// progress, and flushes traces and metrics. Events sent after Shutdown are
// dropped. Calling it again returns the first call's result.
func (t *Tap) Shutdown(ctx context.Context) error {
	t.stopped.Do(func() { close(t.quit) })
	select {
	case <-t.done:
	case <-ctx.Done():
		return fmt.Errorf("tap: shutdown: %w", ctx.Err())
	}
	t.shutdownOnce.Do(func() {
		var errs []error
		if t.sdkTP != nil {
			if err := t.sdkTP.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("tap: trace provider shutdown: %w", err))
			}
		}
		if err := t.mp.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("tap: meter provider shutdown: %w", err))
		}
		t.shutdownErr = errors.Join(errs...)
	})
	return t.shutdownErr
}
