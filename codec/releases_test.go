package codec

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// The ApiVersions answers of real brokers (issue 14), written by the
// interop tier's brokers (interop/kafka.sh start --version V) and kept as
// text in testdata/apiversions/kafka-V.txt: one "key min max name" line
// per key.
var releases = []string{"3.6.2", "4.1.1", "4.4.0"}

// readRelease loads a release's ApiVersions answer.
func readRelease(t *testing.T, version string) *kmsg.ApiVersionsResponse {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "apiversions", "kafka-"+version+".txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	resp := kmsg.NewPtrApiVersionsResponse()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var nums [3]int16
		fields := strings.Fields(line)
		if len(fields) < 3 {
			t.Fatalf("%s: bad line %q", version, line)
		}
		for i := range nums {
			n, err := strconv.ParseInt(fields[i], 10, 16)
			if err != nil {
				t.Fatalf("%s: bad line %q: %v", version, line, err)
			}
			nums[i] = int16(n)
		}
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = nums[0], nums[1], nums[2]
		resp.ApiKeys = append(resp.ApiKeys, k)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return resp
}

// advertised maps key to [min, max] of an ApiVersions answer.
func advertised(resp *kmsg.ApiVersionsResponse) map[int16][2]int16 {
	m := map[int16][2]int16{}
	for _, k := range resp.ApiKeys {
		m[k.ApiKey] = [2]int16{k.MinVersion, k.MaxVersion}
	}
	return m
}

// checkMerged asserts what kproxy may advertise after MergeApiVersions:
// only keys kmsg knows; for every key it decodes (Rewrite or Local rows)
// nothing above what kmsg parses; no version that RouteFor refuses, so a
// client that believes the answer is never disconnected; and, with groups
// local, every group key at the engine's versions (capped at the
// broker's for the keys kproxy may forward, when the broker has them and
// speaks KIP-848) and
// FindCoordinator (forwarded for transactions) at most at the broker's.
func checkMerged(t *testing.T, name string, broker, merged *kmsg.ApiVersionsResponse, groupsLocal bool) {
	t.Helper()
	got := advertised(merged)
	for key, mm := range got {
		if MaxVersion(key) < 0 {
			t.Errorf("%s: key %d, unknown to kmsg, advertised", name, key)
			continue
		}
		if mm[0] > mm[1] {
			t.Errorf("%s: %s advertised with min %d > max %d", name, kmsg.NameForKey(key), mm[0], mm[1])
		}
		if a, ok := row(key); ok && (a.route == Rewrite || a.route == Local) && mm[1] > MaxVersion(key) {
			t.Errorf("%s: %s advertised up to v%d, kproxy decodes it and kmsg parses up to v%d", name, kmsg.NameForKey(key), mm[1], MaxVersion(key))
		}
		for v := mm[0]; v <= mm[1]; v++ {
			if d := RouteFor(key, v, groupsLocal); d.Route == Refuse {
				t.Errorf("%s: %s v%d advertised but refused: %v", name, kmsg.NameForKey(key), v, d.Refusal(key, v))
			}
		}
	}
	if groupsLocal {
		for _, key := range GroupKeys() {
			want := [2]int16{0, MaxVersion(key)}
			_, kip848 := advertised(broker)[KeyConsumerGroupHeartbeat]
			if b, ok := advertised(broker)[key]; ok && kip848 && Forwardable(key) {
				want[1] = min(want[1], b[1])
			}
			if got[key] != want {
				t.Errorf("%s: group key %s advertised as %v, want %v", name, kmsg.NameForKey(key), got[key], want)
			}
		}
		want := MaxVersion(KeyFindCoordinator)
		if b, ok := advertised(broker)[KeyFindCoordinator]; ok {
			want = min(want, b[1])
		}
		if got[KeyFindCoordinator][1] != want {
			t.Errorf("%s: FindCoordinator advertised as %v, want up to v%d", name, got[KeyFindCoordinator], want)
		}
	}
}

// TestMergeApiVersionsOfReleases merges each real broker's answer and
// checks what kproxy advertises in front of it.
func TestMergeApiVersionsOfReleases(t *testing.T) {
	for _, version := range releases {
		for _, groupsLocal := range []bool{true, false} {
			name := fmt.Sprintf("Kafka %s, groups local %v", version, groupsLocal)
			raw := readRelease(t, version)
			broker := advertised(raw)
			merged := readRelease(t, version)
			MergeApiVersions(merged, groupsLocal)
			checkMerged(t, name, raw, merged, groupsLocal)
			got := advertised(merged)
			// Keys kproxy neither decodes, caps nor refuses pass as the
			// broker advertised them.
			for key, mm := range broker {
				if _, special := row(key); special {
					continue
				}
				if got[key] != mm {
					t.Errorf("%s: plain key %s advertised as %v, the broker's %v", name, kmsg.NameForKey(key), got[key], mm)
				}
			}
			if fetch := got[KeyFetch]; fetch[1] != min(15, broker[KeyFetch][1]) {
				t.Errorf("%s: Fetch advertised up to v%d, want v15 or the broker's lower max", name, fetch[1])
			}
			// Share and streams groups are the cluster's: advertised
			// exactly as the broker does, in every mode (capped only
			// for ShareFetch/ShareAcknowledge at what kmsg parses).
			for _, key := range []int16{KeyShareGroupHeartbeat, KeyShareGroupDescribe, KeyShareFetch, KeyShareAcknowledge,
				KeyDescribeShareGroupOffsets, KeyAlterShareGroupOffsets, KeyDeleteShareGroupOffsets,
				KeyStreamsGroupHeartbeat, KeyStreamsGroupDescribe, KeyStreamsGroupTopologyDescriptionUpdate} {
				want, had := broker[key]
				if had {
					want[1] = min(want[1], MaxVersion(key))
				}
				mm, has := got[key]
				if has != had || (had && mm != want) {
					t.Errorf("%s: %s advertised %v (%v), the broker %v (%v)", name, kmsg.NameForKey(key), mm, has, broker[key], had)
				}
			}
		}
	}
	// Kafka 3.6.2 has no KIP-848: kproxy adds it.
	merged := readRelease(t, "3.6.2")
	if _, ok := advertised(merged)[KeyConsumerGroupHeartbeat]; ok {
		t.Fatalf("the Kafka 3.6.2 answer already lists ConsumerGroupHeartbeat")
	}
	MergeApiVersions(merged, true)
	if got := advertised(merged)[KeyConsumerGroupHeartbeat]; got[1] < 1 {
		t.Errorf("in front of Kafka 3.6.2, ConsumerGroupHeartbeat advertised as %v, want v1+ (what franz-go and Kafka 4 clients need)", got)
	}
	// Kafka 4.4.0 advertises the streams group keys; 4.1.1 does not.
	if _, ok := advertised(readRelease(t, "4.4.0"))[KeyStreamsGroupHeartbeat]; !ok {
		t.Errorf("the Kafka 4.4.0 answer lacks StreamsGroupHeartbeat: the streams rows of this test prove nothing")
	}
}

