package authz

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// groupConfigs authorizes a DescribeConfigs, AlterConfigs or
// IncrementalAlterConfigs whose resources are GROUP configs (kproxy
// answers those itself for a cluster without GROUP configs) as Kafka's
// KafkaApis does from 4.0: DESCRIBE_CONFIGS on the group to describe it
// (ALTER_CONFIGS implies it), ALTER_CONFIGS to alter it; a denied
// resource is answered GROUP_AUTHORIZATION_FAILED and the others go on.
// A 3.x cluster holds such ACLs: its CreateAcls takes any operation on a
// GROUP resource (Kafka's 3.x kafka-acls tool offers only READ,
// DESCRIBE and DELETE for groups; the admin API is not so limited).
// ok is false for any other request.
func groupConfigs(req kmsg.Request, can Can) (d Decision, ok bool) {
	switch r := req.(type) {
	case *kmsg.DescribeConfigsRequest:
		return configSplit[kmsg.DescribeConfigsRequestResource, kmsg.DescribeConfigsResponseResource]{
			req: r, resources: r.Resources, op: kmsg.ACLOperationDescribeConfigs,
			group: func(rr kmsg.DescribeConfigsRequestResource) (kmsg.ConfigResourceType, string) {
				return rr.ResourceType, rr.ResourceName
			},
			denied: func(rr kmsg.DescribeConfigsRequestResource) kmsg.DescribeConfigsResponseResource {
				res := kmsg.NewDescribeConfigsResponseResource()
				res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, codeGroupAuth
				return res
			},
			narrow: func(keep []kmsg.DescribeConfigsRequestResource) kmsg.Request {
				cp := *r
				cp.Resources = keep
				return &cp
			},
			answers: func(resp kmsg.Response) *[]kmsg.DescribeConfigsResponseResource {
				if dr, ok := resp.(*kmsg.DescribeConfigsResponse); ok {
					return &dr.Resources
				}
				return nil
			},
		}.decide(can), true
	case *kmsg.IncrementalAlterConfigsRequest:
		return configSplit[kmsg.IncrementalAlterConfigsRequestResource, kmsg.IncrementalAlterConfigsResponseResource]{
			req: r, resources: r.Resources, op: kmsg.ACLOperationAlterConfigs,
			group: func(rr kmsg.IncrementalAlterConfigsRequestResource) (kmsg.ConfigResourceType, string) {
				return rr.ResourceType, rr.ResourceName
			},
			denied: func(rr kmsg.IncrementalAlterConfigsRequestResource) kmsg.IncrementalAlterConfigsResponseResource {
				res := kmsg.NewIncrementalAlterConfigsResponseResource()
				res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, codeGroupAuth
				return res
			},
			narrow: func(keep []kmsg.IncrementalAlterConfigsRequestResource) kmsg.Request {
				cp := *r
				cp.Resources = keep
				return &cp
			},
			answers: func(resp kmsg.Response) *[]kmsg.IncrementalAlterConfigsResponseResource {
				if ar, ok := resp.(*kmsg.IncrementalAlterConfigsResponse); ok {
					return &ar.Resources
				}
				return nil
			},
		}.decide(can), true
	case *kmsg.AlterConfigsRequest:
		return configSplit[kmsg.AlterConfigsRequestResource, kmsg.AlterConfigsResponseResource]{
			req: r, resources: r.Resources, op: kmsg.ACLOperationAlterConfigs,
			group: func(rr kmsg.AlterConfigsRequestResource) (kmsg.ConfigResourceType, string) {
				return rr.ResourceType, rr.ResourceName
			},
			denied: func(rr kmsg.AlterConfigsRequestResource) kmsg.AlterConfigsResponseResource {
				res := kmsg.NewAlterConfigsResponseResource()
				res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, codeGroupAuth
				return res
			},
			narrow: func(keep []kmsg.AlterConfigsRequestResource) kmsg.Request { cp := *r; cp.Resources = keep; return &cp },
			answers: func(resp kmsg.Response) *[]kmsg.AlterConfigsResponseResource {
				if ar, ok := resp.(*kmsg.AlterConfigsResponse); ok {
					return &ar.Resources
				}
				return nil
			},
		}.decide(can), true
	}
	return Decision{}, false
}

// configSplit is one config request's resources R (answered with A),
// split by the group authorization of its GROUP ones, as groupSplit
// splits a request's groups (the other resources are not the group
// authorizer's to judge, and always pass).
type configSplit[R, A any] struct {
	req       kmsg.Request
	resources []R
	op        kmsg.ACLOperation
	// group is a resource's type and name.
	group func(R) (kmsg.ConfigResourceType, string)
	// denied is a denied resource's answer.
	denied func(R) A
	// narrow is req with only the resources kept.
	narrow func(keep []R) kmsg.Request
	// answers is an answer's resources; nil for an answer of another
	// type.
	answers func(kmsg.Response) *[]A
}

// decide passes req as it is when no resource is denied; answers it
// here when every one is; else passes the others and puts the denied
// back in their places in the answer.
func (s configSplit[R, A]) decide(can Can) Decision {
	deniedAt := make([]bool, len(s.resources))
	var keep []R
	for i, rr := range s.resources {
		if typ, name := s.group(rr); typ == kmsg.ConfigResourceTypeGroupConfig && !can(group, name, s.op) {
			deniedAt[i] = true
			continue
		}
		keep = append(keep, rr)
	}
	if len(keep) == len(s.resources) {
		return Decision{Pass: s.req}
	}
	merge := func(got []A) []A {
		out := make([]A, 0, len(s.resources))
		next := 0
		for i, rr := range s.resources {
			if deniedAt[i] || next >= len(got) {
				out = append(out, s.denied(rr))
				continue
			}
			out = append(out, got[next])
			next++
		}
		return out
	}
	whole := func() kmsg.Response {
		resp := s.req.ResponseKind() // at req's version
		*s.answers(resp) = merge(nil)
		return resp
	}
	if len(keep) == 0 {
		return Decision{Answer: whole()}
	}
	return Decision{Pass: s.narrow(keep), Finish: func(resp kmsg.Response) kmsg.Response {
		if as := s.answers(resp); as != nil {
			*as = merge(*as)
			return resp
		}
		return whole()
	}}
}
