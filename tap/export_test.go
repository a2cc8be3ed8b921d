package tap

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/kproxy/kproxy/groupstate"
)

// receiver collects the spans an OTLP receiver got.
type receiver struct {
	mu    sync.Mutex // guards spans and resources
	spans []*tracepb.Span
	// resourceSpans keeps every export whole, resources included.
	resourceSpans []*tracepb.ResourceSpans
	attrs         map[string]string // resource attributes seen
	got           chan struct{}     // signalled on every export
}

func newReceiver() *receiver {
	return &receiver{attrs: map[string]string{}, got: make(chan struct{}, 100)}
}

func (rc *receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	rc.mu.Lock()
	rc.resourceSpans = append(rc.resourceSpans, req.GetResourceSpans()...)
	for _, rs := range req.GetResourceSpans() {
		for _, kv := range rs.GetResource().GetAttributes() {
			rc.attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			rc.spans = append(rc.spans, ss.GetSpans()...)
		}
	}
	rc.mu.Unlock()
	select {
	case rc.got <- struct{}{}:
	default:
	}
}

// check asserts the receiver got one full rebalance of group "g".
func (rc *receiver) check(t *testing.T) {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	byName := map[string]*tracepb.Span{}
	for _, s := range rc.spans {
		byName[s.GetName()] = s
	}
	root, join, sync := byName["rebalance"], byName["join"], byName["sync"]
	if root == nil || join == nil || sync == nil {
		t.Fatalf("received spans %v, want rebalance g, join and sync", keys(byName))
	}
	if !bytes.Equal(join.GetParentSpanId(), root.GetSpanId()) || !bytes.Equal(join.GetTraceId(), root.GetTraceId()) {
		t.Errorf("join is not a child of the root")
	}
	attrs := map[string]string{}
	for _, kv := range root.GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue().GetStringValue()
	}
	if attrs["messaging.consumer.group.name"] != "g" || attrs["kproxy.rebalance.cause"] != "member_joined" {
		t.Errorf("root attributes %v", attrs)
	}
	if rc.attrs["service.name"] != "kproxy-test" {
		t.Errorf("resource service.name %q, want kproxy-test", rc.attrs["service.name"])
	}
	if d := time.Duration(root.GetEndTimeUnixNano() - root.GetStartTimeUnixNano()); d != 2*time.Second {
		t.Errorf("root lasted %v, want 2s", d)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// exportOneRebalance creates a Tap from cfg, feeds it one rebalance and
// shuts it down (which exports).
func exportOneRebalance(t *testing.T, cfg Config, wantExporter string) {
	t.Helper()
	cfg.ServiceName = "kproxy-test"
	tp, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if got := tp.TraceExporter(); got != wantExporter {
		t.Errorf("exporter %q, want %q", got, wantExporter)
	}
	completedRebalance(tp, newSeq("g"), groupstate.CauseMemberJoined, 1, member("m1"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// clearOTELEnv empties the OTEL variables the exporters read.
func clearOTELEnv(t *testing.T) {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(k, "")
	}
}

// newHTTPReceiver serves OTLP/HTTP protobuf at /v1/traces.
func newHTTPReceiver(t *testing.T) (*receiver, *httptest.Server, *http.Header) {
	rc := newReceiver()
	var hdr http.Header
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "unexpected "+r.URL.Path+" "+r.Header.Get("Content-Type"), http.StatusBadRequest)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		hdr = r.Header.Clone()
		mu.Unlock()
		rc.add(&req)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return rc, srv, &hdr
}

func TestOTLPHTTPExportFromConfig(t *testing.T) {
	clearOTELEnv(t)
	rc, srv, hdr := newHTTPReceiver(t)
	exportOneRebalance(t, Config{Traces: TracesConfig{
		Endpoint: srv.URL, Headers: map[string]string{"x-api-key": "secret"},
	}}, "otlp-http")
	rc.check(t)
	if got := hdr.Get("X-Api-Key"); got != "secret" {
		t.Errorf("header x-api-key = %q, want secret", got)
	}
}

func TestOTLPHTTPExportFromEnv(t *testing.T) {
	clearOTELEnv(t)
	rc, srv, _ := newHTTPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	// The environment wins over the config file's endpoint.
	exportOneRebalance(t, Config{Traces: TracesConfig{Endpoint: "http://127.0.0.1:1"}}, "otlp-http")
	rc.check(t)
}

// grpcReceiver implements the OTLP trace service.
type grpcReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	rc *receiver
}

func (g grpcReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.rc.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func newGRPCReceiver(t *testing.T) (*receiver, string) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc := newReceiver()
	s := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(s, grpcReceiver{rc: rc})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return rc, lis.Addr().String()
}

func TestOTLPGRPCExportFromConfig(t *testing.T) {
	clearOTELEnv(t)
	rc, addr := newGRPCReceiver(t)
	exportOneRebalance(t, Config{Traces: TracesConfig{Protocol: "grpc", Endpoint: "http://" + addr}}, "otlp-grpc")
	rc.check(t)
}

func TestOTLPGRPCExportFromEnv(t *testing.T) {
	clearOTELEnv(t)
	rc, addr := newGRPCReceiver(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://"+addr)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
	exportOneRebalance(t, Config{}, "otlp-grpc")
	rc.check(t)
}

func TestConsoleExporter(t *testing.T) {
	clearOTELEnv(t)
	var buf syncBuffer
	exportOneRebalance(t, Config{Traces: TracesConfig{Exporter: "console", Stdout: &buf}}, "console")
	out := buf.String()
	for _, want := range []string{`"Name": "rebalance"`, `"Name": "join"`, `"Name": "sync"`, `"messaging.consumer.group.name"`} {
		if !strings.Contains(out, want) {
			t.Errorf("console output lacks %s", want)
		}
	}
}

func TestExporterSelection(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		cfg  TracesConfig
		want string
		err  bool
	}{
		{name: "nothing configured", want: "none"},
		{name: "env none beats config", env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, cfg: TracesConfig{Endpoint: "http://127.0.0.1:4318"}, want: "none"},
		{name: "sdk disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, want: "none"},
		{name: "config endpoint implies otlp", cfg: TracesConfig{Endpoint: "http://127.0.0.1:4318"}, want: "otlp-http"},
		{name: "env endpoint implies otlp", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: "otlp-grpc"},
		{name: "env console", env: map[string]string{"OTEL_TRACES_EXPORTER": "console"}, cfg: TracesConfig{Stdout: io.Discard}, want: "console"},
		{name: "config otlp-grpc shorthand", cfg: TracesConfig{Exporter: "otlp-grpc", Endpoint: "http://127.0.0.1:4317"}, want: "otlp-grpc"},
		{name: "config otlp-http shorthand", cfg: TracesConfig{Exporter: "otlp-http"}, want: "otlp-http"},
		{name: "env protocol beats the shorthand", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, cfg: TracesConfig{Exporter: "otlp-grpc"}, want: "otlp-http"},
		{name: "unknown exporter", cfg: TracesConfig{Exporter: "zipkin"}, err: true},
		{name: "unknown protocol", cfg: TracesConfig{Exporter: "otlp", Protocol: "http/json"}, err: true},
		{name: "bad endpoint", cfg: TracesConfig{Endpoint: "collector:4317"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Traces: tc.cfg, Getenv: func(k string) string { return tc.env[k] }}
			exp, name, err := newSpanExporter(context.Background(), cfg)
			if tc.err {
				if err == nil {
					t.Fatalf("no error, exporter %q", name)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if name != tc.want {
				t.Errorf("exporter %q, want %q", name, tc.want)
			}
			if (exp == nil) != (tc.want == "none") {
				t.Errorf("exporter %v for %q", exp, tc.want)
			}
			if exp != nil {
				_ = exp.Shutdown(context.Background())
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for the exporter's goroutine.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
