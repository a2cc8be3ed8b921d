package fleetrun

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

// TestDistributedRefusesUpstreamWithoutTransactions builds the fleet
// runtime in front of a cluster that speaks Kafka 0.10.2 (no
// transactions, so no way to fence a stale owner): it must refuse and
// name the two modes that work there. The same cluster at its stable
// versions (transactions) is accepted.
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
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.MaxVersions(tc.vs), kfake.AllowAutoTopicCreation())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			f, err := New(ctx, Config{Client: cl})
			if !tc.refuse {
				if err != nil {
					t.Fatalf("distributed mode in front of a cluster with transactions: %v", err)
				}
				if f.partitions <= 0 {
					t.Fatalf("groups topic of %d partitions", f.partitions)
				}
				return
			}
			if err == nil {
				t.Fatal("distributed mode accepted a cluster without transactions")
			}
			for _, want := range []string{"transactions", "--groups local", "--groups forward"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal %q does not mention %q", err, want)
				}
			}
		})
	}
}
