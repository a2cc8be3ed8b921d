#!/usr/bin/env bash
# kafka.sh runs a real Apache Kafka broker (KRaft, combined broker+controller)
# on 127.0.0.1 for the kproxy interop tier. The broker jars come from Maven
# Central through interop/broker/pom.xml and are cached under $KPROXY_CACHE.
#
#   interop/kafka.sh start  [--brokers 1|3] [--port 9092] [--version 4.1.1] [--security sasl_ssl] [--partitions 1]
#   interop/kafka.sh stop
#   interop/kafka.sh status
#   interop/kafka.sh fetch [--version V]  # only download the jars
#   interop/kafka.sh tools [--version V]  # kafka-consumer-groups: print its class path and main class
#   interop/kafka.sh request-log      # print the request log path(s)
#   interop/kafka.sh kill N           # SIGKILL node N (a crash, for fault rows)
#   interop/kafka.sh restart N        # start node N again on its data, wait for it
#
# With 3 nodes, internal topics (offsets, transactions) and auto-created
# topics are replicated 3 ways (min.insync 2 for transactions), and a node
# that stops heartbeating is fenced after 4 s, so a killed broker's
# partitions move within seconds.
# Node N (1-based) listens on port+N-1 for clients and on port+100+N-1 for
# the controller quorum. Every request the broker serves is logged by
# kafka.request.logger at DEBUG into $STATE/node-N/request.log so the harness
# can count the API keys the broker saw.
# --partitions N sets num.partitions, the partition count of auto-created
# topics (default 1; librdkafka's tests expect 4, interop/librdkafka.sh).
# group.initial.rebalance.delay.ms is 0 unless
# KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS says otherwise (Kafka's own default
# is 3000; e2e's BenchmarkAnchorFirstCommit runs against that).
# KAFKA_EXTRA_PROPERTIES, lines of key=value, is appended to every node's
# server.properties last, so it overrides the lines above (an experiment's
# broker settings, e.g. a shorter group.consumer.heartbeat.interval.ms).
# The request log keeps each request's first 320 characters (enough for
# the API key counts the harness reads); KAFKA_REQUEST_LOG_MAXLEN keeps more,
# e.g. 4000 to see whole group requests and their answers when tracing.
#
# --security sasl_ssl (one node only): the client port is a SASL_SSL
# listener (SCRAM-SHA-256 and SCRAM-SHA-512) and the standard authorizer
# is on; see write_security below for the users and the files written
# into $STATE/security for clients.
#
# Versions (--version, or KAFKA_VERSION; default 4.1.1): any Kafka release on
# Maven Central with KRaft, tried with 3.6.2, 4.1.1 and 4.4.0. Each version's
# jars are cached apart; the version-specific parts are in version_setup
# below. The JVM is the first one found (KAFKA_JAVA, JAVA_HOME, PATH, then
# /usr/lib/jvm/* and /opt/*) whose release is at least the class-file level of
# the broker's jar, so a version built for a newer Java than the default one
# picks a newer JDK from the machine.
set -euo pipefail

KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
CACHE="${KPROXY_CACHE:-$HOME/.cache/kproxy-interop}"
LIBS="$CACHE/kafka-$KAFKA_VERSION/libs"
STATE="${KPROXY_INTEROP_STATE:-$CACHE/run}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CLUSTER_ID="${KAFKA_CLUSTER_ID:-kproxyInteropClust0001}" # 22 chars, base64-url of 16 bytes

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- broker versions ----------------------------------------------------
JAVA=""

# version_ge A B succeeds when version A >= version B (numeric, dotted).
version_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" == "$2" ]]; }

