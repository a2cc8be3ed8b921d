package groupconfig

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ClusterHasGroupConfigs asks the cluster, once, whether it has GROUP
// config resources (Kafka 4.0+, KIP-848): a DescribeConfigs of one
// GROUP resource. Kafka 3.x does not know the resource type (32) and
// answers the resource INVALID_REQUEST (3.6.2, measured: its
// DescribeConfigs authorization step refuses the unknown type before
// anything else), as do the brokers before it; a broker that knows the
// type answers the group's configs, or an error about the group (its
// authorization), which still says that it has them. An error reaching
// the cluster is returned: the caller decides.
func ClusterHasGroupConfigs(ctx context.Context, cl kmsg.Requestor) (bool, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, "kproxy-group-configs-probe"
	r.ConfigNames = []string{groupConfigSession}
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, fmt.Errorf("describing a GROUP config resource: %w", err)
	}
	if len(resp.Resources) == 0 {
		return false, errors.New("describing a GROUP config resource: an answer without the resource")
	}
	switch err := kerr.ErrorForCode(resp.Resources[0].ErrorCode); {
	case errors.Is(err, kerr.InvalidRequest), errors.Is(err, kerr.UnsupportedVersion):
		return false, nil
	}
	return true, nil
}
