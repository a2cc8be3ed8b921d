#!/usr/bin/env bash
# librdkafka.sh runs a chosen subset of librdkafka's own consumer-group tests
# (its tests/ suite, test-runner) against a running Kafka broker, first
# directly and then through a kproxy it starts in front of that broker, with
# the classic group protocol and with KIP-848's (group.protocol=consumer),
# and prints a table test x protocol x path with the result and the time.
#
#   bash interop/librdkafka.sh --broker 127.0.0.1:9092 [--kproxy-port 19300]
#        [--tier ci|all] [--tests '0029 0045 ...'] [--protocols classic,consumer]
#
# It fails when a chosen test fails directly twice (a direct failure runs
# once more, reported; the subset is chosen to pass
# against Kafka 4.1.1, so a direct failure is a broker or machine problem to
# look at, never something to skip) or passes directly and not through
# kproxy, or runs fewer subtests through kproxy than directly.
#
# librdkafka comes from Debian's source package (it carries tests/; the
# upstream tarball on GitHub is not fetched): a deb-src entry for
# KPROXY_LIBRDKAFKA_SUITE (default sid) in a private apt configuration under
# $KPROXY_CACHE/librdkafka (the machine's own apt sources are not touched),
# `apt-get source --download-only librdkafka=VERSION`, then ./configure
# (--no-download: mklove fetches nothing), make and the tests' test-runner.
# The source and the build are cached under $KPROXY_CACHE, so a rerun on the
# same machine neither refetches nor rebuilds. The compilers and the headers
# it needs (g++, make, libssl-dev, zlib1g-dev) are installed with apt-get
# when missing.
#
# The broker must auto-create topics with 4 partitions, as librdkafka's test
# scenario "default" does (interop/kafka.sh start --partitions 4).
#
# Environment:
#   KPROXY_CACHE                  cache dir (default ~/.cache/kproxy-interop)
#   KPROXY_INTEROP_LOGS           where the logs go (default a new temp dir);
#                                 this script writes under its librdkafka/
#   KPROXY_LIBRDKAFKA_VERSION     Debian version of the source package
#                                 (default 2.14.2-1)
#   KPROXY_LIBRDKAFKA_SUITE       Debian suite of the deb-src entry (default
#                                 sid; trixie has 2.8.0-1)
#   KAFKA_VERSION                 the broker's version, given to the tests as
#                                 TEST_KAFKA_VERSION (default 4.1.1)
#   KPROXY_BIN                    a kproxy binary to use instead of building
#                                 ./cmd/kproxy
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KPROXY_CACHE="${KPROXY_CACHE:-$HOME/.cache/kproxy-interop}"
LOGS="${KPROXY_INTEROP_LOGS:-$(mktemp -d /tmp/kproxy-librdkafka.XXXXXX)}"
VERSION="${KPROXY_LIBRDKAFKA_VERSION:-2.14.2-1}"
SUITE="${KPROXY_LIBRDKAFKA_SUITE:-sid}"
KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"

