// Command harness runs the kproxy interop table: real Kafka clients in Java,
// Go, Python and JavaScript consume as a group from a real Apache Kafka
// broker, once directly (path=direct) and once through kproxy
// (path=kproxy). Each row produces records, runs a group whose membership
// changes mid-way, and checks that no record was lost, that the committed
// offsets reach the end offsets, and that no partition was held by two
// members at once. It prints one table and exits non-zero if a row fails.
//
// interop/run.sh builds the clients, starts the broker and runs this program.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// harness holds the configuration shared by every row; immutable after
// main sets it up, except adm which is safe for concurrent use.
type harness struct {
	root           string
	broker         string
	partitions     int
	records        int
	membersN       int
	sessionMS      int
	heartbeatMS    int
	settleTimeout  time.Duration
	consumeTimeout time.Duration
	logDir         string
	kproxyArgs     []string
	kafkaVersion   string         // the broker's release (-kafka-version); "" = unknown, no per-version expectations
	subset         *regexp.Regexp // -subset: a second row filter, ANDed with -rows; nil = all
	adm            *kadm.Client
	cl             *kgo.Client // adm's client, for raw requests
	log            *slog.Logger
	// sec is the secured broker's configuration (security.go); nil
	// unless -security is given.
	sec *securityConfig
	// probeOpts are the kgo options of the probe that waits for kproxy
	// to serve metadata (TLS and SASL in the security phase).
	probeOpts []kgo.Opt
}

func main() {
	var (
		h           harness
		rowsFilter  string
		pathsFlag   string
		requestLogs string
		kproxyBin   string
		kproxyPort  int
		kproxyArgs  string
		cacheDir    string
		multiBroker bool
		list        bool
		security    string
	)
	home, _ := os.UserHomeDir()
	defCache := os.Getenv("KPROXY_CACHE")
	if defCache == "" {
		defCache = filepath.Join(home, ".cache", "kproxy-interop")
	}
	flag.StringVar(&h.root, "root", ".", "repository root")
	flag.StringVar(&h.broker, "broker", "127.0.0.1:9092", "the real broker's bootstrap address")
	flag.IntVar(&h.partitions, "partitions", 6, "partitions per scenario topic")
	flag.IntVar(&h.records, "records", 1000, "records per scenario")
	flag.IntVar(&h.membersN, "members", 3, "group members per scenario")
	flag.IntVar(&h.sessionMS, "session-ms", 10000, "client session timeout")
	flag.IntVar(&h.heartbeatMS, "heartbeat-ms", 1000, "client heartbeat interval")
	flag.DurationVar(&h.settleTimeout, "settle-timeout", 45*time.Second, "how long a group may take to settle")
	flag.DurationVar(&h.consumeTimeout, "consume-timeout", 60*time.Second, "how long consumption and commits may take")
	flag.StringVar(&rowsFilter, "rows", "", "regexp selecting rows by name (default all)")
	flag.StringVar(&pathsFlag, "paths", "direct,kproxy", "paths to run: direct, kproxy or both")
	flag.StringVar(&requestLogs, "request-log", "", "comma-separated broker request logs (kafka.request.logger) to count group APIs")
	flag.StringVar(&kproxyBin, "kproxy-bin", "", "prebuilt kproxy binary (default: go build ./cmd/kproxy)")
	flag.IntVar(&kproxyPort, "kproxy-port", 19200, "kproxy listen port on 127.0.0.1")
	// --share-groups forward: the kind rows (kinds.go) compare share
	// groups the cluster serves, or lacks, directly and through kproxy;
	// kproxy's default (auto) would serve them where the cluster lacks
	// them, which the shareserve.go rows test on their own kproxy.
	flag.StringVar(&kproxyArgs, "kproxy-args", "--group-initial-rebalance-delay=0 --share-groups forward", "extra `kproxy serve` flags, space-separated (the default mirrors the broker's group.initial.rebalance.delay.ms=0 and leaves share groups to the cluster)")
	flag.StringVar(&cacheDir, "cache", defCache, "cache directory (python venv)")
	flag.StringVar(&h.logDir, "logs", "", "directory for per-member logs (default a temp dir)")
	flag.BoolVar(&multiBroker, "multibroker", false, "run only the rows that need a cluster of 3 brokers (franz-brokerkill) and the ApiVersions check (every broker's port); without it the former run only when the cluster has 3")
	flag.StringVar(&security, "security", "", "security.json written by `kafka.sh start --security sasl_ssl`: run only the security rows (security.go) against that broker, as its super user")
	flag.BoolVar(&list, "list", false, "print the names of the rows -rows, -subset and -multibroker select, and exit")
	flag.StringVar(&h.kafkaVersion, "kafka-version", os.Getenv("KAFKA_VERSION"), "the broker's Kafka release, for the per-version expectations (rows needing a feature the release lacks are expected to fail directly); default $KAFKA_VERSION")
	var subset string
	flag.StringVar(&subset, "subset", "", "a second regexp rows must match as well as -rows (run.sh's per-version subsets)")
	flag.Parse()
	if subset != "" {
		var err error
		if h.subset, err = regexp.Compile(subset); err != nil {
			fmt.Fprintln(os.Stderr, "-subset:", err)
			os.Exit(2)
		}
	}
	if list {
		filter, err := regexp.Compile(rowsFilter)
		if err != nil {
			fmt.Fprintln(os.Stderr, "-rows:", err)
			os.Exit(2)
		}
		for _, r := range h.rows(cacheDir, "goclient") {
			if filter.MatchString(r.name) && h.inSubset(r.name) && (!multiBroker || r.threeBrokers() || r.apiVersions) && (security != "") == r.security {
				fmt.Println(r.name)
			}
		}
		return
	}

	h.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h.kproxyArgs = strings.Fields(kproxyArgs)
	if err := run(&h, rowsFilter, pathsFlag, requestLogs, kproxyBin, kproxyPort, cacheDir, multiBroker, security); err != nil {
		h.log.Error("harness failed", "err", err)
		os.Exit(1)
	}
}

