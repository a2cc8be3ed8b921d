package tap

import (
	"context"
	"fmt"
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
	if cfg.SpanExporter != nil {
		return cfg.SpanExporter, "custom", nil
	}
	env := cfg.Getenv
	if strings.EqualFold(strings.TrimSpace(env("OTEL_SDK_DISABLED")), "true") {
		return nil, "none", nil
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
		return nil, "none", nil
	case "console", "stdout":
		w := cfg.Traces.Stdout
		if w == nil {
			w = os.Stdout
		}
		exp, err := stdouttrace.New(stdouttrace.WithWriter(w), stdouttrace.WithPrettyPrint())
		if err != nil {
			return nil, "", fmt.Errorf("tap: console trace exporter: %w", err)
		}
		return exp, "console", nil
	case "otlp":
		return newOTLPExporter(ctx, cfg, envEndpoint)
	default:
		return nil, "", fmt.Errorf("tap: unsupported trace exporter %q (want otlp, console or none)", kind)
	}
}

// newOTLPExporter builds an OTLP exporter over gRPC or HTTP. Settings the
// environment carries are left to the exporter, which reads OTEL_* itself;
// the Config supplies only what the environment does not.
func newOTLPExporter(ctx context.Context, cfg Config, envEndpoint bool) (sdktrace.SpanExporter, string, error) {
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
			return nil, "", fmt.Errorf("tap: traces endpoint %q: %w", cfg.Traces.Endpoint, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, "", fmt.Errorf("tap: traces endpoint %q: want http://host:port or https://host:port", cfg.Traces.Endpoint)
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
			return nil, "", fmt.Errorf("tap: otlp grpc trace exporter: %w", err)
		}
		return exp, "otlp-grpc", nil
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
			return nil, "", fmt.Errorf("tap: otlp http trace exporter: %w", err)
		}
		return exp, "otlp-http", nil
	default:
		return nil, "", fmt.Errorf("tap: unsupported OTLP protocol %q (want grpc or http/protobuf)", protocol)
	}
}
