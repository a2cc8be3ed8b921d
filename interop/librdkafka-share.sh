#!/usr/bin/env bash
# librdkafka-share.sh runs librdkafka's own share-consumer tests (KIP-932:
# its tests 0170-0190 that need a real broker) twice: directly against a
# broker that serves share groups itself (Kafka 4.2+, the baseline), and
# through a kproxy it starts with `--groups local --share-groups serve` in
# front of another broker (Kafka 4.1.1 in CI, which lacks share groups). It
# prints a table test x path with the result and the time.
#
#   bash interop/librdkafka-share.sh --direct 127.0.0.1:9142 --upstream 127.0.0.1:9092
#        [--kproxy-port 19330] [--tier ci|all] [--tests '0171 0172']
#
# It fails when a chosen test fails directly twice (a direct failure runs
# once more, reported), or passes directly and not through kproxy, or
# passes fewer subtests through kproxy than directly.
#
# librdkafka's share consumer is newer than any Debian package (Debian's
# 2.14.2, interop/librdkafka.sh, has none), so its source comes from the
# npm registry: @confluentinc/kafka-javascript carries librdkafka's full
# source, tests/ included, in package/deps/librdkafka (1.10.1 has librdkafka
# 2.15.1). `npm pack` fetches the tarball into $KPROXY_CACHE/librdkafka;
# ./configure --no-download, make and the tests' test-runner build it there
# (about a minute on 2 cores without optimization), once: a rerun on the
# same machine neither refetches nor rebuilds. g++, make, python3,
# libssl-dev, zlib1g-dev and libzstd-dev (0171 consumes every compression
# codec) are installed with apt-get when missing.
#
# Both paths give the tests TEST_KAFKA_VERSION of the direct broker (the
# tests need 4.2+ to run at all; kproxy answers the share APIs at the
# versions Kafka 4.4 does, docs/share-groups.md), so the paths differ only
# in what serves the share groups. The tests create their topics and set
# share.auto.offset.reset with IncrementalAlterConfigs on GROUP resources,
# which kproxy forwards to its broker (Kafka 4.0+ has GROUP configs) and
# reads back when the group first asks.
#
# Environment:
#   KPROXY_CACHE          cache dir (default ~/.cache/kproxy-interop)
#   KPROXY_INTEROP_LOGS   where the logs go (default a new temp dir); this
#                         script writes under its librdkafka-share/
#   KPROXY_KJS_VERSION    @confluentinc/kafka-javascript version (1.10.1)
#   KAFKA_VERSION         the direct broker's version (default 4.4.0)
#   KPROXY_BIN            a kproxy binary to use instead of building it
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KPROXY_CACHE="${KPROXY_CACHE:-$HOME/.cache/kproxy-interop}"
LOGS="${KPROXY_INTEROP_LOGS:-$(mktemp -d /tmp/kproxy-librdkafka-share.XXXXXX)}"
KJS="${KPROXY_KJS_VERSION:-1.10.1}"
KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"

