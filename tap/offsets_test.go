package tap

import (
	"errors"
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
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
	got := computeLag(committed, ends)
	want := []PartitionLag{
		{Topic: "a", Partition: 0, Committed: 40, End: 30, Lag: 0},
		{Topic: "a", Partition: 1, Committed: -1, End: 12, Lag: 12},
		{Topic: "a", Partition: 2, Committed: 5, End: -1, Lag: -1, Error: boom.Error()},
		{Topic: "a", Partition: 3, Committed: 7, End: 9, Lag: 2, Error: boom.Error()},
		{Topic: "a", Partition: 4, Committed: 3, End: -1, Lag: -1},
		{Topic: "b", Partition: 0, Committed: 10, End: 25, Lag: 15},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("computeLag:\n got %+v\nwant %+v", got, want)
	}
}
