package kproxy

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/internal/groupconfig"
)

// probeGroupConfigs asks, once, at start, whether the cluster has GROUP
// configs (groupconfig.ClusterHasGroupConfigs), on a goroutine of its
// own so that the question runs alongside the other start-up reads of
// the cluster; the function returned waits for the answer.
func (w *Server) probeGroupConfigs(ctx context.Context) func() (bool, error) {
	type result struct {
		has bool
		err error
	}
	ch := make(chan result, 1)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		has, err := groupconfig.ClusterHasGroupConfigs(dctx, w.upstream)
		ch <- result{has, err}
	}()
	return func() (bool, error) { r := <-ch; return r.has, r.err }
}

// keepGroupConfigs acts on probe's answer. Where the cluster has no
// GROUP configs (Kafka before 4.0), kproxy keeps them itself: a Store
// over the cluster's compacted groupconfig.DefaultStoreTopic, read by
// w.groupConfigs in place of the cluster, and a Service that answers the
// config requests whose resources are all GROUP (w.groupConfigService,
// handed to the proxy by Start). Where it has them, nothing changes. A
// cluster that could not be asked within 10 s is taken to have them (as
// before this choice existed), with a warning.
func (w *Server) keepGroupConfigs(probe func() (bool, error)) {
	has, err := probe()
	log := w.log.With("component", "group_configs")
	switch {
	case err != nil:
		log.Warn("cannot tell whether the cluster has GROUP configs: they are left to the cluster", "err", err)
		return
	case has:
		log.Info("the cluster has GROUP configs: kproxy reads them from it")
		// Configs kproxy kept while the cluster had none (before an
		// upgrade to 4.0+) go to the cluster before anything reads it.
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := groupconfig.CarryOver(cctx, w.upstream, w.newUpstreamConsumer, log); err != nil {
			log.Warn("cannot carry the GROUP configs kproxy kept to the cluster; left for the next start", "topic", groupconfig.DefaultStoreTopic, "err", err)
		}
		return
	}
	log.Info("the cluster has no GROUP configs (Kafka before 4.0): kproxy keeps them itself", "topic", groupconfig.DefaultStoreTopic)
	st := groupconfig.NewStore(w.upstream, "", w.newUpstreamConsumer, log)
	w.groupConfigs.UseStore(st)
	w.runUntilClose(st.Run)
	w.groupConfigService = groupconfig.NewService(st, log)
}

// newUpstreamConsumer is a new client of the cluster with kproxy's own
// options and more.
func (w *Server) newUpstreamConsumer(more ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append(append([]kgo.Opt(nil), w.upstreamOpts...), more...)...)
}