// rows returns the table's scenarios. Client programs all accept the same
// flags (see interop/README.md).
func (h *harness) rows(cacheDir, goclient string) []row {
	javaCP := filepath.Join(h.root, "interop/java/target/classes") + ":" + filepath.Join(h.root, "interop/java/target/lib/*")
	java := []string{"java", "-Xmx192m", "-Xss512k", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", javaCP, "io.kproxy.interop.Client"}
	py := []string{filepath.Join(cacheDir, "venv/bin/python"), "-u", filepath.Join(h.root, "interop/python/client.py")}
	js := []string{"node", filepath.Join(h.root, "interop/js/client.js")}
	goc := func(lib string) []string { return []string{goclient, "--client", lib} }
	kafkaTools := []string{"env", "KPROXY_CACHE=" + cacheDir, "bash", filepath.Join(h.root, "interop/kafka.sh"), "tools"}
	return []row{
		{name: "java-range", client: java, assignor: "range"},
		{name: "java-coop-sticky", client: java, assignor: "cooperative-sticky"},
		{name: "java-kip848", client: java, assignor: "server-uniform", needs: kip848},
		{name: "java-static", client: java, assignor: "range", static: true},
		{name: "java-txn", client: java, assignor: "range", txn: true},
		// migration.go: classic → consumer → classic, one member at a time.
		{name: "java-migration", client: java, assignor: "cooperative-sticky", migration: true, producer: goc("franz")},
		{name: "go-franz", client: goc("franz"), assignor: "range"},
		{name: "go-franz-coop", client: goc("franz"), assignor: "cooperative-sticky"},
		{name: "go-franz-kip848", client: goc("franz"), assignor: "server-uniform", needs: kip848},
		{name: "go-sarama", client: goc("sarama"), assignor: "range"},
		{name: "go-confluent", client: goc("confluent"), assignor: "range"},
		{name: "py-confluent", client: append(append([]string(nil), py...), "--client", "confluent"), assignor: "range"},
		{name: "py-kafka-python", client: append(append([]string(nil), py...), "--client", "kafka-python"), assignor: "range"},
		{name: "js-kafkajs", client: js, assignor: "roundrobin"},
		// Both run on the kproxy path only. apiversions.go: franz-go's
		// connection opening, byte for byte, direct vs kproxy.
		{name: "franz-apiversions", apiVersions: true},
		// brokerkill.go: a broker's JVM killed and restarted; three
		// brokers only (run.sh gives it a cluster of its own).
		{name: "franz-brokerkill", brokerKill: true},
		// fleet.go: one member per
		// kproxy of a fleet, then the group's owner is killed.
		// faults.go: a fleet owner's upstream cut or slowed, the peer
		// link into it cut, each beside a direct member whose own
		// path gets the same fault.
		{name: "fault-owner-upstream-cut", fault: faultUpstreamCut, faultFor: 35 * time.Second, brokerGroupTraffic: faultTraffic},
		{name: "fault-peer-link-cut", fault: faultPeerCut, faultFor: 30 * time.Second, brokerGroupTraffic: faultTraffic},
		{name: "fault-owner-upstream-slow", fault: faultUpstreamSlow, faultFor: 30 * time.Second, brokerGroupTraffic: faultTraffic},
		{name: "fault-owner-upstream-slow-2s", fault: faultUpstreamVerySlow, faultFor: 30 * time.Second, brokerGroupTraffic: faultTraffic},
		{name: "fault-owner-upstream-stalls", fault: faultUpstreamStalls, faultFor: 30 * time.Second, brokerGroupTraffic: faultTraffic},
		// A one-way partition: A's requests reach the broker, the
		// broker's answers to A are held (and the direct member's).
		{name: "fault-owner-upstream-responses-held", fault: faultUpstreamResponsesHeld, faultFor: 30 * time.Second, brokerGroupTraffic: faultTraffic},
		{name: "fleet-mixed", assignor: "range", fleet: true, sessionMS: 20000,
			members:  [][]string{java, append(append([]string(nil), py...), "--client", "confluent"), goc("franz")},
			producer: goc("franz")},
		// anchors.go: a group kproxy serves, seen live by Kafka's own
		// kafka-consumer-groups through its anchor; a live group's
		// members moved behind a fleet of kproxies and back.
		{name: "anchor-admin", client: goc("franz"), assignor: "range", anchorAdmin: true,
			tools: []string{"env", "KPROXY_CACHE=" + cacheDir, "bash", filepath.Join(h.root, "interop/kafka.sh"), "tools"}},
		// The adoption rows run on three brokers (the 3-broker phase),
		// each member moved onto its own kproxy; franz-go produces the
		// stream for the others (one record at a time).
		{name: "franz-adoption", client: goc("franz"), assignor: "cooperative-sticky", adoption: true,
			brokerGroupTraffic: adoptionTraffic},
		{name: "franz-kip848-adoption", client: goc("franz"), assignor: "server-uniform", needs: kip848, adoption: true,
			brokerGroupTraffic: adoptionTraffic},
		{name: "franz-static-adoption", client: goc("franz"), assignor: "range", static: true, adoption: true,
			brokerGroupTraffic: adoptionTraffic},
		{name: "java-adoption", client: java, assignor: "cooperative-sticky", adoption: true, producer: goc("franz"),
			brokerGroupTraffic: adoptionTraffic},
		{name: "py-confluent-adoption", client: append(append([]string(nil), py...), "--client", "confluent"), assignor: "range",
			adoption: true, producer: goc("franz"), brokerGroupTraffic: adoptionTraffic},
		// Rolled in one member at a time, rolled back all at once: every
		// member and every sidecar stopped, the members started against
		// the brokers.
		{name: "java-rollback-all", client: java, assignor: "cooperative-sticky", adoption: true, rollbackAll: true, producer: goc("franz"),
			brokerGroupTraffic: adoptionTraffic},
		{name: "py-confluent-rollback-all", client: append(append([]string(nil), py...), "--client", "confluent"), assignor: "range",
			adoption: true, rollbackAll: true, producer: goc("franz"), brokerGroupTraffic: adoptionTraffic},
		// Share and streams groups (kinds.go): the cluster's coordinator
		// serves them, kproxy forwards; direct, through kproxy and
		// through a fleet of two.
		{name: "java-share", kind: "share", tools: []string{"env", "KPROXY_CACHE=" + cacheDir, "bash", filepath.Join(h.root, "interop/kafka.sh"), "tools"},
			brokerGroupTraffic: "share groups are the cluster's: kproxy forwards them"},
		{name: "go-franz-share", kind: "share", client: goc("franz"), brokerGroupTraffic: "share groups are the cluster's: kproxy forwards them"},
		// shareserve.go: share groups served by kproxy itself
		// (--share-groups serve) in front of a cluster without them;
		// directly the consumers are expected to fail.
		{name: "java-share-serve", kind: "share", shareServe: true, needs: shareGroups, tools: kafkaTools},
		{name: "java41-share-serve", kind: "share", shareServe: true, needs: shareGroups, kindsLib: "interop/java/target/lib"},
		{name: "franz-share-serve", kind: "share", shareServe: true, needs: shareGroups, client: goc("franz")},
		// sharefleet.go: the same served by a fleet of three, a
		// consumer and then the group's owner SIGKILLed.
		{name: "franz-share-serve-fleet", kind: "share", shareServe: true, shareFleet: true, needs: shareGroups, client: goc("franz")},
		{name: "java-share-serve-fleet", kind: "share", shareServe: true, shareFleet: true, needs: shareGroups},
		{name: "py-share-serve-fleet", kind: "share", shareServe: true, shareFleet: true, needs: shareGroups,
			client: append(append([]string(nil), py...), "--client", "confluent")},
		{name: "py-share-serve", kind: "share", shareServe: true, needs: shareGroups,
			client: append(append([]string(nil), py...), "--client", "confluent")},
		{name: "java-streams", kind: "streams", brokerGroupTraffic: "streams groups are the cluster's: kproxy forwards them"},
		// The same word count on the classic protocol, and Kafka
		// Connect's workers and sink group (connect.go): kproxy's
		// engine serves both, so the broker must see none of it.
		{name: "java-streams-classic", kind: "streams", groupProtocol: "classic"},
		{name: "kafka-connect", connect: true},
		// tools.go: Kafka's own verifiable clients and
		// kafka-consumer-groups, direct and through kproxy.
		{name: "kafka-verifiable", assignor: "cooperative-sticky", verifiable: true, tools: kafkaTools},
		{name: "kafka-verifiable-kip848", assignor: "server-uniform", needs: kip848, verifiable: true, tools: kafkaTools},
		{name: "kafka-consumer-groups-diff", client: goc("franz"), assignor: "range", groupsDiff: true, tools: kafkaTools},
		// security.go: alice, bob and carol with their ACLs over
		// SASL_SSL; only with -security (run.sh's security phase).
		{name: "java-sasl-acls", client: java, security: true},
		{name: "py-confluent-sasl-acls", client: append(append([]string(nil), py...), "--client", "confluent"), security: true},
	}
}

func run(h *harness, rowsFilter, pathsFlag, requestLogs, kproxyBin string, kproxyPort int, cacheDir string, multiBroker bool, security string) error {
	ctx := context.Background()
	began := time.Now()
	var err error
	if h.root, err = filepath.Abs(h.root); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	if h.logDir == "" {
		if h.logDir, err = os.MkdirTemp("", "kproxy-interop-"); err != nil {
			return fmt.Errorf("log dir: %w", err)
		}
	}
	if err := os.MkdirAll(h.logDir, 0o755); err != nil {
		return fmt.Errorf("log dir: %w", err)
	}
	// Absolute, because the go builds below run in other directories.
	if h.logDir, err = filepath.Abs(h.logDir); err != nil {
		return fmt.Errorf("log dir: %w", err)
	}
	var secOpts []kgo.Opt
	if security != "" {
		if secOpts, err = h.setupSecurity(ctx, security); err != nil {
			return err
		}
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.broker)}, secOpts...)...)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer cl.Close()
	h.cl, h.adm = cl, kadm.NewClient(cl)
	{
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := h.adm.ListBrokers(cctx)
		cancel()
		if err != nil {
			return fmt.Errorf("broker %s does not answer (is interop/kafka.sh start running?): %w", h.broker, err)
		}
	}
	if h.sec != nil {
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := h.securityACLs(actx)
		cancel()
		if err != nil {
			return err
		}
		if err := h.warmCoordinator(ctx); err != nil {
			return err
		}
	}

	goclient := filepath.Join(h.logDir, "goclient")
	if err := goBuild(filepath.Join(h.root, "interop"), goclient, "./goclient"); err != nil {
		return err
	}

	var filter *regexp.Regexp
	if rowsFilter != "" {
		if filter, err = regexp.Compile(rowsFilter); err != nil {
			return fmt.Errorf("-rows: %w", err)
		}
	}
	var paths []string
	for _, p := range strings.Split(pathsFlag, ",") {
		switch p = strings.TrimSpace(p); p {
		case "direct", "kproxy":
			paths = append(paths, p)
		case "":
		default:
			return fmt.Errorf("unknown path %q", p)
		}
	}

	var logs []*requestLog
	for _, p := range strings.Split(requestLogs, ",") {
		if p = strings.TrimSpace(p); p != "" {
			logs = append(logs, &requestLog{path: p})
		}
	}
	expectEngine := os.Getenv("KPROXY_INTEROP_EXPECT_ENGINE") == "1"

	var kp *kproxyProc
	var kpErr error
	startKproxy := func() {
		if kp != nil || kpErr != nil {
			return
		}
		kp, kpErr = startKproxyProc(ctx, h, kproxyBin, kproxyPort)
		if kpErr != nil {
			h.log.Error("kproxy could not start; every kproxy row fails", "err", kpErr)
		}
	}
	defer func() {
		if kp != nil {
			kp.stop()
		}
	}()

	brokers, err := h.clusterSize(ctx)
	if err != nil {
		return fmt.Errorf("cluster size: %w", err)
	}
	brokerSummary, err := h.checkBrokerFeatures(ctx)
	if err != nil {
		return err
	}
	groupsTopic, persisted := h.groupsTopic()
	groupRecords, groupRows := 0, 0
	var killPrior *brokerOutage            // the direct path's outcome of the broker-kill row
	adoptPrior := map[string]*adoption{}   // the direct path's outcome of each adoption row
	kindPrior := map[string]*kindOutcome{} // the direct path's outcome of each kinds row
	var connectPrior *connectOutcome       // the direct path's outcome of the Connect row
	var skipped []string
	var results []result
	directBlind := false // set when a direct row shows the request log counter sees nothing

	// The direct path's outcomes of the tools.go rows.
	verifPrior := map[string]*verifOutcome{}
	var diffPrior *groupsDiffOutcome
	stamp := time.Now().Unix()
	for _, l := range logs {
		l.late = fmt.Sprintf("-direct-%d", stamp) // the direct rows' groups and topics
	}
	for _, r := range h.rows(cacheDir, goclient) {
		if filter != nil && !filter.MatchString(r.name) || !h.inSubset(r.name) {
			continue
		}
		if multiBroker && !r.threeBrokers() && !r.apiVersions {
			continue // the ApiVersions check runs on both clusters: every broker's port
		}
		if r.security != (h.sec != nil) {
			continue // the security rows run against the secured broker, alone
		}
		if r.threeBrokers() && !multiBroker && brokers < 3 {
			skipped = append(skipped, r.name)
			continue
		}
		for _, path := range paths {
			name := r.name + "/" + path
			bootstrap := h.broker
			if (r.fleet || r.apiVersions || r.fault != "") && path != "kproxy" {
				continue // compared with the direct path inside the row, or none exists
			}
			if path == "kproxy" && !r.fleet && !r.adoption && r.fault == "" {
				startKproxy()
				if kpErr != nil {
					results = append(results, result{row: r.name, path: path, rebalances: "-", settle: "-", broker: "-",
						reason: "kproxy unavailable (see KPROXY START FAILED below)"})
					continue
				}
				bootstrap = kp.addr
			}
			h.log.Info("row start", "row", name)
			s := &scenario{
				h: h, r: r, path: path, bootstrap: bootstrap,
				topic: fmt.Sprintf("interop-%s-%s-%d", r.name, path, stamp),
				group: fmt.Sprintf("interop-%s-%s-%d", r.name, path, stamp),
				dir:   filepath.Join(h.logDir, r.name+"-"+path),
				seen:  map[string]int{},
			}
			if r.txn {
				s.outTopic = s.topic + "-out"
			}
			// Counted on both paths: the direct rows show that the counter
			// sees group traffic, the kproxy rows what reached the broker.
			var before, beforeLate map[int]int
			var countErr error
			if len(logs) > 0 {
				before, beforeLate, countErr = countAll(logs)
			}
			var res result
			if r.fleet {
				res = s.runFleet(ctx, kproxyBin, kproxyPort)
				res.notes = append(res.notes, "runs on the kproxy path only: a fleet of kproxies has no direct counterpart")
			} else if r.fault != "" {
				res = s.runFaultRow(ctx, kproxyBin, kproxyPort, r.fault, r.faultFor)
				res.notes = append(res.notes, "runs on the kproxy path only and compares it with a direct member under the same fault itself; settle column = recovery after heal, kproxy/direct")
			} else if r.brokerKill {
				var o *brokerOutage
				res, o = s.runBrokerKill(ctx, killPrior)
				if path == "direct" {
					killPrior = o
				}
			} else if r.security {
				res = s.runSecurity(ctx)
			} else if r.apiVersions {
				res = s.runApiVersions(ctx)
				res.notes = append(res.notes, "runs on the kproxy path only and compares it with the direct path itself")
			} else if r.migration {
				res = s.runMigration(ctx)
			} else if r.anchorAdmin {
				res = s.runAnchorAdmin(ctx)
			} else if r.kind != "" {
				var o *kindOutcome
				res, o = s.runKind(ctx, kproxyBin, kproxyPort, kindPrior[r.name])
				if path == "direct" {
					kindPrior[r.name] = o
				}
			} else if r.connect {
				var o *connectOutcome
				res, o = s.runConnect(ctx, kproxyPort, connectPrior)
				if path == "direct" {
					connectPrior = o
				}
			} else if r.verifiable {
				var o *verifOutcome
				res, o = s.runVerifiable(ctx, verifPrior[r.name])
				if path == "direct" {
					verifPrior[r.name] = o
				}
			} else if r.groupsDiff {
				var o *groupsDiffOutcome
				res, o = s.runGroupsDiff(ctx, diffPrior)
				if path == "direct" {
					diffPrior = o
				}
			} else if r.adoption {
				var o *adoption
				res, o = s.runAdoption(ctx, kproxyBin, kproxyPort, adoptPrior[r.name])
				if path == "direct" {
					adoptPrior[r.name] = o
				}
			} else {
				res = s.run(ctx)
				if path == "kproxy" && res.pass && persisted {
					groupRows++
					if err := h.checkGroupRecord(ctx, groupsTopic, s.group); err != nil {
						res.pass = false
						res.reason = fmt.Sprintf("group metadata not persisted: %v", err)
					} else {
						groupRecords++
					}
				}
			}
			res = applyExpectation(res, h.expectedLack(r, path))
			if path == "kproxy" && !r.fleet && r.fault == "" && kp != nil && !kp.alive() {
				res.pass = false
				res.reason = joinReason(res.reason, "kproxy process died: "+tail(kp.logPath, 300))
			}
			if len(logs) > 0 {
				var after, afterLate map[int]int
				if countErr == nil {
					time.Sleep(500 * time.Millisecond) // the broker logs a request after answering it
					after, afterLate, countErr = countAll(logs)
				}
				if path == "kproxy" && countErr == nil {
					// What the direct rows' clients sent meanwhile is not
					// this row's (requestLog.late).
					late := 0
					for _, k := range []int{11, 14, 12, 68, 76, 88} {
						late += afterLate[k] - beforeLate[k]
					}
					for k := range after {
						after[k] -= afterLate[k]
					}
					for k := range before {
						before[k] -= beforeLate[k]
					}
					if late > 0 {
						res.notes = append(res.notes, fmt.Sprintf("the broker answered %d JoinGroup/SyncGroup/heartbeat requests of a direct row's group during this row (that row's clients, late); not counted as this row's", late))
					}
				}
				switch {
				case countErr != nil:
					res.broker = "error"
					res.notes = append(res.notes, "broker request log unreadable: "+countErr.Error())
					if path == "kproxy" && expectEngine {
						res.pass = false
						res.reason = joinReason(res.reason, "cannot prove the broker saw no group traffic: "+countErr.Error())
					}
				default:
					// HB counts classic Heartbeats, KIP-848
					// ConsumerGroupHeartbeats (key 68), and the share
					// and streams groups' heartbeats (76, 88) alike.
					jg, sg := after[11]-before[11], after[14]-before[14]
					hb := 0
					for _, k := range []int{12, 68, 76, 88} {
						hb += after[k] - before[k]
					}
					res.broker = fmt.Sprintf("%d/%d/%d", jg, sg, hb)
					if path == "direct" && res.pass && !res.xfail && jg+hb == 0 {
						// A passing direct row always joins; zero means the counter is blind.
						directBlind = true
						res.notes = append(res.notes, "the broker request log shows no JoinGroup for a direct row: the counter cannot see group traffic")
					}
					if path == "kproxy" && r.brokerGroupTraffic != "" && jg+sg+hb > 0 {
						res.notes = append(res.notes, fmt.Sprintf("broker group traffic expected on the kproxy path, not held to KPROXY_INTEROP_EXPECT_ENGINE: %s", r.brokerGroupTraffic))
					} else if path == "kproxy" && expectEngine && jg+sg+hb > 0 {
						res.pass = false
						res.reason = joinReason(res.reason, fmt.Sprintf("broker saw group traffic on the kproxy path: JoinGroup=%d SyncGroup=%d Heartbeat+ConsumerGroupHeartbeat=%d", jg, sg, hb))
					}
				}
			}
			h.log.Info("row done", "row", name, "pass", res.pass, "elapsed", res.elapsed.Round(100*time.Millisecond), "reason", res.reason)
			results = append(results, res)
		}
	}
	fmt.Printf("\n%s\n", brokerSummary)
	failed := printTable(os.Stdout, results, len(logs) > 0, expectEngine)
	if groupRows > 0 {
		fmt.Printf("kproxy rows whose group has a committed transactional record in %s (read_committed from the broker): %d of %d\n", groupsTopic, groupRecords, groupRows)
	}
	for _, name := range skipped {
		fmt.Printf("not run here: %s needs a cluster of 3 brokers; run.sh runs it against one of its own after this run (or: KPROXY_INTEROP_BROKERS=3)\n", name)
	}
	if kpErr != nil {
		fmt.Printf("KPROXY START FAILED: %v\n", kpErr)
	}
	if directBlind && expectEngine {
		fmt.Println("FAIL: the broker request log did not show the group traffic of a direct row, so 0/0/0 on kproxy rows proves nothing")
		failed++
	}
	fmt.Printf("logs: %s\ntotal: %s\n", h.logDir, time.Since(began).Round(time.Second))
	fmt.Printf("interop: %d passed, %d failed\n", len(results)-failed, failed)
	if failed > 0 {
		return fmt.Errorf("%d of %d rows failed", failed, len(results))
	}
	if len(results) == 0 && len(skipped) == 0 {
		return fmt.Errorf("no row matched")
	}
	return nil
}

