package e2e

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/kproxy/kproxy/internal/coexist"
	"github.com/kproxy/kproxy/internal/kproxy"
)

// Groups that live on the brokers are visible through kproxy as they are
// directly: kafka-consumer-groups --list and --describe --all-groups
// through kproxy answer for a group the cluster's coordinator serves as
// the brokers do (protocol type, state, type, members), and for the
// groups kproxy serves with their real members, never with kproxy's
// anchor (which is a member of the cluster's group of the same id, not a
// group of its own).

// TestVisibilityOfClusterGroups: a classic group and a KIP-848 group with
// members directly on the cluster, and a group served by kproxy; the
// multi-group requests (served by kproxy's engine, not forwarded) answer
// for the direct groups exactly as the cluster does.
func TestVisibilityOfClusterGroups(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s := newStack(t)
	const topic = "visib-t"
	const directG, direct848, proxyG = "visib-direct", "visib-direct-848", "visib-kproxy"
	s.produce(ctx, topic, 3, 30)
	// The cluster's coordinator takes sessions of 6 s and more.
	clusterSession := kgo.SessionTimeout(6 * time.Second)
	ownD, ownK, own8 := newOwnership(t), newOwnership(t), newOwnership(t)
	startMemberAt(t, s.cluster.ListenAddrs()[0], "direct", memberCfg{group: directG, topic: topic, own: ownD, recs: newRecords(),
		opts: []kgo.Opt{clusterSession}})
	startMemberAt(t, s.cluster.ListenAddrs()[0], "direct848", memberCfg{group: direct848, topic: topic, own: own8, recs: newRecords(),
		opts: []kgo.Opt{clusterSession, kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer()}})
	s.startMember("behind", memberCfg{group: proxyG, topic: topic, own: ownK, recs: newRecords()})
	waitOwners(t, ownD, 3, "direct")
	waitOwners(t, own8, 3, "direct848")
	waitOwners(t, ownK, 3, "behind")
	adm := directAdmin(t, s)
	// The cluster sees kproxy's group through its anchor.
	waitDirect(ctx, t, adm, proxyG, "anchored", func(d kadm.DescribedGroup) bool {
		return d.State == "Stable" && len(d.Members) == 1 && d.Members[0].InstanceID != nil &&
			*d.Members[0].InstanceID == coexist.DefaultAnchorInstanceID
	})
	waitDirect(ctx, t, adm, directG, "stable", func(d kadm.DescribedGroup) bool { return d.State == "Stable" && len(d.Members) == 1 })

	through := s.client()
	direct := directClient(t, s)
	eventually := func(what string, check func() string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			diff := check()
			if diff == "" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s", what, diff)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// ListGroups (kafka-consumer-groups --list): every group of the
	// cluster, the direct ones as the cluster lists them, kproxy's as
	// its engine serves it, once.
	eventually("ListGroups through kproxy", func() string {
		got, err := kadm.NewClient(through).ListGroups(ctx)
		if err != nil {
			return "through kproxy: " + err.Error()
		}
		want, err := adm.ListGroups(ctx)
		if err != nil {
			return "directly: " + err.Error()
		}
		if g, w := got.Groups(), want.Groups(); !slices.Equal(sorted(g), sorted(w)) {
			return "groups " + join(sorted(g)) + ", directly " + join(sorted(w))
		}
		for _, id := range []string{directG, direct848} {
			g, w := got[id], want[id]
			if g.ProtocolType != w.ProtocolType || g.State != w.State || g.GroupType != w.GroupType {
				return id + ": " + g.ProtocolType + "/" + g.State + "/" + g.GroupType + ", directly " + w.ProtocolType + "/" + w.State + "/" + w.GroupType
			}
		}
		if g := got[proxyG]; g.ProtocolType != "consumer" || g.State != "Stable" || g.GroupType != "classic" {
			return "kproxy's group: " + g.ProtocolType + "/" + g.State + "/" + g.GroupType
		}
		if got[direct848].GroupType != "consumer" {
			return "the KIP-848 group's type: " + got[direct848].GroupType
		}
		return ""
	})
	// The request's filters apply to the cluster's groups too.
	lreq := kmsg.NewPtrListGroupsRequest()
	lreq.StatesFilter, lreq.TypesFilter = []string{"stable"}, []string{"Classic"}
	lresp, err := lreq.RequestWith(ctx, through)
	if err != nil {
		t.Fatal(err)
	}
	var filtered []string
	for _, g := range lresp.Groups {
		filtered = append(filtered, g.Group)
	}
	if slices.Sort(filtered); !slices.Equal(filtered, []string{directG, proxyG}) {
		t.Fatalf("ListGroups of Stable classic groups: %v", filtered)
	}

	// One multi-group request to one kproxy listener: served by the
	// engine (a single-group request for a forwarded group would go
	// upstream as it is).
	engineReqWith := func(cl *kgo.Client, req kmsg.Request) kmsg.Response {
		t.Helper()
		if err := cl.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		resp, err := cl.Broker(0).Request(ctx, req)
		if err != nil {
			t.Fatalf("%s through kproxy: %v", kmsg.NameForKey(req.Key()), err)
		}
		return resp
	}
	engineReq := func(req kmsg.Request) kmsg.Response { return engineReqWith(through, req) }
	groups := []string{directG, proxyG, direct848, "visib-nobody"}
	// v5 and v6 (KIP-1043: an unknown group is GROUP_ID_NOT_FOUND from
	// v6, Dead without an error before), both sides pinned to the
	// version (kgo sends the newest otherwise).
	for _, v := range []int16{5, 6} {
		pinned := kversion.Stable()
		pinned.SetMaxKeyVersion(kmsg.DescribeGroups.Int16(), v)
		throughV := s.client(kgo.MaxVersions(pinned))
		directV := directClientWith(t, s, kgo.MaxVersions(pinned))
		eventually("DescribeGroups through kproxy", func() string {
			req := kmsg.NewPtrDescribeGroupsRequest()
			req.Groups, req.IncludeAuthorizedOperations = groups, true
			got := engineReqWith(throughV, req).(*kmsg.DescribeGroupsResponse)
			dreq := kmsg.NewPtrDescribeGroupsRequest()
			dreq.Groups, dreq.IncludeAuthorizedOperations = []string{directG, direct848, "visib-nobody"}, true
			want, err := dreq.RequestWith(ctx, directV)
			if err != nil {
				return "directly: " + err.Error()
			}
			if got.Version != v || want.Version != v {
				return "answered at v" + itoa(int(got.Version)) + ", directly v" + itoa(int(want.Version))
			}
			if len(got.Groups) != len(groups) {
				return "groups answered: " + itoa(len(got.Groups))
			}
			if nobody := got.Groups[3]; (v >= 6) != (nobody.ErrorCode == kerr.GroupIDNotFound.Code) || nobody.State != "Dead" {
				return "an unknown group at v" + itoa(int(v)) + ": state " + nobody.State + ", code " + itoa(int(nobody.ErrorCode))
			}
			for _, w := range want.Groups {
				g := got.Groups[slices.Index(groups, w.Group)]
				if !reflect.DeepEqual(g, w) {
					return "v" + itoa(int(v)) + " " + w.Group + " differs from the cluster's description"
				}
			}
			if diff := realMembers(got.Groups[1].ErrorCode, got.Groups[1].State, got.Groups[1].Members); diff != "" {
				return diff
			}
			return ""
		})
	}

	// ConsumerGroupDescribe, likewise.
	eventually("ConsumerGroupDescribe through kproxy", func() string {
		req := kmsg.NewPtrConsumerGroupDescribeRequest()
		req.Groups = groups
		got := engineReq(req).(*kmsg.ConsumerGroupDescribeResponse)
		dreq := kmsg.NewPtrConsumerGroupDescribeRequest()
		dreq.Groups = []string{directG, direct848, "visib-nobody"}
		want, err := dreq.RequestWith(ctx, direct)
		if err != nil {
			return "directly: " + err.Error()
		}
		for _, w := range want.Groups {
			if !reflect.DeepEqual(got.Groups[slices.Index(groups, w.Group)], w) {
				return w.Group + " differs from the cluster's description"
			}
		}
		if g := got.Groups[2]; g.ErrorCode != 0 || len(g.Members) != 1 {
			return "the direct KIP-848 group: " + kerr.ErrorForCode(g.ErrorCode).Error()
		}
		if g := got.Groups[1]; g.ErrorCode != kerr.GroupIDNotFound.Code {
			return "kproxy's classic group is not a consumer group, got code " + itoa(int(g.ErrorCode))
		}
		return ""
	})

	// kafka-consumer-groups --describe --all-groups: list, then describe
	// what was listed (kadm asks each group's coordinator).
	eventually("describing every group through kproxy", func() string {
		tadm := kadm.NewClient(through)
		listed, err := tadm.ListGroups(ctx)
		if err != nil {
			return err.Error()
		}
		got, err := tadm.DescribeGroups(ctx, listed.Groups()...)
		if err != nil {
			return err.Error()
		}
		want, err := adm.DescribeGroups(ctx, directG)
		if err != nil {
			return err.Error()
		}
		g, w := got[directG], want[directG]
		if g.Err != nil || g.State != w.State || g.ProtocolType != w.ProtocolType || g.Protocol != w.Protocol || !reflect.DeepEqual(g.Members, w.Members) {
			return "the direct group through kproxy: " + g.State + " " + itoa(len(g.Members)) + " members; directly " + w.State
		}
		k := got[proxyG]
		var members []kmsg.DescribeGroupsResponseGroupMember
		for _, m := range k.Members {
			members = append(members, kmsg.DescribeGroupsResponseGroupMember{MemberID: m.MemberID, InstanceID: m.InstanceID, ClientID: m.ClientID})
		}
		return realMembers(errCode(k.Err), k.State, members)
	})
}

// directClientWith is a client straight to the cluster with opts.
func directClientWith(t testing.TB, s *stack, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.cluster.ListenAddrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// realMembers says how the description of kproxy's group differs from
// its one real member "behind", or "".
func realMembers(code int16, state string, members []kmsg.DescribeGroupsResponseGroupMember) string {
	if code != 0 || state != "Stable" || len(members) != 1 {
		return "kproxy's group: " + state + " " + itoa(len(members)) + " members, code " + itoa(int(code))
	}
	for _, m := range members {
		if m.InstanceID != nil && *m.InstanceID == coexist.DefaultAnchorInstanceID {
			return "kproxy's anchor described as a member of its group"
		}
		if m.ClientID != "behind" {
			return "kproxy's group has member " + m.ClientID
		}
	}
	return ""
}

func errCode(err error) int16 {
	if ke, ok := err.(*kerr.Error); ok {
		return ke.Code
	}
	if err != nil {
		return -1
	}
	return 0
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func join(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}

// TestVisibilityInFleet: in distributed mode (a fleet of one, as `kproxy
// dev` runs) the owner lists the cluster's groups it owns, a group live
// on the cluster as the cluster lists it, and never the fleet's own group
// (protocol type "kproxy"), which the cluster lists.
func TestVisibilityInFleet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s := newStack(t, func(c *kproxy.Config) { c.Groups.Mode = kproxy.GroupsDistributed })
	const topic, directG = "visib-fleet-t", "visib-fleet-direct"
	s.produce(ctx, topic, 3, 30)
	own := newOwnership(t)
	startMemberAt(t, s.cluster.ListenAddrs()[0], "direct", memberCfg{group: directG, topic: topic, own: own, recs: newRecords(),
		opts: []kgo.Opt{kgo.SessionTimeout(6 * time.Second)}})
	waitOwners(t, own, 3, "direct")
	adm := directAdmin(t, s)
	through := kadm.NewClient(s.client())
	deadline := time.Now().Add(30 * time.Second)
	for {
		want, err := adm.ListGroups(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := through.ListGroups(ctx)
		var fleetGroups []string
		for _, g := range want {
			if g.ProtocolType == "kproxy" {
				fleetGroups = append(fleetGroups, g.Group)
			}
		}
		w, g := want[directG], got[directG]
		ok := err == nil && len(fleetGroups) > 0 && w.State == "Stable" &&
			g.Group == directG && g.ProtocolType == w.ProtocolType && g.State == w.State && g.GroupType == w.GroupType
		for _, f := range fleetGroups {
			if _, listed := got[f]; listed {
				t.Fatalf("the fleet's group %s listed through kproxy", f)
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("through kproxy %+v (%v); directly %+v", got, err, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
