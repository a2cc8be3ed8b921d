package authz

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// ClusterName is the name of the CLUSTER resource in ACLs.
const ClusterName = "kafka-cluster"

// Can answers one authorization question for the principal a request
// came from: may it perform op on the resource of type rt named name.
type Can func(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool

// TopicName names a topic the request gives by id (OffsetCommit and
// OffsetFetch v10); ok=false when the id cannot be named, and the topic
// is then denied.
type TopicName func(id [16]byte) (name string, ok bool)

// Decision is what Authorize makes of one group request: either the
// whole answer (Answer set: the request goes no further, no group state
// is touched), or the request to hand on, without the groups and topics
// the principal may not use, and Finish to turn its answer into the
// client's (the denied parts merged back, ListGroups and all-topics
// OffsetFetch answers filtered).
type Decision struct {
	Answer kmsg.Response
	Pass   kmsg.Request
	// Finish edits the answer to Pass into the client's; nil leaves it
	// as it is.
	Finish func(kmsg.Response) kmsg.Response
}

const (
	read = kmsg.ACLOperationRead
	desc = kmsg.ACLOperationDescribe
	del  = kmsg.ACLOperationDelete
)

var (
	codeGroupAuth = kerr.GroupAuthorizationFailed.Code
	codeTopicAuth = kerr.TopicAuthorizationFailed.Code
	codeTxnAuth   = kerr.TransactionalIDAuthorizationFailed.Code
)

const (
	group = kmsg.ACLResourceTypeGroup
	topic = kmsg.ACLResourceTypeTopic
)

// Authorize applies to req the checks a Kafka broker's KafkaApis makes
// before its group coordinator sees the request (see the package
// comment's table), asking can for each. Requests of other APIs pass
// unchanged.
func Authorize(req kmsg.Request, can Can, name TopicName) Decision {
	deny := func() Decision { return Decision{Answer: codec.GroupErrorResponse(req, codeGroupAuth)} }
	pass := Decision{Pass: req}
	if d, ok := shareRequest(req, can, name); ok {
		return d
	}
	if d, ok := groupConfigs(req, can); ok {
		return d
	}
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		if !can(group, r.Group, read) {
			return deny()
		}
	case *kmsg.SyncGroupRequest:
		if !can(group, r.Group, read) {
			return deny()
		}
	case *kmsg.HeartbeatRequest:
		if !can(group, r.Group, read) {
			return deny()
		}
	case *kmsg.LeaveGroupRequest:
		if !can(group, r.Group, read) {
			return deny()
		}
	case *kmsg.ConsumerGroupHeartbeatRequest:
		if !can(group, r.Group, read) {
			return deny()
		}
	case *kmsg.OffsetCommitRequest:
		if !can(group, r.Group, read) {
			return deny()
		}
		return offsetCommit(r, can, name)
	case *kmsg.TxnOffsetCommitRequest:
		if !can(kmsg.ACLResourceTypeTransactionalId, r.TransactionalID, kmsg.ACLOperationWrite) {
			return Decision{Answer: codec.GroupErrorResponse(req, codeTxnAuth)}
		}
		if !can(group, r.Group, read) {
			return deny()
		}
		return txnOffsetCommit(r, can)
	case *kmsg.OffsetFetchRequest:
		return offsetFetch(r, can, name)
	case *kmsg.DescribeGroupsRequest:
		return describeGroups(r, can)
	case *kmsg.ConsumerGroupDescribeRequest:
		return consumerGroupDescribe(r, can)
	case *kmsg.ListGroupsRequest:
		if can(kmsg.ACLResourceTypeCluster, ClusterName, desc) {
			return pass
		}
		pass.Finish = func(resp kmsg.Response) kmsg.Response {
			if lr, ok := resp.(*kmsg.ListGroupsResponse); ok {
				keep := lr.Groups[:0]
				for _, g := range lr.Groups {
					if can(group, g.Group, desc) {
						keep = append(keep, g)
					}
				}
				lr.Groups = keep
			}
			return resp
		}
	case *kmsg.DeleteGroupsRequest:
		return deleteGroups(r, can)
	case *kmsg.OffsetDeleteRequest:
		if !can(group, r.Group, del) {
			return deny()
		}
		return offsetDelete(r, can)
	}
	return pass
}

