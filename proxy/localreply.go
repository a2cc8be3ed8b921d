package proxy

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// localReply carries one answer kproxy serves itself (the coordinator's,
// or one the reader has at once) to the session's writer, which waits
// for it in the request's place. Replies are pooled, so a local request
// costs neither a channel nor a callback closure: the reader takes one
// and puts it in the slot, the coordinator (or the reader) calls deliver
// exactly once, and the writer puts it back only after it has received
// the answer, when nobody else holds it. A reply whose answer never
// arrives (the session ended first) is left to the collector.
type localReply struct {
	ch      chan kmsg.Response       // buffered(1): written once per use
	deliver func(resp kmsg.Response) // sends on ch; made once, with the reply
}

var replyPool = sync.Pool{New: func() any {
	r := &localReply{ch: make(chan kmsg.Response, 1)}
	r.deliver = func(resp kmsg.Response) { r.ch <- resp }
	return r
}}

func getReply() *localReply { return replyPool.Get().(*localReply) }

// putReply returns r once its answer was received.
func putReply(r *localReply) { replyPool.Put(r) }
