package codec

import (
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Share groups (KIP-932) served by kproxy itself, in front of a cluster
// that lacks them: the membership APIs go to the coordinator engine and
// ShareFetch/ShareAcknowledge to kproxy's share service, which fetches
// the records from the brokers. Which of the two serves a cluster is
// chosen at start (proxy.Config.Shares); with share groups forwarded the
// routing table's rows hold.

// shareServed lists the keys kproxy serves when it serves share groups,
// and the versions it speaks: v1 of the membership APIs (v0 was Kafka
// 4.0's early access), v1-v2 of ShareFetch and ShareAcknowledge (v2:
// KIP-1206's record-limit acquisition and KIP-1222's renew), v0 of the
// offsets APIs.
var shareServed = []struct{ key, min, max int16 }{
	{KeyShareGroupHeartbeat, 1, 1},
	{KeyShareGroupDescribe, 1, 1},
	{KeyShareFetch, 1, 2},
	{KeyShareAcknowledge, 1, 2},
	{KeyDescribeShareGroupOffsets, 0, 1},
	{KeyAlterShareGroupOffsets, 0, 0},
	{KeyDeleteShareGroupOffsets, 0, 0},
}

// IsServedShareKey reports whether kproxy serves key itself when it
// serves share groups.
func IsServedShareKey(key int16) bool {
	return slices.ContainsFunc(shareServed, func(s struct{ key, min, max int16 }) bool { return s.key == key })
}

// IsShareCoordinatorKey reports whether key is a share-group API the
// coordinator engine serves when kproxy serves share groups (membership,
// description and offsets); ShareFetch and ShareAcknowledge go to the share
// service.
func IsShareCoordinatorKey(key int16) bool {
	switch key {
	case KeyShareGroupHeartbeat, KeyShareGroupDescribe, KeyDescribeShareGroupOffsets, KeyAlterShareGroupOffsets, KeyDeleteShareGroupOffsets:
		return true
	}
	return false
}

// ServedShareVersion reports whether version of key is one kproxy serves.
func ServedShareVersion(key, version int16) bool {
	for _, s := range shareServed {
		if s.key == key {
			return version >= s.min && version <= s.max
		}
	}
	return false
}

// AddShareApis advertises the share-group APIs kproxy serves in a merged
// ApiVersions response, in place of whatever the broker said of them.
func AddShareApis(resp *kmsg.ApiVersionsResponse) {
	keys := slices.DeleteFunc(resp.ApiKeys, func(k kmsg.ApiVersionsResponseApiKey) bool { return IsServedShareKey(k.ApiKey) })
	for _, s := range shareServed {
		k := kmsg.NewApiVersionsResponseApiKey()
		k.ApiKey, k.MinVersion, k.MaxVersion = s.key, s.min, s.max
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b kmsg.ApiVersionsResponseApiKey) int { return int(a.ApiKey) - int(b.ApiKey) })
	resp.ApiKeys = keys
}