say() { printf 'librdkafka: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

# The chosen tests, one per line: the tier (ci: run by default, a few
# seconds each; slow: only with --tier all), the test number (test-runner's
# TESTS matches every test of that number: 0045 is six tests, of which the
# mock ones are left out by -L), the protocols it runs with, and SUBTESTS
# (a substring of the subtests' names) when only some subtests are chosen.
# Times are per path, measured directly against Kafka 4.1.1 on a shared
# 2-core machine (classic/consumer).
# Left out on purpose: the mock-cluster and sockem tests (TEST_F_LOCAL,
# TEST_F_SOCKEM: they never reach a broker, e.g. 0106_cgrp_sess_timeout,
# 0116_kafkaconsumer_close, 0147_consumer_group_consumer_mock); 0103
# (transactions: creates topics with replication factor 3, one broker
# cannot); 0089_max_poll_interval (33-82 s; failed once directly, its
# topic not seen in metadata within 5 s); 0113's full run (minutes; its
# l_unsubscribe fails directly with classic, "Expecting consumer 1's
# assign_call_cnt to be 1 not: 3", and n_wildcard timed out directly with
# consumer after 122 s).
CHOSEN=(
	# tier number protocols        subtests
	"ci   0029   classic,consumer -" # assign offsets in the rebalance callback (2/2 s)
	"ci   0030   classic,consumer -" # sync/async commits, committed() (15/13 s)
	"ci   0040   classic,consumer -" # group consumer on an IO event queue (4/4 s)
	"ci   0042   classic,consumer -" # one group over many topics (6/3 s)
	"ci   0045   classic,consumer resubscribe_with_regex" # literal topic + regex, resubscribe (4/9 s)
	"ci   0056   classic,consumer -" # two members balanced, multi-threaded (3/3 s)
	"ci   0064   classic,consumer -" # interceptors on consume and commit (2/1 s)
	"ci   0099   classic,consumer -" # commit metadata, read back (2/2 s)
	"ci   0102   classic,consumer fenced_member" # static member fenced by a new one with its instance id (8/13 s)
	"ci   0112   classic,consumer -" # assign an unknown partition, then it appears (5/4 s)
	"ci   0113   classic,consumer change_subscription" # cooperative: topics added and removed (13/14 s)
	"ci   0113   classic,consumer add_partition" # cooperative: partitions added to the subscribed topic (4/6 s)
	"ci   0118   classic,consumer -" # commit inside the rebalance callback (7/11 s)
	"ci   0130   classic,consumer -" # stored offsets committed, and after a rebalance (1/1 s)
	"ci   0132   classic          -" # assignor strategy ordering (5 s; the test skips itself with KIP-848)
	"ci   0140   classic,consumer -" # commit metadata through the C++ API (2/2 s)
	"slow 0018   classic,consumer -" # members leave while consuming, close() (29/39 s)
	"slow 0033   classic,consumer -" # regex subscriptions (34/85 s)
	"slow 0045   classic,consumer -" # subscription updates: regex, topics added, many updates (52/60 s)
	"slow 0050   classic,consumer -" # subscribe adds topics (21/23 s)
	"slow 0091   classic          -" # max.poll.interval.ms expiry (65 s)
	"slow 0102   classic,consumer -" # static membership rebalances (43/13 s)
	"slow 0113   classic,consumer delete_topic" # cooperative: subscribed topic deleted (10/20 s)
	"slow 0113   consumer         unsubscribe" # unsubscribe while others stay (15 s)
	"slow 0122   classic,consumer -" # buffer cleaning after a rebalance (37/38 s)
	"slow 0137   classic,consumer -" # batch consume across a rebalance barrier (47/47 s)
)

BROKER=""
KPORT=19300
TESTS_ARG=""
TIER=ci
PROTOCOLS="classic,consumer"
while (($#)); do
	case "$1" in
	--broker) BROKER=$2; shift 2 ;;
	--kproxy-port) KPORT=$2; shift 2 ;;
	--tests) TESTS_ARG=$2; shift 2 ;;
	--tier) TIER=$2; shift 2 ;;
	--protocols) PROTOCOLS=$2; shift 2 ;;
	*) die "unknown flag $1" ;;
	esac
done
[[ -n "$BROKER" ]] || die "--broker HOST:PORT is required (start one with interop/kafka.sh start --partitions 4)"
mkdir -p "$KPROXY_CACHE" "$LOGS/librdkafka"
LOGS="$(cd "$LOGS" && pwd)/librdkafka"
began=$SECONDS

