package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// shareRaw is a member of a share group kproxy serves, driven with raw
// requests so that a test sees each answer as a client gets it.
type shareRaw struct {
	t      *testing.T
	cl     *kgo.Client
	group  string
	member string
	topic  [16]byte
	leader int32
	epoch  int32
}

// newShareRaw joins group as member subscribed to topic (one partition).
func newShareRaw(t *testing.T, s *stack, group, member, topic string) *shareRaw {
	t.Helper()
	ctx := context.Background()
	cl := s.client()
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	td := md.Topics[topic]
	r := &shareRaw{t: t, cl: cl, group: group, member: member, topic: td.ID, leader: td.Partitions[0].Leader}
	hb := kmsg.NewPtrShareGroupHeartbeatRequest()
	hb.GroupID, hb.MemberID, hb.MemberEpoch, hb.SubscribedTopicNames = group, member, 0, []string{topic}
	resp, err := hb.RequestWith(ctx, cl)
	if err != nil || resp.ErrorCode != 0 {
		t.Fatalf("join: %v %v", err, resp)
	}
	return r
}

// fetch sends a ShareFetch of partition 0 at the member's next session
// epoch, with acks (accept) of first..last when last >= first.
func (r *shareRaw) fetch(maxBytes int32, first, last int64) *kmsg.ShareFetchResponse {
	r.t.Helper()
	return r.fetchOf(r.topic, maxBytes, first, last)
}

// fetchOf is fetch of partition 0 of topic.
func (r *shareRaw) fetchOf(topic [16]byte, maxBytes int32, first, last int64) *kmsg.ShareFetchResponse {
	r.t.Helper()
	req := kmsg.NewPtrShareFetchRequest()
	req.GroupID, req.MemberID, req.ShareSessionEpoch = &r.group, &r.member, r.epoch
	req.MaxWaitMillis, req.MinBytes, req.MaxBytes, req.MaxRecords, req.BatchSize = 500, 1, maxBytes, 500, 500
	rt := kmsg.NewShareFetchRequestTopic()
	rt.TopicID = topic
	p := kmsg.NewShareFetchRequestTopicPartition()
	if last >= first {
		b := kmsg.NewShareFetchRequestTopicPartitionAcknowledgementBatch()
		b.FirstOffset, b.LastOffset, b.AcknowledgeTypes = first, last, []int8{1}
		p.AcknowledgementBatches = append(p.AcknowledgementBatches, b)
	}
	rt.Partitions = append(rt.Partitions, p)
	req.Topics = append(req.Topics, rt)
	raw, err := r.cl.Broker(int(r.leader)).Request(context.Background(), req)
	if err != nil {
		r.t.Fatalf("ShareFetch: %v", err)
	}
	r.epoch++
	resp := raw.(*kmsg.ShareFetchResponse)
	if resp.ErrorCode != 0 {
		r.t.Fatalf("ShareFetch: %v", kerr.ErrorForCode(resp.ErrorCode))
	}
	return resp
}

// ack sends a ShareAcknowledge accepting first..last of partition 0.
func (r *shareRaw) ack(first, last int64) *kmsg.ShareAcknowledgeResponse {
	r.t.Helper()
	req := kmsg.NewPtrShareAcknowledgeRequest()
	req.GroupID, req.MemberID, req.ShareSessionEpoch = &r.group, &r.member, r.epoch
	rt := kmsg.NewShareAcknowledgeRequestTopic()
	rt.TopicID = r.topic
	p := kmsg.NewShareAcknowledgeRequestTopicPartition()
	b := kmsg.NewShareAcknowledgeRequestTopicPartitionAcknowledgementBatch()
	b.FirstOffset, b.LastOffset, b.AcknowledgeTypes = first, last, []int8{1}
	p.AcknowledgementBatches = append(p.AcknowledgementBatches, b)
	rt.Partitions = append(rt.Partitions, p)
	req.Topics = append(req.Topics, rt)
	raw, err := r.cl.Broker(int(r.leader)).Request(context.Background(), req)
	if err != nil {
		r.t.Fatalf("ShareAcknowledge: %v", err)
	}
	r.epoch++
	resp := raw.(*kmsg.ShareAcknowledgeResponse)
	if resp.ErrorCode != 0 {
		r.t.Fatalf("ShareAcknowledge: %v", kerr.ErrorForCode(resp.ErrorCode))
	}
	return resp
}

// acquired counts the records a ShareFetch answer acquired.
func acquired(resp *kmsg.ShareFetchResponse) int64 {
	var n int64
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			for _, a := range p.AcquiredRecords {
				n += a.LastOffset - a.FirstOffset + 1
			}
		}
	}
	return n
}

