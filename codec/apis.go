package codec

import (
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Route says what the proxy does with one request.
type Route uint8

const (
	// Forward sends the request upstream as the bytes that arrived and
	// streams the response back untouched.
	Forward Route = iota
	// Rewrite forwards the request and decodes the response to edit it
	// (Decision.Edit says when): broker addresses become proxy
	// addresses, ApiVersions is merged with what kproxy serves.
	Rewrite
	// Local is served by kproxy itself (the coordinator engine, or the
	// proxy for FindCoordinator of groups and for ApiVersions at a
	// version it does not know); it never reaches a broker.
	Local
	// Refuse closes the connection: the key, or this version of it, is
	// one kproxy cannot proxy safely (Decision.Refusal says why).
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

// Edit says which upstream responses kproxy decodes and edits before
// they reach the client.
type Edit uint8

const (
	// EditNone streams every response as the broker sent it.
	EditNone Edit = iota
	// EditAlways decodes every response and replaces the broker
	// addresses in it (Metadata, DescribeCluster, FindCoordinator).
	EditAlways
	// EditIfNoError merges a response whose error code is 0 with what
	// kproxy serves (ApiVersions); an error answer, such as the v0
	// UNSUPPORTED_VERSION a broker sends for a version it does not
	// speak, passes as the broker gave it.
	EditIfNoError
	// EditIfEndpoints edits a response only when it carries leader
	// endpoints (Produce v10+, KIP-951); one without them, the usual
	// case, passes as the broker sent it.
	EditIfEndpoints
	// EditObserve reads every response whole so that the session can
	// learn from it (the broker's verdict on a client's SASL exchange,
	// which gives the session its principal) and passes it on exactly
	// as the broker sent it.
	EditObserve
)

// String names the edit for logs and tests.
func (e Edit) String() string {
	switch e {
	case EditNone:
		return "none"
	case EditAlways:
		return "always"
	case EditIfNoError:
		return "if_no_error"
	case EditIfEndpoints:
		return "if_endpoints"
	case EditObserve:
		return "observe"
	}
	return "unknown"
}

// API keys kproxy treats specially. Everything not listed here is
// forwarded as is, at the versions the broker advertises.
const (
	KeyProduce                 = 0
	KeyFetch                   = 1
	KeyMetadata                = 3
	KeyOffsetCommit            = 8
	KeyOffsetFetch             = 9
	KeyFindCoordinator         = 10
	KeyJoinGroup               = 11
	KeyHeartbeat               = 12
	KeyLeaveGroup              = 13
	KeySyncGroup               = 14
	KeyDescribeGroups          = 15
	KeyListGroups              = 16
	KeySaslHandshake           = 17
	KeyApiVersions             = 18
	KeyTxnOffsetCommit         = 28
	KeyDescribeConfigs         = 32
	KeyAlterConfigs            = 33
	KeyDeleteGroups            = 42
	KeyIncrementalAlterConfigs = 44
	KeyOffsetDelete            = 47
	KeyDescribeQuorum          = 55
	KeyDescribeCluster         = 60
	KeyConsumerGroupHeartbeat  = 68
	KeyConsumerGroupDescribe   = 69
	KeySaslAuthenticate        = 36

	KeyShareGroupHeartbeat                   = 76
	KeyShareGroupDescribe                    = 77
	KeyShareFetch                            = 78
	KeyShareAcknowledge                      = 79
	KeyStreamsGroupHeartbeat                 = 88
	KeyStreamsGroupDescribe                  = 89
	KeyDescribeShareGroupOffsets             = 90
	KeyAlterShareGroupOffsets                = 91
	KeyDeleteShareGroupOffsets               = 92
	KeyStreamsGroupTopologyDescriptionUpdate = 93
)

// Decision is what happens to one request: where it goes, the highest
// version kproxy advertises for its key, and which of its responses are
// edited. RouteFor makes it.
type Decision struct {
	Route Route
	// MaxVersion caps the version advertised in ApiVersions; -1 keeps
	// the broker's.
	MaxVersion int16
	// Edit says which responses from upstream are decoded and edited.
	// It is EditNone unless Route is Rewrite, except for FindCoordinator
	// served locally: the transactional lookups the session forwards
	// after decoding are edited as with groups forwarded.
	Edit Edit
	// Why says why the key is special, for readers and for errors.
	Why string
	// badVersion marks a refusal of this version, not of the key.
	badVersion bool
}

// apiRow is one row of the routing table.
type apiRow struct {
	// route when kproxy serves groups; with groups forwarded Local
	// becomes Forward, or Rewrite when edit is set.
	route Route
	// maxVersion caps the advertised version; -1 keeps the broker's.
	maxVersion int16
	// edit applies to responses from editFrom on; earlier versions are
	// forwarded untouched.
	edit     Edit
	editFrom int16
	why      string
}

// apis is the one table of every API key kproxy intercepts, rewrites,
// caps or refuses, and of which responses it edits. Group keys are Local
// only while the engine serves groups; with groups forwarded
// (Config.ForwardGroups in proxy) they revert to Forward and
// FindCoordinator to Rewrite. RouteFor reads it; so does
// MergeApiVersions.
var apis = map[int16]apiRow{
	KeyProduce: {Rewrite, MaxVersion(KeyProduce), EditIfEndpoints, 10,
		"v10+ responses may carry leader endpoints (KIP-951), edited only when they do; capped to what kmsg parses"},
	KeyFetch: {Forward, 15, EditNone, 0,
		"v16+ responses may carry leader endpoints (KIP-951); capping at v15 keeps fetch responses streamable without decoding them"},
	KeyMetadata: {Rewrite, MaxVersion(KeyMetadata), EditAlways, 0, "carries every broker's address"},
	KeyFindCoordinator: {Local, MaxVersion(KeyFindCoordinator), EditAlways, 0,
		"groups: answered with a kproxy address; transactions: forwarded and rewritten"},
	KeyApiVersions: {Rewrite, MaxVersion(KeyApiVersions), EditIfNoError, 0,
		"merged, only when the answer carries no error: group APIs added, address-bearing APIs capped; error answers (UNSUPPORTED_VERSION in v0) pass untouched"},
	KeyDescribeCluster: {Rewrite, MaxVersion(KeyDescribeCluster), EditAlways, 0, "carries every broker's address"},
	KeyDescribeQuorum:  {Forward, 1, EditNone, 0, "v2 responses carry controller endpoints"},

	// SASL passes through byte for byte; the session reads the
	// mechanism and the client's first bytes from the requests, and the
	// broker's verdict from the responses, to learn the principal its
	// group requests are authorized as (package authz).
	KeySaslHandshake: {Rewrite, MaxVersion(KeySaslHandshake), EditObserve, 0,
		"observed, not edited: the client's SASL mechanism (its principal for group authorization); v0 refused: raw SASL tokens without Kafka framing follow it"},
	KeySaslAuthenticate: {Rewrite, MaxVersion(KeySaslAuthenticate), EditObserve, 0,
		"observed, not edited: the broker's verdict on the client's SASL exchange (its principal for group authorization)"},

	KeyOffsetCommit:    {Local, MaxVersion(KeyOffsetCommit), EditNone, 0, "coordinator engine"},
	KeyOffsetFetch:     {Local, MaxVersion(KeyOffsetFetch), EditNone, 0, "coordinator engine"},
	KeyJoinGroup:       {Local, MaxVersion(KeyJoinGroup), EditNone, 0, "coordinator engine"},
	KeyHeartbeat:       {Local, MaxVersion(KeyHeartbeat), EditNone, 0, "coordinator engine"},
	KeyLeaveGroup:      {Local, MaxVersion(KeyLeaveGroup), EditNone, 0, "coordinator engine"},
	KeySyncGroup:       {Local, MaxVersion(KeySyncGroup), EditNone, 0, "coordinator engine"},
	KeyDescribeGroups:  {Local, MaxVersion(KeyDescribeGroups), EditNone, 0, "coordinator engine"},
	KeyListGroups:      {Local, MaxVersion(KeyListGroups), EditNone, 0, "coordinator engine"},
	KeyTxnOffsetCommit: {Local, MaxVersion(KeyTxnOffsetCommit), EditNone, 0, "coordinator engine validates, then the store forwards"},
	KeyDeleteGroups:    {Local, MaxVersion(KeyDeleteGroups), EditNone, 0, "coordinator engine"},
	KeyOffsetDelete:    {Local, MaxVersion(KeyOffsetDelete), EditNone, 0, "coordinator engine"},

	KeyConsumerGroupHeartbeat: {Local, MaxVersion(KeyConsumerGroupHeartbeat), EditNone, 0, "coordinator engine (KIP-848)"},
	KeyConsumerGroupDescribe:  {Local, MaxVersion(KeyConsumerGroupDescribe), EditNone, 0, "coordinator engine (KIP-848)"},

	// Share groups (KIP-932) and streams groups (KIP-1071) are served by
	// the cluster's own coordinator, never by kproxy's engine: their
	// coordinator requests are forwarded on the client's connection at
	// the broker's versions, and kproxy answers FindCoordinator for such a
	// group with its listener for the cluster's coordinator (GroupKind,
	// proxy/forward.go). ShareFetch and ShareAcknowledge go to partition
	// leaders like Fetch; their responses carry leader endpoints for
	// partitions that moved, edited only when they do.
	KeyShareGroupHeartbeat:                   {Forward, -1, EditNone, 0, shareWhy},
	KeyShareGroupDescribe:                    {Forward, -1, EditNone, 0, shareWhy},
	KeyDescribeShareGroupOffsets:             {Forward, -1, EditNone, 0, shareWhy},
	KeyAlterShareGroupOffsets:                {Forward, -1, EditNone, 0, shareWhy},
	KeyDeleteShareGroupOffsets:               {Forward, -1, EditNone, 0, shareWhy},
	KeyStreamsGroupHeartbeat:                 {Forward, -1, EditNone, 0, streamsWhy},
	KeyStreamsGroupDescribe:                  {Forward, -1, EditNone, 0, streamsWhy},
	KeyStreamsGroupTopologyDescriptionUpdate: {Forward, -1, EditNone, 0, streamsWhy},
	KeyShareFetch: {Rewrite, MaxVersion(KeyShareFetch), EditIfEndpoints, 0,
		"responses carry the endpoints of partitions' new leaders (KIP-932), edited only when they do; capped to what kmsg parses"},
	KeyShareAcknowledge: {Rewrite, MaxVersion(KeyShareAcknowledge), EditIfEndpoints, 0,
		"responses carry the endpoints of partitions' new leaders (KIP-932), edited only when they do; capped to what kmsg parses"},
}

const (
	shareWhy   = "share groups (KIP-932): the cluster's coordinator serves them, kproxy forwards"
	streamsWhy = "streams groups (KIP-1071): the cluster's coordinator serves them, kproxy forwards"
)

// Group kinds kproxy forwards to the cluster's coordinator, as Kafka
// names them in ListGroups (KIP-848's group types).
const (
	KindShare   = "share"
	KindStreams = "streams"
)

// GroupKind returns the kind of group a coordinator request of key is
// about when the cluster's coordinator, not kproxy's engine, serves that
// kind ("share", "streams"); "" for every other key. The session reads
// the group ids of such a request, so that FindCoordinator for them
// names the cluster's coordinator.
func GroupKind(key int16) string {
	switch key {
	case KeyShareGroupHeartbeat, KeyShareGroupDescribe, KeyDescribeShareGroupOffsets, KeyAlterShareGroupOffsets, KeyDeleteShareGroupOffsets:
		return KindShare
	case KeyStreamsGroupHeartbeat, KeyStreamsGroupDescribe, KeyStreamsGroupTopologyDescriptionUpdate:
		return KindStreams
	}
	return ""
}

// RouteFor says what kproxy does with a request of key at version:
// forward it, forward it and edit the response, serve it itself, or
// refuse it. groupsLocal is whether kproxy serves the group APIs (a
// coordinator is configured). It is on the path of every request and
// does not allocate.
//
// Beyond the table's rows, the version decides three things: a Produce
// below v10 is forwarded untouched (its response carries no endpoints);
// a version above what kmsg parses is refused for every key kproxy
// decodes, since it could not read it; and ApiVersions at such a version
// is answered by kproxy, UNSUPPORTED_VERSION in v0, as a broker does, so
// that the client retries with a version it can use.
func RouteFor(key, version int16, groupsLocal bool) Decision {
	a, ok := row(key)
	if !ok {
		return Decision{Route: Forward, MaxVersion: -1}
	}
	d := Decision{Route: a.route, MaxVersion: a.maxVersion, Edit: a.edit, Why: a.why}
	if d.Route == Local && !groupsLocal {
		d.Route = Forward
		if a.edit != EditNone {
			d.Route = Rewrite
		}
	}
	if key == KeySaslHandshake && version == 0 {
		// After a v0 handshake the SASL tokens follow as raw frames
		// without Kafka headers, which the session cannot tell from
		// requests. Every client since Kafka 1.0 (KIP-152) sends v1,
		// and MergeApiVersions advertises v1 as the lowest.
		d.Route, d.Edit, d.badVersion = Refuse, EditNone, true
		d.Why = "SASL without Kafka framing (SaslHandshake v0) cannot be proxied; clients since Kafka 1.0 use v1 (KIP-152)"
		return d
	}
	switch d.Route {
	case Rewrite:
		if version < a.editFrom {
			d.Route, d.Edit = Forward, EditNone
			return d
		}
		if version <= MaxVersion(key) {
			return d
		}
		if key == KeyApiVersions {
			d.Route, d.Edit = Local, EditNone
			d.Why = "a version kproxy does not speak: answered UNSUPPORTED_VERSION in v0 with the versions it does"
			return d
		}
		d.Route, d.Edit, d.badVersion = Refuse, EditNone, true
		d.Why = "responses cannot be rewritten"
	case Local:
		if version > MaxVersion(key) {
			d.Route, d.Edit, d.badVersion = Refuse, EditNone, true
			d.Why = "kproxy serves it and cannot decode this version"
		}
	}
	return d
}

// Refusal is the error that closes a connection refused by d, for a
// request of key at version; nil unless d.Route is Refuse. A refused
// version wraps ErrBadVersion.
func (d Decision) Refusal(key, version int16) error {
	switch {
	case d.Route != Refuse:
		return nil
	case d.badVersion:
		return fmt.Errorf("%w: %s v%d: %s", ErrBadVersion, kmsg.NameForKey(key), version, d.Why)
	}
	return fmt.Errorf("refusing %s: %s", kmsg.NameForKey(key), d.Why)
}

// row returns key's row of apis, without a map lookup: it is on the path
// of every request.
func row(key int16) (apiRow, bool) {
	if key < 0 || int(key) >= len(apiTable) {
		return apiRow{}, false
	}
	e := apiTable[key]
	return e.row, e.ok
}

var apiTable = func() (t [apiKeys]struct {
	row apiRow
	ok  bool
}) {
	for k, r := range apis {
		t[k].row, t[k].ok = r, true
	}
	return t
}()

// IsGroupKey reports whether key is a group API that the coordinator
// engine serves when groups are local (FindCoordinator is answered by the
// proxy and is not one).
func IsGroupKey(key int16) bool {
	a, ok := row(key)
	return ok && a.route == Local && key != KeyFindCoordinator
}

// GroupKeys lists, in order, the keys for which IsGroupKey holds: the
// requests a coordinator must answer.
func GroupKeys() []int16 {
	var keys []int16
	for k := range int16(apiKeys) {
		if IsGroupKey(k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// Forwardable reports whether key names one group that kproxy may
// forward to the cluster's coordinator when the cluster serves that group
// (per-group forwarding, docs/anchors.md): the single-group requests of
// the classic and KIP-848 protocols, and the offsets APIs.
func Forwardable(key int16) bool {
	switch key {
	case KeyOffsetCommit, KeyOffsetFetch, KeyJoinGroup, KeyHeartbeat, KeyLeaveGroup, KeySyncGroup, KeyDescribeGroups,
		KeyTxnOffsetCommit, KeyOffsetDelete, KeyConsumerGroupHeartbeat, KeyConsumerGroupDescribe:
		return true
	}
	return false
}

// MergeApiVersions edits an upstream ApiVersions response in place into
// what kproxy advertises: keys kmsg cannot parse are dropped (the proxy
// could not read their headers), refused keys are dropped, capped keys are
// capped, and when localGroups is set every group key is advertised at the
// versions the engine serves, capped at the broker's for the keys of a
// group kproxy may forward to the cluster's coordinator (Forwardable), so
// a client never sends a forwarded request in a version the broker does
// not read (OffsetFetch and OffsetCommit v10 through kproxy in front of
// Kafka 4.1, which reads v9). The cap applies only in front of a cluster
// that speaks KIP-848 (ConsumerGroupHeartbeat): on an older one the
// engine's versions stand, since KIP-848 members need OffsetCommit and
// OffsetFetch v9 that such a cluster lacks (kproxy gives it KIP-848), and
// a group forwarded there must be one whose clients' versions the
// cluster reads.
func MergeApiVersions(resp *kmsg.ApiVersionsResponse, localGroups bool) {
	cap848 := slices.ContainsFunc(resp.ApiKeys, func(k kmsg.ApiVersionsResponseApiKey) bool { return k.ApiKey == KeyConsumerGroupHeartbeat })
	seen := make(map[int16]bool, len(resp.ApiKeys))
	keys := resp.ApiKeys[:0]
	for _, k := range resp.ApiKeys {
		if MaxVersion(k.ApiKey) < 0 {
			continue
		}
		info, special := row(k.ApiKey)
		if special {
			if info.route == Refuse {
				continue
			}
			brokerMax := k.MaxVersion
			if info.maxVersion >= 0 && k.MaxVersion > info.maxVersion {
				k.MaxVersion = info.maxVersion
			}
			if localGroups && IsGroupKey(k.ApiKey) {
				k.MinVersion, k.MaxVersion = 0, info.maxVersion
				if cap848 && Forwardable(k.ApiKey) {
					k.MaxVersion = min(k.MaxVersion, brokerMax)
				}
			}
			if k.ApiKey == KeySaslHandshake && k.MinVersion < 1 {
				k.MinVersion = 1 // v0 is refused (RouteFor)
			}
			if k.MinVersion > k.MaxVersion {
				continue
			}
		}
		seen[k.ApiKey] = true
		keys = append(keys, k)
	}
	if localGroups {
		for key, info := range apis {
			if !IsGroupKey(key) && key != KeyFindCoordinator {
				continue
			}
			if seen[key] {
				continue
			}
			k := kmsg.NewApiVersionsResponseApiKey()
			k.ApiKey, k.MinVersion, k.MaxVersion = key, 0, info.maxVersion
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b kmsg.ApiVersionsResponseApiKey) int { return int(a.ApiKey) - int(b.ApiKey) })
	resp.ApiKeys = keys
}
