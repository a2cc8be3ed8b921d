package tap

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kproxy/kproxy/groupstate"
)

// failingExporter fails every export, as an exporter pointed at the wrong
// port does.
type failingExporter struct {
	mu    sync.Mutex // guards calls
	calls int
}

func (f *failingExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	return errors.New(`traces export: Post "http://127.0.0.1:4317/v1/traces": net/http: HTTP/1.x transport connection broken: malformed HTTP response`)
}

func (f *failingExporter) Shutdown(context.Context) error { return nil }

func (f *failingExporter) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// logLines decodes the JSON log lines in buf.
func logLines(t *testing.T, buf *syncBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func linesWithMsg(lines []map[string]any, msg string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["msg"] == msg {
			out = append(out, l)
		}
	}
	return out
}

// TestExportFailuresAreLoggedRateLimited: every span export fails; the
// failures reach the Tap's slog logger as one line, not one per export.
func TestExportFailuresAreLoggedRateLimited(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	fail := &failingExporter{}
	tp, _ := newTestTap(t, Config{SpanExporter: fail, Logger: log})
	for i := range 5 {
		completedRebalance(tp, newSeq("g"), groupstate.CauseMemberJoined, int32(i+1), member("m1"))
	}
	flush(t, tp)
	if fail.count() < 15 {
		t.Fatalf("%d exports, want one per span (15)", fail.count())
	}
	failed := linesWithMsg(logLines(t, &buf), "tap: exporting traces failed")
	if len(failed) != 1 {
		t.Fatalf("%d export-failure lines for %d failures, want 1:\n%s", len(failed), fail.count(), buf.String())
	}
	if l := failed[0]; l["level"] != "WARN" || !strings.Contains(l["err"].(string), "malformed HTTP response") {
		t.Errorf("export-failure line %v", l)
	}
}

// TestExportErrorsSuppressedCount: after the quiet period the next line
// says how many failures it left out.
func TestExportErrorsSuppressedCount(t *testing.T) {
	var buf syncBuffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := newExportErrors(slog.New(slog.NewJSONHandler(&buf, nil)), exportTarget{Endpoint: "http://c:4317/v1/traces", Protocol: "http/protobuf", Hint: protocolHint("http/protobuf", "http://c:4317/v1/traces")})
	h.now = func() time.Time { return now }
	for range 100 {
		h.Handle(errors.New("boom"))
		now = now.Add(100 * time.Millisecond)
	}
	now = now.Add(time.Minute)
	h.Handle(errors.New("boom again"))
	lines := linesWithMsg(logLines(t, &buf), "tap: exporting traces failed")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2 for 101 errors over 70s:\n%s", len(lines), buf.String())
	}
	last := lines[1]
	if last["suppressed"] != float64(99) || last["err"] != "boom again" {
		t.Errorf("second line %v, want suppressed=99 and the latest error", last)
	}
	if last["endpoint"] != "http://c:4317/v1/traces" || last["protocol"] != "http/protobuf" || !strings.Contains(last["hint"].(string), "OTEL_EXPORTER_OTLP_PROTOCOL=grpc") {
		t.Errorf("second line %v, want endpoint, protocol and the port hint", last)
	}
}

// TestStartLineNamesTarget: the start line names the endpoint and the
// protocol, and warns when the port is the other protocol's.
func TestStartLineNamesTarget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		cfg      TracesConfig
		endpoint string
		protocol string
		hint     bool
	}{
		{name: "http to the gRPC port", cfg: TracesConfig{Endpoint: "http://127.0.0.1:4317"},
			endpoint: "http://127.0.0.1:4317/v1/traces", protocol: "http/protobuf", hint: true},
		{name: "grpc to the HTTP port", cfg: TracesConfig{Endpoint: "http://127.0.0.1:4318", Protocol: "grpc"},
			endpoint: "http://127.0.0.1:4318", protocol: "grpc", hint: true},
		{name: "grpc to 4317", cfg: TracesConfig{Endpoint: "http://127.0.0.1:4317", Protocol: "grpc"},
			endpoint: "http://127.0.0.1:4317", protocol: "grpc"},
		{name: "env base URL, protocol unset", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"},
			endpoint: "http://collector:4317/v1/traces", protocol: "http/protobuf", hint: true},
		{name: "env full URL", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"},
			endpoint: "http://collector:4318/v1/traces", protocol: "http/protobuf"},
		{name: "default", cfg: TracesConfig{Exporter: "otlp"},
			endpoint: "https://localhost:4318/v1/traces", protocol: "http/protobuf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf syncBuffer
			tp, err := New(context.Background(), Config{
				Traces: tc.cfg, Getenv: func(k string) string { return tc.env[k] },
				Logger: slog.New(slog.NewJSONHandler(&buf, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := tp.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			lines := logLines(t, &buf)
			started := linesWithMsg(lines, "tap started")
			if len(started) != 1 || started[0]["endpoint"] != tc.endpoint || started[0]["protocol"] != tc.protocol {
				t.Errorf("start lines %v, want endpoint %s protocol %s", started, tc.endpoint, tc.protocol)
			}
			hints := linesWithMsg(lines, "tap: the traces endpoint's port does not match the OTLP protocol")
			if tc.hint != (len(hints) == 1) {
				t.Errorf("hint lines %v, want hint=%v", hints, tc.hint)
			}
		})
	}
}

// TestResourceAttributes: the resource names the service, its version,
// the host and the process, and the standard variables override it.
func TestResourceAttributes(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	res, err := newResource(context.Background(), Config{ServiceName: "kproxy", ServiceVersion: "v1.2.3", InstanceID: "web-1"})
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	got := attrMap(res.Attributes())
	for k, want := range map[string]string{
		"service.name": "kproxy", "service.version": "v1.2.3", "service.instance.id": "web-1",
		"host.name": host, "process.pid": strconv.Itoa(os.Getpid()),
	} {
		if v := got[k].String(); v != want {
			t.Errorf("%s = %q, want %q", k, v, want)
		}
	}

	t.Setenv("OTEL_SERVICE_NAME", "kproxy-eu")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "service.namespace=payments,deployment.environment.name=prod")
	res, err = newResource(context.Background(), Config{ServiceName: "kproxy"})
	if err != nil {
		t.Fatal(err)
	}
	got = attrMap(res.Attributes())
	for k, want := range map[string]string{
		"service.name": "kproxy-eu", "service.namespace": "payments", "deployment.environment.name": "prod",
	} {
		if v := got[k].String(); v != want {
			t.Errorf("from the environment: %s = %q, want %q", k, v, want)
		}
	}
}
