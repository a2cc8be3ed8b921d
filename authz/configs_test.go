package authz

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestGroupConfigsAuthorized: GROUP configs are described with
// DESCRIBE_CONFIGS (or ALTER_CONFIGS) on the group and altered with
// ALTER_CONFIGS; a denied group is answered GROUP_AUTHORIZATION_FAILED
// in its place, the others go on.
func TestGroupConfigsAuthorized(t *testing.T) {
	can := func(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool {
		return rt == kmsg.ACLResourceTypeGroup && name == "mine" &&
			(op == kmsg.ACLOperationDescribeConfigs || op == kmsg.ACLOperationAlterConfigs)
	}
	desc := kmsg.NewPtrDescribeConfigsRequest()
	for _, g := range []string{"theirs", "mine"} {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, g
		desc.Resources = append(desc.Resources, r)
	}
	d := Authorize(desc, can, nil)
	pass, ok := d.Pass.(*kmsg.DescribeConfigsRequest)
	if d.Answer != nil || !ok || len(pass.Resources) != 1 || pass.Resources[0].ResourceName != "mine" || d.Finish == nil {
		t.Fatalf("describe: %+v", d)
	}
	inner := kmsg.NewPtrDescribeConfigsResponse()
	rr := kmsg.NewDescribeConfigsResponseResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeGroupConfig, "mine"
	inner.Resources = append(inner.Resources, rr)
	out := d.Finish(inner).(*kmsg.DescribeConfigsResponse)
	if len(out.Resources) != 2 || out.Resources[0].ResourceName != "theirs" || out.Resources[0].ErrorCode != kerr.GroupAuthorizationFailed.Code ||
		out.Resources[1].ResourceName != "mine" || out.Resources[1].ErrorCode != 0 {
		t.Errorf("describe answer: %+v", out.Resources)
	}

	alter := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, "theirs"
	alter.Resources = append(alter.Resources, r)
	d = Authorize(alter, can, nil)
	ans, ok := d.Answer.(*kmsg.IncrementalAlterConfigsResponse)
	if !ok || len(ans.Resources) != 1 || ans.Resources[0].ErrorCode != kerr.GroupAuthorizationFailed.Code {
		t.Fatalf("alter of a denied group: %+v", d)
	}
	alter.Resources[0].ResourceName = "mine"
	if d := Authorize(alter, can, nil); d.Pass != alter || d.Answer != nil {
		t.Errorf("alter of an allowed group: %+v", d)
	}
}
