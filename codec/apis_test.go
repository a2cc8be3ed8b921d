package codec

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRouteFor pins the decision for each kind of row and for the
// versions that change it.
func TestRouteFor(t *testing.T) {
	const listOffsets = 2 // not in the table
	over := func(key int16) int16 { return MaxVersion(key) + 1 }
	for _, c := range []struct {
		name        string
		key, v      int16
		groupsLocal bool
		route       Route
		edit        Edit
		max         int16
		badVersion  bool
	}{
		{"plain key", listOffsets, 5, true, Forward, EditNone, -1, false},
		{"key unknown to kmsg", 99, 0, true, Forward, EditNone, -1, false},
		{"fetch capped, streamed", KeyFetch, 12, true, Forward, EditNone, 15, false},
		{"produce before endpoints", KeyProduce, 9, true, Forward, EditNone, MaxVersion(KeyProduce), false},
		{"produce with endpoints", KeyProduce, 10, true, Rewrite, EditIfEndpoints, MaxVersion(KeyProduce), false},
		{"produce beyond kmsg", KeyProduce, over(KeyProduce), true, Refuse, EditNone, MaxVersion(KeyProduce), true},
		{"metadata", KeyMetadata, 0, false, Rewrite, EditAlways, MaxVersion(KeyMetadata), false},
		{"metadata beyond kmsg", KeyMetadata, over(KeyMetadata), true, Refuse, EditNone, MaxVersion(KeyMetadata), true},
		{"api versions", KeyApiVersions, 3, true, Rewrite, EditIfNoError, MaxVersion(KeyApiVersions), false},
		{"api versions beyond kmsg", KeyApiVersions, over(KeyApiVersions), true, Local, EditNone, MaxVersion(KeyApiVersions), false},
		{"join group, groups local", KeyJoinGroup, 5, true, Local, EditNone, MaxVersion(KeyJoinGroup), false},
		{"join group, groups forwarded", KeyJoinGroup, 5, false, Forward, EditNone, MaxVersion(KeyJoinGroup), false},
		{"join group beyond kmsg", KeyJoinGroup, over(KeyJoinGroup), true, Refuse, EditNone, MaxVersion(KeyJoinGroup), true},
		{"find coordinator, groups local", KeyFindCoordinator, 4, true, Local, EditAlways, MaxVersion(KeyFindCoordinator), false},
		{"find coordinator, groups forwarded", KeyFindCoordinator, 4, false, Rewrite, EditAlways, MaxVersion(KeyFindCoordinator), false},
		{"share fetch", KeyShareFetch, 1, true, Rewrite, EditIfEndpoints, MaxVersion(KeyShareFetch), false},
		{"share fetch, groups forwarded", KeyShareFetch, 1, false, Rewrite, EditIfEndpoints, MaxVersion(KeyShareFetch), false},
		{"share fetch beyond kmsg", KeyShareFetch, over(KeyShareFetch), true, Refuse, EditNone, MaxVersion(KeyShareFetch), true},
		{"share acknowledge", KeyShareAcknowledge, 1, true, Rewrite, EditIfEndpoints, MaxVersion(KeyShareAcknowledge), false},
		{"share group heartbeat", KeyShareGroupHeartbeat, 1, true, Forward, EditNone, -1, false},
		{"streams group heartbeat", KeyStreamsGroupHeartbeat, 0, true, Forward, EditNone, -1, false},
	} {
		d := RouteFor(c.key, c.v, c.groupsLocal)
		if d.Route != c.route || d.Edit != c.edit || d.MaxVersion != c.max {
			t.Errorf("%s: %s edit %s max %d, want %s edit %s max %d", c.name, d.Route, d.Edit, d.MaxVersion, c.route, c.edit, c.max)
		}
		err := d.Refusal(c.key, c.v)
		if (err != nil) != (c.route == Refuse) {
			t.Errorf("%s: refusal %v for route %s", c.name, err, d.Route)
		}
		if errors.Is(err, ErrBadVersion) != c.badVersion {
			t.Errorf("%s: refusal %v, want a bad version %v", c.name, err, c.badVersion)
		}
	}
}

