package proxy

import (
	"github.com/twmb/franz-go/pkg/kmsg"
)

// groupAPI is what the router needs to know about one group API: which
// groups a request names (its error answer is codec.GroupErrorResponse)
// and, for APIs
// that name several groups, how to split a request by owner and merge
// the answers.
type groupAPI struct {
	// groups names the groups req is for, in request order.
	groups func(req kmsg.Request) []string
	// multi splits and merges requests naming several groups; nil for
	// single-group APIs.
	multi splitter
}

// splitter splits a multi-group request by destination and merges the
// answers in the original order.
type splitter interface {
	// subset is a copy of req naming only the groups at idx.
	subset(req kmsg.Request, idx []int) kmsg.Request
	// merge builds the answer to req from the answers to its subsets.
	merge(req kmsg.Request, parts []part) kmsg.Response
}

// part is one subset of a split request and its answer.
type part struct {
	idx  []int // positions of the subset's groups in the original request
	resp kmsg.Response
}

// groupAPIs lists every API the router routes, by key. ListGroups names
// no group: the router asks every owner (router.go). FindCoordinator is
// answered by the session, never routed.
var groupAPIs = map[int16]groupAPI{
	8: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.OffsetCommitRequest).Group} },
	},
	9: {
		groups: offsetFetchGroups,
		multi:  offsetFetchSplitter,
	},
	11: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.JoinGroupRequest).Group} },
	},
	12: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.HeartbeatRequest).Group} },
	},
	13: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.LeaveGroupRequest).Group} },
	},
	14: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.SyncGroupRequest).Group} },
	},
	15: describeGroupsAPI,
	16: {
		groups: func(kmsg.Request) []string { return nil },
	},
	28: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.TxnOffsetCommitRequest).Group} },
	},
	42: deleteGroupsAPI,
	47: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.OffsetDeleteRequest).Group} },
	},
	68: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.ConsumerGroupHeartbeatRequest).Group} },
	},
	69: consumerGroupDescribeAPI,
	// Share groups (KIP-932), when kproxy serves them: membership,
	// description and offsets go to the group's owner like the other
	// group APIs. ShareFetch and ShareAcknowledge do not pass here: the
	// share service of the member's kproxy serves them and asks the
	// owner only what the member acquires (internal/shares).
	76: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.ShareGroupHeartbeatRequest).GroupID} },
	},
	77: shareGroupDescribeAPI,
	90: describeShareGroupOffsetsAPI,
	91: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.AlterShareGroupOffsetsRequest).GroupID} },
	},
	92: {
		groups: func(r kmsg.Request) []string { return []string{r.(*kmsg.DeleteShareGroupOffsetsRequest).GroupID} },
	},
}

// multiAPI describes a multi-group API whose request is a *Q holding a
// list of G (one per group) and whose response is a *S holding a list of
// I (one per group). Its methods implement splitter for any such pair.
type multiAPI[Q, S, G, I any] struct {
	reqItems func(*Q) *[]G // the request's group list
	reqName  func(G) string
	newResp  func() *S
	items    func(*S) *[]I // the response's group list
	name     func(I) string
	errItem  func(group string, code int16) I
}

func (m multiAPI[Q, S, G, I]) api() groupAPI {
	return groupAPI{groups: m.groups, multi: m}
}

func (m multiAPI[Q, S, G, I]) groups(r kmsg.Request) []string {
	gs := *m.reqItems(any(r).(*Q))
	names := make([]string, len(gs))
	for i, g := range gs {
		names[i] = m.reqName(g)
	}
	return names
}

func (m multiAPI[Q, S, G, I]) subset(r kmsg.Request, idx []int) kmsg.Request {
	q := *any(r).(*Q) // a shallow copy; only its group list changes
	all := *m.reqItems(any(r).(*Q))
	sub := make([]G, len(idx))
	for i, j := range idx {
		sub[i] = all[j]
	}
	*m.reqItems(&q) = sub
	return any(&q).(kmsg.Request)
}