// FindCoordinatorCode is the error a FindCoordinator key of keyType
// gets before any lookup: GROUP_AUTHORIZATION_FAILED for a group
// without DESCRIBE, TRANSACTIONAL_ID_AUTHORIZATION_FAILED for a
// transactional id without DESCRIBE, else 0.
func FindCoordinatorCode(can Can, keyType int8, key string) int16 {
	switch keyType {
	case 0:
		if !can(group, key, desc) {
			return codeGroupAuth
		}
	case 1:
		if !can(kmsg.ACLResourceTypeTransactionalId, key, desc) {
			return codeTxnAuth
		}
	}
	return 0
}

// topicOf is a request topic's name: its own, else its id's.
func topicOf(n string, id [16]byte, name TopicName) (string, bool) {
	if n != "" || id == ([16]byte{}) {
		return n, true
	}
	if name == nil {
		return "", false
	}
	return name(id)
}

func offsetCommit(r *kmsg.OffsetCommitRequest, can Can, name TopicName) Decision {
	return commitTopics(r, r.Topics,
		func(t kmsg.OffsetCommitRequestTopic) bool {
			n, ok := topicOf(t.Topic, t.TopicID, name)
			return ok && can(topic, n, read)
		},
		func(ts []kmsg.OffsetCommitRequestTopic) kmsg.Request { cp := *r; cp.Topics = ts; return &cp },
		func(resp kmsg.Response) *[]kmsg.OffsetCommitResponseTopic {
			if cr, ok := resp.(*kmsg.OffsetCommitResponse); ok {
				return &cr.Topics
			}
			return nil
		})
}

func txnOffsetCommit(r *kmsg.TxnOffsetCommitRequest, can Can) Decision {
	return commitTopics(r, r.Topics,
		func(t kmsg.TxnOffsetCommitRequestTopic) bool { return can(topic, t.Topic, read) },
		func(ts []kmsg.TxnOffsetCommitRequestTopic) kmsg.Request { cp := *r; cp.Topics = ts; return &cp },
		func(resp kmsg.Response) *[]kmsg.TxnOffsetCommitResponseTopic {
			if cr, ok := resp.(*kmsg.TxnOffsetCommitResponse); ok {
				return &cr.Topics
			}
			return nil
		})
}

// commitTopics is the topic filter of OffsetCommit and TxnOffsetCommit:
// of r's topics (request topics T), those allowed does not allow are
// left out of what passes (with builds r with other topics) and answered
// TOPIC_AUTHORIZATION_FAILED ahead of the coordinator's answer (answer
// topics D, topicsOf: an answer's topics, nil for an answer of another
// type). With no topic allowed the answer is whole here: as the broker,
// nothing is left to commit and the coordinator is not asked. With
// every topic allowed, r passes as it is.
func commitTopics[T, D any](r kmsg.Request, topics []T, allowed func(T) bool,
	with func([]T) kmsg.Request, topicsOf func(kmsg.Response) *[]D) Decision {
	var kept, refused []T
	for _, t := range topics {
		if allowed(t) {
			kept = append(kept, t)
		} else {
			refused = append(refused, t)
		}
	}
	denied := *topicsOf(codec.GroupErrorResponse(with(refused), codeTopicAuth))
	if len(kept) == 0 {
		resp := r.ResponseKind() // at r's version
		*topicsOf(resp) = denied
		return Decision{Answer: resp}
	}
	if len(denied) == 0 {
		return Decision{Pass: r}
	}
	return Decision{Pass: with(kept), Finish: func(resp kmsg.Response) kmsg.Response {
		if ts := topicsOf(resp); ts != nil {
			*ts = append(denied, *ts...)
		}
		return resp
	}}
}