// TestRoutingTableIsConsistent checks every key at every version against
// the rules the table's readers rely on.
func TestRoutingTableIsConsistent(t *testing.T) {
	for key := range int16(1000) {
		if kmsg.RequestForKey(key) != nil && key >= apiKeys {
			t.Fatalf("kmsg knows key %d, beyond the %d the tables hold", key, apiKeys)
		}
	}
	for key := range int16(apiKeys) {
		a, listed := row(key)
		if listed && (a.route == Rewrite || a.route == Local) && a.maxVersion != MaxVersion(key) {
			t.Errorf("%s is decoded by kproxy but capped at v%d, not kmsg's v%d", kmsg.NameForKey(key), a.maxVersion, MaxVersion(key))
		}
		if listed && (a.route == Rewrite) != (a.edit != EditNone) && key != KeyFindCoordinator {
			t.Errorf("%s: route %s with edit %s", kmsg.NameForKey(key), a.route, a.edit)
		}
		for _, groupsLocal := range []bool{false, true} {
			for v := int16(0); v <= MaxVersion(key)+1; v++ {
				d := RouteFor(key, v, groupsLocal)
				if d.Route == Rewrite && d.Edit == EditNone {
					t.Errorf("%s v%d: rewritten with no edit", kmsg.NameForKey(key), v)
				}
				if d.Route == Local && !groupsLocal && key != KeyApiVersions {
					t.Errorf("%s v%d: served locally with groups forwarded", kmsg.NameForKey(key), v)
				}
			}
		}
	}
	want := []int16{KeyOffsetCommit, KeyOffsetFetch, KeyJoinGroup, KeyHeartbeat, KeyLeaveGroup, KeySyncGroup,
		KeyDescribeGroups, KeyListGroups, KeyTxnOffsetCommit, KeyDeleteGroups, KeyOffsetDelete,
		KeyConsumerGroupHeartbeat, KeyConsumerGroupDescribe}
	if got := GroupKeys(); !slices.Equal(got, want) {
		t.Errorf("GroupKeys() = %v, want %v", got, want)
	}
}

// TestRouteForDoesNotAllocate: RouteFor is on the path of every request.
func TestRouteForDoesNotAllocate(t *testing.T) {
	var sink Decision
	if n := testing.AllocsPerRun(100, func() {
		sink = RouteFor(KeyProduce, 11, true)
		sink = RouteFor(KeyFetch, 12, true)
		sink = RouteFor(KeyApiVersions, 99, true)
	}); n != 0 {
		t.Errorf("RouteFor allocates %v times per run", n)
	}
	_ = sink
}

// TestSASLRoutes: SaslHandshake and SaslAuthenticate are forwarded and
// their responses read but never edited (the session learns the
// client's principal from them); SaslHandshake v0, after which raw SASL
// tokens without Kafka headers follow, is refused with a clear reason,
// and ApiVersions advertises v1 as its lowest version.
func TestSASLRoutes(t *testing.T) {
	for _, key := range []int16{KeySaslHandshake, KeySaslAuthenticate} {
		for v := int16(1); v <= MaxVersion(key); v++ {
			d := RouteFor(key, v, true)
			if d.Route != Rewrite || d.Edit != EditObserve {
				t.Fatalf("%s v%d: %v/%v, want rewritten/observe", kmsg.NameForKey(key), v, d.Route, d.Edit)
			}
			resp := kmsg.RequestForKey(key).ResponseKind()
			resp.SetVersion(v)
			if edited, err := RewriteResponse(key, v, resp.AppendTo(nil), nil, true); edited != nil || err != nil {
				t.Fatalf("%s v%d response edited: %v %v", kmsg.NameForKey(key), v, edited, err)
			}
		}
	}
	d := RouteFor(KeySaslHandshake, 0, true)
	err := d.Refusal(KeySaslHandshake, 0)
	if d.Route != Refuse || !errors.Is(err, ErrBadVersion) || !strings.Contains(err.Error(), "KIP-152") {
		t.Fatalf("SaslHandshake v0: %v, %v; want refused with the reason", d.Route, err)
	}
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.ApiKeys = []kmsg.ApiVersionsResponseApiKey{{ApiKey: KeySaslHandshake, MinVersion: 0, MaxVersion: 1}}
	MergeApiVersions(resp, true)
	i := slices.IndexFunc(resp.ApiKeys, func(k kmsg.ApiVersionsResponseApiKey) bool { return k.ApiKey == KeySaslHandshake })
	if i < 0 || resp.ApiKeys[i].MinVersion != 1 || resp.ApiKeys[i].MaxVersion != 1 {
		t.Fatalf("advertised SaslHandshake: %+v", resp.ApiKeys)
	}
}
