package codec

import (
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Route says what the proxy does with one API key.
type Route uint8

const (
	// Forward sends the request upstream as the bytes that arrived and
	// streams the response back untouched.
	Forward Route = iota
	// Rewrite forwards the request and decodes the response to replace
	// upstream broker addresses with proxy addresses.
	Rewrite
	// Local is served by kproxy itself (the coordinator engine, or the
	// proxy for FindCoordinator of groups); it never reaches a broker.
	Local
	// Refuse closes the connection: the key is one kproxy cannot proxy
	// safely and does not advertise.
	Refuse
)

// String returns the route's name as it appears in metrics and logs.
func (r Route) String() string {
	switch r {
	case Forward:
		return "forwarded"
	case Rewrite:
		return "rewritten"
	case Local:
		return "local"
	case Refuse:
		return "refused"
	}
	return "unknown"
}

// API keys kproxy treats specially. Everything not listed here is
// forwarded as is, at the versions the broker advertises.
const (
	KeyProduce                = 0
	KeyFetch                  = 1
	KeyMetadata               = 3
	KeyOffsetCommit           = 8
	KeyOffsetFetch            = 9
	KeyFindCoordinator        = 10
	KeyJoinGroup              = 11
	KeyHeartbeat              = 12
	KeyLeaveGroup             = 13
	KeySyncGroup              = 14
	KeyDescribeGroups         = 15
	KeyListGroups             = 16
	KeyApiVersions            = 18
	KeyTxnOffsetCommit        = 28
	KeyDeleteGroups           = 42
	KeyOffsetDelete           = 47
	KeyDescribeQuorum         = 55
	KeyDescribeCluster        = 60
	KeyConsumerGroupHeartbeat = 68
	KeyConsumerGroupDescribe  = 69
)

// APIInfo is one row of the routing table.
type APIInfo struct {
	// Route when the coordinator engine serves groups.
	Route Route
	// MaxVersion caps the version advertised in ApiVersions; -1 keeps
	// the broker's.
	MaxVersion int16
	// Why says why the key is special, for readers of this table.
	Why string
}

// APIs is the one table of every API key kproxy intercepts, rewrites,
// caps or refuses. Group keys are Local only while the engine serves
// groups; with groups forwarded (Config.ForwardGroups in proxy) they
// revert to Forward and FindCoordinator to Rewrite.
var APIs = map[int16]APIInfo{
	KeyProduce: {Rewrite, MaxVersion(KeyProduce),
		"v10+ responses may carry leader endpoints (KIP-951); capped to what kmsg parses"},
	KeyFetch: {Forward, 15,
		"v16+ responses may carry leader endpoints (KIP-951); capping at v15 keeps fetch responses streamable without decoding them"},
	KeyMetadata: {Rewrite, MaxVersion(KeyMetadata), "carries every broker's address"},
	KeyFindCoordinator: {Local, MaxVersion(KeyFindCoordinator),
		"groups: answered with a kproxy address; transactions: forwarded and rewritten"},
	KeyApiVersions:     {Rewrite, MaxVersion(KeyApiVersions), "merged, only when the answer carries no error: group APIs added, address-bearing APIs capped; error answers (UNSUPPORTED_VERSION in v0) pass untouched"},
	KeyDescribeCluster: {Rewrite, MaxVersion(KeyDescribeCluster), "carries every broker's address"},
	KeyDescribeQuorum:  {Forward, 1, "v2 responses carry controller endpoints"},

	KeyOffsetCommit:    {Local, MaxVersion(KeyOffsetCommit), "coordinator engine"},
	KeyOffsetFetch:     {Local, MaxVersion(KeyOffsetFetch), "coordinator engine"},
	KeyJoinGroup:       {Local, MaxVersion(KeyJoinGroup), "coordinator engine"},
	KeyHeartbeat:       {Local, MaxVersion(KeyHeartbeat), "coordinator engine"},
	KeyLeaveGroup:      {Local, MaxVersion(KeyLeaveGroup), "coordinator engine"},
	KeySyncGroup:       {Local, MaxVersion(KeySyncGroup), "coordinator engine"},
	KeyDescribeGroups:  {Local, MaxVersion(KeyDescribeGroups), "coordinator engine"},
	KeyListGroups:      {Local, MaxVersion(KeyListGroups), "coordinator engine"},
	KeyTxnOffsetCommit: {Local, MaxVersion(KeyTxnOffsetCommit), "coordinator engine validates, then the store forwards"},
	KeyDeleteGroups:    {Local, MaxVersion(KeyDeleteGroups), "coordinator engine"},
	KeyOffsetDelete:    {Local, MaxVersion(KeyOffsetDelete), "coordinator engine"},

	KeyConsumerGroupHeartbeat: {Local, MaxVersion(KeyConsumerGroupHeartbeat), "coordinator engine (KIP-848)"},
	KeyConsumerGroupDescribe:  {Local, MaxVersion(KeyConsumerGroupDescribe), "coordinator engine (KIP-848)"},
	76:                        {Refuse, -1, "share groups (KIP-932) are not proxied: their responses carry leader endpoints"},
	77:                        {Refuse, -1, "share groups (KIP-932) are not proxied"},
	78:                        {Refuse, -1, "share groups (KIP-932) are not proxied: their responses carry leader endpoints"},
	79:                        {Refuse, -1, "share groups (KIP-932) are not proxied: their responses carry leader endpoints"},
	90:                        {Refuse, -1, "share groups (KIP-932) are not proxied"},
	91:                        {Refuse, -1, "share groups (KIP-932) are not proxied"},
	92:                        {Refuse, -1, "share groups (KIP-932) are not proxied"},
}

// Lookup returns key's row of APIs, without a map lookup: it is on the
// path of every request.
func Lookup(key int16) (APIInfo, bool) {
	if key < 0 || int(key) >= len(apiTable) {
		return APIInfo{}, false
	}
	e := apiTable[key]
	return e.info, e.ok
}

var apiTable = func() (t [100]struct {
	info APIInfo
	ok   bool
}) {
	for k, info := range APIs {
		t[k].info, t[k].ok = info, true
	}
	return t
}()

// IsGroupKey reports whether key is a consumer-group API that the engine
// serves when groups are local.
func IsGroupKey(key int16) bool {
	a, ok := Lookup(key)
	return ok && a.Route == Local && key != KeyFindCoordinator
}

// MergeApiVersions edits an upstream ApiVersions response in place into
// what kproxy advertises: keys kmsg cannot parse are dropped (the proxy
// could not read their headers), refused keys are dropped, capped keys are
// capped, and when localGroups is set every group key is advertised at the
// versions the engine serves whatever the broker supports.
func MergeApiVersions(resp *kmsg.ApiVersionsResponse, localGroups bool) {
	seen := make(map[int16]bool, len(resp.ApiKeys))
	keys := resp.ApiKeys[:0]
	for _, k := range resp.ApiKeys {
		if MaxVersion(k.ApiKey) < 0 {
			continue
		}
		info, special := APIs[k.ApiKey]
		if special {
			if info.Route == Refuse {
				continue
			}
			if info.MaxVersion >= 0 && k.MaxVersion > info.MaxVersion {
				k.MaxVersion = info.MaxVersion
			}
			if localGroups && IsGroupKey(k.ApiKey) {
				k.MinVersion, k.MaxVersion = 0, info.MaxVersion
			}
			if k.MinVersion > k.MaxVersion {
				continue
			}
		}
		seen[k.ApiKey] = true
		keys = append(keys, k)
	}
	if localGroups {
		for key := range APIs {
			if !IsGroupKey(key) && key != KeyFindCoordinator {
				continue
			}
			if seen[key] {
				continue
			}
			k := kmsg.NewApiVersionsResponseApiKey()
			k.ApiKey, k.MinVersion, k.MaxVersion = key, 0, APIs[key].MaxVersion
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b kmsg.ApiVersionsResponseApiKey) int { return int(a.ApiKey) - int(b.ApiKey) })
	resp.ApiKeys = keys
}