say() { printf 'librdkafka-share: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

# The chosen tests, one per line: the tier (ci: run by default; slow: only
# with --tier all), the test number and SUBTESTS (a substring of the
# subtests' names, "-" for all). The times are per path (direct/kproxy),
# measured against Kafka 4.4.0 directly and through kproxy in front of
# 4.1.1 on a shared 2-core machine.
# --tier ci runs the ci lines, --tier all the slow ones, which are the
# whole tests (the ci lines' subtests among them). Through kproxy (2026-12-05,
# in front of 4.1.1), 0176, 0177, 0178, 0180 and 0181 failed at first and
# pass since kproxy was fixed: acknowledgements sent on close after the
# leave heartbeat are applied (0178), a deleted topic's partitions are
# answered UNKNOWN_TOPIC_ID (0176, 0181), ShareFetch MaxBytes 0 gets no
# records (0180), and a GROUP config altered through kproxy applies at
# once (0177). Each whole test takes over 60 s directly (70-130 s), too
# long for the ci tier. One still fails through kproxy, at its first
# subtest (so the others do not run):
#   0179 destroy_with_explicit_ack: the test expects the first ShareFetch
#     response to carry one partition's records (50) and the next one the
#     other's, as Kafka 4.4's did here; kproxy's carries both (100). This
#     is not a rule of Kafka's: MaxRecords is a budget for the whole
#     response (ShareFetchUtils.processFetchResponse) and MaxBytes is
#     split among the partitions (PartitionMaxBytesStrategy), neither
#     binding here; a broker loads each new share-partition's state
#     asynchronously, and a partition still loading cannot be fetched
#     (SharePartition.maybeAcquireFetchLock), so its first fetch of two
#     new partitions answers with the one that loaded first. kproxy holds
#     the state in memory and does not copy that timing.
# Directly against 4.4.0 every slow test passed in the first run (0190
# skips itself); in a later one 0184 failed on both paths, twice directly,
# its producer getting "Unknown partition" in recreate_stall_then_recover.
# Left out on purpose: the tests that never reach a broker (TEST_F_LOCAL:
# the mock-cluster ones 0155-0158, 0182, 0183, 0186, 0187, 0191 and the
# *_local variants; -L leaves them out anyway), and 0190_telemetry
# (TEST_F_MANUAL: it needs a broker with a client-telemetry plugin).
CHOSEN=(
	# tier number subtests
	"ci   0171   single_consumer"          # one consumer, topics x partitions, 1000-3000 records
	"ci   0171   multiple_consumers"       # several consumers share partitions
	"ci   0172   release_redelivery"       # RELEASE comes back with a higher delivery count
	"ci   0173   second_consumer"          # commit_async; what one member acks or releases, another gets (6 subtests)
	"ci   0175   -"                        # several share groups on one topic
	"slow 0170   -"                        # subscriptions, share.auto.offset.reset (229 s directly)
	"slow 0171   -"                        # consume: all scenarios, codecs, headers, fetch sizes
	"slow 0172   -"                        # accept/release/reject, delivery limit, lock timeouts
	"slow 0173   -"                        # commit_async
	"slow 0174   -"                        # concurrency (minutes)
	"slow 0176   -"                        # commit_sync
	"slow 0177   -"                        # read_committed / transactions
	"slow 0178   -"                        # close
	"slow 0179   -"                        # destroy
	"slow 0180   -"                        # configs
	"slow 0181   -"                        # topic deleted while consuming
	"slow 0184   -"                        # topic deleted and created again
	"slow 0185   -"                        # max.poll.interval.ms
)

DIRECT=""
UPSTREAM=""
KPORT=19330
TESTS_ARG=""
TIER=ci
while (($#)); do
	case "$1" in
	--direct) DIRECT=$2; shift 2 ;;
	--upstream) UPSTREAM=$2; shift 2 ;;
	--kproxy-port) KPORT=$2; shift 2 ;;
	--tests) TESTS_ARG=$2; shift 2 ;;
	--tier) TIER=$2; shift 2 ;;
	*) die "unknown flag $1" ;;
	esac
done
[[ -n "$DIRECT" ]] || die "--direct HOST:PORT (a broker serving share groups, Kafka 4.2+) is required"
[[ -n "$UPSTREAM" ]] || die "--upstream HOST:PORT (the broker kproxy fronts) is required"
mkdir -p "$KPROXY_CACHE" "$LOGS/librdkafka-share"
LOGS="$(cd "$LOGS" && pwd)/librdkafka-share"
began=$SECONDS

