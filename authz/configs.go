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
		denied := map[int]bool{}
		var keep []kmsg.DescribeConfigsRequestResource
		for i, rr := range r.Resources {
			if rr.ResourceType == kmsg.ConfigResourceTypeGroupConfig && !can(group, rr.ResourceName, kmsg.ACLOperationDescribeConfigs) {
				denied[i] = true
				continue
			}
			keep = append(keep, rr)
		}
		if len(denied) == 0 {
			return Decision{Pass: req}, true
		}
		pass := *r
		pass.Resources = keep
		merge := func(resp kmsg.Response) kmsg.Response {
			got, _ := resp.(*kmsg.DescribeConfigsResponse)
			out := r.ResponseKind().(*kmsg.DescribeConfigsResponse)
			j := 0
			for i, rr := range r.Resources {
				if denied[i] || got == nil || j >= len(got.Resources) {
					res := kmsg.NewDescribeConfigsResponseResource()
					res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, codeGroupAuth
					out.Resources = append(out.Resources, res)
					continue
				}
				out.Resources = append(out.Resources, got.Resources[j])
				j++
			}
			if got != nil {
				out.ThrottleMillis = got.ThrottleMillis
			}
			return out
		}
		if len(keep) == 0 {
			return Decision{Answer: merge(nil)}, true
		}
		return Decision{Pass: &pass, Finish: merge}, true
	case *kmsg.IncrementalAlterConfigsRequest:
		denied := map[int]bool{}
		var keep []kmsg.IncrementalAlterConfigsRequestResource
		for i, rr := range r.Resources {
			if rr.ResourceType == kmsg.ConfigResourceTypeGroupConfig && !can(group, rr.ResourceName, kmsg.ACLOperationAlterConfigs) {
				denied[i] = true
				continue
			}
			keep = append(keep, rr)
		}
		if len(denied) == 0 {
			return Decision{Pass: req}, true
		}
		pass := *r
		pass.Resources = keep
		merge := func(resp kmsg.Response) kmsg.Response {
			got, _ := resp.(*kmsg.IncrementalAlterConfigsResponse)
			out := r.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
			j := 0
			for i, rr := range r.Resources {
				if denied[i] || got == nil || j >= len(got.Resources) {
					res := kmsg.NewIncrementalAlterConfigsResponseResource()
					res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, codeGroupAuth
					out.Resources = append(out.Resources, res)
					continue
				}
				out.Resources = append(out.Resources, got.Resources[j])
				j++
			}
			return out
		}
		if len(keep) == 0 {
			return Decision{Answer: merge(nil)}, true
		}
		return Decision{Pass: &pass, Finish: merge}, true
	case *kmsg.AlterConfigsRequest:
		denied := map[int]bool{}
		var keep []kmsg.AlterConfigsRequestResource
		for i, rr := range r.Resources {
			if rr.ResourceType == kmsg.ConfigResourceTypeGroupConfig && !can(group, rr.ResourceName, kmsg.ACLOperationAlterConfigs) {
				denied[i] = true
				continue
			}
			keep = append(keep, rr)
		}
		if len(denied) == 0 {
			return Decision{Pass: req}, true
		}
		pass := *r
		pass.Resources = keep
		merge := func(resp kmsg.Response) kmsg.Response {
			got, _ := resp.(*kmsg.AlterConfigsResponse)
			out := r.ResponseKind().(*kmsg.AlterConfigsResponse)
			j := 0
			for i, rr := range r.Resources {
				if denied[i] || got == nil || j >= len(got.Resources) {
					res := kmsg.NewAlterConfigsResponseResource()
					res.ResourceType, res.ResourceName, res.ErrorCode = rr.ResourceType, rr.ResourceName, codeGroupAuth
					out.Resources = append(out.Resources, res)
					continue
				}
				out.Resources = append(out.Resources, got.Resources[j])
				j++
			}
			return out
		}
		if len(keep) == 0 {
			return Decision{Answer: merge(nil)}, true
		}
		return Decision{Pass: &pass, Finish: merge}, true
	}
	return Decision{}, false
}