// onlyPartition returns the answer's single partition.
func onlyPartition(t *testing.T, resp *kmsg.ShareFetchResponse) kmsg.ShareFetchResponseTopicPartition {
	t.Helper()
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("ShareFetch answered %d topics, want one partition: %+v", len(resp.Topics), resp.Topics)
	}
	return resp.Topics[0].Partitions[0]
}

// partitionOf returns partition 0 of topic in the answer.
func partitionOf(t *testing.T, resp *kmsg.ShareFetchResponse, topic [16]byte) kmsg.ShareFetchResponseTopicPartition {
	t.Helper()
	for _, rt := range resp.Topics {
		for _, p := range rt.Partitions {
			if rt.TopicID == topic && p.Partition == 0 {
				return p
			}
		}
	}
	t.Fatalf("ShareFetch answered no partition 0 of the topic: %+v", resp.Topics)
	return kmsg.ShareFetchResponseTopicPartition{}
}

// TestShareGroupsServedAnswers: kproxy answers ShareFetch and
// ShareAcknowledge as Kafka 4.4's KafkaApis does where librdkafka's
// share-consumer tests look: MaxBytes 0 gets no records (each partition
// UNKNOWN_SERVER_ERROR: Kafka's PartitionMaxBytesStrategy refuses 0,
// librdkafka's 0180), and acknowledgements and fetches of a deleted topic
// are answered UNKNOWN_TOPIC_ID (0176, 0181), not NO_ERROR.
func TestShareGroupsServedAnswers(t *testing.T) {
	s := newShareStack(t)
	ctx := context.Background()
	topic, group := "answers-share", "answers-share-g"
	s.produce(ctx, topic, 1, 10)
	r := newShareRaw(t, s, group, "m-answers", topic)

	resp := r.fetch(0, 0, -1)
	if n := acquired(resp); n != 0 {
		t.Fatalf("MaxBytes 0 acquired %d records, want none", n)
	}
	if p := onlyPartition(t, resp); p.ErrorCode != kerr.UnknownServerError.Code {
		t.Errorf("MaxBytes 0: partition error %v, want UNKNOWN_SERVER_ERROR", kerr.ErrorForCode(p.ErrorCode))
	}

	var got int64
	deadline := time.Now().Add(10 * time.Second)
	for got < 10 && time.Now().Before(deadline) {
		got += acquired(r.fetch(1<<20, 0, -1))
	}
	if got != 10 {
		t.Fatalf("acquired %d of 10 records", got)
	}
	if ar := r.ack(0, 4); ar.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("accept of a live topic's records: %v", kerr.ErrorForCode(ar.Topics[0].Partitions[0].ErrorCode))
	}
	// A topic created after kproxy's last listing of the topics (the
	// fetches above) is not refused.
	created, err := kadm.NewClient(s.client()).CreateTopic(ctx, 1, 1, nil, topic+"-new")
	if err != nil || created.Err != nil {
		t.Fatalf("create topic: %v %v", err, created.Err)
	}
	for _, tp := range r.fetchOf(created.ID, 1<<20, 0, -1).Topics {
		for _, p := range tp.Partitions {
			if tp.TopicID == created.ID && p.ErrorCode == kerr.UnknownTopicID.Code {
				t.Errorf("ShareFetch of a topic just created answered UNKNOWN_TOPIC_ID")
			}
		}
	}

	if _, err := kadm.NewClient(s.client()).DeleteTopic(ctx, topic); err != nil {
		t.Fatalf("delete topic: %v", err)
	}
	time.Sleep(1500 * time.Millisecond) // kproxy lists topics at most once a second
	ar := r.ack(5, 7)
	if len(ar.Topics) != 1 || len(ar.Topics[0].Partitions) != 1 || ar.Topics[0].Partitions[0].ErrorCode != kerr.UnknownTopicID.Code {
		t.Errorf("ShareAcknowledge of a deleted topic answered %+v, want UNKNOWN_TOPIC_ID", ar.Topics)
	}
	p := partitionOf(t, r.fetch(1<<20, 8, 9), r.topic)
	if p.AcknowledgeErrorCode != kerr.UnknownTopicID.Code || p.ErrorCode != kerr.UnknownTopicID.Code {
		t.Errorf("ShareFetch of a deleted topic: ack %v, fetch %v, want UNKNOWN_TOPIC_ID for both",
			kerr.ErrorForCode(p.AcknowledgeErrorCode), kerr.ErrorForCode(p.ErrorCode))
	}
}