// merge places each part's answers at their groups' original positions.
// An owner answers its groups in request order; when a part does not (a
// group missing or renamed), its answers are matched by group name, and
// a group nobody answered gets COORDINATOR_NOT_AVAILABLE.
func (m multiAPI[Q, S, G, I]) merge(r kmsg.Request, parts []part) kmsg.Response {
	names := m.groups(r)
	out := make([]I, len(names))
	filled := make([]bool, len(names))
	var throttle int32
	for _, p := range parts {
		s, ok := any(p.resp).(*S)
		if !ok {
			continue
		}
		if t, ok := p.resp.(kmsg.ThrottleResponse); ok {
			ms, _ := t.Throttle()
			throttle = max(throttle, ms)
		}
		got := *m.items(s)
		inOrder := len(got) == len(p.idx)
		for i := 0; inOrder && i < len(got); i++ {
			inOrder = m.name(got[i]) == names[p.idx[i]]
		}
		if inOrder {
			for i, j := range p.idx {
				out[j], filled[j] = got[i], true
			}
			continue
		}
		used := make([]bool, len(got))
		for _, j := range p.idx {
			for i, it := range got {
				if !used[i] && m.name(it) == names[j] {
					out[j], filled[j], used[i] = it, true, true
					break
				}
			}
		}
	}
	for j, ok := range filled {
		if !ok {
			out[j] = m.errItem(names[j], errCoordinatorNotAvailable)
		}
	}
	resp := m.newResp()
	*m.items(resp) = out
	kr := any(resp).(kmsg.Response)
	if t, ok := kr.(kmsg.SetThrottleResponse); ok {
		t.SetThrottle(throttle)
	}
	return kr
}

// Kafka error codes the router answers with.
const (
	errCoordinatorNotAvailable int16 = 15 // COORDINATOR_NOT_AVAILABLE
	errInvalidRequest          int16 = 42 // INVALID_REQUEST
	errUnsupportedVersion      int16 = 35 // UNSUPPORTED_VERSION
	errUnknownMemberID         int16 = 25 // UNKNOWN_MEMBER_ID
	errRebalanceInProgress     int16 = 27 // REBALANCE_IN_PROGRESS
)

var describeGroupsAPI = multiAPI[kmsg.DescribeGroupsRequest, kmsg.DescribeGroupsResponse, string, kmsg.DescribeGroupsResponseGroup]{
	reqItems: func(q *kmsg.DescribeGroupsRequest) *[]string { return &q.Groups },
	reqName:  func(g string) string { return g },
	newResp:  kmsg.NewPtrDescribeGroupsResponse,
	items:    func(s *kmsg.DescribeGroupsResponse) *[]kmsg.DescribeGroupsResponseGroup { return &s.Groups },
	name:     func(g kmsg.DescribeGroupsResponseGroup) string { return g.Group },
	errItem: func(group string, code int16) kmsg.DescribeGroupsResponseGroup {
		g := kmsg.NewDescribeGroupsResponseGroup()
		g.Group, g.ErrorCode = group, code
		return g
	},
}.api()

var deleteGroupsAPI = multiAPI[kmsg.DeleteGroupsRequest, kmsg.DeleteGroupsResponse, string, kmsg.DeleteGroupsResponseGroup]{
	reqItems: func(q *kmsg.DeleteGroupsRequest) *[]string { return &q.Groups },
	reqName:  func(g string) string { return g },
	newResp:  kmsg.NewPtrDeleteGroupsResponse,
	items:    func(s *kmsg.DeleteGroupsResponse) *[]kmsg.DeleteGroupsResponseGroup { return &s.Groups },
	name:     func(g kmsg.DeleteGroupsResponseGroup) string { return g.Group },
	errItem: func(group string, code int16) kmsg.DeleteGroupsResponseGroup {
		g := kmsg.NewDeleteGroupsResponseGroup()
		g.Group, g.ErrorCode = group, code
		return g
	},
}.api()

