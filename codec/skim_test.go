package codec

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestProduceHasEndpoints(t *testing.T) {
	for v := int16(9); v <= MaxVersion(KeyProduce); v++ {
		for _, withEP := range []bool{false, true} {
			r := kmsg.NewPtrProduceResponse()
			r.SetVersion(v)
			for ti := range 3 {
				tp := kmsg.NewProduceResponseTopic()
				tp.Topic = "topic-name"
				tp.TopicID[0] = byte(ti)
				for pi := range 4 {
					p := kmsg.NewProduceResponseTopicPartition()
					p.Partition = int32(pi)
					msg := "boom"
					p.ErrorMessage = &msg
					re := kmsg.NewProduceResponseTopicPartitionErrorRecord()
					re.ErrorMessage = &msg
					p.ErrorRecords = append(p.ErrorRecords, re)
					if pi == 1 {
						p.CurrentLeader.LeaderID = 3
					}
					tp.Partitions = append(tp.Partitions, p)
				}
				r.Topics = append(r.Topics, tp)
			}
			if withEP {
				b := kmsg.NewProduceResponseBroker()
				b.NodeID, b.Host, b.Port = 1, "upstream", 9092
				r.Brokers = append(r.Brokers, b)
			}
			body := r.AppendTo(nil)
			dec := kmsg.NewPtrProduceResponse()
			dec.SetVersion(v)
			if err := dec.ReadFrom(body); err != nil {
				t.Fatal(err)
			}
			has, ok := ProduceHasEndpoints(body, v)
			if !ok || has != (len(dec.Brokers) > 0) {
				t.Errorf("v%d withEP=%v: has=%v ok=%v", v, withEP, has, ok)
			}
			if _, ok := ProduceHasEndpoints(body[:len(body)-1], v); ok {
				t.Errorf("v%d: truncated body accepted", v)
			}
		}
	}
}

// shareResponse builds a ShareFetch or ShareAcknowledge response at v with
// three topics of four partitions (records, acquired ranges, a moved
// leader on one), with NodeEndpoints when withEP.
func shareResponse(key, v int16, withEP bool) kmsg.Response {
	msg := "boom"
	switch key {
	case KeyShareFetch:
		r := kmsg.NewPtrShareFetchResponse()
		r.SetVersion(v)
		r.ErrorMessage = &msg
		r.AcquisitionLockTimeoutMillis = 30000
		for ti := range 3 {
			tp := kmsg.NewShareFetchResponseTopic()
			tp.TopicID[0] = byte(ti + 1)
			for pi := range 4 {
				p := kmsg.NewShareFetchResponseTopicPartition()
				p.Partition = int32(pi)
				p.ErrorMessage, p.AcknowledgeErrorMessage = &msg, &msg
				p.Records = make([]byte, 100*(pi+1))
				for a := range pi {
					ar := kmsg.NewShareFetchResponseTopicPartitionAcquiredRecord()
					ar.FirstOffset, ar.LastOffset, ar.DeliveryCount = int64(a*10), int64(a*10+9), 1
					p.AcquiredRecords = append(p.AcquiredRecords, ar)
				}
				if pi == 1 {
					p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = 3, 7
				}
				tp.Partitions = append(tp.Partitions, p)
			}
			r.Topics = append(r.Topics, tp)
		}
		if withEP {
			b := kmsg.NewShareFetchResponseNodeEndpoint()
			b.NodeID, b.Host, b.Port = 3, "upstream", 9092
			r.NodeEndpoints = append(r.NodeEndpoints, b)
		}
		return r
	default:
		r := kmsg.NewPtrShareAcknowledgeResponse()
		r.SetVersion(v)
		r.ErrorMessage = &msg
		r.AcquisitionLockTimeoutMillis = 30000
		for ti := range 3 {
			tp := kmsg.NewShareAcknowledgeResponseTopic()
			tp.TopicID[0] = byte(ti + 1)
			for pi := range 4 {
				p := kmsg.NewShareAcknowledgeResponseTopicPartition()
				p.Partition = int32(pi)
				p.ErrorMessage = &msg
				if pi == 1 {
					p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = 3, 7
				}
				tp.Partitions = append(tp.Partitions, p)
			}
			r.Topics = append(r.Topics, tp)
		}
		if withEP {
			b := kmsg.NewShareAcknowledgeResponseNodeEndpoint()
			b.NodeID, b.Host, b.Port = 3, "upstream", 9092
			r.NodeEndpoints = append(r.NodeEndpoints, b)
		}
		return r
	}
}

// TestShareHasEndpoints: the skim of ShareFetch and ShareAcknowledge
// responses agrees with kmsg's decoding at every version, and refuses a
// truncated body.
func TestShareHasEndpoints(t *testing.T) {
	for _, key := range []int16{KeyShareFetch, KeyShareAcknowledge} {
		for v := int16(0); v <= MaxVersion(key); v++ {
			for _, withEP := range []bool{false, true} {
				body := shareResponse(key, v, withEP).AppendTo(nil)
				has, ok := HasEndpoints(key, body, v)
				if !ok || has != withEP {
					t.Errorf("%s v%d withEP=%v: has=%v ok=%v", kmsg.NameForKey(key), v, withEP, has, ok)
				}
				if has, ok := HasEndpoints(key, body[:len(body)-1], v); ok && !has {
					t.Errorf("%s v%d withEP=%v: truncated body read as one without endpoints", kmsg.NameForKey(key), v, withEP)
				}
			}
		}
	}
}