func offsetDelete(r *kmsg.OffsetDeleteRequest, can Can) Decision {
	var allowed []kmsg.OffsetDeleteRequestTopic
	var denied []kmsg.OffsetDeleteResponseTopic
	for _, t := range r.Topics {
		if can(topic, t.Topic, read) {
			allowed = append(allowed, t)
			continue
		}
		rt := kmsg.NewOffsetDeleteResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewOffsetDeleteResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, codeTopicAuth
			rt.Partitions = append(rt.Partitions, rp)
		}
		denied = append(denied, rt)
	}
	if len(denied) == 0 {
		return Decision{Pass: r}
	}
	// Even with no topic left the coordinator is asked, as by the
	// broker: it still answers for the group (GROUP_ID_NOT_FOUND...).
	cp := *r
	cp.Topics = allowed
	if cp.Topics == nil {
		cp.Topics = []kmsg.OffsetDeleteRequestTopic{}
	}
	return Decision{Pass: &cp, Finish: func(resp kmsg.Response) kmsg.Response {
		if dr, ok := resp.(*kmsg.OffsetDeleteResponse); ok && dr.ErrorCode == 0 {
			dr.Topics = append(denied, dr.Topics...)
		}
		return resp
	}}
}

// fetchGroup is one group of an OffsetFetch v8+, as authorized.
type fetchGroup struct {
	denied bool                                 // no GROUP DESCRIBE: answered GROUP_AUTHORIZATION_FAILED
	all    bool                                 // every topic asked: the answer is filtered
	groupT []kmsg.OffsetFetchRequestGroupTopic  // the topics the principal may describe
	hidden []kmsg.OffsetFetchResponseGroupTopic // the others, answered TOPIC_AUTHORIZATION_FAILED
}

func offsetFetch(r *kmsg.OffsetFetchRequest, can Can, name TopicName) Decision {
	if r.Version < 8 {
		if !can(group, r.Group, desc) {
			return Decision{Answer: codec.GroupErrorResponse(r, codeGroupAuth)}
		}
		if r.Topics == nil {
			return Decision{Pass: r, Finish: func(resp kmsg.Response) kmsg.Response {
				if fr, ok := resp.(*kmsg.OffsetFetchResponse); ok {
					keep := fr.Topics[:0]
					for _, t := range fr.Topics {
						if can(topic, t.Topic, desc) {
							keep = append(keep, t)
						}
					}
					fr.Topics = keep
				}
				return resp
			}}
		}
		allowed := []kmsg.OffsetFetchRequestTopic{}
		var refused []kmsg.OffsetFetchRequestTopic
		for _, t := range r.Topics {
			if can(topic, t.Topic, desc) {
				allowed = append(allowed, t)
			} else {
				refused = append(refused, t)
			}
		}
		dr := *r
		dr.Topics = refused
		denied := codec.GroupErrorResponse(&dr, codeTopicAuth).(*kmsg.OffsetFetchResponse).Topics
		if len(denied) == 0 {
			return Decision{Pass: r}
		}
		cp := *r
		cp.Topics = allowed
		return Decision{Pass: &cp, Finish: func(resp kmsg.Response) kmsg.Response {
			if fr, ok := resp.(*kmsg.OffsetFetchResponse); ok && fr.ErrorCode == 0 {
				fr.Topics = append(fr.Topics, denied...)
			}
			return resp
		}}
	}
	groups := make([]fetchGroup, len(r.Groups))
	var pass []kmsg.OffsetFetchRequestGroup
	changed := false
	for i, g := range r.Groups {
		fg := &groups[i]
		if !can(group, g.Group, desc) {
			fg.denied, changed = true, true
			continue
		}
		if g.Topics == nil {
			fg.all, changed = true, true
			pass = append(pass, g)
			continue
		}
		fg.groupT = []kmsg.OffsetFetchRequestGroupTopic{}
		for _, t := range g.Topics {
			if n, ok := topicOf(t.Topic, t.TopicID, name); ok && can(topic, n, desc) {
				fg.groupT = append(fg.groupT, t)
				continue
			}
			rt := kmsg.NewOffsetFetchResponseGroupTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetFetchResponseGroupTopicPartition()
				rp.Partition, rp.Offset, rp.LeaderEpoch, rp.ErrorCode = p, -1, -1, codeTopicAuth
				rt.Partitions = append(rt.Partitions, rp)
			}
			fg.hidden = append(fg.hidden, rt)
			changed = true
		}
		pg := g
		pg.Topics = fg.groupT
		pass = append(pass, pg)
	}
	if !changed {
		return Decision{Pass: r}
	}
	merge := func(inner []kmsg.OffsetFetchResponseGroup) []kmsg.OffsetFetchResponseGroup {
		out := make([]kmsg.OffsetFetchResponseGroup, 0, len(r.Groups))
		next := 0
		for i, g := range r.Groups {
			fg := &groups[i]
			if fg.denied {
				rg := kmsg.NewOffsetFetchResponseGroup()
				rg.Group, rg.ErrorCode = g.Group, codeGroupAuth
				out = append(out, rg)
				continue
			}
			if next >= len(inner) {
				continue
			}
			rg := inner[next]
			next++
			switch {
			case rg.ErrorCode != 0:
			case fg.all:
				keep := rg.Topics[:0]
				for _, t := range rg.Topics {
					if n, ok := topicOf(t.Topic, t.TopicID, name); ok && can(topic, n, desc) {
						keep = append(keep, t)
					}
				}
				rg.Topics = keep
			default:
				rg.Topics = append(rg.Topics, fg.hidden...)
			}
			out = append(out, rg)
		}
		return append(out, inner[min(next, len(inner)):]...)
	}
	if len(pass) == 0 {
		resp := kmsg.NewPtrOffsetFetchResponse()
		resp.SetVersion(r.Version)
		resp.Groups = merge(nil)
		return Decision{Answer: resp}
	}
	cp := *r
	cp.Groups = pass
	return Decision{Pass: &cp, Finish: func(resp kmsg.Response) kmsg.Response {
		if fr, ok := resp.(*kmsg.OffsetFetchResponse); ok {
			fr.Groups = merge(fr.Groups)
		}
		return resp
	}}
}

