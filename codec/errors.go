package codec

import "github.com/twmb/franz-go/pkg/kmsg"

// GroupErrorResponse is the answer to the group request req that carries
// code everywhere a Kafka broker puts a coordinator error: at the top
// level, per group, or per partition, at req's version. The engine
// answers with it (NOT_COORDINATOR for a group it does not own, a store
// error) and so does the fleet's router (COORDINATOR_NOT_AVAILABLE when a
// group has no reachable owner). A request of another API gets its empty
// response.
func GroupErrorResponse(req kmsg.Request, code int16) kmsg.Response {
	resp := groupErrorResponse(req, code)
	resp.SetVersion(req.GetVersion())
	return resp
}

func groupErrorResponse(req kmsg.Request, code int16) kmsg.Response {
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		resp := kmsg.NewPtrJoinGroupResponse()
		resp.ErrorCode, resp.MemberID = code, r.MemberID
		return resp
	case *kmsg.SyncGroupRequest:
		resp := kmsg.NewPtrSyncGroupResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.HeartbeatRequest:
		resp := kmsg.NewPtrHeartbeatResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.LeaveGroupRequest:
		resp := kmsg.NewPtrLeaveGroupResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.OffsetCommitRequest:
		resp := kmsg.NewPtrOffsetCommitResponse()
		for _, t := range r.Topics {
			rt := kmsg.NewOffsetCommitResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetCommitResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	case *kmsg.TxnOffsetCommitRequest:
		resp := kmsg.NewPtrTxnOffsetCommitResponse()
		for _, t := range r.Topics {
			rt := kmsg.NewTxnOffsetCommitResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	case *kmsg.OffsetFetchRequest:
		resp := kmsg.NewPtrOffsetFetchResponse()
		if r.Version >= 8 {
			for _, g := range r.Groups {
				rg := kmsg.NewOffsetFetchResponseGroup()
				rg.Group, rg.ErrorCode = g.Group, code
				resp.Groups = append(resp.Groups, rg)
			}
		} else {
			resp.ErrorCode = code
			for _, t := range r.Topics {
				rt := kmsg.NewOffsetFetchResponseTopic()
				rt.Topic = t.Topic
				for _, p := range t.Partitions {
					rp := kmsg.NewOffsetFetchResponseTopicPartition()
					rp.Partition, rp.Offset, rp.LeaderEpoch, rp.ErrorCode = p, -1, -1, code
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
		}
		return resp
	case *kmsg.DescribeGroupsRequest:
		resp := kmsg.NewPtrDescribeGroupsResponse()
		for _, g := range r.Groups {
			rg := kmsg.NewDescribeGroupsResponseGroup()
			rg.Group, rg.ErrorCode = g, code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.ListGroupsRequest:
		resp := kmsg.NewPtrListGroupsResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.DeleteGroupsRequest:
		resp := kmsg.NewPtrDeleteGroupsResponse()
		for _, g := range r.Groups {
			rg := kmsg.NewDeleteGroupsResponseGroup()
			rg.Group, rg.ErrorCode = g, code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.OffsetDeleteRequest:
		resp := kmsg.NewPtrOffsetDeleteResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.ConsumerGroupHeartbeatRequest:
		resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.ConsumerGroupDescribeRequest:
		resp := kmsg.NewPtrConsumerGroupDescribeResponse()
		for _, g := range r.Groups {
			rg := kmsg.NewConsumerGroupDescribeResponseGroup()
			rg.Group, rg.ErrorCode = g, code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.ShareFetchRequest:
		resp := kmsg.NewPtrShareFetchResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.ShareAcknowledgeRequest:
		resp := kmsg.NewPtrShareAcknowledgeResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.ShareGroupHeartbeatRequest:
		resp := kmsg.NewPtrShareGroupHeartbeatResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.DescribeShareGroupOffsetsRequest:
		resp := kmsg.NewPtrDescribeShareGroupOffsetsResponse()
		for _, g := range r.Groups {
			rg := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
			rg.GroupID, rg.ErrorCode = g.GroupID, code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.AlterShareGroupOffsetsRequest:
		resp := kmsg.NewPtrAlterShareGroupOffsetsResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.DeleteShareGroupOffsetsRequest:
		resp := kmsg.NewPtrDeleteShareGroupOffsetsResponse()
		resp.ErrorCode = code
		return resp
	case *kmsg.ShareGroupDescribeRequest:
		resp := kmsg.NewPtrShareGroupDescribeResponse()
		for _, g := range r.GroupIDs {
			rg := kmsg.NewShareGroupDescribeResponseGroup()
			rg.GroupID, rg.ErrorCode = g, code
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.DescribeConfigsRequest:
		resp := kmsg.NewPtrDescribeConfigsResponse()
		for _, rr := range r.Resources {
			res := kmsg.NewDescribeConfigsResponseResource()
			res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, code
			resp.Resources = append(resp.Resources, res)
		}
		return resp
	case *kmsg.AlterConfigsRequest:
		resp := kmsg.NewPtrAlterConfigsResponse()
		for _, rr := range r.Resources {
			res := kmsg.NewAlterConfigsResponseResource()
			res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, code
			resp.Resources = append(resp.Resources, res)
		}
		return resp
	case *kmsg.IncrementalAlterConfigsRequest:
		resp := kmsg.NewPtrIncrementalAlterConfigsResponse()
		for _, rr := range r.Resources {
			res := kmsg.NewIncrementalAlterConfigsResponseResource()
			res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, code
			resp.Resources = append(resp.Resources, res)
		}
		return resp
	}
	return req.ResponseKind()
}
