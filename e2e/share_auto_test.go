package e2e

import (
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// TestShareGroupsAutoAfterUpgrade: kproxy with --share-groups auto in
// front of a cluster without share groups serves a share group; the
// cluster is then upgraded (restarted from its data, now advertising
// share groups) and kproxy restarted with auto. kproxy finds the share
// group it served in its groups topic and keeps serving share groups,
// so the group goes on where it was (shareSurvivesRestart's ledger:
// nothing accepted comes back, the held records do, and kproxy's engine
// holds the group at the end). Had it forwarded, the cluster would have
// started the group over at share.auto.offset.reset.
func TestShareGroupsAutoAfterUpgrade(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var closeOnce sync.Once
	before, err := kproxy.NewDevCluster(3, 0, testLogger(), append(noShareCluster(), kfake.DataDir(dir))...)
	if err != nil {
		t.Fatal(err)
	}
	closeBefore := func() { closeOnce.Do(before.Close) }
	t.Cleanup(closeBefore)
	auto := func(c *kproxy.Config) {
		c.Groups.SharesAuto = true
		c.Groups.Engine.ShareSettings = func(string) groupstate.ShareSettings {
			return groupstate.ShareSettings{AutoOffsetReset: "earliest", SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second}
		}
	}
	s := &stack{t: t, cluster: before, listen: "127.0.0.1:0", opts: []stackOpt{auto}}
	s.start()
	shareSurvivesRestart(t, s, func() {
		closeBefore()
		after, err := kproxy.NewDevCluster(3, 0, testLogger(), kfake.DataDir(dir))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(after.Close)
		s.cluster = after
		s.listen = "127.0.0.1:0"
		s.start()
	})
}