// groupOps are the operations on a group whose bits an answer's
// authorized_operations carries (Kafka's AclEntry.supportedOperations
// for GROUP).
var groupOps = []kmsg.ACLOperation{read, desc, del}

// authorizedOps is the KIP-430 bit field of what the principal may do
// with the group.
func authorizedOps(can Can, g string) int32 {
	var bits int32
	for _, op := range groupOps {
		if can(group, g, op) {
			bits |= 1 << uint(op)
		}
	}
	return bits
}

// groupSplit is the authorization of a request naming several groups
// (DescribeGroups, ConsumerGroupDescribe, DeleteGroups,
// ShareGroupDescribe), over its answer's per-group entries G: the
// groups the principal may not perform op on are answered
// GROUP_AUTHORIZATION_FAILED in their place and the others pass, as a
// broker's KafkaApis splits them before its coordinator sees the
// request. It takes a function per field of kmsg's structs, as
// shareTopics does.
type groupSplit[G any] struct {
	req   kmsg.Request
	names []string // req's groups, in order
	op    kmsg.ACLOperation
	// denied is a denied group's answer.
	denied func(name string) G
	// narrow is req with only the allowed groups.
	narrow func(allowed []string) kmsg.Request
	// groups is the answer's groups (an answer of req's kind, or the
	// one decide builds from req.ResponseKind()); nil for an answer of
	// another type.
	groups func(kmsg.Response) *[]G
	// ops, set when the request asks for the groups' authorized
	// operations (KIP-430), is an answered group's error code, name and
	// field for them; decide fills it where the code is 0.
	ops func(*G) (code int16, group string, field *int32)
}