// joinReason appends a failure reason to an existing one.
func joinReason(old, add string) string {
	if old == "" {
		return add
	}
	return old + "; " + add
}

// goBuild builds package pkg of the module in dir into out: kproxy from
// the repository root, the Go client from the interop module.
func goBuild(dir, out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, strings.TrimSpace(string(b)))
	}
	return nil
}

// printTable writes the results table and returns the number of failed rows.
func printTable(w *os.File, rs []result, haveLog, expectEngine bool) int {
	failed := 0
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%-18s %-7s %-5s %8s %10s %-22s %-12s %8s\n", "scenario", "path", "pass", "records", "rebalances", "settle(init/leave/join)", "broker JG/SG/HB", "time")
	fmt.Fprintln(w, strings.Repeat("-", 98))
	xfails := 0
	for _, r := range rs {
		pass := "PASS"
		if r.xfail {
			pass = "XFAIL" // failed as expected (see its note)
		}
		if !r.pass {
			pass = "FAIL"
			failed++
		}
		fmt.Fprintf(w, "%-18s %-7s %-5s %8d %10s %-23s %-15s %7.1fs\n", r.row, r.path, pass, r.records, r.rebalances, r.settle, r.broker, r.elapsed.Seconds())
	}
	fmt.Fprintln(w)
	for _, r := range rs {
		if r.xfail {
			xfails++
		}
		if !r.pass {
			fmt.Fprintf(w, "FAIL %s/%s: %s\n", r.row, r.path, r.reason)
		}
		for _, n := range r.notes {
			fmt.Fprintf(w, "note %s/%s: %s\n", r.row, r.path, n)
		}
	}
	if xfails > 0 {
		fmt.Fprintf(w, "XFAIL = failed as this broker version is expected to make it fail (the note says why); counted as passing\n")
	}
	if haveLog {
		mode := "informational (set KPROXY_INTEROP_EXPECT_ENGINE=1 to require 0/0/0)"
		if expectEngine {
			mode = "asserted: must be 0/0/0"
		}
		fmt.Fprintf(w, "broker JG/SG/HB = JoinGroup/SyncGroup/Heartbeat (classic and KIP-848) requests the broker logged during each row; on kproxy rows %s\n", mode)
	} else {
		fmt.Fprintln(w, "broker JG/SG/HB not measured (no -request-log given)")
	}
	return failed
}

// inSubset reports whether the row named name matches -subset.
func (h *harness) inSubset(name string) bool { return h.subset == nil || h.subset.MatchString(name) }