// TestMergeApiVersionsCapsNewerBroker: a broker newer than kmsg (every
// key Kafka 4.4.0 advertises, each three versions higher, plus keys kmsg
// has never heard of) is capped to what kproxy parses, for the keys it
// rewrites or serves: Metadata, FindCoordinator, ApiVersions,
// DescribeCluster, Produce and every group key.
func TestMergeApiVersionsCapsNewerBroker(t *testing.T) {
	for _, groupsLocal := range []bool{true, false} {
		future := func() *kmsg.ApiVersionsResponse {
			resp := readRelease(t, "4.4.0")
			for i := range resp.ApiKeys {
				resp.ApiKeys[i].MaxVersion += 3
			}
			for _, key := range []int16{95, 96, apiKeys + 5} {
				k := kmsg.NewApiVersionsResponseApiKey()
				k.ApiKey, k.MaxVersion = key, 2
				resp.ApiKeys = append(resp.ApiKeys, k)
			}
			return resp
		}
		raw, resp := future(), future()
		MergeApiVersions(resp, groupsLocal)
		name := fmt.Sprintf("future broker, groups local %v", groupsLocal)
		checkMerged(t, name, raw, resp, groupsLocal)
		got := advertised(resp)
		for _, key := range append([]int16{KeyProduce, KeyMetadata, KeyFindCoordinator, KeyApiVersions, KeyDescribeCluster}, GroupKeys()...) {
			if got[key][1] != MaxVersion(key) {
				t.Errorf("%s: %s advertised up to v%d, want kmsg's v%d", name, kmsg.NameForKey(key), got[key][1], MaxVersion(key))
			}
		}
		if got[KeyDescribeQuorum][1] != 1 {
			t.Errorf("%s: DescribeQuorum advertised up to v%d, want v1", name, got[KeyDescribeQuorum][1])
		}
		// A client that asks anyway: versions beyond kmsg are refused
		// for the keys kproxy decodes, and ApiVersions is answered
		// UNSUPPORTED_VERSION by kproxy itself.
		for _, key := range []int16{KeyMetadata, KeyFindCoordinator, KeyDescribeCluster, KeyJoinGroup, KeyConsumerGroupHeartbeat} {
			d := RouteFor(key, MaxVersion(key)+1, true)
			if d.Route != Refuse {
				t.Errorf("%s v%d: route %s, want refused", kmsg.NameForKey(key), MaxVersion(key)+1, d.Route)
			}
		}
		if d := RouteFor(KeyApiVersions, MaxVersion(KeyApiVersions)+1, groupsLocal); d.Route != Local {
			t.Errorf("ApiVersions v%d: route %s, want answered by kproxy", MaxVersion(KeyApiVersions)+1, d.Route)
		}
	}
}

// TestKindsForwardedInEveryMode: share and streams group requests are
// forwarded at the broker's versions whether kproxy serves groups or
// not, and GroupKind names their kind.
func TestKindsForwardedInEveryMode(t *testing.T) {
	for key, kind := range map[int16]string{
		KeyShareGroupHeartbeat: KindShare, KeyShareGroupDescribe: KindShare, KeyDescribeShareGroupOffsets: KindShare,
		KeyAlterShareGroupOffsets: KindShare, KeyDeleteShareGroupOffsets: KindShare,
		KeyStreamsGroupHeartbeat: KindStreams, KeyStreamsGroupDescribe: KindStreams, KeyStreamsGroupTopologyDescriptionUpdate: KindStreams,
	} {
		for _, local := range []bool{true, false} {
			if d := RouteFor(key, 0, local); d.Route != Forward || d.MaxVersion != -1 || d.Refusal(key, 0) != nil {
				t.Errorf("%s, groups local %v: route %s max %d, want forwarded at the broker's versions", kmsg.NameForKey(key), local, d.Route, d.MaxVersion)
			}
		}
		if got := GroupKind(key); got != kind {
			t.Errorf("GroupKind(%s) = %q, want %q", kmsg.NameForKey(key), got, kind)
		}
	}
	for _, key := range []int16{KeyJoinGroup, KeyConsumerGroupHeartbeat, KeyShareFetch, KeyShareAcknowledge, KeyFetch} {
		if got := GroupKind(key); got != "" {
			t.Errorf("GroupKind(%s) = %q, want none", kmsg.NameForKey(key), got)
		}
	}
}
