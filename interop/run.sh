#!/usr/bin/env bash
# run.sh runs the whole interop tier: it installs the client dependencies
# that are missing (Maven, PyPI, npm; all cached), starts a real Apache Kafka
# broker with interop/kafka.sh, runs the table-driven harness (every row
# direct and through kproxy) and always stops the broker, even on failure.
#
#   bash interop/run.sh [harness flags...]     e.g. -rows '^java-' -paths direct
#
# Environment:
#   KPROXY_CACHE                  cache dir (default ~/.cache/kproxy-interop)
#   KPROXY_INTEROP_PORT           broker client port (default 9092)
#   KPROXY_INTEROP_BROKERS        1 (default) or 3 brokers; with 1, the rows that
#                                 need 3 (franz-brokerkill) run afterwards against
#                                 a 3-broker cluster of their own
#   KPROXY_INTEROP_MULTIBROKER    0 = skip that 3-broker phase
#   KPROXY_INTEROP_SECURITY       0 = skip the security phase (the SASL_SSL rows
#                                 against a broker with ACLs of their own)
#   KPROXY_INTEROP_LOGS           where member logs go (default a new temp dir)
#   KPROXY_INTEROP_EXPECT_ENGINE  1 = the broker must see no JoinGroup/SyncGroup/
#                                 Heartbeat during kproxy rows
#   KPROXY_INTEROP_OFFSETS        path = read committed offsets through kproxy
#                                 on kproxy rows instead of from the broker
#   KAFKA_VERSION                 the main run's broker (default 4.1.1)
#   KPROXY_INTEROP_VERSIONS       other broker versions, each a phase of its own
#                                 after the main run: VERSION[=ROWS],... (default
#                                 "3.6.2,4.4.0", each with its subset below;
#                                 "none" skips them; 4.4.0=. runs every row)
#   KPROXY_INTEROP_RDKAFKA_DEBUG  librdkafka debug contexts (e.g. cgrp) for the
#                                 confluent-kafka Python members; their stderr
#                                 is in the member logs
#   KPROXY_INTEROP_LIBRDKAFKA_SHARE  0 = skip librdkafka's share-consumer tests
#                                 (interop/librdkafka-share.sh) in the librdkafka
#                                 phase; all = their slow tier too
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export KPROXY_CACHE="${KPROXY_CACHE:-$HOME/.cache/kproxy-interop}"
PORT="${KPROXY_INTEROP_PORT:-9092}"
BROKERS="${KPROXY_INTEROP_BROKERS:-1}"
LOGS="${KPROXY_INTEROP_LOGS:-$(mktemp -d /tmp/kproxy-interop.XXXXXX)}"
began=$SECONDS
export KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}" # kafka.sh's broker, the harness's expectations
cd "$ROOT"

