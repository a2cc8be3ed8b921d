package authz

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// The share-group requests (KIP-932) kproxy serves itself, authorized as
// Kafka 4.4's KafkaApis authorizes them:
//
//   - ShareGroupHeartbeat: READ on the group;
//   - ShareGroupDescribe, DescribeShareGroupOffsets: DESCRIBE on each
//     group;
//   - AlterShareGroupOffsets: READ on the group; DeleteShareGroupOffsets:
//     DELETE on the group;
//   - ShareFetch, ShareAcknowledge: READ on the group (else the whole
//     request is GROUP_AUTHORIZATION_FAILED), and READ on each topic: a
//     topic the principal may not read is left out of the request and
//     answered TOPIC_AUTHORIZATION_FAILED, so no record of it reaches
//     the client.

// shareRequest authorizes a share-group request; ok=false for a request
// of another kind.
func shareRequest(req kmsg.Request, can Can, name TopicName) (Decision, bool) {
	deny := func() Decision { return Decision{Answer: codec.GroupErrorResponse(req, codeGroupAuth)} }
	switch r := req.(type) {
	case *kmsg.ShareGroupHeartbeatRequest:
		if !can(group, r.GroupID, read) {
			return deny(), true
		}
	case *kmsg.ShareGroupDescribeRequest:
		return shareDescribe(r, can), true
	case *kmsg.DescribeShareGroupOffsetsRequest:
		for _, g := range r.Groups {
			if !can(group, g.GroupID, desc) {
				return deny(), true
			}
		}
	case *kmsg.AlterShareGroupOffsetsRequest:
		if !can(group, r.GroupID, read) {
			return deny(), true
		}
	case *kmsg.DeleteShareGroupOffsetsRequest:
		if !can(group, r.GroupID, del) {
			return deny(), true
		}
	case *kmsg.ShareFetchRequest:
		if r.GroupID == nil || !can(group, *r.GroupID, read) {
			resp := kmsg.NewPtrShareFetchResponse()
			resp.SetVersion(r.Version)
			resp.ErrorCode = codeGroupAuth
			return Decision{Answer: resp}, true
		}
		return shareFetch(r, can, name), true
	case *kmsg.ShareAcknowledgeRequest:
		if r.GroupID == nil || !can(group, *r.GroupID, read) {
			resp := kmsg.NewPtrShareAcknowledgeResponse()
			resp.SetVersion(r.Version)
			resp.ErrorCode = codeGroupAuth
			return Decision{Answer: resp}, true
		}
		return shareAcknowledge(r, can, name), true
	default:
		return Decision{}, false
	}
	return Decision{Pass: req}, true
}

// readable reports whether the principal may read the topic of id.
func readable(id [16]byte, can Can, name TopicName) bool {
	if id == ([16]byte{}) {
		return false
	}
	n, ok := topicOf("", id, name)
	return ok && can(topic, n, read)
}

// shareDescribe answers the denied groups of a ShareGroupDescribe and
// passes the others.
func shareDescribe(r *kmsg.ShareGroupDescribeRequest, can Can) Decision {
	type G = kmsg.ShareGroupDescribeResponseGroup
	return groupSplit[G]{req: r, names: r.GroupIDs, op: desc,
		denied: func(g string) G {
			rg := kmsg.NewShareGroupDescribeResponseGroup()
			rg.GroupID, rg.ErrorCode = g, codeGroupAuth
			return rg
		},
		narrow: func(allowed []string) kmsg.Request { cp := *r; cp.GroupIDs = allowed; return &cp },
		groups: func(resp kmsg.Response) *[]G {
			if dr, ok := resp.(*kmsg.ShareGroupDescribeResponse); ok {
				return &dr.Groups
			}
			return nil
		},
	}.decide(can)
}

// shareFetch leaves out the topics the principal may not read and
// answers their partitions TOPIC_AUTHORIZATION_FAILED (their
// acknowledgements too).
func shareFetch(r *kmsg.ShareFetchRequest, can Can, name TopicName) Decision {
	return shareTopics(r, r.Topics, can, name,
		func(t kmsg.ShareFetchRequestTopic) [16]byte { return t.TopicID },
		func(t kmsg.ShareFetchRequestTopic) kmsg.ShareFetchResponseTopic {
			rt := kmsg.NewShareFetchResponseTopic()
			rt.TopicID = t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewShareFetchResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, codeTopicAuth
				if len(p.AcknowledgementBatches) > 0 {
					rp.AcknowledgeErrorCode = codeTopicAuth
				}
				rp.CurrentLeader.LeaderID, rp.CurrentLeader.LeaderEpoch = -1, -1
				rt.Partitions = append(rt.Partitions, rp)
			}
			return rt
		},
		func(keep []kmsg.ShareFetchRequestTopic) kmsg.Request {
			cp := *r
			cp.Topics = keep
			return &cp
		},
		func(resp kmsg.Response, denied []kmsg.ShareFetchResponseTopic) {
			if fr, ok := resp.(*kmsg.ShareFetchResponse); ok && fr.ErrorCode == 0 {
				fr.Topics = append(fr.Topics, denied...)
			}
		})
}

// shareAcknowledge leaves out the topics the principal may not read and
// answers their partitions TOPIC_AUTHORIZATION_FAILED.
func shareAcknowledge(r *kmsg.ShareAcknowledgeRequest, can Can, name TopicName) Decision {
	return shareTopics(r, r.Topics, can, name,
		func(t kmsg.ShareAcknowledgeRequestTopic) [16]byte { return t.TopicID },
		func(t kmsg.ShareAcknowledgeRequestTopic) kmsg.ShareAcknowledgeResponseTopic {
			rt := kmsg.NewShareAcknowledgeResponseTopic()
			rt.TopicID = t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewShareAcknowledgeResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, codeTopicAuth
				rp.CurrentLeader.LeaderID, rp.CurrentLeader.LeaderEpoch = -1, -1
				rt.Partitions = append(rt.Partitions, rp)
			}
			return rt
		},
		func(keep []kmsg.ShareAcknowledgeRequestTopic) kmsg.Request {
			cp := *r
			cp.Topics = keep
			return &cp
		},
		func(resp kmsg.Response, denied []kmsg.ShareAcknowledgeResponseTopic) {
			if ar, ok := resp.(*kmsg.ShareAcknowledgeResponse); ok && ar.ErrorCode == 0 {
				ar.Topics = append(ar.Topics, denied...)
			}
		})
}

// shareTopics is the topic filter of ShareFetch and ShareAcknowledge: of
// r's topics (request topics T, named by id), those the principal may
// not read are left out of what passes (keep builds that request) and
// answered as deny builds them (answer topics D), added to the answer by
// add (which leaves them out of an answer that failed as a whole). With
// every topic readable, r passes as it is.
func shareTopics[T, D any](r kmsg.Request, topics []T, can Can, name TopicName,
	id func(T) [16]byte, deny func(T) D, keep func([]T) kmsg.Request, add func(kmsg.Response, []D)) Decision {
	var kept []T
	var denied []D
	for _, t := range topics {
		if readable(id(t), can, name) {
			kept = append(kept, t)
		} else {
			denied = append(denied, deny(t))
		}
	}
	if len(denied) == 0 {
		return Decision{Pass: r}
	}
	return Decision{Pass: keep(kept), Finish: func(resp kmsg.Response) kmsg.Response {
		add(resp, denied)
		return resp
	}}
}
