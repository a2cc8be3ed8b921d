// Package codec frames and parses the parts of the Kafka wire protocol that
// kproxy must understand: the size prefix, request and response headers,
// and the few responses that carry broker addresses and are rewritten so
// that clients keep talking through the proxy.
//
// Everything else is opaque: a forwarded request or response body is never
// decoded. Decoding and encoding of the messages kproxy does touch is done
// by franz-go's kmsg, with one exception: the responses whose endpoints
// follow records or many partitions (Produce v10+, ShareFetch,
// ShareAcknowledge) are walked field by field as they stream and only
// their endpoints re-encoded (stream.go), so that their records are never
// held; tests check the result byte for byte against kmsg's decode,
// rewrite and encode.
//
// apis.go holds the one table of every API key the proxy intercepts,
// rewrites, caps or refuses, with which of its responses are edited and
// on what condition, so the routing can be audited in one place.
// RouteFor reads it and answers, for one key at one version, what
// happens to a request: forwarded, forwarded with its response edited,
// served by kproxy, or refused. The proxy's session, its metrics,
// RewriteResponse and MergeApiVersions all go by that answer; GroupKeys
// lists the keys a coordinator serves.
package codec
