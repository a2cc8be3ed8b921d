package main

import (
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// gen returns a pointer to a generation number for test events.
func gen(g int64) *int64 { return &g }

// newTestScenario returns a scenario with members named by the events' Member field.
func newTestScenario(t *testing.T, identities map[string]string, events []event) *scenario {
	t.Helper()
	s := &scenario{h: &harness{partitions: 4}, seen: map[string]int{}}
	byName := map[string]*member{}
	for _, e := range events {
		m := byName[e.Member]
		if m == nil {
			m = &member{name: e.Member, identity: e.Member}
			if id, ok := identities[e.Member]; ok {
				m.identity = id
			}
			byName[e.Member] = m
			s.members = append(s.members, m)
		}
		s.observe(m, e)
	}
	return s
}

func TestCheckOwnership(t *testing.T) {
	tests := []struct {
		name       string
		identities map[string]string
		events     []event
		wantErr    string
		rebalances string
		restart    int64 // scenario.epochsRestart
	}{
		{
			name: "clean eager handover",
			events: []event{
				{TS: 10, Ev: "assigned", Member: "a", Generation: gen(1), Partitions: []int32{0, 1, 2, 3}},
				{TS: 20, Ev: "revoked", Member: "a", Generation: gen(1), Partitions: nil},
				{TS: 30, Ev: "assigned", Member: "a", Generation: gen(2), Partitions: []int32{0, 1}},
				{TS: 30, Ev: "assigned", Member: "b", Generation: gen(2), Partitions: []int32{2, 3}},
			},
			rebalances: "2",
		},
		{
			name: "two owners in one generation",
			events: []event{
				{TS: 10, Ev: "assigned", Member: "a", Generation: gen(3), Partitions: []int32{0, 1}},
				{TS: 11, Ev: "revoked", Member: "a", Generation: gen(3), Partitions: nil},
				{TS: 12, Ev: "assigned", Member: "b", Generation: gen(3), Partitions: []int32{1, 2}},
			},
			wantErr: "partition 1 held by a and b in generation 3",
		},
		{
			name: "overlap in time without generations",
			events: []event{
				{TS: 10, Ev: "assigned", Member: "a", Generation: gen(-1), Partitions: []int32{0, 1}},
				{TS: 15, Ev: "assigned", Member: "b", Generation: gen(-1), Partitions: []int32{1}},
				{TS: 20, Ev: "revoked", Member: "a", Generation: gen(-1), Partitions: nil},
			},
			wantErr: "partition 1 held by a and b at the same time",
			// The client hides generations: the estimate is the most assignments one member saw.
			rebalances: "~1",
		},
		{
			name: "closed ends ownership",
			events: []event{
				{TS: 10, Ev: "assigned", Member: "a", Generation: gen(-1), Partitions: []int32{0}},
				{TS: 20, Ev: "closed", Member: "a"},
				{TS: 25, Ev: "assigned", Member: "b", Generation: gen(-1), Partitions: []int32{0}},
			},
			rebalances: "~1",
		},
		{
			name:       "static member returns with the same identity",
			identities: map[string]string{"m1": "inst-1", "m4": "inst-1"},
			events: []event{
				{TS: 10, Ev: "assigned", Member: "m1", Generation: gen(5), Partitions: []int32{0, 1}},
				{TS: 20, Ev: "closed", Member: "m1"},
				{TS: 30, Ev: "assigned", Member: "m4", Generation: gen(5), Partitions: []int32{0, 1}},
			},
			rebalances: "1",
		},
		{
			name:    "a KIP-848 group's epochs restart after its takeover",
			restart: 25,
			events: []event{
				{TS: 10, Ev: "assigned", Member: "m1", Generation: gen(3), Partitions: []int32{2}},
				{TS: 20, Ev: "closed", Member: "m1"},
				{TS: 30, Ev: "assigned", Member: "m7", Generation: gen(3), Partitions: []int32{2}},
			},
		},
		{
			name:    "two owners in one generation after the restart",
			restart: 5,
			events: []event{
				{TS: 10, Ev: "assigned", Member: "m1", Generation: gen(3), Partitions: []int32{2}},
				{TS: 20, Ev: "closed", Member: "m1"},
				{TS: 30, Ev: "assigned", Member: "m7", Generation: gen(3), Partitions: []int32{2}},
			},
			wantErr: "partition 2 held by m1 and m7 in generation 3",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScenario(t, tc.identities, tc.events)
			s.epochsRestart = tc.restart
			reb, err := s.checkOwnership()
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error = %v, want it to mention %q", err, tc.wantErr)
			}
			if tc.rebalances != "" && reb != tc.rebalances {
				t.Fatalf("rebalances = %q, want %q", reb, tc.rebalances)
			}
		})
	}
}

