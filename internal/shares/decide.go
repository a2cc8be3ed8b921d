package shares

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/upstream"
)

// Choice is who serves share groups under `--share-groups auto`, decided
// once at start by Decide.
type Choice struct {
	// Serve is true when kproxy serves share groups itself.
	Serve bool
	// Why says what decided it, for the start-up log line.
	Why string
	// Held lists the share groups kproxy served before whose records
	// are in its groups topic (set only when the cluster serves share
	// groups too).
	Held []string
}

// Decide chooses who serves share groups:
//
//   - the cluster's brokers do not advertise ShareGroupHeartbeat v1
//     (Kafka 3.x, 4.0, or 4.1 without share groups enabled): kproxy
//     serves them;
//   - they do, and held (the share groups whose records kproxy's groups
//     topic holds) names none: the cluster serves them and kproxy
//     forwards;
//   - they do, and kproxy served share groups here before (the cluster
//     was upgraded since): kproxy keeps serving share groups, so that no
//     group it served starts over from share.auto.offset.reset at the
//     cluster. Moving them is the operator's step
//     (docs/share-groups.md).
//
// An error reading the groups topic is returned rather than guessed
// past: forwarding would lose the state of the groups kproxy served,
// serving would take from the cluster groups it serves.
func Decide(ctx context.Context, cl kmsg.Requestor, held func(context.Context) ([]string, error)) (Choice, error) {
	lacks, err := clusterLacksShares(ctx, cl)
	if err != nil {
		return Choice{}, err
	}
	if lacks {
		return Choice{Serve: true, Why: "the cluster does not serve share groups (no ShareGroupHeartbeat v1 in its ApiVersions)"}, nil
	}
	groups, err := held(ctx)
	if err != nil {
		return Choice{}, fmt.Errorf("looking for share groups kproxy served before: %w", err)
	}
	if len(groups) == 0 {
		return Choice{Why: "the cluster serves share groups"}, nil
	}
	return Choice{
		Serve: true,
		Held:  groups,
		Why: fmt.Sprintf("the cluster serves share groups, but kproxy served %d here before (%s): kproxy keeps serving share groups until they are moved to the cluster (docs/share-groups.md)",
			len(groups), summarize(groups, 5)),
	}, nil
}

// summarize lists up to n names, then how many more.
func summarize(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// clusterLacksShares reports whether the cluster's brokers do not
// advertise ShareGroupHeartbeat v1 or later: Kafka before 4.0, 4.x with
// share groups not enabled, or 4.0's early access, whose v0 Kafka 4.1
// removed and today's share consumers do not speak.
func clusterLacksShares(ctx context.Context, cl kmsg.Requestor) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	keys, err := upstream.Keys(ctx, cl)
	if err != nil {
		return false, err
	}
	v, ok := keys[kmsg.ShareGroupHeartbeat.Int16()]
	return !ok || v < 1, nil
}