var consumerGroupDescribeAPI = multiAPI[kmsg.ConsumerGroupDescribeRequest, kmsg.ConsumerGroupDescribeResponse, string, kmsg.ConsumerGroupDescribeResponseGroup]{
	reqItems: func(q *kmsg.ConsumerGroupDescribeRequest) *[]string { return &q.Groups },
	reqName:  func(g string) string { return g },
	newResp:  kmsg.NewPtrConsumerGroupDescribeResponse,
	items: func(s *kmsg.ConsumerGroupDescribeResponse) *[]kmsg.ConsumerGroupDescribeResponseGroup {
		return &s.Groups
	},
	name: func(g kmsg.ConsumerGroupDescribeResponseGroup) string { return g.Group },
	errItem: func(group string, code int16) kmsg.ConsumerGroupDescribeResponseGroup {
		g := kmsg.NewConsumerGroupDescribeResponseGroup()
		g.Group, g.ErrorCode = group, code
		return g
	},
}.api()

// offsetFetchV8 splits OffsetFetch v8+, which names groups in Groups;
// v0-7 name one group in Group and are never split.
var offsetFetchV8 = multiAPI[kmsg.OffsetFetchRequest, kmsg.OffsetFetchResponse, kmsg.OffsetFetchRequestGroup, kmsg.OffsetFetchResponseGroup]{
	reqItems: func(q *kmsg.OffsetFetchRequest) *[]kmsg.OffsetFetchRequestGroup { return &q.Groups },
	reqName:  func(g kmsg.OffsetFetchRequestGroup) string { return g.Group },
	newResp:  kmsg.NewPtrOffsetFetchResponse,
	items:    func(s *kmsg.OffsetFetchResponse) *[]kmsg.OffsetFetchResponseGroup { return &s.Groups },
	name:     func(g kmsg.OffsetFetchResponseGroup) string { return g.Group },
	errItem: func(group string, code int16) kmsg.OffsetFetchResponseGroup {
		g := kmsg.NewOffsetFetchResponseGroup()
		g.Group, g.ErrorCode = group, code
		return g
	},
}

var offsetFetchSplitter splitter = offsetFetchV8

func offsetFetchGroups(r kmsg.Request) []string {
	q := r.(*kmsg.OffsetFetchRequest)
	if q.Version < 8 {
		return []string{q.Group}
	}
	return offsetFetchV8.groups(r)
}

var shareGroupDescribeAPI = multiAPI[kmsg.ShareGroupDescribeRequest, kmsg.ShareGroupDescribeResponse, string, kmsg.ShareGroupDescribeResponseGroup]{
	reqItems: func(q *kmsg.ShareGroupDescribeRequest) *[]string { return &q.GroupIDs },
	reqName:  func(g string) string { return g },
	newResp:  kmsg.NewPtrShareGroupDescribeResponse,
	items: func(s *kmsg.ShareGroupDescribeResponse) *[]kmsg.ShareGroupDescribeResponseGroup {
		return &s.Groups
	},
	name: func(g kmsg.ShareGroupDescribeResponseGroup) string { return g.GroupID },
	errItem: func(group string, code int16) kmsg.ShareGroupDescribeResponseGroup {
		g := kmsg.NewShareGroupDescribeResponseGroup()
		g.GroupID, g.ErrorCode = group, code
		return g
	},
}.api()

var describeShareGroupOffsetsAPI = multiAPI[kmsg.DescribeShareGroupOffsetsRequest, kmsg.DescribeShareGroupOffsetsResponse, kmsg.DescribeShareGroupOffsetsRequestGroup, kmsg.DescribeShareGroupOffsetsResponseGroup]{
	reqItems: func(q *kmsg.DescribeShareGroupOffsetsRequest) *[]kmsg.DescribeShareGroupOffsetsRequestGroup {
		return &q.Groups
	},
	reqName: func(g kmsg.DescribeShareGroupOffsetsRequestGroup) string { return g.GroupID },
	newResp: kmsg.NewPtrDescribeShareGroupOffsetsResponse,
	items: func(s *kmsg.DescribeShareGroupOffsetsResponse) *[]kmsg.DescribeShareGroupOffsetsResponseGroup {
		return &s.Groups
	},
	name: func(g kmsg.DescribeShareGroupOffsetsResponseGroup) string { return g.GroupID },
	errItem: func(group string, code int16) kmsg.DescribeShareGroupOffsetsResponseGroup {
		g := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
		g.GroupID, g.ErrorCode = group, code
		return g
	},
}.api()
