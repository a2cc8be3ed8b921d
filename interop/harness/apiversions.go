package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The ApiVersions check (issue 12): franz-go opens every connection with
// ApiVersions at kmsg's newest version (v5; for a broker it learned from
// metadata it also names the cluster and node, KIP-1242). Kafka 4.1 speaks
// v0-v4 (3.6 v0-v3), so it answers UNSUPPORTED_VERSION in a v0 body that
// lists only the ApiVersions key, and franz-go retries at the version that
// key names; Kafka 4.4 speaks v5 and answers at once. The check replays
// that exchange byte for byte on raw connections, to the bootstrap address
// and to every broker, directly and through kproxy, and requires: the
// error answers are the same bytes; the retry goes out at the same
// version; the successful answers (the retry's, or the first when the
// broker speaks v5) agree in every field and in every API key kproxy does
// not serve or cap itself.

// Keys kproxy treats specially (its codec.APIs table, cmd/kproxy's
// routing). Directly and through kproxy they may differ as said here;
// every other key must be advertised identically.
var (
	// Served by kproxy's coordinator engine: advertised at the engine's
	// versions whatever the broker's are.
	apiEngineKeys = map[int16]bool{8: true, 9: true, 10: true, 11: true, 12: true, 13: true, 14: true,
		15: true, 16: true, 28: true, 42: true, 47: true, 68: true, 69: true}
	// Capped: kproxy advertises at most the broker's maximum, maybe less
	// (ShareFetch and ShareAcknowledge at what kmsg parses: their leader
	// endpoints are rewritten). The coordinator keys of share and
	// streams groups, which kproxy forwards, are plain keys: advertised
	// as the broker does.
	apiCappedKeys = map[int16]bool{0: true, 1: true, 3: true, 18: true, 55: true, 60: true, 78: true, 79: true}
	// Minimum raised, maximum the broker's: SaslHandshake v0 is refused
	// (raw SASL tokens without Kafka framing follow it; clients since
	// Kafka 1.0 send v1, KIP-152), so kproxy advertises v1 as the lowest.
	apiRaisedMinKeys = map[int16]int16{17: 1}
)

// apiExchange is what one connection's opening looked like.
type apiExchange struct {
	first        []byte // the first answer, correlation id and body
	firstVersion int16
	retry        []byte // the retried answer, if the first was UNSUPPORTED_VERSION
	retryVersion int16  // -1 when there was no retry
}

// openLikeFranz does franz-go's connection opening on a raw connection to
// addr: ApiVersions at kmsg's newest version, and on UNSUPPORTED_VERSION
// once more at the version the answer names. nodeID < 0 is a seed (no
// cluster and node named).
func openLikeFranz(addr string, nodeID int32, clusterID *string) (apiExchange, error) {
	ex := apiExchange{retryVersion: -1}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return ex, fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("kgo"))
	send := func(version int16, corr int32) ([]byte, error) {
		req := kmsg.NewPtrApiVersionsRequest()
		req.Version = version
		req.ClientSoftwareName = "kgo"
		req.ClientSoftwareVersion = "1.22.3"
		if version >= 5 && nodeID >= 0 {
			req.ClusterID, req.NodeID = clusterID, nodeID
		}
		if _, err := conn.Write(f.AppendRequest(nil, req, corr)); err != nil {
			return nil, fmt.Errorf("write ApiVersions v%d to %s: %w", version, addr, err)
		}
		var size [4]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return nil, fmt.Errorf("read ApiVersions v%d answer from %s: %w", version, addr, err)
		}
		n := int32(binary.BigEndian.Uint32(size[:]))
		if n < 6 || n > 1<<20 {
			return nil, fmt.Errorf("ApiVersions v%d answer from %s has size %d", version, addr, n)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(conn, b); err != nil {
			return nil, fmt.Errorf("read ApiVersions v%d answer from %s: %w", version, addr, err)
		}
		if got := int32(binary.BigEndian.Uint32(b)); got != corr {
			return nil, fmt.Errorf("ApiVersions answer from %s has correlation id %d, want %d", addr, got, corr)
		}
		return b, nil // the ApiVersions response header is v0 in every version: the id, then the body
	}
	ex.firstVersion = kmsg.NewPtrApiVersionsRequest().MaxVersion()
	if ex.first, err = send(ex.firstVersion, 1); err != nil {
		return ex, err
	}
	body := ex.first[4:]
	if int16(binary.BigEndian.Uint16(body)) != kerr.UnsupportedVersion.Code {
		return ex, nil
	}
	v0 := kmsg.NewPtrApiVersionsResponse()
	v0.Version = 0
	if err := v0.ReadFrom(body); err != nil {
		return ex, fmt.Errorf("decoding the UNSUPPORTED_VERSION answer of %s as v0: %w", addr, err)
	}
	if len(v0.ApiKeys) != 1 || v0.ApiKeys[0].ApiKey != 18 {
		return ex, fmt.Errorf("the UNSUPPORTED_VERSION answer of %s lists %d keys, not just ApiVersions (KIP-511)", addr, len(v0.ApiKeys))
	}
	ex.retryVersion = v0.ApiKeys[0].MaxVersion
	ex.retry, err = send(ex.retryVersion, 2)
	return ex, err
}