# version_setup V points LIBS at version V's jars; every command that runs a
# broker calls it first (start from --version, restart from $STATE/version).
version_setup() {
	KAFKA_VERSION=$1
	[[ "$KAFKA_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--version must look like 3.6.2, not $KAFKA_VERSION"
	version_ge "$KAFKA_VERSION" 3.3.0 || die "Kafka $KAFKA_VERSION has no production KRaft mode (3.3+ is needed)"
	LIBS="$CACHE/kafka-$KAFKA_VERSION/libs"
}

# java_release JAVA prints the feature release (17, 25, ...) of a java binary.
java_release() {
	"$1" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java\.specification\.version = //p' | head -1
}

# pick_java sets JAVA to the first JVM whose release is at least the level
# kafka.Kafka was compiled for (class-file major - 44).
pick_java() {
	local major need
	major=$(python3 - "$LIBS/kafka_2.13-$KAFKA_VERSION.jar" <<'PY'
import struct, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
print(struct.unpack(">H", z.read("kafka/Kafka.class")[6:8])[0])
PY
	) || die "cannot read kafka/Kafka.class from the $KAFKA_VERSION jar"
	need=$((major - 44))
	local c rel
	local -a cands=()
	[[ -n "${KAFKA_JAVA:-}" ]] && cands+=("$KAFKA_JAVA")
	[[ -n "${JAVA_HOME:-}" ]] && cands+=("$JAVA_HOME/bin/java")
	command -v java >/dev/null && cands+=("$(command -v java)")
	for c in /usr/lib/jvm/*/bin/java /opt/*/bin/java /opt/*/*/bin/java; do
		[[ -x "$c" ]] && cands+=("$c")
	done
	for c in "${cands[@]}"; do
		rel=$(java_release "$c") || continue
		rel=${rel#1.} # 1.8 -> 8
		if [[ "$rel" =~ ^[0-9]+$ ]] && ((rel >= need)); then
			JAVA=$c
			log "Kafka $KAFKA_VERSION needs Java $need+: using $c (Java $rel)"
			return 0
		fi
	done
	die "Kafka $KAFKA_VERSION needs Java $need or newer; none found (set KAFKA_JAVA)"
}

# version_properties prints the server.properties lines that exist only in
# some versions: the share-group coordinator (KIP-932) came with 4.0, streams
# groups (KIP-1071) are GA since 4.2. Streams and share sessions are
# shortened as the classic ones are (group.min.session.timeout.ms), so a
# killed member's tasks or acquired records move within the kinds rows'
# time (interop/harness/kinds.go).
version_properties() {
	local rf=$1 isr=$2
	if version_ge "$KAFKA_VERSION" 4.0.0; then
		printf '%s\n' "share.coordinator.state.topic.replication.factor=$rf" \
			"share.coordinator.state.topic.min.isr=$isr"
		# KIP-848 sessions as short as the classic rows' (10 s), so a
		# SIGKILLed consumer-protocol member's partitions move within
		# the kafka-verifiable-kip848 row's time (interop/harness/tools.go).
		printf '%s\n' "group.consumer.min.session.timeout.ms=3000" "group.consumer.session.timeout.ms=10000"
		# librdkafka's share-consumer tests (interop/librdkafka-share.sh)
		# set a group's share.record.lock.duration.ms to 3 s, which the
		# broker validates against this bound (default 15 s), also when
		# kproxy serves the group and forwards the GROUP config.
		printf '%s\n' "group.share.min.record.lock.duration.ms=1000"
		# Share sessions as short as the classic rows' too: a SIGKILLed
		# share consumer's records move within the share rows' time,
		# at the broker from 4.2 and at kproxy serving share groups in
		# front of 4.0 and 4.1 (it reads these settings from the
		# cluster, internal/groupconfig).
		printf '%s\n' "group.share.min.session.timeout.ms=3000" "group.share.session.timeout.ms=10000" \
			"group.share.min.heartbeat.interval.ms=1000" "group.share.heartbeat.interval.ms=2000"
	fi
	if version_ge "$KAFKA_VERSION" 4.2.0; then
		printf '%s\n' "group.streams.min.session.timeout.ms=3000" "group.streams.session.timeout.ms=10000" \
			"group.streams.min.heartbeat.interval.ms=1000" "group.streams.heartbeat.interval.ms=2000" \
			"group.streams.initial.rebalance.delay.ms=0"
	fi
}
# --- end of broker versions ---------------------------------------------

fetch_libs() {
	if [[ -f "$LIBS/.complete" ]]; then
		return 0
	fi
	command -v mvn >/dev/null || die "mvn not found (Maven 3.8+ is needed to fetch the broker jars)"
	log "fetching Apache Kafka $KAFKA_VERSION jars into $LIBS"
	rm -rf "$LIBS"
	mkdir -p "$LIBS"
	mvn -q -B -f "$HERE/broker/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIBS" >&2 ||
		die "maven could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION"
	ls "$LIBS"/kafka_2.13-*.jar >/dev/null 2>&1 || die "kafka_2.13 jar missing from $LIBS"
	touch "$LIBS/.complete"
}

classpath() { printf '%s' "$LIBS/*"; }

# fetch_tools resolves Kafka's command-line tools (kafka-tools, with its
# dependencies; broker/tools-pom.xml) into $CACHE/kafka-<v>/tools, once per
# version. Kafka 3.7+ keeps kafka-consumer-groups' ConsumerGroupCommand
# there (org.apache.kafka.tools.consumer.group); earlier releases have it
# in the broker's own jar (kafka.admin).
fetch_tools() {
	local tools="$CACHE/kafka-$KAFKA_VERSION/tools"
	if [[ -f "$tools/.complete" ]]; then
		return 0
	fi
	command -v mvn >/dev/null || die "mvn not found (Maven 3.8+ is needed to fetch the Kafka tools jars)"
	log "fetching the Apache Kafka $KAFKA_VERSION tools jars into $tools"
	rm -rf "$tools"
	mkdir -p "$tools"
	mvn -q -B -f "$HERE/broker/tools-pom.xml" -Dkafka.version="$KAFKA_VERSION" \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tools" >&2 ||
		die "maven could not resolve org.apache.kafka:kafka-tools:$KAFKA_VERSION"
	ls "$tools"/kafka-tools-"$KAFKA_VERSION".jar >/dev/null 2>&1 || die "kafka-tools jar missing from $tools"
	touch "$tools/.complete"
}

# cmd_tools [--version V] fetches what is missing and prints the Java class
# path of kafka-consumer-groups for version V and its main class, one per
# line.
cmd_tools() {
	[[ "${1:-}" != --version ]] || KAFKA_VERSION=${2:-}
	version_setup "$KAFKA_VERSION"
	if version_ge "$KAFKA_VERSION" 3.7.0; then
		fetch_tools
		printf '%s\n' "$CACHE/kafka-$KAFKA_VERSION/tools/*" org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
	else
		fetch_libs
		printf '%s\n' "$(classpath)" kafka.admin.ConsumerGroupCommand
	fi
}

write_node_config() {
	local n=$1 brokers=$2 port=$3 dir=$4 partitions=${5:-1}
	local voters="" i
	for ((i = 1; i <= brokers; i++)); do
		voters+="${voters:+,}$i@127.0.0.1:$((port + 100 + i - 1))"
	done
	local rf=1 isr=1 session=9000
	if ((brokers >= 3)); then rf=3 isr=2 session=4000; fi
	mkdir -p "$dir/data"
	cat >"$dir/server.properties" <<EOF
# Written by interop/kafka.sh for the kproxy interop tier.
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$((port + n - 1)),CONTROLLER://127.0.0.1:$((port + 100 + n - 1))
advertised.listeners=PLAINTEXT://127.0.0.1:$((port + n - 1))
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$dir/data
num.partitions=$partitions
default.replication.factor=$rf
auto.create.topics.enable=true
broker.session.timeout.ms=$session
broker.heartbeat.interval.ms=1000
group.initial.rebalance.delay.ms=${KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS:-0}
group.min.session.timeout.ms=3000
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=4
$(version_properties "$rf" "$isr")
log.segment.bytes=16777216
num.network.threads=2
num.io.threads=2
background.threads=2
log.retention.hours=2
${KAFKA_EXTRA_PROPERTIES:-}
EOF
	cat >"$dir/log4j2.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by interop/kafka.sh: broker log plus a request log the harness reads. -->
<Configuration status="warn">
  <Appenders>
    <File name="server" fileName="$dir/server.log" append="true">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
    <File name="requests" fileName="$dir/request.log" append="true" immediateFlush="true">
      <PatternLayout pattern="[%d] %maxLen{%m}{${KAFKA_REQUEST_LOG_MAXLEN:-320}}%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="debug" additivity="false">
      <AppenderRef ref="requests"/>
    </Logger>
    <Logger name="kafka" level="info"/>
    <Logger name="org.apache.kafka" level="info"/>
    <Root level="info">
      <AppenderRef ref="server"/>
    </Root>
  </Loggers>
</Configuration>
EOF
}

java_opts() {
	local dir=$1
	printf '%s\n' -Xmx512m -Xms128m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
		-XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$dir/log4j2.xml" -Dkafka.logs.dir="$dir"
}

probe() {
	# Succeeds when a Kafka broker on 127.0.0.1:$1 answers an ApiVersions v0
	# request (written by hand so no client library is needed here); over
	# TLS when a CA file is given as $2 (ApiVersions needs no SASL).
	python3 - "$1" "${2:-}" <<'PY'
import socket, ssl, struct, sys
port = int(sys.argv[1])
cid = b"kafka.sh-probe"
body = struct.pack(">hhih", 18, 0, 7, len(cid)) + cid
try:
    s = socket.create_connection(("127.0.0.1", port), timeout=3)
    if sys.argv[2]:
        s = ssl.create_default_context(cafile=sys.argv[2]).wrap_socket(s, server_hostname="127.0.0.1")
    s.sendall(struct.pack(">i", len(body)) + body)
    hdr = s.recv(4)
    size = struct.unpack(">i", hdr)[0]
    data = b""
    while len(data) < size:
        chunk = s.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    corr, err = struct.unpack(">ih", data[:6])
    sys.exit(0 if corr == 7 and err == 0 else 1)
except Exception:
    sys.exit(1)
PY
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

running_pids() {
	local f
	for f in "$STATE"/node-*/pid; do
		[[ -f "$f" ]] || continue
		local pid
		pid=$(cat "$f")
		if kill -0 "$pid" 2>/dev/null; then
			echo "$pid"
		fi
	done
}

# launch_node N PORT starts node N's JVM on its existing config and data.
launch_node() {
	local n=$1 port=$2 dir="$STATE/node-$1"
	local -a opts
	mapfile -t opts < <(java_opts "$dir")
	nohup "$JAVA" "${opts[@]}" -cp "$(classpath)" kafka.Kafka "$dir/server.properties" \
		>>"$dir/stdout.log" 2>&1 </dev/null &
	echo $! >"$dir/pid"
	log "node $n: pid $(cat "$dir/pid"), client port $((port + n - 1)), logs in $dir"
}

cmd_kill() {
	local n=${1:-} dir="$STATE/node-${1:-}"
	[[ -n "$n" && -f "$dir/pid" ]] || die "kill: no running node ${n:-?} under $STATE"
	local pid
	pid=$(cat "$dir/pid")
	kill -KILL "$pid" 2>/dev/null || die "kill: node $n (pid $pid) is not running"
	while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
	log "node $n: pid $pid killed (SIGKILL)"
}

cmd_restart() {
	local n=${1:-} dir="$STATE/node-${1:-}"
	[[ -n "$n" && -f "$dir/server.properties" && -f "$STATE/layout" ]] || die "restart: no node ${n:-?} under $STATE"
	if [[ -f "$dir/pid" ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
		die "restart: node $n is still running"
	fi
	local brokers port
	read -r brokers port <"$STATE/layout"
	version_setup "$(cat "$STATE/version" 2>/dev/null || echo "$KAFKA_VERSION")"
	pick_java
	launch_node "$n" "$port"
	local p=$((port + n - 1)) deadline=$((SECONDS + 90))
	until probe "$p"; do
		kill -0 "$(cat "$dir/pid")" 2>/dev/null || { tail -n 30 "$dir/server.log" >&2 || true; die "node $n exited during restart"; }
		((SECONDS < deadline)) || die "node $n did not answer ApiVersions on port $p within 90s"
		sleep 0.3
	done
	log "node $n: back on port $p"
}

# SCRAM users of --security sasl_ssl: admin is the super user (kproxy's
# own upstream identity and the harness's ACL writer); the others get
# their ACLs from the harness. Each one's password is NAME-secret.
SECURITY_USERS="admin alice bob carol"

# write_security DIR PORT makes a CA and a broker certificate for
# 127.0.0.1/localhost with openssl (into $STATE/security), switches node
# 1's config to a SASL_SSL client listener with the standard authorizer,
# and writes what clients need: ca.pem, security.json (the harness) and
# admin.properties (Java tools). The controller listener stays
# PLAINTEXT on loopback: KRaft's controller cannot authenticate SCRAM
# (the credentials live in the metadata it serves), so its principal,
# User:ANONYMOUS, is a super user.
write_security() {
	local dir=$1 port=$2 sec="$STATE/security"
	command -v openssl >/dev/null || die "openssl not found (--security needs it for the certificates)"
	mkdir -p "$sec"
	(
		cd "$sec"
		openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kproxy interop CA" \
			-keyout ca.key -out ca.pem
		openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout broker.key -out broker.csr
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >broker.ext
		openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
			-extfile broker.ext -out broker.crt
		openssl pkcs12 -export -in broker.crt -inkey broker.key -certfile ca.pem \
			-name broker -passout pass:keystore-secret -out broker.p12
	) >"$sec/openssl.log" 2>&1 || { cat "$sec/openssl.log" >&2; die "openssl failed"; }
	local conf="$dir/server.properties"
	sed -i -e "s|^listeners=PLAINTEXT://|listeners=SASL_SSL://|" \
		-e "s|^advertised.listeners=PLAINTEXT://|advertised.listeners=SASL_SSL://|" \
		-e "s|^listener.security.protocol.map=.*|listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT|" \
		-e "s|^inter.broker.listener.name=.*|inter.broker.listener.name=SASL_SSL|" "$conf"
	cat >>"$conf" <<EOF
# --security sasl_ssl
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";
ssl.keystore.type=PKCS12
ssl.keystore.location=$sec/broker.p12
ssl.keystore.password=keystore-secret
ssl.truststore.type=PEM
ssl.truststore.location=$sec/ca.pem
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:ANONYMOUS
allow.everyone.if.no.acl.found=false
EOF
	local u users=""
	for u in $SECURITY_USERS; do users+="${users:+, }\"$u\": \"$u-secret\""; done
	cat >"$sec/security.json" <<EOF
{"bootstrap": "127.0.0.1:$port", "ca": "$sec/ca.pem", "mechanisms": ["SCRAM-SHA-256", "SCRAM-SHA-512"],
 "admin": "admin", "passwords": {$users}}
EOF
	cat >"$sec/admin.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";
ssl.truststore.type=PEM
ssl.truststore.location=$sec/ca.pem
EOF
}

# scram_args prints the StorageTool arguments adding every SCRAM user.
scram_args() {
	local u m
	for u in $SECURITY_USERS; do
		for m in SCRAM-SHA-256 SCRAM-SHA-512; do
			printf '%s\n' --add-scram "$m=[name=$u,password=$u-secret]"
		done
	done
}

cmd_start() {
	local brokers=1 port=9092 security="" partitions=1
	while (($#)); do
		case "$1" in
		--brokers) brokers=$2; shift 2 ;;
		--partitions) partitions=$2; shift 2 ;;
		--port) port=$2; shift 2 ;;
		--security) security=$2; shift 2 ;;
		--version) KAFKA_VERSION=$2; shift 2 ;;
		*) die "unknown flag $1" ;;
		esac
	done
	version_setup "$KAFKA_VERSION"
	[[ "$brokers" == 1 || "$brokers" == 3 ]] || die "--brokers must be 1 or 3"
	[[ "$partitions" =~ ^[1-9][0-9]*$ ]] || die "--partitions must be a positive number"
	[[ -z "$security" || "$security" == sasl_ssl ]] || die "--security: only sasl_ssl"
	[[ -z "$security" || "$brokers" == 1 ]] || die "--security sasl_ssl runs one node only"
	if [[ -n "$(running_pids)" ]]; then
		die "a broker started by kafka.sh is already running (interop/kafka.sh stop first)"
	fi
	local n p
	for ((n = 1; n <= brokers; n++)); do
		for p in $((port + n - 1)) $((port + 100 + n - 1)); do
			if port_open "$p"; then die "port $p on 127.0.0.1 is already in use"; fi
		done
	done
	fetch_libs
	pick_java
	rm -rf "$STATE"
	mkdir -p "$STATE"
	echo "$brokers $port" >"$STATE/layout"
	echo "$KAFKA_VERSION" >"$STATE/version"
	cat >"$STATE/probe-log4j2.xml" <<'EOF'
<Configuration status="off"><Loggers><Root level="off"/></Loggers></Configuration>
EOF
	for ((n = 1; n <= brokers; n++)); do
		local dir="$STATE/node-$n"
		write_node_config "$n" "$brokers" "$port" "$dir" "$partitions"
		local -a scram=()
		if [[ -n "$security" ]]; then
			write_security "$dir" "$port"
			mapfile -t scram < <(scram_args)
		fi
		"$JAVA" -Xmx256m -XX:TieredStopAtLevel=1 -cp "$(classpath)" \
			-Dlog4j2.configurationFile="$STATE/probe-log4j2.xml" \
			kafka.tools.StorageTool format -t "$CLUSTER_ID" -c "$dir/server.properties" "${scram[@]}" \
			>"$dir/format.log" 2>&1 || { cat "$dir/format.log" >&2; die "storage format failed for node $n"; }
		launch_node "$n" "$port"
	done
	local deadline=$((SECONDS + 90))
	for ((n = 1; n <= brokers; n++)); do
		local dir="$STATE/node-$n" p=$((port + n - 1))
		until port_open "$p"; do
			kill -0 "$(cat "$dir/pid")" 2>/dev/null || {
				tail -n 30 "$dir/stdout.log" "$dir/server.log" >&2 || true
				die "node $n exited during startup"
			}
			((SECONDS < deadline)) || die "node $n did not open port $p within 90s"
			sleep 0.3
		done
	done
	until probe "$port" ${security:+"$STATE/security/ca.pem"}; do
		((SECONDS < deadline)) || die "broker on port $port did not answer ApiVersions within 90s"
		sleep 0.5
	done
	log "kafka $KAFKA_VERSION up: $brokers node(s), bootstrap 127.0.0.1:$port"
}

cmd_stop() {
	local f stopped=0
	for f in "$STATE"/node-*/pid; do
		[[ -f "$f" ]] || continue
		local pid
		pid=$(cat "$f")
		if kill -0 "$pid" 2>/dev/null; then
			kill -TERM "$pid" 2>/dev/null || true
			stopped=1
		fi
	done
	local deadline=$((SECONDS + 30))
	for f in "$STATE"/node-*/pid; do
		[[ -f "$f" ]] || continue
		local pid
		pid=$(cat "$f")
		while kill -0 "$pid" 2>/dev/null; do
			if ((SECONDS >= deadline)); then
				log "pid $pid did not stop in 30s; killing it"
				kill -KILL "$pid" 2>/dev/null || true
				# Until it is gone: its ports stay open until then, and
				# the next start checks them (a node of a cluster whose
				# nodes all stop at once can wait out its controlled
				# shutdown for want of a quorum).
				while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
				break
			fi
			sleep 0.2
		done
		rm -f "$f"
	done
	if ((stopped)); then log "stopped"; else log "no broker was running"; fi
}

cmd_status() {
	local pids
	pids=$(running_pids)
	if [[ -z "$pids" ]]; then
		echo "stopped"
		return 1
	fi
	local brokers port
	read -r brokers port <"$STATE/layout"
	echo "running: Kafka $(cat "$STATE/version" 2>/dev/null || echo "?"), $brokers node(s), bootstrap 127.0.0.1:$port, pids $(echo $pids), state $STATE"
}

cmd_request_log() {
	local f
	for f in "$STATE"/node-*/request.log; do
		echo "$f"
	done
}

case "${1:-}" in
start) shift; cmd_start "$@" ;;
stop) cmd_stop ;;
status) cmd_status ;;
fetch)
	[[ "${2:-}" != --version ]] || KAFKA_VERSION=${3:-}
	version_setup "$KAFKA_VERSION"
	fetch_libs
	;;
tools) shift; cmd_tools "$@" ;;
request-log) cmd_request_log ;;
kill) shift; cmd_kill "$@" ;;
restart) shift; cmd_restart "$@" ;;
*) die "usage: $0 start [--brokers 1|3] [--port P] [--version V] [--security sasl_ssl] | stop | status | fetch [--version V] | tools [--version V] | request-log | kill N | restart N" ;;
esac
