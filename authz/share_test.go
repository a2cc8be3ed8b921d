package authz

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// shareNames names topic id {1} t-ok and {2} t-no; no other id has a
// name.
func shareNames(id [16]byte) (string, bool) {
	n, ok := map[[16]byte]string{{1}: "t-ok", {2}: "t-no"}[id]
	return n, ok
}

// TestAuthorizeShareFetch: READ on the group is needed for the whole
// request; a topic the principal may not read (or whose id has no name)
// is left out of what reaches the share service and answered
// TOPIC_AUTHORIZATION_FAILED, its acknowledgements too, unless the
// answer failed as a whole.
func TestAuthorizeShareFetch(t *testing.T) {
	can := testCan()
	group := "ok"
	r := kmsg.NewPtrShareFetchRequest()
	r.Version, r.GroupID = 1, &group
	r.Topics = []kmsg.ShareFetchRequestTopic{
		{TopicID: [16]byte{1}, Partitions: []kmsg.ShareFetchRequestTopicPartition{{Partition: 0}}},
		{TopicID: [16]byte{2}, Partitions: []kmsg.ShareFetchRequestTopicPartition{
			{Partition: 0, AcknowledgementBatches: []kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch{{FirstOffset: 0, LastOffset: 1, AcknowledgeTypes: []int8{1}}}},
			{Partition: 1},
		}},
		{TopicID: [16]byte{3}, Partitions: []kmsg.ShareFetchRequestTopicPartition{{Partition: 2}}},
	}
	d := Authorize(r, can, shareNames)
	pass, ok := d.Pass.(*kmsg.ShareFetchRequest)
	if d.Answer != nil || !ok || len(pass.Topics) != 1 || pass.Topics[0].TopicID != [16]byte{1} || len(r.Topics) != 3 {
		t.Fatalf("mixed fetch: %+v", d)
	}
	inner := kmsg.NewPtrShareFetchResponse()
	inner.Topics = []kmsg.ShareFetchResponseTopic{{TopicID: [16]byte{1}, Partitions: []kmsg.ShareFetchResponseTopicPartition{{Partition: 0}}}}
	got := d.Finish(inner).(*kmsg.ShareFetchResponse)
	type part struct {
		id           byte
		p            int32
		code, ackErr int16
		leader       int32
	}
	var parts []part
	for _, rt := range got.Topics {
		for _, rp := range rt.Partitions {
			parts = append(parts, part{rt.TopicID[0], rp.Partition, rp.ErrorCode, rp.AcknowledgeErrorCode, rp.CurrentLeader.LeaderID})
		}
	}
	want := []part{{1, 0, 0, 0, 0}, {2, 0, taf, taf, -1}, {2, 1, taf, 0, -1}, {3, 2, taf, 0, -1}}
	if len(parts) != len(want) {
		t.Fatalf("merged fetch: %+v, want %+v", parts, want)
	}
	for i := range want {
		if parts[i] != want[i] {
			t.Fatalf("merged fetch: %+v, want %+v", parts, want)
		}
	}
	failed := kmsg.NewPtrShareFetchResponse()
	failed.ErrorCode = gaf
	if got := d.Finish(failed).(*kmsg.ShareFetchResponse); len(got.Topics) != 0 {
		t.Fatalf("a failed fetch got the denied topics: %+v", got.Topics)
	}

	r.Topics = r.Topics[:1]
	if d := Authorize(r, can, shareNames); d.Pass != r || d.Finish != nil || d.Answer != nil {
		t.Fatalf("readable fetch: %+v", d)
	}
	desc := "desc"
	r.GroupID = &desc
	if d := Authorize(r, can, shareNames); d.Pass != nil || d.Answer.(*kmsg.ShareFetchResponse).ErrorCode != gaf || d.Answer.GetVersion() != 1 {
		t.Fatalf("fetch without group READ: %+v", d)
	}
	r.GroupID = nil
	if d := Authorize(r, can, shareNames); d.Pass != nil || d.Answer.(*kmsg.ShareFetchResponse).ErrorCode != gaf {
		t.Fatalf("fetch without a group: %+v", d)
	}
}

// TestAuthorizeShareAcknowledge: as ShareFetch, for acknowledgements.
func TestAuthorizeShareAcknowledge(t *testing.T) {
	can := testCan()
	group := "ok"
	r := kmsg.NewPtrShareAcknowledgeRequest()
	r.Version, r.GroupID = 1, &group
	r.Topics = []kmsg.ShareAcknowledgeRequestTopic{
		{TopicID: [16]byte{2}, Partitions: []kmsg.ShareAcknowledgeRequestTopicPartition{{Partition: 4}}},
		{TopicID: [16]byte{1}, Partitions: []kmsg.ShareAcknowledgeRequestTopicPartition{{Partition: 0}}},
	}
	d := Authorize(r, can, shareNames)
	pass, ok := d.Pass.(*kmsg.ShareAcknowledgeRequest)
	if d.Answer != nil || !ok || len(pass.Topics) != 1 || pass.Topics[0].TopicID != [16]byte{1} {
		t.Fatalf("mixed acknowledge: %+v", d)
	}
	inner := kmsg.NewPtrShareAcknowledgeResponse()
	inner.Topics = []kmsg.ShareAcknowledgeResponseTopic{{TopicID: [16]byte{1}, Partitions: []kmsg.ShareAcknowledgeResponseTopicPartition{{Partition: 0}}}}
	got := d.Finish(inner).(*kmsg.ShareAcknowledgeResponse)
	if len(got.Topics) != 2 || got.Topics[1].TopicID != [16]byte{2} || len(got.Topics[1].Partitions) != 1 {
		t.Fatalf("merged acknowledge: %+v", got.Topics)
	}
	if rp := got.Topics[1].Partitions[0]; rp.Partition != 4 || rp.ErrorCode != taf || rp.CurrentLeader.LeaderID != -1 || rp.CurrentLeader.LeaderEpoch != -1 {
		t.Fatalf("denied partition: %+v", rp)
	}
	failed := kmsg.NewPtrShareAcknowledgeResponse()
	failed.ErrorCode = gaf
	if got := d.Finish(failed).(*kmsg.ShareAcknowledgeResponse); len(got.Topics) != 0 {
		t.Fatalf("a failed acknowledge got the denied topics: %+v", got.Topics)
	}
	r.Topics = r.Topics[1:]
	if d := Authorize(r, can, shareNames); d.Pass != r || d.Finish != nil {
		t.Fatalf("readable acknowledge: %+v", d)
	}
	desc := "desc"
	r.GroupID = &desc
	if d := Authorize(r, can, shareNames); d.Pass != nil || d.Answer.(*kmsg.ShareAcknowledgeResponse).ErrorCode != gaf {
		t.Fatalf("acknowledge without group READ: %+v", d)
	}
}