// brokersOf returns the brokers' addresses by node id and the cluster id,
// from metadata through bootstrap.
func brokersOf(ctx context.Context, bootstrap string) (map[int32]string, *string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap))
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(cctx, cl)
	if err != nil {
		return nil, nil, fmt.Errorf("metadata via %s: %w", bootstrap, err)
	}
	out := map[int32]string{}
	for _, b := range resp.Brokers {
		out[b.NodeID] = net.JoinHostPort(b.Host, fmt.Sprint(b.Port))
	}
	return out, resp.ClusterID, nil
}

// compareOpenings compares one connection's opening directly (d) and
// through kproxy (k) and returns what differs beyond what kproxy is meant to
// change, and a summary of the differences that are meant. A broker that
// speaks the first version (Kafka 4.4 speaks v5) answers it at once: then
// kproxy must too, and the two answers are compared as retries are.
func compareOpenings(d, k apiExchange) (problems []string, meant string) {
	if d.retryVersion < 0 && k.retryVersion < 0 {
		return compareAnswers("first answer", d.firstVersion, d.first, k.first)
	}
	if !bytes.Equal(d.first, k.first) {
		problems = append(problems, fmt.Sprintf("first answer (ApiVersions v%d) differs: direct %d bytes %x, kproxy %d bytes %x",
			d.firstVersion, len(d.first), clip(d.first), len(k.first), clip(k.first)))
	}
	if d.retryVersion != k.retryVersion {
		problems = append(problems, fmt.Sprintf("retried at v%d directly, v%d through kproxy", d.retryVersion, k.retryVersion))
		return problems, ""
	}
	ps, meant := compareAnswers("retry", d.retryVersion, d.retry, k.retry)
	return append(problems, ps...), meant
}

