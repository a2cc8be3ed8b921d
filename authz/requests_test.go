package authz

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestOAuthBearerSubject(t *testing.T) {
	enc := base64.RawURLEncoding.EncodeToString
	tok := func(claims string) string { return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(claims)) + ".sig" }
	for _, c := range []struct {
		auth, want string
		ok         bool
	}{
		{"n,,\x01auth=Bearer " + tok(`{"sub":"alice","scope":"x"}`) + "\x01\x01", "alice", true},
		{"n,a=alice,\x01host=h\x01port=9\x01auth=bearer " + tok(`{"sub":"alice"}`) + "\x01\x01", "alice", true},
		{"n,,\x01auth=Bearer " + tok(`{"name":"alice"}`) + "\x01\x01", "", false},
		{"n,,\x01auth=Basic YWxpY2U=\x01\x01", "", false},
		{"n,,\x01auth=Bearer notajwt\x01\x01", "", false},
		{"\x01", "", false},
	} {
		got, ok := OAuthBearerSubject([]byte(c.auth))
		if got != c.want || ok != c.ok {
			t.Errorf("OAuthBearerSubject(%q) = %q, %v; want %q, %v", c.auth, got, ok, c.want, c.ok)
		}
	}
}

// TestRFC2253 pins the subject form of X500Principal.getName(): most
// specific RDN first, Java's keywords, other attributes as OID=#hex,
// RFC 2253 escapes, multi-valued RDNs joined by '+'.
func TestRFC2253(t *testing.T) {
	oid := func(s ...int) asn1.ObjectIdentifier { return s }
	atv := func(o asn1.ObjectIdentifier, v any) pkix.AttributeTypeAndValue {
		return pkix.AttributeTypeAndValue{Type: o, Value: v}
	}
	for _, c := range []struct {
		rdns pkix.RDNSequence
		want string
	}{
		{pkix.Name{CommonName: "alice", OrganizationalUnit: []string{"eng"}, Organization: []string{"acme"}, Country: []string{"US"}}.ToRDNSequence(),
			"CN=alice,OU=eng,O=acme,C=US"},
		{pkix.RDNSequence{{atv(oid(0, 9, 2342, 19200300, 100, 1, 25), "com")}, {atv(oid(2, 5, 4, 3), "a,b+c")}}, `CN=a\,b\+c,DC=com`},
		{pkix.RDNSequence{{atv(oid(2, 5, 4, 3), " lead#"), atv(oid(0, 9, 2342, 19200300, 100, 1, 1), "u1")}}, `CN=\ lead#+UID=u1`},
		{pkix.RDNSequence{{atv(oid(1, 2, 840, 113549, 1, 9, 1), asn1.RawValue{Tag: asn1.TagIA5String, Bytes: []byte("a@b.c")})}, {atv(oid(2, 5, 4, 3), "x")}},
			"CN=x,1.2.840.113549.1.9.1=#16056140622e63"},
	} {
		der, err := asn1.Marshal(c.rdns)
		if err != nil {
			t.Fatal(err)
		}
		if got := RFC2253(der); got != c.want {
			t.Errorf("RFC2253 = %q, want %q", got, c.want)
		}
		if got := CertPrincipal(&x509.Certificate{RawSubject: der}); got != "User:"+c.want {
			t.Errorf("CertPrincipal = %q", got)
		}
	}
}

