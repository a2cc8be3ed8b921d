// Package proxy is kproxy's data path: listeners, one session per client
// connection, its upstream connection, the broker address map, and the
// routing of each request either upstream or to the coordinator engine.
//
// A session has two goroutines. The reader parses each request's header,
// reserves the request's place in the ordered slot queue, and either
// streams the request upstream untouched or hands the decoded request to
// the coordinator. The writer takes the slots in order and, for each,
// streams the upstream response to the client (decoding only responses
// that carry broker addresses) or encodes the coordinator's reply when it
// arrives. Large bodies move between the two sockets without being copied
// through user space (TCPConn.ReadFrom splices from an io.LimitedReader
// over a TCPConn); with TLS on either side they go through a pooled
// buffer (tls.go). A session holds its socket buffers only while a frame
// is in flight: between requests it waits in a stash of a few hundred
// bytes, so an idle connection costs about 20 KiB (buffers.go). A client
// that stops reading its responses stops its own session, and no other:
// the writer blocks on its socket, at most Config.MaxInFlight requests
// queue, then the reader stops reading that client.
//
// In a fleet of kproxies (docs/fleet.md) the coordinator is a Router: it
// serves a group request locally when the group's partition is owned
// here and otherwise relays it, wrapped in an Envelope request, over a
// multiplexed peer connection to the owner's PeerServer (peer.go
// describes the wire). Requests naming several groups are split by owner
// and merged (relay_apis.go holds the per-API table).
//
// The session reads the client's SASL exchange as it passes through and
// knows its principal (sasl.go); an Authorizer in front of the
// coordinator authorizes each group request for it with the cluster's
// ACLs (authorize.go, package authz).
package proxy