func TestStable(t *testing.T) {
	s := &scenario{h: &harness{partitions: 4}, seen: map[string]int{}}
	a := &member{name: "a", owned: []int32{0, 1}}
	b := &member{name: "b", owned: []int32{2, 3}}
	c := &member{name: "c", owned: nil}
	s.members = []*member{a, b, c}
	if !s.stableLocked([]*member{a, b}) {
		t.Fatal("a and b cover every partition once: want stable")
	}
	if s.stableLocked([]*member{a, b, c}) {
		t.Fatal("c owns nothing: want unstable")
	}
	b.owned = []int32{1, 2, 3}
	if s.stableLocked([]*member{a, b}) {
		t.Fatal("partition 1 held twice: want unstable")
	}
	b.owned = []int32{2}
	if s.stableLocked([]*member{a, b}) {
		t.Fatal("partition 3 unowned: want unstable")
	}
	b.owned = []int32{2, 3}
	c.owned = []int32{3}
	if s.stableLocked([]*member{a, b}) {
		t.Fatal("a live member outside the wanted set still holds a partition: want unstable")
	}
}

func TestRequestLogScan(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/request.log"
	write := func(s string) {
		t.Helper()
		f, err := openAppend(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	write(`[x] Completed request:{"requestHeader":{"requestApiKey":11,"requestApiVersion":9}}` + "\n" +
		`[x] Completed request:{"requestHeader":{"requestApiKey":12,"requestApiVersion":4}}` + "\n" +
		`[x] Completed request:{"requestHeader":{"requestApiKey":12,"requestApiVersion":4,"correlationId":3,"clientId":"kproxy","requestApiKeyName":"HEARTBEAT"},"request":{"groupId":"g","generationId":1,"memberId":"kproxy-anchor-1",...` + "\n" +
		`[x] Completed request:{"requestHeader":{"requestApiKey":11,"requestApiVersion":9,"clientId":"w2"},"request":{"groupId":"connect-interop-kafka-connect-direct-17-sink",...` + "\n" +
		`[x] Completed request:{"requestHeader":{"requestApiKey":1`)
	l := &requestLog{path: path, late: "-direct-17"}
	got, late, err := countAll([]*requestLog{l})
	if err != nil {
		t.Fatal(err)
	}
	if got[11] != 2 || got[12] != 1 || got[1] != 0 {
		t.Fatalf("first scan counts = %v, want two JoinGroups and one Heartbeat, the anchor's heartbeat and a partial line ignored", got)
	}
	if late[11] != 1 || len(late) != 1 {
		t.Fatalf("first scan late counts = %v, want the direct row's JoinGroup alone", late)
	}
	write(`4,"requestApiVersion":5}}` + "\n")
	got, late, err = countAll([]*requestLog{l})
	if err != nil {
		t.Fatal(err)
	}
	if got[14] != 1 || got[11] != 2 || late[11] != 1 {
		t.Fatalf("second scan counts = %v (late %v), want the completed SyncGroup line counted once", got, late)
	}
	if _, _, err := countAll([]*requestLog{{path: dir + "/missing"}}); err == nil {
		t.Fatal("a missing log must be an error")
	}
}

// openAppend opens a file for appending, creating it if needed.
func openAppend(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}

// apiAnswer encodes an ApiVersions answer (correlation id 1, then the body).
func apiAnswer(version, errCode int16, keys ...[3]int16) []byte {
	r := kmsg.NewPtrApiVersionsResponse()
	r.Version, r.ErrorCode = version, errCode
	for _, k := range keys {
		a := kmsg.NewApiVersionsResponseApiKey()
		a.ApiKey, a.MinVersion, a.MaxVersion = k[0], k[1], k[2]
		r.ApiKeys = append(r.ApiKeys, a)
	}
	return r.AppendTo([]byte{0, 0, 0, 1})
}

// TestCompareOpenings: the ApiVersions check fails on the bug of issue 12
// (group keys merged into the UNSUPPORTED_VERSION answer) and on a changed
// key kproxy does not own, and passes kproxy's documented edits.
func TestCompareOpenings(t *testing.T) {
	unsupported := apiAnswer(0, 35, [3]int16{18, 0, 4})
	retry := apiAnswer(4, 0, [3]int16{0, 3, 12}, [3]int16{1, 4, 18}, [3]int16{2, 1, 10}, [3]int16{8, 2, 9}, [3]int16{18, 0, 4}, [3]int16{76, 0, 1})
	direct := apiExchange{first: unsupported, firstVersion: 5, retry: retry, retryVersion: 4}

	// kproxy's edits: Fetch capped at v15, OffsetCommit at the engine's
	// versions; the share group key as the broker's.
	edited := apiAnswer(4, 0, [3]int16{0, 3, 12}, [3]int16{1, 4, 15}, [3]int16{2, 1, 10}, [3]int16{8, 0, 10}, [3]int16{18, 0, 4}, [3]int16{76, 0, 1})
	if ps, _ := compareOpenings(direct, apiExchange{first: unsupported, firstVersion: 5, retry: edited, retryVersion: 4}); len(ps) != 0 {
		t.Fatalf("documented edits reported as problems: %v", ps)
	}
	noShare := apiAnswer(4, 0, [3]int16{0, 3, 12}, [3]int16{1, 4, 15}, [3]int16{2, 1, 10}, [3]int16{8, 0, 10}, [3]int16{18, 0, 4})
	if ps, _ := compareOpenings(direct, apiExchange{first: unsupported, firstVersion: 5, retry: noShare, retryVersion: 4}); len(ps) != 1 || !strings.Contains(ps[0], "key 76") {
		t.Fatalf("ShareGroupHeartbeat dropped through kproxy: got %v", ps)
	}
	merged := apiAnswer(0, 35, [3]int16{8, 0, 10}, [3]int16{11, 0, 9}, [3]int16{18, 0, 4})
	if ps, _ := compareOpenings(direct, apiExchange{first: merged, firstVersion: 5, retry: edited, retryVersion: 4}); len(ps) == 0 {
		t.Fatal("a merged UNSUPPORTED_VERSION answer passed")
	}
	changed := apiAnswer(4, 0, [3]int16{0, 3, 12}, [3]int16{1, 4, 15}, [3]int16{2, 1, 9}, [3]int16{8, 0, 10}, [3]int16{18, 0, 4}, [3]int16{76, 0, 1})
	if ps, _ := compareOpenings(direct, apiExchange{first: unsupported, firstVersion: 5, retry: changed, retryVersion: 4}); len(ps) != 1 || !strings.Contains(ps[0], "key 2") {
		t.Fatalf("ListOffsets v1-9 instead of v1-10 through kproxy: got %v", ps)
	}
	if ps, _ := compareOpenings(direct, apiExchange{first: unsupported, firstVersion: 5, retry: edited, retryVersion: 3}); len(ps) == 0 {
		t.Fatal("a retry at another version passed")
	}
}

// TestCompareOpeningsAnsweredAtOnce: a broker that speaks v5 (Kafka 4.4)
// answers the first request; kproxy's answer then gets the retry's
// comparison (its edits pass, other changes do not), and a kproxy that
// answers UNSUPPORTED_VERSION instead fails.
func TestCompareOpeningsAnsweredAtOnce(t *testing.T) {
	first := apiAnswer(5, 0, [3]int16{0, 3, 13}, [3]int16{1, 4, 18}, [3]int16{2, 1, 11}, [3]int16{18, 0, 5}, [3]int16{88, 0, 1})
	direct := apiExchange{first: first, firstVersion: 5, retryVersion: -1}
	edited := apiAnswer(5, 0, [3]int16{0, 3, 13}, [3]int16{1, 4, 15}, [3]int16{2, 1, 11}, [3]int16{8, 0, 10}, [3]int16{18, 0, 5}, [3]int16{88, 0, 1})
	ps, meant := compareOpenings(direct, apiExchange{first: edited, firstVersion: 5, retryVersion: -1})
	if len(ps) != 0 {
		t.Fatalf("documented edits (Fetch capped, a group key added, streams groups as the broker's) reported as problems: %v", ps)
	}
	if !strings.HasPrefix(meant, "first answer v5:") {
		t.Fatalf("summary %q does not say the first answer was compared", meant)
	}
	changed := apiAnswer(5, 0, [3]int16{0, 3, 13}, [3]int16{1, 4, 15}, [3]int16{2, 1, 10}, [3]int16{18, 0, 5}, [3]int16{88, 0, 1})
	if ps, _ := compareOpenings(direct, apiExchange{first: changed, firstVersion: 5, retryVersion: -1}); len(ps) != 1 || !strings.Contains(ps[0], "key 2") {
		t.Fatalf("ListOffsets v1-10 instead of v1-11 through kproxy: got %v", ps)
	}
	unsupported := apiAnswer(0, 35, [3]int16{18, 0, 4})
	if ps, _ := compareOpenings(direct, apiExchange{first: unsupported, firstVersion: 5, retry: edited, retryVersion: 4}); len(ps) == 0 {
		t.Fatal("kproxy answering UNSUPPORTED_VERSION to a broker that speaks v5 passed")
	}
}

// TestCompareOpeningsSaslHandshakeMin: kproxy refuses SaslHandshake v0,
// so it advertises v1-1 where the broker says v0-1; any other change of
// the key is a problem.
func TestCompareOpeningsSaslHandshakeMin(t *testing.T) {
	direct := apiExchange{first: apiAnswer(5, 0, [3]int16{17, 0, 1}, [3]int16{18, 0, 5}), firstVersion: 5, retryVersion: -1}
	raised := apiAnswer(5, 0, [3]int16{17, 1, 1}, [3]int16{18, 0, 5})
	if ps, _ := compareOpenings(direct, apiExchange{first: raised, firstVersion: 5, retryVersion: -1}); len(ps) != 0 {
		t.Fatalf("SaslHandshake v1-1 through kproxy reported: %v", ps)
	}
	for _, bad := range [][]byte{
		apiAnswer(5, 0, [3]int16{17, 0, 1}, [3]int16{18, 0, 5}), // v0 still advertised
		apiAnswer(5, 0, [3]int16{17, 1, 0}, [3]int16{18, 0, 5}), // max changed
		apiAnswer(5, 0, [3]int16{18, 0, 5}),                     // missing
	} {
		if ps, _ := compareOpenings(direct, apiExchange{first: bad, firstVersion: 5, retryVersion: -1}); len(ps) == 0 {
			t.Errorf("SaslHandshake advertised wrongly through kproxy passed: %x", bad)
		}
	}
}

// TestVersionExpectations: directly against a release older than a row's
// feature the row must fail (XFAIL, counted as passing) and a pass is a
// failure; through kproxy, and against releases that have the feature,
// the outcome stands as it is.
func TestVersionExpectations(t *testing.T) {
	for _, c := range []struct{ a, b string }{{"3.6.2", "4.0.0"}, {"3.9.1", "4.0.0"}, {"4.0.0", "4.0.1"}, {"4.1.1", "4.10.0"}} {
		if !versionLess(c.a, c.b) || versionLess(c.b, c.a) {
			t.Errorf("versionLess(%s, %s) wrong", c.a, c.b)
		}
	}
	if versionLess("4.0.0", "4.0.0") {
		t.Error("a version is older than itself")
	}
	r := row{name: "java-kip848", needs: kip848}
	old, cur, unknown := &harness{kafkaVersion: "3.6.2"}, &harness{kafkaVersion: "4.4.0"}, &harness{}
	if old.expectedLack(r, "direct") == "" {
		t.Fatal("no expected failure for KIP-848 directly against 3.6.2")
	}
	for _, c := range []struct {
		h    *harness
		path string
	}{{old, "kproxy"}, {cur, "direct"}, {cur, "kproxy"}, {unknown, "direct"}} {
		if lack := c.h.expectedLack(r, c.path); lack != "" {
			t.Errorf("Kafka %q %s: expected failure %q", c.h.kafkaVersion, c.path, lack)
		}
	}
	if lack := old.expectedLack(row{name: "py-confluent"}, "direct"); lack != "" {
		t.Errorf("a classic row is expected to fail against 3.6.2: %q", lack)
	}
	lack := old.expectedLack(r, "direct")
	got := applyExpectation(result{pass: false, reason: "UnsupportedVersionException"}, lack)
	if !got.pass || !got.xfail || got.reason != "" || len(got.notes) == 0 || !strings.Contains(got.notes[0], "UnsupportedVersionException") {
		t.Errorf("expected failure: %+v", got)
	}
	got = applyExpectation(result{pass: true}, lack)
	if got.pass || got.xfail || !strings.Contains(got.reason, "but it passed") {
		t.Errorf("unexpected pass: %+v", got)
	}
	if got := applyExpectation(result{pass: false, reason: "x"}, ""); got.pass || got.xfail {
		t.Errorf("a failure without expectation became %+v", got)
	}
}

// TestGroupsTopic: the groups topic and mode follow -kproxy-args.
func TestGroupsTopic(t *testing.T) {
	for _, c := range []struct {
		args  []string
		topic string
		dist  bool
	}{
		{nil, "__kproxy_groups", true},
		{[]string{"--group-initial-rebalance-delay=0", "--fleet-name", "a"}, "__kproxy_groups.a", true},
		{[]string{"--fleet-name=b", "--groups=local"}, "__kproxy_groups.b", false},
		{[]string{"--groups", "forward"}, "__kproxy_groups", false},
	} {
		h := &harness{kproxyArgs: c.args}
		if topic, dist := h.groupsTopic(); topic != c.topic || dist != c.dist {
			t.Errorf("%v: %s %v, want %s %v", c.args, topic, dist, c.topic, c.dist)
		}
	}
}
