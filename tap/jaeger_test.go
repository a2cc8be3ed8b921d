//go:build jaeger

package tap

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestJaegerScenarios is the on-demand tier against a real trace backend:
// it starts Jaeger v2 (KPROXY_JAEGER_BIN: a jaeger binary, for example
// built from github.com/jaegertracing/jaeger/cmd/jaeger v1.76.0, which is
// Jaeger 2.x), exports the scenarios of scenarios_test.go to it over
// OTLP/gRPC, and checks the traces Jaeger's query API returns. It is
// built only with the jaeger build tag (go test -tags jaeger), and fails
// without KPROXY_JAEGER_BIN; TestOTLPScenariosInProcess covers the same
// scenarios in every run.
func TestJaegerScenarios(t *testing.T) {
	bin := os.Getenv("KPROXY_JAEGER_BIN")
	if bin == "" {
		t.Fatal("KPROXY_JAEGER_BIN not set: this tier needs a Jaeger v2 binary (see tap/README.md)")
	}
	clearOTELEnv(t)
	otlpPort, queryPort, queryGRPCPort := freePort(t), freePort(t), freePort(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    max_clock_skew_adjust: 0s
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, queryPort, queryGRPCPort, otlpPort)
	cfgPath := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "jaeger.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting jaeger: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	query := "http://127.0.0.1:" + strconv.Itoa(queryPort)
	waitHTTP(t, query+"/api/services", 60*time.Second, func() string {
		b, _ := os.ReadFile(logf.Name())
		return string(b)
	})
	t.Logf("jaeger ready in %v", time.Since(started).Round(time.Millisecond))

	service := "kproxy-jaeger-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	tp, err := New(context.Background(), Config{
		ServiceName: service, Getenv: noEnv,
		Traces: TracesConfig{Protocol: "grpc", Endpoint: "http://127.0.0.1:" + strconv.Itoa(otlpPort)},
	})
	if err != nil {
		t.Fatal(err)
	}
	runTraceScenarios(t, tp)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// Jaeger stores asynchronously: poll until the six rebalances are in
	// and two answers in a row hold as many spans.
	var spans []gotSpan
	deadline := time.Now().Add(30 * time.Second)
	for prev := -1; ; {
		spans = jaegerSpans(t, query, service)
		roots := 0
		for _, s := range spans {
			if s.Parent == "" {
				roots++
			}
		}
		if (roots >= 6 && len(spans) == prev) || time.Now().After(deadline) {
			break
		}
		prev = len(spans)
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("jaeger returned %d spans of service %s", len(spans), service)
	checkScenarioTraces(t, spans, service)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitHTTP polls url until it answers 200.
func waitHTTP(t *testing.T, url string, limit time.Duration, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer within %v (%v); jaeger's log:\n%s", url, limit, err, logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// jaegerTraces is the part of Jaeger's /api/traces answer the test reads.
type jaegerTraces struct {
	Data []struct {
		Spans []struct {
			TraceID       string `json:"traceID"`
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			References    []struct {
				RefType string `json:"refType"`
				TraceID string `json:"traceID"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			StartTime int64       `json:"startTime"` // µs
			Duration  int64       `json:"duration"`  // µs
			Tags      []jaegerTag `json:"tags"`
			Logs      []struct {
				Timestamp int64       `json:"timestamp"`
				Fields    []jaegerTag `json:"fields"`
			} `json:"logs"`
			ProcessID string `json:"processID"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string      `json:"serviceName"`
			Tags        []jaegerTag `json:"tags"`
		} `json:"processes"`
	} `json:"data"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

func jaegerTagMap(tags []jaegerTag) map[string]string {
	m := map[string]string{}
	for _, tg := range tags {
		m[tg.Key] = fmt.Sprint(tg.Value)
	}
	return m
}

// jaegerSpans queries Jaeger for service's traces and converts them.
func jaegerSpans(t *testing.T, query, service string) []gotSpan {
	t.Helper()
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	to := time.Now().Add(24 * time.Hour).UnixMicro()
	url := fmt.Sprintf("%s/api/traces?service=%s&limit=1000&start=%d&end=%d&lookback=custom", query, service, from, to)
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("querying jaeger: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("querying jaeger: %d %v %s", resp.StatusCode, err, body)
	}
	var tr jaegerTraces
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&tr); err != nil {
		t.Fatalf("decoding jaeger's answer: %v", err)
	}
	var out []gotSpan
	for _, d := range tr.Data {
		for _, s := range d.Spans {
			p := d.Processes[s.ProcessID]
			res := jaegerTagMap(p.Tags)
			res["service.name"] = p.ServiceName
			g := gotSpan{
				Name: s.OperationName, TraceID: s.TraceID, SpanID: s.SpanID,
				Start:    time.UnixMicro(s.StartTime).UTC(),
				End:      time.UnixMicro(s.StartTime + s.Duration).UTC(),
				Attrs:    jaegerTagMap(s.Tags),
				Resource: res,
			}
			g.Error = g.Attrs["error"] == "true"
			for _, r := range s.References {
				switch {
				case r.RefType == "CHILD_OF" && r.TraceID == s.TraceID && g.Parent == "":
					g.Parent = r.SpanID
				default:
					g.Links = append(g.Links, r.SpanID)
				}
			}
			for _, l := range s.Logs {
				f := jaegerTagMap(l.Fields)
				name := f["event"]
				delete(f, "event")
				g.Events = append(g.Events, gotEvent{Name: name, Time: time.UnixMicro(l.Timestamp).UTC(), Attrs: f})
			}
			out = append(out, g)
		}
	}
	return out
}
