#!/usr/bin/env bash
# Screenshots of kproxy's rebalance traces in Jaeger's UI, on demand.
#
# Starts Jaeger v2 (KPROXY_JAEGER_BIN, memory storage) serving the built
# Jaeger UI in JAEGER_UI_DIR, starts `kproxy dev` exporting its traces to
# it over OTLP/HTTP, plays the rebalances of tap/jaeger/driver (a classic
# group with a late joiner and a killed member, a KIP-848 group gaining a
# member), stops kproxy so its last spans are flushed, then has headless
# chromium (playwright-core) open Jaeger's search page and two traces and
# save PNGs in OUT_DIR (default docs/images). Everything listens on
# 127.0.0.1 on free ports; every step is time-bounded; every process is
# stopped on exit. How to get the binary and the UI: tap/README.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
chromium=${CHROMIUM:-/usr/bin/chromium}
out=${OUT_DIR:-$root/docs/images}

fail() { echo "screenshot: FATAL: $*" >&2; exit 1; }
[ -n "${KPROXY_JAEGER_BIN:-}" ] && [ -x "$KPROXY_JAEGER_BIN" ] || fail "KPROXY_JAEGER_BIN must be a jaeger (v2) binary (tap/README.md)"
[ -n "${JAEGER_UI_DIR:-}" ] && [ -f "$JAEGER_UI_DIR/index.html" ] || fail "JAEGER_UI_DIR must hold the built Jaeger UI (index.html; tap/README.md)"
[ -x "$chromium" ] || fail "chromium is missing at $chromium (apt-get install -y chromium)"
for tool in node npm go curl; do command -v "$tool" >/dev/null || fail "$tool is not installed"; done

work=$(mktemp -d)
pids=()
# cleanup stops the processes in the reverse order of their start (the
# driver's clients leave while kproxy still answers), then removes $work.
cleanup() {
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# freeport VAR N sets VAR to a port P such that P..P+N-1 accept no
# connection on 127.0.0.1 and were not picked before (kproxy's broker
# listeners follow its bootstrap port). Ports are drawn below Linux's
# ephemeral range (32768 up), which outgoing connections take their local
# ports from.
taken=" "
freeport() {
	local -n port=$1
	local n=$2 p i
	for _ in $(seq 50); do
		p=$((20000 + RANDOM % 12000))
		for ((i = 0; i < n; i++)); do
			[[ $taken == *" $((p + i)) "* ]] && continue 2
			(exec 3<>"/dev/tcp/127.0.0.1/$((p + i))") 2>/dev/null && continue 2
		done
		for ((i = 0; i < n; i++)); do taken+="$((p + i)) "; done
		port=$p
		return
	done
	fail "no free port block of $n"
}
freeport q_http 1; freeport q_grpc 1; freeport otlp_grpc 1; freeport otlp_http 1
freeport kp_listen 4; freeport kp_admin 1

cat >"$work/jaeger.yaml" <<YAML
service:
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
    ui:
      assets_path: $JAEGER_UI_DIR
    http:
      endpoint: 127.0.0.1:$q_http
    grpc:
      endpoint: 127.0.0.1:$q_grpc
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$otlp_grpc
      http:
        endpoint: 127.0.0.1:$otlp_http
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
YAML

# waiturl URL SECONDS LOG PID: wait until URL answers 200, failing with
# LOG when PID exits or SECONDS pass.
waiturl() {
	local deadline=$((SECONDS + $2))
	until curl -fs -o /dev/null "$1"; do
		kill -0 "$4" 2>/dev/null || { cat "$3" >&2; fail "the process serving $1 exited"; }
		[ $SECONDS -lt $deadline ] || { cat "$3" >&2; fail "$1 did not answer within $2 s"; }
		sleep 0.2
	done
}

echo "screenshot: building kproxy and the driver" >&2
(cd "$root" && go build -o "$work/kproxy" ./cmd/kproxy && go build -o "$work/driver" ./tap/jaeger/driver)
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error)

"$KPROXY_JAEGER_BIN" --config "$work/jaeger.yaml" >"$work/jaeger.log" 2>&1 &
pids+=($!)
query=http://127.0.0.1:$q_http
waiturl "$query/api/services" 60 "$work/jaeger.log" "${pids[-1]}"
echo "screenshot: jaeger at $query" >&2

OTEL_SERVICE_NAME=kproxy OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$otlp_http \
	"$work/kproxy" dev --listen "127.0.0.1:$kp_listen" --admin-listen "127.0.0.1:$kp_admin" \
	>"$work/kproxy.log" 2>&1 &
kproxy_pid=$!
pids+=("$kproxy_pid")
waiturl "http://127.0.0.1:$kp_admin/readyz" 60 "$work/kproxy.log" "$kproxy_pid"
echo "screenshot: kproxy dev at 127.0.0.1:$kp_listen" >&2

# Long steps run in the background and are waited for, so that a signal
# reaches the trap at once and the cleanup stops them. The driver bounds
# itself (3 minutes).
"$work/driver" -bootstrap "127.0.0.1:$kp_listen" &
pids+=($!)
wait "${pids[-1]}" || { cat "$work/kproxy.log" >&2; fail "driver failed"; }

# Stopping kproxy flushes the spans its batch exporter still holds.
kill -TERM "$kproxy_pid"
for _ in $(seq 150); do
	kill -0 "$kproxy_pid" 2>/dev/null || break
	sleep 0.2
done
kill -0 "$kproxy_pid" 2>/dev/null && fail "kproxy did not stop within 30 s"

mkdir -p "$out"
CHROMIUM="$chromium" JAEGER_URL="$query" OUT_DIR="$out" timeout 180 node "$here/shoot.mjs" &
pids+=($!)
wait "${pids[-1]}" || fail "shoot.mjs failed"