// compareAnswers compares two successful ApiVersions answers at version
// (correlation id, then body), direct d and through kproxy k: every field
// alike, and every key alike except those kproxy serves, caps or refuses.
func compareAnswers(what string, version int16, d, k []byte) (problems []string, meant string) {
	dr, kr := kmsg.NewPtrApiVersionsResponse(), kmsg.NewPtrApiVersionsResponse()
	dr.Version, kr.Version = version, version
	if err := dr.ReadFrom(d[4:]); err != nil {
		return []string{"decoding the direct " + what + ": " + err.Error()}, ""
	}
	if err := kr.ReadFrom(k[4:]); err != nil {
		return []string{"decoding the kproxy " + what + ": " + err.Error()}, ""
	}
	if dr.ErrorCode != 0 || kr.ErrorCode != 0 {
		problems = append(problems, fmt.Sprintf("%s answered with error %d directly, %d through kproxy", what, dr.ErrorCode, kr.ErrorCode))
	}
	// FinalizedFeaturesEpoch is the offset of the broker's metadata image
	// in KRaft, which moves every metadata.max.idle.interval.ms (no-op
	// records): only whether the answer has one must agree.
	switch {
	case dr.ThrottleMillis != kr.ThrottleMillis:
		problems = append(problems, fmt.Sprintf("%s: throttle %d ms directly, %d through kproxy", what, dr.ThrottleMillis, kr.ThrottleMillis))
	case (dr.FinalizedFeaturesEpoch < 0) != (kr.FinalizedFeaturesEpoch < 0):
		problems = append(problems, fmt.Sprintf("finalized features epoch %d directly, %d through kproxy", dr.FinalizedFeaturesEpoch, kr.FinalizedFeaturesEpoch))
	case dr.ZkMigrationReady != kr.ZkMigrationReady:
		problems = append(problems, "ZkMigrationReady differs")
	case !reflect.DeepEqual(dr.SupportedFeatures, kr.SupportedFeatures):
		problems = append(problems, fmt.Sprintf("supported features %+v directly, %+v through kproxy", dr.SupportedFeatures, kr.SupportedFeatures))
	case !reflect.DeepEqual(dr.FinalizedFeatures, kr.FinalizedFeatures):
		problems = append(problems, fmt.Sprintf("finalized features %+v directly, %+v through kproxy", dr.FinalizedFeatures, kr.FinalizedFeatures))
	}
	dk, kk := map[int16]kmsg.ApiVersionsResponseApiKey{}, map[int16]kmsg.ApiVersionsResponseApiKey{}
	for _, a := range dr.ApiKeys {
		dk[a.ApiKey] = a
	}
	for _, a := range kr.ApiKeys {
		kk[a.ApiKey] = a
	}
	var engine, capped []string
	same := 0
	for key, a := range dk {
		b, ok := kk[key]
		known := kmsg.RequestForKey(key) != nil
		switch {
		case !known:
		case apiEngineKeys[key]:
			if !ok {
				problems = append(problems, fmt.Sprintf("group key %d missing through kproxy", key))
			} else if !sameRange(a, b) {
				engine = append(engine, fmt.Sprintf("%d:v%d-%d→v%d-%d", key, a.MinVersion, a.MaxVersion, b.MinVersion, b.MaxVersion))
			}
		case apiRaisedMinKeys[key] > 0:
			if want := max(a.MinVersion, apiRaisedMinKeys[key]); !ok || b.MinVersion != want || b.MaxVersion != a.MaxVersion {
				problems = append(problems, fmt.Sprintf("key %d: v%d-%d directly, %s through kproxy (want v%d-%d)", key, a.MinVersion, a.MaxVersion, rangeOf(b, ok), want, a.MaxVersion))
			} else {
				same++
			}
		case apiCappedKeys[key]:
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("key %d missing through kproxy", key))
			case b.MinVersion != a.MinVersion || b.MaxVersion > a.MaxVersion:
				problems = append(problems, fmt.Sprintf("key %d: v%d-%d directly, v%d-%d through kproxy (may only be capped)", key, a.MinVersion, a.MaxVersion, b.MinVersion, b.MaxVersion))
			case b.MaxVersion < a.MaxVersion:
				capped = append(capped, fmt.Sprintf("%d:v%d→v%d", key, a.MaxVersion, b.MaxVersion))
			default:
				same++
			}
		default:
			if !ok {
				problems = append(problems, fmt.Sprintf("key %d (v%d-%d) missing through kproxy", key, a.MinVersion, a.MaxVersion))
			} else if !sameRange(a, b) {
				problems = append(problems, fmt.Sprintf("key %d: v%d-%d directly, v%d-%d through kproxy", key, a.MinVersion, a.MaxVersion, b.MinVersion, b.MaxVersion))
			} else {
				same++
			}
		}
	}
	for key := range kk {
		if _, ok := dk[key]; !ok && !apiEngineKeys[key] {
			problems = append(problems, fmt.Sprintf("key %d advertised through kproxy only", key))
		}
	}
	sort.Strings(engine)
	sort.Strings(capped)
	meant = fmt.Sprintf("%s v%d: %d keys directly, %d through kproxy, %d identical; capped %v; group keys at the engine's versions %v",
		what, version, len(dk), len(kk), same, capped, engine)
	return problems, meant
}

