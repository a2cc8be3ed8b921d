package tap

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/groupstate"
)

func TestComputeLag(t *testing.T) {
	boom := errors.New("leader not available")
	committed := kadm.OffsetResponses{
		"b": {
			0: {Offset: kadm.Offset{Topic: "b", Partition: 0, At: 10}},
		},
		"a": {
			1: {Offset: kadm.Offset{Topic: "a", Partition: 1, At: -1}},           // nothing committed
			0: {Offset: kadm.Offset{Topic: "a", Partition: 0, At: 40}},           // committed past the end (truncation)
			2: {Offset: kadm.Offset{Topic: "a", Partition: 2, At: 5}},            // end offset failed
			3: {Offset: kadm.Offset{Topic: "a", Partition: 3, At: 7}, Err: boom}, // commit fetch failed
			4: {Offset: kadm.Offset{Topic: "a", Partition: 4, At: 3}},            // no end offset listed
		},
	}
	ends := kadm.ListedOffsets{
		"a": {
			0: {Topic: "a", Partition: 0, Offset: 30},
			1: {Topic: "a", Partition: 1, Offset: 12},
			2: {Topic: "a", Partition: 2, Err: boom},
			3: {Topic: "a", Partition: 3, Offset: 9},
		},
		"b": {0: {Topic: "b", Partition: 0, Offset: 25}},
	}
	// Assigned: b/0 is committed (listed once), b/1 and c/0 are not
	// (listed with Committed -1, c/0 claimed twice), c/0's end is unknown.
	assigned := []TopicPartitions{{Topic: "b", Partitions: []int32{0, 1}}, {Topic: "c", Partitions: []int32{0}}, {Topic: "c", Partitions: []int32{0}}}
	ends["b"][1] = kadm.ListedOffset{Topic: "b", Partition: 1, Offset: 4}
	got := computeLag(committed, assigned, ends)
	want := []PartitionLag{
		{Topic: "a", Partition: 0, Committed: 40, End: 30, Lag: 0},
		{Topic: "a", Partition: 1, Committed: -1, End: 12, Lag: 12},
		{Topic: "a", Partition: 2, Committed: 5, End: -1, Lag: -1, Error: boom.Error()},
		{Topic: "a", Partition: 3, Committed: 7, End: 9, Lag: 2, Error: boom.Error()},
		{Topic: "a", Partition: 4, Committed: 3, End: -1, Lag: -1},
		{Topic: "b", Partition: 0, Committed: 10, End: 25, Lag: 15},
		{Topic: "b", Partition: 1, Committed: -1, End: 4, Lag: 4},
		{Topic: "c", Partition: 0, Committed: -1, End: -1, Lag: -1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("computeLag:\n got %+v\nwant %+v", got, want)
	}
}

// TestKadmOffsetSourceWithoutCommits reads offsets from a real (in-memory)
// broker for a group that has members but has committed nothing: the
// broker knows no such group, which is no error; the assigned partitions
// are listed with their end offsets and lag, in the group's detail and as
// its total in the group list.
func TestKadmOffsetSourceWithoutCommits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "payments"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for p, n := range []int{3, 2} {
		for range n {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "payments", Partition: int32(p), Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	adm := kadm.NewClient(cl)
	if _, err := adm.FetchOffsets(ctx, "g"); err != nil {
		t.Logf("the broker answers a group without commits with %v", err)
	}
	src := NewKadmOffsetSource(adm)
	assigned := []TopicPartitions{{Topic: "payments", Partitions: []int32{0, 1}}}

	lags, err := src.Lag(ctx, []LagQuery{{Group: "g", Assigned: assigned}, {Group: "idle"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []PartitionLag{
		{Topic: "payments", Partition: 0, Committed: -1, End: 3, Lag: 3},
		{Topic: "payments", Partition: 1, Committed: -1, End: 2, Lag: 2},
	}
	if g := lags["g"]; g.Err != nil || !reflect.DeepEqual(g.Offsets, want) {
		t.Errorf("g without commits: %+v, %v; want %+v", g.Offsets, g.Err, want)
	}
	if g, ok := lags["idle"]; !ok || g.Err != nil || len(g.Offsets) != 0 {
		t.Errorf("idle group: %+v (answered %v), want no offsets and no error", g, ok)
	}

	// Through the admin API, with the group's member assigned both
	// partitions.
	m := member("m1")
	m.Assignment = assignment("payments", 0, 1)
	groups := &fakeGroups{groups: []groupstate.GroupSnapshot{{Group: "g", State: "Stable", ProtocolType: "consumer", Generation: 1, Members: []groupstate.Member{m}}}}
	srv := httptest.NewServer(NewHTTPHandler(HTTPConfig{Groups: groups, Offsets: src}))
	defer srv.Close()
	code, body := get(t, srv, "/api/groups/g")
	var d GroupDetail
	if err := json.Unmarshal([]byte(body), &d); err != nil || code != 200 {
		t.Fatalf("/api/groups/g: %d %v %s", code, err, body)
	}
	if d.OffsetsError != "" || !reflect.DeepEqual(d.Offsets, want) || d.TotalLag != 5 {
		t.Errorf("detail offsets %+v, error %q, total %d; want %+v, no error, 5", d.Offsets, d.OffsetsError, d.TotalLag, want)
	}
	code, body = get(t, srv, "/api/groups")
	var list []GroupSummary
	if err := json.Unmarshal([]byte(body), &list); err != nil || code != 200 {
		t.Fatalf("/api/groups: %d %v %s", code, err, body)
	}
	if len(list) != 1 || list[0].TotalLag == nil || *list[0].TotalLag != 5 || list[0].LagError != "" {
		t.Errorf("group list %s, want g with total lag 5", body)
	}

	// A commit on one partition: that partition's lag counts from it.
	offs := kadm.Offsets{}
	offs.AddOffset("payments", 0, 1, -1)
	if _, err := adm.CommitOffsets(ctx, "g", offs); err != nil {
		t.Fatal(err)
	}
	lags, err = src.Lag(ctx, []LagQuery{{Group: "g", Assigned: assigned}})
	if err != nil {
		t.Fatal(err)
	}
	want[0].Committed, want[0].Lag = 1, 2
	if g := lags["g"]; g.Err != nil || !reflect.DeepEqual(g.Offsets, want) {
		t.Errorf("g after a commit: %+v, %v; want %+v", g.Offsets, g.Err, want)
	}
}