// decide splits s.names: with every group allowed (and no operations
// to fill) req passes as it is; with every group denied the answer is
// whole here; else the allowed pass and Finish puts the denied back in
// their places.
func (s groupSplit[G]) decide(can Can) Decision {
	var allowed []string
	deniedAt := make([]bool, len(s.names))
	anyDenied := false
	for i, g := range s.names {
		if can(group, g, s.op) {
			allowed = append(allowed, g)
		} else {
			deniedAt[i], anyDenied = true, true
		}
	}
	if !anyDenied && s.ops == nil {
		return Decision{Pass: s.req}
	}
	merge := func(inner []G) []G {
		out := make([]G, 0, len(s.names))
		next := 0
		for i, g := range s.names {
			if deniedAt[i] {
				out = append(out, s.denied(g))
				continue
			}
			if next < len(inner) {
				rg := inner[next]
				next++
				if s.ops != nil {
					if code, g, field := s.ops(&rg); code == 0 {
						*field = authorizedOps(can, g)
					}
				}
				out = append(out, rg)
			}
		}
		return append(out, inner[min(next, len(inner)):]...)
	}
	if anyDenied && len(allowed) == 0 {
		resp := s.req.ResponseKind() // at req's version
		*s.groups(resp) = merge(nil)
		return Decision{Answer: resp}
	}
	pass := s.req
	if anyDenied {
		pass = s.narrow(allowed)
	}
	return Decision{Pass: pass, Finish: func(resp kmsg.Response) kmsg.Response {
		if gs := s.groups(resp); gs != nil {
			*gs = merge(*gs)
		}
		return resp
	}}
}

func describeGroups(r *kmsg.DescribeGroupsRequest, can Can) Decision {
	type G = kmsg.DescribeGroupsResponseGroup
	s := groupSplit[G]{req: r, names: r.Groups, op: desc,
		denied: func(g string) G {
			rg := kmsg.NewDescribeGroupsResponseGroup()
			rg.Group, rg.ErrorCode = g, codeGroupAuth
			return rg
		},
		narrow: func(allowed []string) kmsg.Request { cp := *r; cp.Groups = allowed; return &cp },
		groups: func(resp kmsg.Response) *[]G {
			if dr, ok := resp.(*kmsg.DescribeGroupsResponse); ok {
				return &dr.Groups
			}
			return nil
		},
	}
	if r.IncludeAuthorizedOperations {
		s.ops = func(rg *G) (int16, string, *int32) { return rg.ErrorCode, rg.Group, &rg.AuthorizedOperations }
	}
	return s.decide(can)
}

func consumerGroupDescribe(r *kmsg.ConsumerGroupDescribeRequest, can Can) Decision {
	type G = kmsg.ConsumerGroupDescribeResponseGroup
	s := groupSplit[G]{req: r, names: r.Groups, op: desc,
		denied: func(g string) G {
			rg := kmsg.NewConsumerGroupDescribeResponseGroup()
			rg.Group, rg.ErrorCode = g, codeGroupAuth
			return rg
		},
		narrow: func(allowed []string) kmsg.Request { cp := *r; cp.Groups = allowed; return &cp },
		groups: func(resp kmsg.Response) *[]G {
			if dr, ok := resp.(*kmsg.ConsumerGroupDescribeResponse); ok {
				return &dr.Groups
			}
			return nil
		},
	}
	if r.IncludeAuthorizedOperations {
		s.ops = func(rg *G) (int16, string, *int32) { return rg.ErrorCode, rg.Group, &rg.AuthorizedOperations }
	}
	return s.decide(can)
}

func deleteGroups(r *kmsg.DeleteGroupsRequest, can Can) Decision {
	type G = kmsg.DeleteGroupsResponseGroup
	return groupSplit[G]{req: r, names: r.Groups, op: del,
		denied: func(g string) G {
			rg := kmsg.NewDeleteGroupsResponseGroup()
			rg.Group, rg.ErrorCode = g, codeGroupAuth
			return rg
		},
		narrow: func(allowed []string) kmsg.Request { cp := *r; cp.Groups = allowed; return &cp },
		groups: func(resp kmsg.Response) *[]G {
			if dr, ok := resp.(*kmsg.DeleteGroupsResponse); ok {
				return &dr.Groups
			}
			return nil
		},
	}.decide(can)
}