// sameRange reports whether two advertised keys have the same versions.
func sameRange(a, b kmsg.ApiVersionsResponseApiKey) bool {
	return a.ApiKey == b.ApiKey && a.MinVersion == b.MinVersion && a.MaxVersion == b.MaxVersion
}

// clip returns at most 48 bytes of b, for messages.
func clip(b []byte) []byte {
	if len(b) > 48 {
		return b[:48]
	}
	return b
}

// runApiVersions runs the check against the bootstrap address and every
// broker, directly (s.h.broker) and through kproxy (s.bootstrap).
func (s *scenario) runApiVersions(ctx context.Context) (res result) {
	start := time.Now()
	res = result{row: s.r.name, path: s.path, rebalances: "-", settle: "-", broker: "-"}
	defer func() { res.elapsed = time.Since(start) }()
	fail := func(format string, args ...any) result {
		res.pass = false
		res.reason = fmt.Sprintf(format, args...)
		return res
	}
	direct, clusterID, err := brokersOf(ctx, s.h.broker)
	if err != nil {
		return fail("%v", err)
	}
	proxied, proxiedCluster, err := brokersOf(ctx, s.bootstrap)
	if err != nil {
		return fail("%v", err)
	}
	if fmt.Sprint(deref(clusterID)) != fmt.Sprint(deref(proxiedCluster)) {
		return fail("cluster id %q directly, %q through kproxy", deref(clusterID), deref(proxiedCluster))
	}
	type target struct {
		name        string
		node        int32
		direct, via string
	}
	targets := []target{{"bootstrap", -1, s.h.broker, s.bootstrap}}
	var ids []int32
	for id := range direct {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		via, ok := proxied[id]
		if !ok {
			return fail("broker %d missing from metadata through kproxy", id)
		}
		targets = append(targets, target{fmt.Sprintf("broker %d", id), id, direct[id], via})
	}
	if len(proxied) != len(direct) {
		return fail("%d brokers directly, %d through kproxy", len(direct), len(proxied))
	}
	var problems []string
	for _, t := range targets {
		d, err := openLikeFranz(t.direct, t.node, clusterID)
		if err != nil {
			return fail("%s directly: %v", t.name, err)
		}
		k, err := openLikeFranz(t.via, t.node, clusterID)
		if err != nil {
			return fail("%s through kproxy: %v", t.name, err)
		}
		ps, meant := compareOpenings(d, k)
		for _, p := range ps {
			problems = append(problems, t.name+": "+p)
		}
		first := "first answer ApiVersions v" + fmt.Sprint(d.firstVersion)
		if d.retryVersion >= 0 {
			first += fmt.Sprintf(" → UNSUPPORTED_VERSION, %d bytes, identical=%v", len(d.first), bytes.Equal(d.first, k.first))
		}
		res.notes = append(res.notes, fmt.Sprintf("%s (%s via %s): %s; %s", t.name, t.direct, t.via, first, meant))
	}
	if len(problems) > 0 {
		return fail("franz-go's connection opening differs through kproxy: %s", strings.Join(problems, "; "))
	}
	res.pass = true
	return res
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// rangeOf prints an advertised key's versions, or "missing".
func rangeOf(k kmsg.ApiVersionsResponseApiKey, ok bool) string {
	if !ok {
		return "missing"
	}
	return fmt.Sprintf("v%d-%d", k.MinVersion, k.MaxVersion)
}
