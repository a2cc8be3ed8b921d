package groupstate

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestDescribeGroupsTexts guards DescribeGroups v6's error messages as
// Kafka's GroupMetadataManager words them (KIP-1043): a KIP-848 group is
// "Group <id> is not a classic group.", a group that does not exist
// "Group <id> not found." (kafka-consumer-groups and the admin client show
// them; the interop row kafka-consumer-groups-diff compares them with a
// broker's).
func TestDescribeGroupsTexts(t *testing.T) {
	h := newConsumerHarness(t, map[string]int32{"t": 2})
	(&client{id: "m1"}).applyResp(h.consumerResp(consumerJoin("kip848", "m1", "t"), errNone))
	d := kmsg.NewPtrDescribeGroupsRequest()
	d.Version = 6
	d.Groups = []string{"kip848", "missing"}
	r := h.do(d).(*kmsg.DescribeGroupsResponse)
	if len(r.Groups) != 2 {
		t.Fatalf("%d groups, want 2", len(r.Groups))
	}
	for i, want := range []string{"Group kip848 is not a classic group.", "Group missing not found."} {
		g := r.Groups[i]
		msg := "<nil>"
		if g.ErrorMessage != nil {
			msg = *g.ErrorMessage
		}
		if g.ErrorCode != errGroupIDNotFound || msg != want || g.State != "Dead" {
			t.Errorf("%s: %s %q state %s, want GROUP_ID_NOT_FOUND %q Dead", g.Group, errName(g.ErrorCode), msg, g.State, want)
		}
	}
}