# --- tools --------------------------------------------------------------
need=()
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
command -v python3 >/dev/null || need+=(python3) # librdkafka's lds-gen.py
for pkg in libssl-dev zlib1g-dev; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if ((${#need[@]})); then
	say "installing ${need[*]} with apt-get"
	{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"; } \
		>"$LOGS/apt-install.log" 2>&1 || { tail -30 "$LOGS/apt-install.log" >&2; die "apt-get install ${need[*]} failed"; }
fi

# --- source -------------------------------------------------------------
# A private apt configuration: only a deb-src entry for $SUITE, its lists
# and caches under the cache dir, signed by Debian's archive keyring.
CACHE_DIR="$KPROXY_CACHE/librdkafka"
SRC_DIR="$CACHE_DIR/src-$VERSION"
upstream=${VERSION%-*}
upstream=${upstream#*:}
if [[ ! -f "$SRC_DIR/.complete" ]]; then
	apt_dir="$CACHE_DIR/apt-$SUITE"
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$SRC_DIR"
	printf 'deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian %s main\n' \
		"$SUITE" >"$apt_dir/sources.list"
	apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
		-o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root)
	say "fetching Debian's source package librdkafka=$VERSION ($SUITE) into $SRC_DIR"
	apt-get -q "${apt_opts[@]}" update >"$LOGS/apt-source.log" 2>&1 ||
		{ tail -20 "$LOGS/apt-source.log" >&2; die "apt-get update for the deb-src entry ($SUITE) failed"; }
	(cd "$SRC_DIR" && apt-get -q "${apt_opts[@]}" source --download-only "librdkafka=$VERSION") >>"$LOGS/apt-source.log" 2>&1 || {
		tail -20 "$LOGS/apt-source.log" >&2
		have=$(apt-cache "${apt_opts[@]}" showsrc librdkafka 2>/dev/null | sed -n 's/^Version: //p' | paste -sd' ' -)
		die "librdkafka $VERSION is not in Debian $SUITE (it has: ${have:-none}); set KPROXY_LIBRDKAFKA_VERSION and KPROXY_LIBRDKAFKA_SUITE, and check the chosen tests against that version"
	}
	ls "$SRC_DIR/librdkafka_$upstream.orig.tar.gz" >/dev/null || die "no librdkafka_$upstream.orig.tar.gz in $SRC_DIR"
	touch "$SRC_DIR/.complete"
	rm -rf "$apt_dir" # sid's source index (25 MB), not needed again
fi

# --- build --------------------------------------------------------------
BUILD_DIR="$CACHE_DIR/build-$VERSION-O0"
build_secs=0
if [[ ! -f "$BUILD_DIR/.complete" ]]; then
	b=$SECONDS
	rm -rf "$BUILD_DIR"
	mkdir -p "$BUILD_DIR"
	tar -xzf "$SRC_DIR/librdkafka_$upstream.orig.tar.gz" -C "$BUILD_DIR" --strip-components=1
	jobs=$(nproc 2>/dev/null || echo 2)
	say "building librdkafka $upstream and its test-runner in $BUILD_DIR (make -j$jobs; log $LOGS/build.log)"
	# No GSSAPI (Kerberos) and no libcurl (OIDC): none of the chosen tests
	# uses them, and it keeps the headers to install to two. Without
	# optimization and debug symbols (as librdkafka's dev-conf.sh builds for
	# testing, which also drops -O2): about 2 min on 2 cores instead of 6,
	# and the chosen tests check behaviour, not speed.
	(cd "$BUILD_DIR" && ./configure --no-download --disable-gssapi --disable-curl \
		--disable-optimization --disable-debug-symbols &&
		make -j"$jobs" libs && make -C tests -j"$jobs" test-runner) >"$LOGS/build.log" 2>&1 ||
		{ tail -40 "$LOGS/build.log" >&2; die "building librdkafka failed"; }
	# The objects are not needed again (about half of the build's size).
	find "$BUILD_DIR" -name '*.o' -delete
	touch "$BUILD_DIR/.complete"
	build_secs=$((SECONDS - b))
	say "built in ${build_secs}s"
fi
RUNNER="$BUILD_DIR/tests/test-runner"
export LD_LIBRARY_PATH="$BUILD_DIR/src:$BUILD_DIR/src-cpp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

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
# As the harness does (interop/harness/kproxy.go): kproxy in front of the
# broker, with the broker's group.initial.rebalance.delay.ms=0.
"$bin" serve --upstream "$BROKER" --listen "127.0.0.1:$KPORT" --group-initial-rebalance-delay=0 \
	>"$LOGS/kproxy.log" 2>&1 &
KPROXY_PID=$!
deadline=$((SECONDS + 30))
until port_open "$KPORT"; do
	kill -0 "$KPROXY_PID" 2>/dev/null || { tail -20 "$LOGS/kproxy.log" >&2; die "kproxy exited during startup"; }
	((SECONDS < deadline)) || die "kproxy did not listen on $KPORT within 30s"
	sleep 0.2
done
say "kproxy $KPROXY_PID on 127.0.0.1:$KPORT in front of $BROKER (log $LOGS/kproxy.log)"

# --- tests --------------------------------------------------------------
for path in direct kproxy; do
	mkdir -p "$LOGS/$path"
	addr=$BROKER
	[[ $path == direct ]] || addr="127.0.0.1:$KPORT"
	# Random topic names: the two paths share one broker.
	printf 'bootstrap.servers=%s\ntest.topic.random=true\n' "$addr" >"$LOGS/$path/test.conf"
done

# run_one PATH PROTOCOL NUMBER SUBTESTS runs test-runner once and appends
# one line per test it ran to $LOGS/results: path protocol name state secs
# subtests-passed.
run_one() {
	local path=$1 proto=$2 num=$3 sub=$4
	local log="$LOGS/$path/$num-$proto.log" rc=0
	[[ "$sub" == - ]] || log="$LOGS/$path/$num-$sub-$proto.log"
	local -a env=(TESTS="$num" TEST_CONSUMER_GROUP_PROTOCOL="$proto" TEST_KAFKA_VERSION="$KAFKA_VERSION"
		RDKAFKA_TEST_CONF="$LOGS/$path/test.conf" RDKAFKA_GITVER="$upstream")
	[[ "$sub" == - ]] || env+=(SUBTESTS="$sub")
	# -p1: one test at a time; -L: no broker-less (mock) tests; -E: no
	# sockem tests. Not -Q: quick mode skips most subtests.
	(cd "$LOGS/$path" && env "${env[@]}" timeout 600 "$RUNNER" -p1 -L -E) >"$log" 2>&1 || rc=$?
	local clean
	clean=$(sed 's/\x1b\[[0-9;]*m//g' "$log")
	local n=0 written=0 name state secs reason subs
	while IFS='|' read -r _ name state secs reason; do
		name=$(echo $name) state=$(echo $state) secs=$(echo $secs) reason=$(echo $reason)
		[[ "$name" != "<MAIN>" && -n "$name" ]] || continue
		# The mock and sockem tests of the same number, left out by -L -E,
		# and the ones of another test scenario (noautocreate: a broker
		# that does not create topics), which the runner skips silently.
		[[ "$state" != SKIPPED || ( -n "$reason" && "$reason" != *"negative test flags"* ) ]] || continue
		# Subtests passed: the runner's "[ name:line...: PASS (1.23s) ]".
		subs=$(grep -cE "^\[$name +/ *[0-9.]+s\] \[ .*: PASS \([0-9.]+s\) \]" <<<"$clean" || true)
		n=$((n + 1))
		if [[ "$sub" != - ]]; then
			# A test of this number with none of the chosen subtests.
			((subs > 0)) || [[ "$state" != PASSED ]] || continue
			name="$name[$sub]"
		fi
		echo "$path $proto $name $state ${secs%s} $subs" >>"$LOGS/results"
		written=$((written + 1))
	done < <(grep -E '^\| [0-9]{4}_' <<<"$clean")
	local suffix=""
	[[ "$sub" == - ]] || suffix="[$sub]"
	# The runner's own words for a failure: '### Test "NAME (SUBTEST)"
	# failed at FILE:LINE...' and the line after it.
	if ((rc != 0)); then
		printf '%s %s %s%s: %s\n' "$path" "$proto" "$num" "$suffix" \
			"$(grep -m1 -A1 '^### Test .* failed at' <<<"$clean" | paste -sd' ' - | cut -c1-300)" >>"$LOGS/failures"
	fi
	# No summary: the runner crashed or timed out. A failure outside the
	# tests (the runner's exit checks: threads left, leaks) fails too.
	if ((n == 0)); then
		echo "$path $proto ${num}_runner$suffix NO-SUMMARY(rc=$rc) 0 0" >>"$LOGS/results"
	elif ((written == 0)); then
		echo "$path $proto ${num}_runner$suffix NO-SUBTEST-RAN 0 0" >>"$LOGS/results"
	elif ((rc != 0)) && ! grep -qE '^\| [0-9]{4}_.*\| +FAILED' <<<"$clean"; then
		echo "$path $proto ${num}_runner$suffix FAILED(rc=$rc) 0 0" >>"$LOGS/results"
	fi
}

: >"$LOGS/results"
: >"$LOGS/failures"
: >"$LOGS/retried"
wanted=" ${TESTS_ARG//,/ } "
tests_began=$SECONDS
for entry in "${CHOSEN[@]}"; do
	read -r tier num protos sub _ <<<"$entry"
	[[ "$TIER" == all || "$tier" == "$TIER" ]] || continue
	[[ -z "$TESTS_ARG" || "$wanted" == *" $num "* ]] || continue
	IFS=, read -ra plist <<<"$protos"
	for proto in "${plist[@]}"; do
		[[ ",$PROTOCOLS," == *",$proto,"* ]] || continue
		for path in direct kproxy; do
			t=$SECONDS before=$(wc -l <"$LOGS/results")
			run_one "$path" "$proto" "$num" "$sub"
			# A test that fails directly, where kproxy is not involved,
			# runs once more directly (0118 aborted once on the direct
			# path against Kafka 4.1.1, "Expected closing consumer's
			# commit to fail, but got NO_ERROR", and passed through
			# kproxy in the same run): the second result counts, the
			# retry is reported, and a second direct failure fails the
			# row as before.
			if [[ "$path" == direct ]] && tail -n +$((before + 1)) "$LOGS/results" | awk '$4 != "PASSED" && $4 != "SKIPPED" {bad=1} END {exit !bad}'; then
				first=$(tail -n +$((before + 1)) "$LOGS/results" | awk '{printf "%s %s; ", $3, $4}')
				head -n "$before" "$LOGS/results" >"$LOGS/results.tmp" && mv "$LOGS/results.tmp" "$LOGS/results"
				for f in "$LOGS/direct/$num-$proto.log" "$LOGS/direct/$num-$sub-$proto.log"; do
					[[ -f "$f" ]] && mv "$f" "${f%.log}.first.log"
				done
				echo "direct $proto $num$([[ "$sub" == - ]] || echo "[$sub]"): failed directly ($first) and ran again" >>"$LOGS/retried"
				say "$num $proto direct failed (${first% }), running it again directly"
				run_one "$path" "$proto" "$num" "$sub"
			fi
			say "$num$([[ "$sub" == - ]] || echo " [$sub]") $proto $path: $(tail -n +$((before + 1)) "$LOGS/results" | awk '{printf "%s ", $4}')($((SECONDS - t))s)"
		done
	done
done
tests_secs=$((SECONDS - tests_began))
stop_kproxy

# --- table --------------------------------------------------------------
# One row per test and protocol; a row fails when the test fails directly,
# or passes directly and not through kproxy, or passes through kproxy with
# fewer subtests passed than directly.
fail=0
printf '\n%-48s %-9s %-22s %-22s %s\n' TEST PROTOCOL DIRECT KPROXY VERDICT
while read -r name proto; do
	d=$(awk -v n="$name" -v g="$proto" '$1=="direct" && $2==g && $3==n {print $4, $5, $6; exit}' "$LOGS/results")
	k=$(awk -v n="$name" -v g="$proto" '$1=="kproxy" && $2==g && $3==n {print $4, $5, $6; exit}' "$LOGS/results")
	read -r ds dt dn <<<"${d:-MISSING 0 0}"
	read -r ks kt kn <<<"${k:-MISSING 0 0}"
	verdict=ok
	if [[ "$ds" == SKIPPED && "$ks" == SKIPPED ]]; then
		verdict="ok (skipped by the test on both paths)"
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
	printf '%-48s %-9s %-22s %-22s %s\n' "$name" "$proto" "$ds ${dt}s ${dn}sub" "$ks ${kt}s ${kn}sub" "$verdict"
done < <(awk '{print $3, $2}' "$LOGS/results" | awk '!seen[$0]++')
if [[ -s "$LOGS/retried" ]]; then
	printf '\nRun again after failing directly (the table has the second run):\n'
	cat "$LOGS/retried"
fi
if [[ -s "$LOGS/failures" ]]; then
	printf '\nFailures (path protocol test: the runner'"'"'s message):\n'
	cat "$LOGS/failures"
fi
say "librdkafka $upstream (Debian $VERSION), broker $BROKER (Kafka $KAFKA_VERSION): build ${build_secs}s (0 = cached), tests ${tests_secs}s, total $((SECONDS - began))s; logs in $LOGS"
exit $fail
