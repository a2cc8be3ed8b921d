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
