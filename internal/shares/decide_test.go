package shares

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

func TestDecide(t *testing.T) {
	noShares := kversion.Stable()
	noShares.SetMaxKeyVersion(76, -1) // ShareGroupHeartbeat
	earlyAccess := kversion.Stable()
	earlyAccess.SetMaxKeyVersion(76, 0) // Kafka 4.0's early access
	unreadable := errors.New("groups topic unreadable")
	for _, c := range []struct {
		name      string
		versions  *kversion.Versions
		held      []string
		heldErr   error
		serve     bool
		wantErr   error
		whyHas    string
		heldAsked bool
	}{
		{name: "cluster lacks share groups", versions: noShares, serve: true, whyHas: "does not serve"},
		{name: "cluster has only the early access", versions: earlyAccess, serve: true, whyHas: "does not serve"},
		{name: "cluster serves them, none held", heldAsked: true, whyHas: "the cluster serves share groups"},
		{name: "cluster serves them, kproxy served some", held: []string{"a", "b", "c", "d", "e", "f"}, heldAsked: true, serve: true, whyHas: "served 6 here before (a, b, c, d, e and 1 more)"},
		{name: "groups topic unreadable", heldErr: unreadable, heldAsked: true, wantErr: unreadable},
	} {
		t.Run(c.name, func(t *testing.T) {
			var opts []kfake.Opt
			if c.versions != nil {
				opts = append(opts, kfake.MaxVersions(c.versions))
			}
			cluster, err := kfake.NewCluster(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cluster.Close()
			cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			asked := false
			got, err := Decide(context.Background(), cl, func(context.Context) ([]string, error) {
				asked = true
				return c.held, c.heldErr
			})
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("error %v, want %v", err, c.wantErr)
			}
			if asked != c.heldAsked {
				t.Errorf("held groups asked: %v, want %v", asked, c.heldAsked)
			}
			if err != nil {
				return
			}
			if got.Serve != c.serve || !strings.Contains(got.Why, c.whyHas) {
				t.Errorf("got %+v, want serve %v and a reason with %q", got, c.serve, c.whyHas)
			}
		})
	}
}
