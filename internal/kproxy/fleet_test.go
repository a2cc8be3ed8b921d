package kproxy

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/kproxy/kproxy/proxy"
	"github.com/kproxy/kproxy/tap"
)

// TestDistributedRefusesUpstreamWithoutTransactions starts kproxy in
// distributed mode in front of a cluster that speaks Kafka
// 0.10.2 (no transactions, so no way to fence a stale owner): it must
// refuse to start and name the two modes that work there. The same
// cluster at 0.11 (transactions) starts.
func TestDistributedRefusesUpstreamWithoutTransactions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		vs     *kversion.Versions
		refuse bool
	}{
		{"0.10.2", kversion.V0_10_2(), true},
		{"stable", kversion.Stable(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.MaxVersions(tc.vs))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cfg := Config{
				Upstream: c.ListenAddrs(),
				Proxy:    proxy.Config{Listen: "127.0.0.1:0"},
				Groups: GroupsConfig{
					Mode:  GroupsDistributed,
					Fleet: FleetConfig{SessionTimeout: 10 * time.Second, HeartbeatInterval: time.Second},
				},
				Telemetry: tap.Config{Getenv: func(string) string { return "" }},
				Logger:    slog.New(slog.DiscardHandler),
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := Start(ctx, cfg)
			if !tc.refuse {
				if err != nil {
					t.Fatalf("distributed mode in front of a cluster with transactions: %v", err)
				}
				if err := s.Shutdown(ctx); err != nil {
					t.Errorf("shutdown: %v", err)
				}
				return
			}
			if err == nil {
				s.Shutdown(ctx)
				t.Fatal("distributed mode started in front of a cluster without transactions")
			}
			for _, want := range []string{"transactions", "--groups local", "--groups forward"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal %q does not mention %q", err, want)
				}
			}
		})
	}
}
