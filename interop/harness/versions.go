package main

// Broker versions (issue 14). The tier runs against more than one Kafka
// release (run.sh: 4.1.1 in full, then subsets against 3.6.2 and 4.4.0).
// Some rows need a broker feature that older releases lack; directly
// against such a broker their failure is the expected outcome (printed
// XFAIL, counted as passing), while through kproxy, which serves the
// feature itself, they must pass. A row expected to fail that passes
// fails: it did not exercise what it claims.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// feature is a broker capability some rows need.
type feature struct {
	name  string // as printed in the report
	since string // the first Kafka release that offers it by default
	// key and minVersion: the ApiVersions entry a broker advertises when
	// it has the feature.
	key, minVersion int16
}

// kip848 is the consumer group protocol: ConsumerGroupHeartbeat v1 is the
// version franz-go requires and Kafka 4.0 made generally available (3.6
// and 3.7 had an early-access v0 behind a flag, not enabled here).
var kip848 = &feature{name: "KIP-848 (ConsumerGroupHeartbeat v1)", since: "4.0.0", key: 68, minVersion: 1}

// features lists every feature a row may need, for the check that the
// per-version table agrees with what the broker advertises.
var features = []*feature{kip848}

// versionLess reports whether dotted version a is older than b. Parts
// that are not numbers compare as 0.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// brokerHas reports whether the broker version the run was given offers f.
func (h *harness) brokerHas(f *feature) bool {
	return h.kafkaVersion == "" || !versionLess(h.kafkaVersion, f.since)
}

// expectedLack returns why the row is expected to fail on path, or "" if
// it is expected to pass: only the direct path lacks what the broker
// lacks, since kproxy serves the group protocols itself.
func (h *harness) expectedLack(r row, path string) string {
	if r.needs == nil || path != "direct" || h.brokerHas(r.needs) {
		return ""
	}
	return fmt.Sprintf("the broker lacks it: Kafka %s has no %s (since %s)", h.kafkaVersion, r.needs.name, r.needs.since)
}

// applyExpectation turns a row's outcome into its verdict under the
// expectation lack (see expectedLack).
func applyExpectation(res result, lack string) result {
	if lack == "" {
		return res
	}
	if res.pass {
		res.pass = false
		res.reason = joinReason(res.reason, "expected to fail because "+lack+", but it passed: the row did not exercise what it claims")
		return res
	}
	res.pass, res.xfail = true, true
	res.notes = append([]string{"expected failure, " + lack + "; it failed with: " + res.reason}, res.notes...)
	res.reason = ""
	return res
}

// checkBrokerFeatures asks the broker for its ApiVersions and fails when
// the per-version expectations (feature.since) disagree with what it
// advertises: the expectations would then be wrong for this broker.
// It returns a summary for the report.
func (h *harness) checkBrokerFeatures(ctx context.Context) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName, req.ClientSoftwareVersion = "kproxy-interop", "1"
	resp, err := req.RequestWith(cctx, h.cl)
	if err != nil {
		return "", fmt.Errorf("ApiVersions from the broker: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return "", fmt.Errorf("ApiVersions from the broker: %w", err)
	}
	maxV := map[int16]int16{}
	for _, k := range resp.ApiKeys {
		maxV[k.ApiKey] = k.MaxVersion
	}
	version := h.kafkaVersion
	if version == "" {
		version = "(version not given)"
	}
	var has []string
	for _, f := range features {
		v, ok := maxV[f.key]
		advertised := ok && v >= f.minVersion
		if h.kafkaVersion != "" && advertised != h.brokerHas(f) {
			return "", fmt.Errorf("broker Kafka %s %s %s, but the per-version expectation (since %s) says the opposite; fix -kafka-version or the feature table",
				h.kafkaVersion, map[bool]string{true: "advertises", false: "does not advertise"}[advertised], f.name, f.since)
		}
		has = append(has, fmt.Sprintf("%s: %s", f.name, map[bool]string{true: "yes", false: "no"}[advertised]))
	}
	return fmt.Sprintf("broker: Kafka %s, %d API keys, %s", version, len(resp.ApiKeys), strings.Join(has, ", ")), nil
}

// checkGroupRecord reads the groups topic of the tier's kproxy from the
// broker with read_committed and requires a record of group (key = group
// id) with a value, written inside a transaction: kproxy's distributed
// mode persists group metadata through the partition's transactional
// producer, so a committed transactional record proves the broker's
// transactions work for it.
func (h *harness) checkGroupRecord(ctx context.Context, topic, group string) error {
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	td, err := h.adm.ListTopics(cctx, topic)
	if err != nil {
		return fmt.Errorf("metadata of %s: %w", topic, err)
	}
	t, ok := td[topic]
	if !ok || t.Err != nil || len(t.Partitions) == 0 {
		return fmt.Errorf("%s does not exist on the broker (err %v)", topic, t.Err)
	}
	p := groupPartition(group, len(t.Partitions))
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.broker),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return fmt.Errorf("reader: %w", err)
	}
	defer cl.Close()
	seen, plain := 0, 0
	for cctx.Err() == nil {
		fs := cl.PollFetches(cctx)
		found := false
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) != group || r.Value == nil {
				return
			}
			seen++
			if r.Attrs.IsTransactional() {
				found = true
			} else {
				plain++
			}
		})
		if found {
			return nil
		}
	}
	if seen > 0 {
		return fmt.Errorf("%s/%d holds %d records of the group, none of them transactional", topic, p, plain)
	}
	return fmt.Errorf("no committed record of the group in %s/%d within 20s", topic, p)
}

// groupsTopic returns the groups topic of the tier's kproxy and whether
// it runs in distributed mode (the default), the mode that writes it
// transactionally: from -kproxy-args' --groups and --fleet-name.
func (h *harness) groupsTopic() (string, bool) {
	mode, name := "distributed", ""
	for i, a := range h.kproxyArgs {
		for flag, dst := range map[string]*string{"--groups": &mode, "--fleet-name": &name} {
			if v, ok := strings.CutPrefix(a, flag+"="); ok {
				*dst = v
			} else if a == flag && i+1 < len(h.kproxyArgs) {
				*dst = h.kproxyArgs[i+1]
			}
		}
	}
	topic := "__kproxy_groups"
	if name != "" {
		topic += "." + name
	}
	return topic, mode == "distributed"
}