# --- tools --------------------------------------------------------------
need=()
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
command -v python3 >/dev/null || need+=(python3) # librdkafka's lds-gen.py
command -v npm >/dev/null || need+=(npm)
for pkg in libssl-dev zlib1g-dev libzstd-dev; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if ((${#need[@]})); then
	say "installing ${need[*]} with apt-get"
	{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"; } \
		>"$LOGS/apt-install.log" 2>&1 || { tail -30 "$LOGS/apt-install.log" >&2; die "apt-get install ${need[*]} failed"; }
fi

# --- source -------------------------------------------------------------
CACHE_DIR="$KPROXY_CACHE/librdkafka"
TGZ="$CACHE_DIR/npm-kjs-$KJS/confluentinc-kafka-javascript-$KJS.tgz"
if [[ ! -f "$TGZ" ]]; then
	mkdir -p "$(dirname "$TGZ")"
	say "fetching @confluentinc/kafka-javascript@$KJS (librdkafka's source in deps/librdkafka) with npm pack"
	(cd "$(dirname "$TGZ")" && npm pack --silent "@confluentinc/kafka-javascript@$KJS") >"$LOGS/npm-pack.log" 2>&1 ||
		{ tail -20 "$LOGS/npm-pack.log" >&2; die "npm pack @confluentinc/kafka-javascript@$KJS failed"; }
	[[ -f "$TGZ" ]] || die "npm pack wrote no $TGZ"
fi

# --- build --------------------------------------------------------------
BUILD_DIR="$CACHE_DIR/build-npm-kjs-$KJS-O0"
build_secs=0
if [[ ! -f "$BUILD_DIR/.complete" ]]; then
	b=$SECONDS
	rm -rf "$BUILD_DIR"
	mkdir -p "$BUILD_DIR"
	tar -xzf "$TGZ" -C "$BUILD_DIR" --strip-components=3 package/deps/librdkafka ||
		die "no package/deps/librdkafka in $TGZ"
	[[ -f "$BUILD_DIR/tests/0171-share_consumer_consume.c" ]] || die "librdkafka in $TGZ has no share-consumer tests"
	jobs=$(nproc 2>/dev/null || echo 2)
	say "building librdkafka and its test-runner in $BUILD_DIR (make -j$jobs; log $LOGS/build.log)"
	# As interop/librdkafka.sh: no GSSAPI, no libcurl, no optimization,
	# no debug symbols; zstd is found through pkg-config.
	(cd "$BUILD_DIR" && ./configure --no-download --disable-gssapi --disable-curl \
		--disable-optimization --disable-debug-symbols &&
		make -j"$jobs" libs && make -C tests -j"$jobs" test-runner) >"$LOGS/build.log" 2>&1 ||
		{ tail -40 "$LOGS/build.log" >&2; die "building librdkafka failed"; }
	find "$BUILD_DIR" -name '*.o' -delete
	touch "$BUILD_DIR/.complete"
	build_secs=$((SECONDS - b))
	say "built in ${build_secs}s"
fi
RUNNER="$BUILD_DIR/tests/test-runner"
export LD_LIBRARY_PATH="$BUILD_DIR/src:$BUILD_DIR/src-cpp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rdver=$(sed -n 's/^#define RD_KAFKA_VERSION *0x\([0-9a-f]\{2\}\)\([0-9a-f]\{2\}\)\([0-9a-f]\{2\}\).*/\1 \2 \3/p' "$BUILD_DIR/src/rdkafka.h" |
	{ read -r a b c; printf '%d.%d.%d' "0x$a" "0x$b" "0x$c"; })

# --- kproxy -------------------------------------------------------------
KPROXY_PID=""
stop_kproxy() {
	if [[ -n "$KPROXY_PID" ]] && kill -0 "$KPROXY_PID" 2>/dev/null; then
		kill -TERM "$KPROXY_PID" 2>/dev/null || true
		for _ in $(seq 1 50); do kill -0 "$KPROXY_PID" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$KPROXY_PID" 2>/dev/null || true
	fi
	KPROXY_PID=""
}
trap stop_kproxy EXIT
bin="${KPROXY_BIN:-}"
if [[ -z "$bin" ]]; then
	bin="$LOGS/kproxy-bin"
	(cd "$ROOT" && go build -o "$bin" ./cmd/kproxy) || die "building ./cmd/kproxy failed"
fi
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port_open "$KPORT" && die "port $KPORT on 127.0.0.1 is already in use"
"$bin" serve --upstream "$UPSTREAM" --listen "127.0.0.1:$KPORT" --group-initial-rebalance-delay=0 \
	--groups local --share-groups serve >"$LOGS/kproxy.log" 2>&1 &
KPROXY_PID=$!
deadline=$((SECONDS + 30))
until port_open "$KPORT"; do
	kill -0 "$KPROXY_PID" 2>/dev/null || { tail -20 "$LOGS/kproxy.log" >&2; die "kproxy exited during startup"; }
	((SECONDS < deadline)) || die "kproxy did not listen on $KPORT within 30s"
	sleep 0.2
done
say "kproxy $KPROXY_PID on 127.0.0.1:$KPORT serving share groups in front of $UPSTREAM (log $LOGS/kproxy.log)"

# --- tests --------------------------------------------------------------
for path in direct kproxy; do
	mkdir -p "$LOGS/$path"
	addr=$DIRECT
	[[ $path == direct ]] || addr="127.0.0.1:$KPORT"
	# Random topic names; the tests add a random suffix to their groups.
	# The tests' own timeouts times 3: on a shared 2-core machine 0170
	# ran past its 200 s directly.
	printf 'bootstrap.servers=%s\ntest.topic.random=true\ntest.timeout.multiplier=3\n' "$addr" >"$LOGS/$path/test.conf"
done

# run_one PATH NUMBER SUBTESTS runs test-runner once and appends one line
# per test it ran to $LOGS/results: path name state secs subtests-passed.
run_one() {
	local path=$1 num=$2 sub=$3
	local log="$LOGS/$path/$num.log" rc=0
	[[ "$sub" == - ]] || log="$LOGS/$path/$num-$sub.log"
	local -a env=(TESTS="$num" TEST_KAFKA_VERSION="$KAFKA_VERSION" RDKAFKA_TEST_CONF="$LOGS/$path/test.conf")
	[[ "$sub" == - ]] || env+=(SUBTESTS="$sub")
	# -p1: one test at a time; -L: no broker-less (mock, local) tests;
	# -E: no sockem tests.
	(cd "$LOGS/$path" && env "${env[@]}" timeout 1800 "$RUNNER" -p1 -L -E) >"$log" 2>&1 || rc=$?
	local clean
	clean=$(sed 's/\x1b\[[0-9;]*m//g' "$log")
	local n=0 written=0 name state secs reason subs
	while IFS='|' read -r _ name state secs reason; do
		name=$(echo $name) state=$(echo $state) secs=$(echo $secs) reason=$(echo $reason)
		[[ "$name" != "<MAIN>" && -n "$name" ]] || continue
		# The mock and local tests of the same number, left out by -L.
		[[ "$state" != SKIPPED || ( -n "$reason" && "$reason" != *"negative test flags"* ) ]] || continue
		# Subtests passed: "[name/  1.23s] [ subtest...: PASS (1.23s) ]", the
		# name padded to 28 characters (a longer one is not).
		subs=$(grep -cE "^\[$name */ *[0-9.]+s\] \[ .*: PASS \([0-9.]+s\) \]" <<<"$clean" || true)
		n=$((n + 1))
		if [[ "$sub" != - ]]; then
			((subs > 0)) || [[ "$state" != PASSED ]] || continue
			name="$name[$sub]"
		fi
		echo "$path $name $state ${secs%s} $subs" >>"$LOGS/results"
		written=$((written + 1))
	done < <(grep -E '^\| [0-9]{4}_' <<<"$clean")
	local suffix=""
	[[ "$sub" == - ]] || suffix="[$sub]"
	if ((rc != 0)); then
		printf '%s %s%s: %s\n' "$path" "$num" "$suffix" \
			"$(grep -m1 -A1 '^### Test .* failed at' <<<"$clean" | paste -sd' ' - | cut -c1-300)" >>"$LOGS/failures"
	fi
	if ((n == 0)); then
		echo "$path ${num}_runner$suffix NO-SUMMARY(rc=$rc) 0 0" >>"$LOGS/results"
	elif ((written == 0)); then
		echo "$path ${num}_runner$suffix NO-SUBTEST-RAN 0 0" >>"$LOGS/results"
	elif ((rc != 0)) && ! grep -qE '^\| [0-9]{4}_.*\| +FAILED' <<<"$clean"; then
		echo "$path ${num}_runner$suffix FAILED(rc=$rc) 0 0" >>"$LOGS/results"
	fi
}

: >"$LOGS/results"
: >"$LOGS/failures"
: >"$LOGS/retried"
wanted=" ${TESTS_ARG//,/ } "
tests_began=$SECONDS
for entry in "${CHOSEN[@]}"; do
	read -r tier num sub _ <<<"$entry"
	[[ "$TIER" == all && "$tier" == slow || "$TIER" == ci && "$tier" == ci ]] || continue
	[[ -z "$TESTS_ARG" || "$wanted" == *" $num "* ]] || continue
	for path in direct kproxy; do
		t=$SECONDS before=$(wc -l <"$LOGS/results")
		run_one "$path" "$num" "$sub"
		if [[ "$path" == direct ]] && tail -n +$((before + 1)) "$LOGS/results" | awk '$3 != "PASSED" && $3 != "SKIPPED" {bad=1} END {exit !bad}'; then
			first=$(tail -n +$((before + 1)) "$LOGS/results" | awk '{printf "%s %s; ", $2, $3}')
			head -n "$before" "$LOGS/results" >"$LOGS/results.tmp" && mv "$LOGS/results.tmp" "$LOGS/results"
			for f in "$LOGS/direct/$num.log" "$LOGS/direct/$num-$sub.log"; do
				[[ -f "$f" ]] && mv "$f" "${f%.log}.first.log"
			done
			echo "direct $num$([[ "$sub" == - ]] || echo "[$sub]"): failed directly ($first) and ran again" >>"$LOGS/retried"
			say "$num direct failed (${first% }), running it again directly"
			run_one "$path" "$num" "$sub"
		fi
		say "$num$([[ "$sub" == - ]] || echo " [$sub]") $path: $(tail -n +$((before + 1)) "$LOGS/results" | awk '{printf "%s ", $3}')($((SECONDS - t))s)"
	done
done
tests_secs=$((SECONDS - tests_began))
stop_kproxy

# --- table --------------------------------------------------------------
fail=0
printf '\n%-52s %-22s %-22s %s\n' TEST "DIRECT (Kafka $KAFKA_VERSION)" "KPROXY (serve)" VERDICT
while read -r name; do
	d=$(awk -v n="$name" '$1=="direct" && $2==n {print $3, $4, $5; exit}' "$LOGS/results")
	k=$(awk -v n="$name" '$1=="kproxy" && $2==n {print $3, $4, $5; exit}' "$LOGS/results")
	read -r ds dt dn <<<"${d:-MISSING 0 0}"
	read -r ks kt kn <<<"${k:-MISSING 0 0}"
	verdict=ok
	if [[ "$ds" == SKIPPED && "$ks" == SKIPPED ]]; then
		verdict="ok (skipped by the test on both paths)"
	elif [[ "$ds" == MISSING && "$name" == *_runner* ]]; then
		# The runner aborted through kproxy only (a failed assertion
		# leaves librdkafka's threads running: no summary).
		verdict="FAIL: the runner ended without its summary through kproxy only (see $LOGS/kproxy)"
		fail=1
	elif [[ "$ds" != PASSED ]]; then
		verdict="FAIL: fails directly (see $LOGS/direct)"
		fail=1
	elif [[ "$ks" != PASSED ]]; then
		verdict="FAIL: passes directly, not through kproxy (see $LOGS/kproxy)"
		fail=1
	elif ((kn < dn)); then
		verdict="FAIL: $kn subtests passed through kproxy, $dn directly"
		fail=1
	fi
	printf '%-52s %-22s %-22s %s\n' "$name" "$ds ${dt}s ${dn}sub" "$ks ${kt}s ${kn}sub" "$verdict"
done < <(awk '{print $2}' "$LOGS/results" | awk '!seen[$0]++')
if [[ -s "$LOGS/retried" ]]; then
	printf '\nRun again after failing directly (the table has the second run):\n'
	cat "$LOGS/retried"
fi
if [[ -s "$LOGS/failures" ]]; then
	printf '\nFailures (path test: the runner'"'"'s message):\n'
	cat "$LOGS/failures"
fi
say "librdkafka $rdver (@confluentinc/kafka-javascript $KJS): direct $DIRECT (Kafka $KAFKA_VERSION), kproxy in front of $UPSTREAM: build ${build_secs}s (0 = cached), tests ${tests_secs}s, total $((SECONDS - began))s; logs in $LOGS"
exit $fail
