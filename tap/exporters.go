package tap

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newSpanExporter builds the span exporter that cfg and the environment
// ask for, and names it. It returns a nil exporter when traces are off.
//
// Precedence: Config.SpanExporter, then OTEL_SDK_DISABLED, then
// OTEL_TRACES_EXPORTER, then Config.Traces.Exporter; with neither, OTLP is
// used when an endpoint is configured somewhere and nothing otherwise.
func newSpanExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, string, error) {
	exp, name, _, err := newSpanExporterTarget(ctx, cfg)
	return exp, name, err
}

// exportTarget says where an OTLP exporter sends spans, for logs.
type exportTarget struct {
	Endpoint string // the URL (HTTP) or host:port (gRPC) spans go to
	Protocol string // "grpc" or "http/protobuf"; empty when not OTLP
	// Hint names the likely mistake when the endpoint's port is the
	// other protocol's well-known port (4317 gRPC, 4318 HTTP).
	Hint string
}

// newSpanExporterTarget is newSpanExporter that also says where an OTLP
// exporter sends.
func newSpanExporterTarget(ctx context.Context, cfg Config) (sdktrace.SpanExporter, string, exportTarget, error) {
	if cfg.SpanExporter != nil {
		return cfg.SpanExporter, "custom", exportTarget{}, nil
	}
	env := cfg.Getenv
	if strings.EqualFold(strings.TrimSpace(env("OTEL_SDK_DISABLED")), "true") {
		return nil, "none", exportTarget{}, nil
	}
	kind := strings.ToLower(strings.TrimSpace(env("OTEL_TRACES_EXPORTER")))
	if kind == "" {
		kind = strings.ToLower(strings.TrimSpace(cfg.Traces.Exporter))
	}
	envEndpoint := env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	// "otlp-grpc" and "otlp-http" name the protocol with the exporter,
	// as kproxy's config file allows.
	switch kind {
	case "otlp-grpc":
		kind, cfg.Traces.Protocol = "otlp", "grpc"
	case "otlp-http":
		kind, cfg.Traces.Protocol = "otlp", "http/protobuf"
	}
	if kind == "" {
		if envEndpoint || cfg.Traces.Endpoint != "" {
			kind = "otlp"
		} else {
			kind = "none"
		}
	}
	switch kind {
	case "none":
		return nil, "none", exportTarget{}, nil
	case "console", "stdout":
		w := cfg.Traces.Stdout
		if w == nil {
			w = os.Stdout
		}
		exp, err := stdouttrace.New(stdouttrace.WithWriter(w), stdouttrace.WithPrettyPrint())
		if err != nil {
			return nil, "", exportTarget{}, fmt.Errorf("tap: console trace exporter: %w", err)
		}
		return exp, "console", exportTarget{}, nil
	case "otlp":
		return newOTLPExporter(ctx, cfg, envEndpoint)
	default:
		return nil, "", exportTarget{}, fmt.Errorf("tap: unsupported trace exporter %q (want otlp, console or none)", kind)
	}
}

// newOTLPExporter builds an OTLP exporter over gRPC or HTTP. Settings the
// environment carries are left to the exporter, which reads OTEL_* itself;
// the Config supplies only what the environment does not.
func newOTLPExporter(ctx context.Context, cfg Config, envEndpoint bool) (sdktrace.SpanExporter, string, exportTarget, error) {
	env := cfg.Getenv
	protocol := strings.TrimSpace(env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if protocol == "" {
		protocol = strings.TrimSpace(env("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	if protocol == "" {
		protocol = strings.TrimSpace(cfg.Traces.Protocol)
	}
	if protocol == "" {
		protocol = "http/protobuf"
	}
	envHeaders := env("OTEL_EXPORTER_OTLP_TRACES_HEADERS") != "" || env("OTEL_EXPORTER_OTLP_HEADERS") != ""

	var endpoint *url.URL
	if !envEndpoint && cfg.Traces.Endpoint != "" {
		u, err := url.Parse(cfg.Traces.Endpoint)
		if err != nil {
			return nil, "", exportTarget{}, fmt.Errorf("tap: traces endpoint %q: %w", cfg.Traces.Endpoint, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, "", exportTarget{}, fmt.Errorf("tap: traces endpoint %q: want http://host:port or https://host:port", cfg.Traces.Endpoint)
		}
		endpoint = u
	}

	switch protocol {
	case "grpc":
		var opts []otlptracegrpc.Option
		if endpoint != nil {
			opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint.String()))
		}
		if !envHeaders && len(cfg.Traces.Headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(cfg.Traces.Headers))
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, "", exportTarget{}, fmt.Errorf("tap: otlp grpc trace exporter: %w", err)
		}
		return exp, "otlp-grpc", otlpTarget(env, "grpc", endpoint), nil
	case "http/protobuf", "http":
		var opts []otlptracehttp.Option
		if endpoint != nil {
			u := *endpoint
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		}
		if !envHeaders && len(cfg.Traces.Headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(cfg.Traces.Headers))
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		if err != nil {
			return nil, "", exportTarget{}, fmt.Errorf("tap: otlp http trace exporter: %w", err)
		}
		return exp, "otlp-http", otlpTarget(env, "http/protobuf", endpoint), nil
	default:
		return nil, "", exportTarget{}, fmt.Errorf("tap: unsupported OTLP protocol %q (want grpc or http/protobuf)", protocol)
	}
}

// otlpTarget works out where an OTLP exporter of protocol sends, as the
// exporter itself does: the signal-specific variable (a full URL), then
// OTEL_EXPORTER_OTLP_ENDPOINT (a base URL; HTTP adds /v1/traces), then
// the config file's endpoint, then the exporter's default.
func otlpTarget(env func(string) string, protocol string, cfgEndpoint *url.URL) exportTarget {
	t := exportTarget{Protocol: protocol}
	switch {
	case strings.TrimSpace(env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) != "":
		t.Endpoint = strings.TrimSpace(env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
	case strings.TrimSpace(env("OTEL_EXPORTER_OTLP_ENDPOINT")) != "":
		t.Endpoint = strings.TrimSpace(env("OTEL_EXPORTER_OTLP_ENDPOINT"))
		if protocol != "grpc" {
			t.Endpoint = strings.TrimSuffix(t.Endpoint, "/") + "/v1/traces"
		}
	case cfgEndpoint != nil:
		u := *cfgEndpoint
		if protocol != "grpc" && (u.Path == "" || u.Path == "/") {
			u.Path = "/v1/traces"
		}
		t.Endpoint = u.String()
	case protocol == "grpc":
		t.Endpoint = "https://localhost:4317"
	default:
		t.Endpoint = "https://localhost:4318/v1/traces"
	}
	t.Hint = protocolHint(protocol, t.Endpoint)
	return t
}

// protocolHint returns advice when endpoint's port is the well-known port
// of the other OTLP protocol: 4317 is OTLP/gRPC's, 4318 OTLP/HTTP's.
func protocolHint(protocol, endpoint string) string {
	host := endpoint
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		host = u.Host
	}
	_, port, err := net.SplitHostPort(host)
	if err != nil {
		return ""
	}
	switch {
	case port == "4317" && protocol != "grpc":
		return "port 4317 is OTLP/gRPC's: set OTEL_EXPORTER_OTLP_PROTOCOL=grpc (or protocol: grpc), or send OTLP/HTTP to port 4318"
	case port == "4318" && protocol == "grpc":
		return "port 4318 is OTLP/HTTP's: set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (or protocol: http/protobuf), or send OTLP/gRPC to port 4317"
	}
	return ""
}