say() { printf 'interop: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

for tool in go java mvn node npm python3 openssl; do
	command -v "$tool" >/dev/null || die "$tool is not installed (the interop tier needs Go, Java 17+, Maven, Node.js, Python 3 and openssl)"
done
mkdir -p "$KPROXY_CACHE" "$LOGS"
LOGS="$(cd "$LOGS" && pwd)" # absolute: the harness is built from interop/

# stamp FILE... prints a hash of the given files, to rebuild only on change.
stamp() { cat "$@" | sha256sum | cut -c1-16; }

# Java client: built once, rebuilt when its sources change.
java_stamp=$(stamp interop/java/pom.xml interop/java/src/main/java/io/kproxy/interop/*.java)
if [[ "$(cat interop/java/target/.kproxy-stamp 2>/dev/null)" != "$java_stamp" ]]; then
	say "building the Java client (kafka-clients from Maven Central)"
	mvn -q -B -f interop/java/pom.xml package -DskipTests >"$LOGS/mvn-java.log" 2>&1 ||
		{ tail -40 "$LOGS/mvn-java.log" >&2; die "Java client build failed"; }
	echo "$java_stamp" >interop/java/target/.kproxy-stamp
fi

# The share and streams group programs (interop/kinds: kafka-clients and
# kafka-streams 4.4.0), built the same way.
kinds_stamp=$(stamp interop/kinds/pom.xml interop/kinds/src/main/java/io/kproxy/interop/kinds/*.java)
if [[ "$(cat interop/kinds/target/.kproxy-stamp 2>/dev/null)" != "$kinds_stamp" ]]; then
	say "building the share and streams group programs (kafka-clients and kafka-streams 4.4.0 from Maven Central)"
	mvn -q -B -f interop/kinds/pom.xml package -DskipTests >"$LOGS/mvn-kinds.log" 2>&1 ||
		{ tail -40 "$LOGS/mvn-kinds.log" >&2; die "share/streams programs build failed"; }
	echo "$kinds_stamp" >interop/kinds/target/.kproxy-stamp
fi

# Kafka Connect for the kafka-connect row (interop/connect: connect-runtime,
# connect-file, connect-json at the main broker's version, log4j2), resolved
# into interop/connect/target/lib the same way; nothing to compile.
connect_stamp=$(stamp interop/connect/pom.xml)
if [[ "$(cat interop/connect/target/.kproxy-stamp 2>/dev/null)" != "$connect_stamp" ]]; then
	say "resolving Kafka Connect (connect-runtime, connect-file, connect-json from Maven Central)"
	rm -rf interop/connect/target/lib
	mvn -q -B -f interop/connect/pom.xml package -DskipTests >"$LOGS/mvn-connect.log" 2>&1 ||
		{ tail -40 "$LOGS/mvn-connect.log" >&2; die "Kafka Connect build failed"; }
	echo "$connect_stamp" >interop/connect/target/.kproxy-stamp
fi

# Python clients: a venv in the cache.
py_stamp=$(stamp interop/python/requirements.txt)
if [[ "$(cat "$KPROXY_CACHE/venv/.kproxy-stamp" 2>/dev/null)" != "$py_stamp" ]]; then
	say "installing confluent-kafka and kafka-python into $KPROXY_CACHE/venv"
	rm -rf "$KPROXY_CACHE/venv"
	python3 -m venv "$KPROXY_CACHE/venv" || die "python3 -m venv failed (apt-get install python3-venv)"
	"$KPROXY_CACHE/venv/bin/pip" install -q --disable-pip-version-check -r interop/python/requirements.txt \
		>"$LOGS/pip.log" 2>&1 || { tail -40 "$LOGS/pip.log" >&2; die "pip install failed"; }
	echo "$py_stamp" >"$KPROXY_CACHE/venv/.kproxy-stamp"
fi

# JavaScript client: kafkajs from the committed lock file.
js_stamp=$(stamp interop/js/package.json interop/js/package-lock.json)
if [[ "$(cat interop/js/node_modules/.kproxy-stamp 2>/dev/null)" != "$js_stamp" ]]; then
	say "installing kafkajs (npm ci)"
	(cd interop/js && npm ci --no-audit --no-fund --loglevel=error) >"$LOGS/npm.log" 2>&1 ||
		{ tail -40 "$LOGS/npm.log" >&2; die "npm ci failed"; }
	echo "$js_stamp" >interop/js/node_modules/.kproxy-stamp
fi

say "building the harness"
# The harness and the Go client are the interop module (interop/go.mod), apart
# from kproxy's own module.
go -C interop build -o "$LOGS/harness" ./harness || die "harness build failed"

# The broker: stop a leftover one from an earlier run, then start fresh, and
# stop it whatever happens next.
bash interop/kafka.sh stop >/dev/null 2>&1 || true
# The librdkafka phase's second broker (Kafka 4.4.0, serving share groups
# itself) has a state dir of its own.
SHARE_STATE="${KPROXY_INTEROP_STATE:-$KPROXY_CACHE/run}-share"
trap 'bash interop/kafka.sh stop || true; KPROXY_INTEROP_STATE="$SHARE_STATE" bash interop/kafka.sh stop >/dev/null 2>&1 || true' EXIT
rc=0
# The librdkafka phase (below) runs when -rows is not given or matches
# "librdkafka" (a bash regex match, as -rows is usually a plain pattern).
rows_arg="" kproxy_port=19200 prev=""
for a in "$@"; do
	case "$prev" in -rows | --rows) rows_arg=$a ;; -kproxy-port | --kproxy-port) kproxy_port=$a ;; esac
	case "$a" in -rows=* | --rows=*) rows_arg=${a#*=} ;; -kproxy-port=* | --kproxy-port=*) kproxy_port=${a#*=} ;; esac
	prev=$a
done
librdkafka=0
if [[ "${KPROXY_INTEROP_LIBRDKAFKA:-1}" != 0 ]] && { [[ -z "$rows_arg" ]] || [[ librdkafka =~ $rows_arg ]]; }; then
	librdkafka=1
fi
# When -rows selects only security rows or the librdkafka phase, the main
# phase has nothing to do.
if [[ -n "$("$LOGS/harness" -list "$@")" ]] ||
	[[ -z "$("$LOGS/harness" -list -security - "$@")" && ( -z "$rows_arg" || "$librdkafka" == 0 ) ]]; then
	bash interop/kafka.sh start --brokers "$BROKERS" --port "$PORT"
	reqlogs=$(bash interop/kafka.sh request-log | paste -sd, -)

	set +e
	"$LOGS/harness" -root "$ROOT" -broker "127.0.0.1:$PORT" -request-log "$reqlogs" -logs "$LOGS" -cache "$KPROXY_CACHE" "$@"
	rc=$?
	set -e
fi

# Rows that need three brokers (franz-brokerkill kills one) run against a
# cluster of their own when the main run had one broker.
if [[ "$BROKERS" == 1 && "${KPROXY_INTEROP_MULTIBROKER:-1}" != 0 ]] &&
	[[ -n "$("$LOGS/harness" -list -multibroker "$@")" ]]; then
	say "3-broker phase: $("$LOGS/harness" -list -multibroker "$@" | paste -sd' ' -)"
	phase=$SECONDS
	bash interop/kafka.sh stop >/dev/null 2>&1 || true
	bash interop/kafka.sh start --brokers 3 --port "$PORT"
	reqlogs=$(bash interop/kafka.sh request-log | paste -sd, -)
	mkdir -p "$LOGS/3brokers"
	cp "$LOGS/kproxy-bin" "$LOGS/3brokers/" 2>/dev/null || true
	set +e
	"$LOGS/harness" -root "$ROOT" -broker "127.0.0.1:$PORT" -request-log "$reqlogs" -logs "$LOGS/3brokers" -cache "$KPROXY_CACHE" "$@" -multibroker
	rc2=$?
	set -e
	say "3-broker phase took $((SECONDS - phase))s"
	((rc != 0)) || rc=$rc2
fi

# The security rows (SASL_SSL, SCRAM, ACLs: harness/security.go) run
# against a secured broker of their own.
if [[ "${KPROXY_INTEROP_SECURITY:-1}" != 0 ]] &&
	[[ -n "$("$LOGS/harness" -list -security - "$@")" ]]; then
	say "security phase: $("$LOGS/harness" -list -security - "$@" | paste -sd' ' -)"
	phase=$SECONDS
	bash interop/kafka.sh stop >/dev/null 2>&1 || true
	bash interop/kafka.sh start --port "$PORT" --security sasl_ssl
	mkdir -p "$LOGS/security"
	cp "$LOGS/kproxy-bin" "$LOGS/security/" 2>/dev/null || true
	set +e
	"$LOGS/harness" -root "$ROOT" -broker "127.0.0.1:$PORT" -logs "$LOGS/security" -cache "$KPROXY_CACHE" "$@" \
		-security "${KPROXY_INTEROP_STATE:-$KPROXY_CACHE/run}/security/security.json"
	rc3=$?
	set -e
	say "security phase took $((SECONDS - phase))s"
	((rc != 0)) || rc=$rc3
fi

# Other broker versions (issue 14): each one in KPROXY_INTEROP_VERSIONS gets
# a single broker of its own and runs its subset of the rows, direct and
# through kproxy (and within what -rows selects). The harness reads the
# version from KAFKA_VERSION for its per-version expectations: directly
# against 3.6.2 the KIP-848 rows are expected to fail.
version_rows() {
	case "$1" in
	# No KIP-848 on the broker: what kproxy adds (the consumer protocol for
	# Java and franz-go, share groups served by kproxy) and classic rows in
	# two more languages.
	3.6.2) echo '^(java-kip848|go-franz-kip848|py-confluent|js-kafkajs|franz-apiversions|java-share-serve|java41-share-serve|franz-share-serve|py-share-serve|franz-share-serve-fleet|java-share-serve-fleet)$' ;;
	# The newest: both group protocols, transactions, franz-go's ApiVersions
	# v5 opening (4.4 speaks v5), librdkafka, and the share and streams
	# groups the cluster serves (kinds.go). Every row: 4.4.0=. (or
	# KAFKA_VERSION=4.4.0 for the main run, 3-broker phase included).
	4.4.0) echo '^(java-kip848|go-franz-kip848|java-txn|go-franz|py-confluent|franz-apiversions|java-share|go-franz-share|py-share-serve|java-streams)$' ;;
	*) echo '.' ;;
	esac
}
versions="${KPROXY_INTEROP_VERSIONS-3.6.2,4.4.0}"
[[ "$versions" != none && "$versions" != 0 ]] || versions=""
IFS=, read -ra version_specs <<<"$versions"
for spec in "${version_specs[@]}"; do
	v=${spec%%=*}
	rows=$(version_rows "$v")
	[[ "$spec" != *=* ]] || rows=${spec#*=}
	if [[ -z "$v" || "$v" == "$KAFKA_VERSION" ]]; then continue; fi
	selected=$("$LOGS/harness" -list "$@" -subset "$rows" | paste -sd' ' -)
	[[ -n "$selected" ]] || continue
	say "Kafka $v phase: $selected"
	phase=$SECONDS
	bash interop/kafka.sh stop >/dev/null 2>&1 || true
	bash interop/kafka.sh start --version "$v" --port "$PORT"
	reqlogs=$(bash interop/kafka.sh request-log | paste -sd, -)
	mkdir -p "$LOGS/kafka-$v"
	cp "$LOGS/kproxy-bin" "$LOGS/kafka-$v/" 2>/dev/null || true
	set +e
	KAFKA_VERSION=$v "$LOGS/harness" -root "$ROOT" -broker "127.0.0.1:$PORT" -request-log "$reqlogs" -logs "$LOGS/kafka-$v" -cache "$KPROXY_CACHE" "$@" -subset "$rows"
	rcv=$?
	set -e
	say "Kafka $v phase took $((SECONDS - phase))s"
	((rc != 0)) || rc=$rcv
done

# librdkafka's own consumer-group tests (interop/librdkafka.sh: its tests/
# suite from Debian's source package, built once and cached), directly and
# through a kproxy of its own, against a one-broker cluster whose
# auto-created topics have 4 partitions as the suite expects. It runs when
# -rows is not given or matches "librdkafka"; KPROXY_INTEROP_LIBRDKAFKA=0
# skips it, =all runs its slow tests too.
if ((librdkafka)); then
	say "librdkafka phase"
	phase=$SECONDS
	bash interop/kafka.sh stop >/dev/null 2>&1 || true
	bash interop/kafka.sh start --port "$PORT" --partitions 4
	set +e
	KPROXY_INTEROP_LOGS="$LOGS" KPROXY_BIN="$([[ -x "$LOGS/kproxy-bin" ]] && echo "$LOGS/kproxy-bin")" \
		bash interop/librdkafka.sh --broker "127.0.0.1:$PORT" --kproxy-port "$kproxy_port" \
		--tier "$([[ "${KPROXY_INTEROP_LIBRDKAFKA:-1}" == all ]] && echo all || echo ci)"
	rcl=$?
	set -e
	say "librdkafka phase took $((SECONDS - phase))s"
	((rc != 0)) || rc=$rcl
	# librdkafka's share-consumer tests (interop/librdkafka-share.sh, its
	# source from the npm registry, built once and cached): directly
	# against a Kafka 4.4.0 broker of their own (it serves share groups),
	# and through a kproxy serving share groups in front of the broker
	# above ($KAFKA_VERSION, 4.1.1 by default, which lacks them).
	if [[ "${KPROXY_INTEROP_LIBRDKAFKA_SHARE:-1}" != 0 ]]; then
		phase=$SECONDS
		share_port=$((PORT + 10))
		KPROXY_INTEROP_STATE="$SHARE_STATE" bash interop/kafka.sh stop >/dev/null 2>&1 || true
		KPROXY_INTEROP_STATE="$SHARE_STATE" bash interop/kafka.sh start --version 4.4.0 --port "$share_port"
		set +e
		KPROXY_INTEROP_LOGS="$LOGS" KPROXY_BIN="$([[ -x "$LOGS/kproxy-bin" ]] && echo "$LOGS/kproxy-bin")" KAFKA_VERSION=4.4.0 \
			bash interop/librdkafka-share.sh --direct "127.0.0.1:$share_port" --upstream "127.0.0.1:$PORT" \
			--kproxy-port "$kproxy_port" \
			--tier "$([[ "${KPROXY_INTEROP_LIBRDKAFKA_SHARE:-1}" == all ]] && echo all || echo ci)"
		rcs=$?
		set -e
		KPROXY_INTEROP_STATE="$SHARE_STATE" bash interop/kafka.sh stop >/dev/null 2>&1 || true
		say "librdkafka share phase took $((SECONDS - phase))s"
		((rc != 0)) || rc=$rcs
	fi
fi

say "total time $((SECONDS - began))s; member logs in $LOGS"
exit $rc