// testCan allows what the ACLs of one principal allow.
func testCan() Can {
	s := &Set{ACLs: []ACL{
		{Principal: "User:p", Host: "*", ResourceType: group, ResourceName: "ok", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationAll, Permission: kmsg.ACLPermissionTypeAllow},
		{Principal: "User:p", Host: "*", ResourceType: group, ResourceName: "desc", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: desc, Permission: kmsg.ACLPermissionTypeAllow},
		{Principal: "User:p", Host: "*", ResourceType: topic, ResourceName: "t-ok", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: read, Permission: kmsg.ACLPermissionTypeAllow},
		{Principal: "User:p", Host: "*", ResourceType: kmsg.ACLResourceTypeTransactionalId, ResourceName: "tx", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationWrite, Permission: kmsg.ACLPermissionTypeAllow},
	}}
	return func(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool {
		return s.Allowed("User:p", "10.0.0.1", rt, name, op)
	}
}

var (
	gaf   = kerr.GroupAuthorizationFailed.Code
	taf   = kerr.TopicAuthorizationFailed.Code
	txnAF = kerr.TransactionalIDAuthorizationFailed.Code
)

func TestAuthorizeSingleGroup(t *testing.T) {
	can := testCan()
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group = "desc" // DESCRIBE does not give READ
	if d := Authorize(join, can, nil); d.Answer == nil || d.Answer.(*kmsg.JoinGroupResponse).ErrorCode != gaf {
		t.Fatalf("join without READ: %+v", d)
	}
	join.Group = "ok"
	if d := Authorize(join, can, nil); d.Answer != nil || d.Pass != join || d.Finish != nil {
		t.Fatalf("join with READ: %+v", d)
	}
	for _, req := range []kmsg.Request{
		&kmsg.SyncGroupRequest{Group: "x"}, &kmsg.HeartbeatRequest{Group: "x"}, &kmsg.LeaveGroupRequest{Group: "x"},
		&kmsg.ConsumerGroupHeartbeatRequest{Group: "x"}, &kmsg.OffsetDeleteRequest{Group: "desc"},
	} {
		if d := Authorize(req, can, nil); d.Answer == nil || d.Pass != nil {
			t.Fatalf("%s denied: %+v", kmsg.NameForKey(req.Key()), d)
		}
	}
	if FindCoordinatorCode(can, 0, "desc") != 0 || FindCoordinatorCode(can, 0, "x") != gaf || FindCoordinatorCode(can, 1, "zz") != txnAF {
		t.Fatal("FindCoordinatorCode")
	}
}

func commitReq(group string, topics ...string) *kmsg.OffsetCommitRequest {
	r := kmsg.NewPtrOffsetCommitRequest()
	r.Version, r.Group = 9, group
	for _, tp := range topics {
		r.Topics = append(r.Topics, kmsg.OffsetCommitRequestTopic{Topic: tp, Partitions: []kmsg.OffsetCommitRequestTopicPartition{{Partition: 3}}})
	}
	return r
}

func TestAuthorizeCommits(t *testing.T) {
	can := testCan()
	d := Authorize(commitReq("ok", "t-ok", "t-no"), can, nil)
	if d.Answer != nil || len(d.Pass.(*kmsg.OffsetCommitRequest).Topics) != 1 {
		t.Fatalf("mixed commit: %+v", d)
	}
	inner := kmsg.NewPtrOffsetCommitResponse()
	inner.Topics = []kmsg.OffsetCommitResponseTopic{{Topic: "t-ok", Partitions: []kmsg.OffsetCommitResponseTopicPartition{{Partition: 3}}}}
	got := d.Finish(inner).(*kmsg.OffsetCommitResponse)
	codes := map[string]int16{}
	for _, tp := range got.Topics {
		codes[tp.Topic] = tp.Partitions[0].ErrorCode
	}
	if !reflect.DeepEqual(codes, map[string]int16{"t-ok": 0, "t-no": taf}) {
		t.Fatalf("merged commit codes %v", codes)
	}
	if d := Authorize(commitReq("ok", "t-no"), can, nil); d.Answer == nil || d.Pass != nil || d.Answer.GetVersion() != 9 {
		t.Fatalf("commit of denied topics only reaches the coordinator: %+v", d)
	}
	if d := Authorize(commitReq("desc", "t-ok"), can, nil); d.Answer.(*kmsg.OffsetCommitResponse).Topics[0].Partitions[0].ErrorCode != gaf {
		t.Fatalf("commit without group READ: %+v", d)
	}
	// v10: a topic named by id is checked under the id's name; an id
	// that cannot be named is denied.
	r := kmsg.NewPtrOffsetCommitRequest()
	r.Version, r.Group = 10, "ok"
	r.Topics = []kmsg.OffsetCommitRequestTopic{{TopicID: [16]byte{1}}, {TopicID: [16]byte{2}}}
	names := func(id [16]byte) (string, bool) { return map[[16]byte]string{{1}: "t-ok"}[id], id == [16]byte{1} }
	if d := Authorize(r, can, names); d.Pass == nil || len(d.Pass.(*kmsg.OffsetCommitRequest).Topics) != 1 || d.Pass.(*kmsg.OffsetCommitRequest).Topics[0].TopicID != [16]byte{1} {
		t.Fatalf("v10 commit: %+v", d)
	}
	tx := kmsg.NewPtrTxnOffsetCommitRequest()
	tx.Group, tx.TransactionalID = "ok", "other"
	tx.Topics = []kmsg.TxnOffsetCommitRequestTopic{{Topic: "t-ok", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{{Partition: 1}}}}
	if d := Authorize(tx, can, nil); d.Answer.(*kmsg.TxnOffsetCommitResponse).Topics[0].Partitions[0].ErrorCode != txnAF {
		t.Fatalf("txn commit without transactional id WRITE: %+v", d)
	}
	tx.TransactionalID = "tx"
	if d := Authorize(tx, can, nil); d.Pass != tx {
		t.Fatalf("txn commit allowed: %+v", d)
	}
	// The same topic filter as OffsetCommit's: the denied topics are
	// answered ahead of the coordinator's, or alone, at the version.
	tx.Version = 3
	tx.Topics = append(tx.Topics, kmsg.TxnOffsetCommitRequestTopic{Topic: "t-no", Partitions: []kmsg.TxnOffsetCommitRequestTopicPartition{{Partition: 4}}})
	d = Authorize(tx, can, nil)
	if d.Answer != nil || len(d.Pass.(*kmsg.TxnOffsetCommitRequest).Topics) != 1 || d.Pass.(*kmsg.TxnOffsetCommitRequest).Topics[0].Topic != "t-ok" {
		t.Fatalf("mixed txn commit: %+v", d)
	}
	txInner := kmsg.NewPtrTxnOffsetCommitResponse()
	txInner.Topics = []kmsg.TxnOffsetCommitResponseTopic{{Topic: "t-ok", Partitions: []kmsg.TxnOffsetCommitResponseTopicPartition{{Partition: 1}}}}
	txGot := d.Finish(txInner).(*kmsg.TxnOffsetCommitResponse).Topics
	if len(txGot) != 2 || txGot[0].Topic != "t-no" || txGot[0].Partitions[0].ErrorCode != taf || txGot[1].Topic != "t-ok" || txGot[1].Partitions[0].ErrorCode != 0 {
		t.Fatalf("merged txn commit %+v", txGot)
	}
	tx.Topics = tx.Topics[1:]
	d = Authorize(tx, can, nil)
	if d.Answer == nil || d.Answer.GetVersion() != 3 || d.Answer.(*kmsg.TxnOffsetCommitResponse).Topics[0].Partitions[0].ErrorCode != taf {
		t.Fatalf("txn commit of denied topics only: %+v", d)
	}
}

func TestAuthorizeOffsetFetch(t *testing.T) {
	can := testCan()
	r := kmsg.NewPtrOffsetFetchRequest()
	r.Version = 9
	r.Groups = []kmsg.OffsetFetchRequestGroup{
		{Group: "ok", Topics: []kmsg.OffsetFetchRequestGroupTopic{{Topic: "t-ok", Partitions: []int32{0}}, {Topic: "t-no", Partitions: []int32{0, 1}}}},
		{Group: "nope"},
		{Group: "desc"}, // every topic
	}
	d := Authorize(r, can, nil)
	pass := d.Pass.(*kmsg.OffsetFetchRequest)
	if len(pass.Groups) != 2 || pass.Groups[0].Group != "ok" || len(pass.Groups[0].Topics) != 1 || pass.Groups[1].Group != "desc" || pass.Groups[1].Topics != nil {
		t.Fatalf("passed %+v", pass.Groups)
	}
	inner := kmsg.NewPtrOffsetFetchResponse()
	inner.Groups = []kmsg.OffsetFetchResponseGroup{
		{Group: "ok", Topics: []kmsg.OffsetFetchResponseGroupTopic{{Topic: "t-ok", Partitions: []kmsg.OffsetFetchResponseGroupTopicPartition{{Offset: 5}}}}},
		{Group: "desc", Topics: []kmsg.OffsetFetchResponseGroupTopic{{Topic: "t-ok"}, {Topic: "t-no"}}},
	}
	got := d.Finish(inner).(*kmsg.OffsetFetchResponse).Groups
	if len(got) != 3 || got[0].Group != "ok" || got[1].Group != "nope" || got[1].ErrorCode != gaf || got[2].Group != "desc" {
		t.Fatalf("merged groups %+v", got)
	}
	if len(got[0].Topics) != 2 || got[0].Topics[1].Topic != "t-no" || got[0].Topics[1].Partitions[1].ErrorCode != taf || got[0].Topics[1].Partitions[1].Offset != -1 {
		t.Fatalf("named topics %+v", got[0].Topics)
	}
	if len(got[2].Topics) != 1 || got[2].Topics[0].Topic != "t-ok" {
		t.Fatalf("all-topics fetch not filtered: %+v", got[2].Topics)
	}
	// v7: one group, the same rules.
	old := kmsg.NewPtrOffsetFetchRequest()
	old.Version, old.Group = 7, "ok"
	old.Topics = []kmsg.OffsetFetchRequestTopic{{Topic: "t-no", Partitions: []int32{2}}}
	d = Authorize(old, can, nil)
	if p := d.Pass.(*kmsg.OffsetFetchRequest); p.Topics == nil || len(p.Topics) != 0 {
		t.Fatalf("v7 passed topics %+v: want an empty, non-nil list (nil asks for every topic)", p.Topics)
	}
	if got := d.Finish(kmsg.NewPtrOffsetFetchResponse()).(*kmsg.OffsetFetchResponse); len(got.Topics) != 1 || got.Topics[0].Partitions[0].ErrorCode != taf {
		t.Fatalf("v7 merged %+v", got.Topics)
	}
	old.Group = "nope"
	if d := Authorize(old, can, nil); d.Answer.(*kmsg.OffsetFetchResponse).ErrorCode != gaf {
		t.Fatalf("v7 without group DESCRIBE: %+v", d)
	}
}

func TestAuthorizeMultiGroup(t *testing.T) {
	can := testCan()
	dg := kmsg.NewPtrDescribeGroupsRequest()
	dg.Groups, dg.IncludeAuthorizedOperations = []string{"nope", "ok", "desc"}, true
	d := Authorize(dg, can, nil)
	if p := d.Pass.(*kmsg.DescribeGroupsRequest); !reflect.DeepEqual(p.Groups, []string{"ok", "desc"}) {
		t.Fatalf("described %v", p.Groups)
	}
	inner := kmsg.NewPtrDescribeGroupsResponse()
	inner.Groups = []kmsg.DescribeGroupsResponseGroup{{Group: "ok"}, {Group: "desc"}}
	got := d.Finish(inner).(*kmsg.DescribeGroupsResponse).Groups
	if len(got) != 3 || got[0].ErrorCode != gaf || got[1].Group != "ok" || got[2].Group != "desc" {
		t.Fatalf("merged %+v", got)
	}
	all := int32(1<<read | 1<<desc | 1<<del)
	if got[1].AuthorizedOperations != all || got[2].AuthorizedOperations != 1<<desc {
		t.Fatalf("authorized operations %b %b", got[1].AuthorizedOperations, got[2].AuthorizedOperations)
	}

	del := kmsg.NewPtrDeleteGroupsRequest()
	del.Groups = []string{"desc", "ok"} // DELETE: only ok
	d = Authorize(del, can, nil)
	dinner := kmsg.NewPtrDeleteGroupsResponse()
	dinner.Groups = []kmsg.DeleteGroupsResponseGroup{{Group: "ok"}}
	dgot := d.Finish(dinner).(*kmsg.DeleteGroupsResponse).Groups
	if len(dgot) != 2 || dgot[0].Group != "desc" || dgot[0].ErrorCode != gaf || dgot[1].Group != "ok" || dgot[1].ErrorCode != 0 {
		t.Fatalf("delete merged %+v", dgot)
	}

	lg := kmsg.NewPtrListGroupsRequest()
	d = Authorize(lg, can, nil)
	linner := kmsg.NewPtrListGroupsResponse()
	linner.Groups = []kmsg.ListGroupsResponseGroup{{Group: "ok"}, {Group: "other"}, {Group: "desc"}}
	lgot := d.Finish(linner).(*kmsg.ListGroupsResponse).Groups
	if len(lgot) != 2 || lgot[0].Group != "ok" || lgot[1].Group != "desc" {
		t.Fatalf("listed %+v", lgot)
	}
	clusterDescribe := func(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) bool {
		return rt == kmsg.ACLResourceTypeCluster && name == ClusterName && op == desc
	}
	if d := Authorize(lg, clusterDescribe, nil); d.Finish != nil {
		t.Fatal("CLUSTER DESCRIBE lists every group, unfiltered")
	}

	cgd := kmsg.NewPtrConsumerGroupDescribeRequest()
	cgd.Groups = []string{"nope"}
	if d := Authorize(cgd, can, nil); d.Answer.(*kmsg.ConsumerGroupDescribeResponse).Groups[0].ErrorCode != gaf {
		t.Fatalf("consumer group describe: %+v", d)
	}

	od := kmsg.NewPtrOffsetDeleteRequest()
	od.Group = "ok"
	od.Topics = []kmsg.OffsetDeleteRequestTopic{{Topic: "t-no", Partitions: []kmsg.OffsetDeleteRequestTopicPartition{{Partition: 0}}}}
	d = Authorize(od, can, nil)
	if p := d.Pass.(*kmsg.OffsetDeleteRequest); len(p.Topics) != 0 {
		t.Fatalf("offset delete passed %+v", p.Topics)
	}
	if got := d.Finish(kmsg.NewPtrOffsetDeleteResponse()).(*kmsg.OffsetDeleteResponse); got.Topics[0].Partitions[0].ErrorCode != taf {
		t.Fatalf("offset delete merged %+v", got)
	}
}

// TestAuthorizeGroupSplit runs the four multi-group requests through the
// same cases (groupSplit): every group allowed passes the request as it
// is; every group denied is answered here, at the request's version;
// a mix passes the allowed groups and merges the denied back in their
// places, an extra entry of the inner answer kept at the end.
func TestAuthorizeGroupSplit(t *testing.T) {
	can := testCan()
	type entry struct {
		group string
		code  int16
	}
	for _, k := range []struct {
		name    string
		allowed string // a group allowed the request's operation
		build   func(groups []string) kmsg.Request
		passed  func(kmsg.Request) []string
		inner   func(groups []string) kmsg.Response
		entries func(kmsg.Response) []entry
	}{{
		name: "DescribeGroups", allowed: "desc",
		build: func(gs []string) kmsg.Request {
			r := kmsg.NewPtrDescribeGroupsRequest()
			r.Version, r.Groups = 5, gs
			return r
		},
		passed: func(r kmsg.Request) []string { return r.(*kmsg.DescribeGroupsRequest).Groups },
		inner: func(gs []string) kmsg.Response {
			resp := kmsg.NewPtrDescribeGroupsResponse()
			for _, g := range gs {
				resp.Groups = append(resp.Groups, kmsg.DescribeGroupsResponseGroup{Group: g})
			}
			return resp
		},
		entries: func(r kmsg.Response) (out []entry) {
			for _, g := range r.(*kmsg.DescribeGroupsResponse).Groups {
				out = append(out, entry{g.Group, g.ErrorCode})
			}
			return out
		},
	}, {
		name: "ConsumerGroupDescribe", allowed: "desc",
		build: func(gs []string) kmsg.Request {
			r := kmsg.NewPtrConsumerGroupDescribeRequest()
			r.Version, r.Groups = 1, gs
			return r
		},
		passed: func(r kmsg.Request) []string { return r.(*kmsg.ConsumerGroupDescribeRequest).Groups },
		inner: func(gs []string) kmsg.Response {
			resp := kmsg.NewPtrConsumerGroupDescribeResponse()
			for _, g := range gs {
				resp.Groups = append(resp.Groups, kmsg.ConsumerGroupDescribeResponseGroup{Group: g})
			}
			return resp
		},
		entries: func(r kmsg.Response) (out []entry) {
			for _, g := range r.(*kmsg.ConsumerGroupDescribeResponse).Groups {
				out = append(out, entry{g.Group, g.ErrorCode})
			}
			return out
		},
	}, {
		name: "DeleteGroups", allowed: "ok",
		build: func(gs []string) kmsg.Request {
			r := kmsg.NewPtrDeleteGroupsRequest()
			r.Version, r.Groups = 2, gs
			return r
		},
		passed: func(r kmsg.Request) []string { return r.(*kmsg.DeleteGroupsRequest).Groups },
		inner: func(gs []string) kmsg.Response {
			resp := kmsg.NewPtrDeleteGroupsResponse()
			for _, g := range gs {
				resp.Groups = append(resp.Groups, kmsg.DeleteGroupsResponseGroup{Group: g})
			}
			return resp
		},
		entries: func(r kmsg.Response) (out []entry) {
			for _, g := range r.(*kmsg.DeleteGroupsResponse).Groups {
				out = append(out, entry{g.Group, g.ErrorCode})
			}
			return out
		},
	}, {
		name: "ShareGroupDescribe", allowed: "desc",
		build: func(gs []string) kmsg.Request {
			r := kmsg.NewPtrShareGroupDescribeRequest()
			r.Version, r.GroupIDs = 1, gs
			return r
		},
		passed: func(r kmsg.Request) []string { return r.(*kmsg.ShareGroupDescribeRequest).GroupIDs },
		inner: func(gs []string) kmsg.Response {
			resp := kmsg.NewPtrShareGroupDescribeResponse()
			for _, g := range gs {
				resp.Groups = append(resp.Groups, kmsg.ShareGroupDescribeResponseGroup{GroupID: g})
			}
			return resp
		},
		entries: func(r kmsg.Response) (out []entry) {
			for _, g := range r.(*kmsg.ShareGroupDescribeResponse).Groups {
				out = append(out, entry{g.GroupID, g.ErrorCode})
			}
			return out
		},
	}} {
		t.Run(k.name, func(t *testing.T) {
			req := k.build([]string{k.allowed})
			if d := Authorize(req, can, nil); d.Answer != nil || d.Pass != req || d.Finish != nil {
				t.Fatalf("every group allowed: %+v, want the request passed as it is", d)
			}

			req = k.build([]string{"nope", "nope-2"})
			d := Authorize(req, can, nil)
			if d.Answer == nil {
				t.Fatalf("every group denied: %+v, want an answer here", d)
			}
			if d.Answer.GetVersion() != req.GetVersion() {
				t.Errorf("answered at version %d, want the request's %d", d.Answer.GetVersion(), req.GetVersion())
			}
			if got, want := k.entries(d.Answer), []entry{{"nope", gaf}, {"nope-2", gaf}}; !reflect.DeepEqual(got, want) {
				t.Errorf("every group denied answered %v, want %v", got, want)
			}

			req = k.build([]string{"nope", k.allowed, "nope-2"})
			d = Authorize(req, can, nil)
			if d.Answer != nil || d.Finish == nil {
				t.Fatalf("a mix: %+v, want the allowed passed and a merge", d)
			}
			if got := k.passed(d.Pass); !reflect.DeepEqual(got, []string{k.allowed}) {
				t.Fatalf("a mix passed %v, want [%s]", got, k.allowed)
			}
			if got := k.passed(req); len(got) != 3 {
				t.Fatalf("the client's request was changed: %v", got)
			}
			got := k.entries(d.Finish(k.inner([]string{k.allowed, "extra"})))
			want := []entry{{"nope", gaf}, {k.allowed, 0}, {"nope-2", gaf}, {"extra", 0}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("a mix merged %v, want %v", got, want)
			}
		})
	}
}
