package groupconfig

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CarryOver hands the GROUP configs kproxy kept for a cluster without
// them (Store, Kafka 3.x) to the cluster once it has them (upgraded to
// Kafka 4.0+), so that the upgrade loses none: each config kept for a
// group that the cluster does not set for it is set on the cluster
// (IncrementalAlterConfigs), and once the cluster holds all of a
// group's, they are deleted from kproxy's store, so that a later start
// finds nothing to carry (and a config changed or deleted on the cluster
// afterwards stays as the cluster has it). A config the cluster already
// sets for the group is the cluster's: kproxy's is deleted without
// being copied. It returns the groups carried; a group the cluster
// refused is logged and left in the store for the next start. Nothing
// is done where the store's topic does not exist.
//
// It runs once at start, before the engine reads any group's configs.
// Several kproxies starting at once may each carry the same configs: the
// same values set twice, and deletions of what is already deleted.
func CarryOver(ctx context.Context, cl *kgo.Client, newConsumer func(opts ...kgo.Opt) (*kgo.Client, error), log *slog.Logger) ([]string, error) {
	exists, err := topicExists(ctx, cl, DefaultStoreTopic)
	if err != nil || !exists {
		return nil, err
	}
	st := NewStore(cl, DefaultStoreTopic, newConsumer, log)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); st.Run(rctx) }()
	defer func() { stop(); <-done }()
	select {
	case <-st.Ready():
	case <-ctx.Done():
		return nil, fmt.Errorf("reading %s: %w", DefaultStoreTopic, ctx.Err())
	}
	var carried []string
	for _, group := range st.Groups() {
		kept := st.Group(group)
		onCluster, err := clusterGroupConfigs(ctx, cl, group)
		if err != nil {
			log.Warn("cannot carry a group's configs kproxy kept to the cluster; left for the next start", "group", group, "err", err)
			continue
		}
		set := map[string]string{}
		var all []string
		for name, v := range kept {
			all = append(all, name)
			if _, ok := onCluster[name]; !ok {
				set[name] = v
			}
		}
		slices.Sort(all)
		if err := alterClusterGroupConfigs(ctx, cl, group, set); err != nil {
			log.Warn("the cluster refused a group's configs kproxy kept; left for the next start", "group", group, "configs", set, "err", err)
			continue
		}
		if err := st.Alter(ctx, group, nil, all); err != nil {
			log.Warn("carried a group's configs to the cluster, but could not delete kproxy's copy", "group", group, "err", err)
			continue
		}
		log.Info("carried a group's configs kproxy kept to the cluster, which has GROUP configs now", "group", group,
			"set", set, "already_set_on_the_cluster", len(all)-len(set))
		carried = append(carried, group)
	}
	return carried, nil
}

// topicExists reports whether the cluster has topic.
func topicExists(ctx context.Context, cl *kgo.Client, topic string) (bool, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic {
			switch err := kerr.ErrorForCode(t.ErrorCode); err {
			case nil:
				return true, nil
			case kerr.UnknownTopicOrPartition:
				return false, nil
			default:
				return false, fmt.Errorf("metadata of %s: %w", topic, err)
			}
		}
	}
	return false, nil
}

// clusterGroupConfigs returns the configs the cluster sets for group
// itself (source GROUP_CONFIG).
func clusterGroupConfigs(ctx context.Context, cl *kgo.Client, group string) (map[string]string, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	if len(resp.Resources) != 1 {
		return nil, fmt.Errorf("%d resources answered, want 1", len(resp.Resources))
	}
	if err := kerr.ErrorForCode(resp.Resources[0].ErrorCode); err != nil {
		return nil, err
	}
	return setOnGroup(resp.Resources[0]), nil
}

// alterClusterGroupConfigs sets set's configs of group on the cluster.
func alterClusterGroupConfigs(ctx context.Context, cl *kgo.Client, group string, set map[string]string) error {
	if len(set) == 0 {
		return nil
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	for name, v := range set {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value, c.Op = name, kmsg.StringPtr(v), kmsg.IncrementalAlterConfigOpSet
		r.Configs = append(r.Configs, c)
	}
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, rr := range resp.Resources {
		if err := kerr.ErrorForCode(rr.ErrorCode); err != nil {
			if rr.ErrorMessage != nil {
				return fmt.Errorf("%w: %s", err, *rr.ErrorMessage)
			}
			return err
		}
	}
	return nil
}
