package loadgen

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Doer sends requests. Do sends req and calls done exactly once with its
// answer or an error, from any goroutine; done must not block. The Doer
// keeps req: the caller must not modify it afterwards.
type Doer interface {
	Do(req kmsg.Request, done func(kmsg.Response, error))
}

// DoerFunc adapts a function to Doer.
type DoerFunc func(req kmsg.Request, done func(kmsg.Response, error))

// Do calls f.
func (f DoerFunc) Do(req kmsg.Request, done func(kmsg.Response, error)) { f(req, done) }

// Request sends req through d and waits for its answer or for ctx.
func Request(ctx context.Context, d Doer, req kmsg.Request) (kmsg.Response, error) {
	type answer struct {
		resp kmsg.Response
		err  error
	}
	ch := make(chan answer, 1) // buffered: an answer after ctx ends is dropped
	d.Do(req, func(resp kmsg.Response, err error) { ch <- answer{resp, err} })
	select {
	case a := <-ch:
		return a.resp, a.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w", kmsg.NameForKey(req.Key()), ctx.Err())
	}
}

// KgoDoer sends requests with a franz-go client, each on a goroutine of
// its own (kgo's Request blocks); ctx bounds every request.
func KgoDoer(ctx context.Context, cl *kgo.Client) Doer {
	return DoerFunc(func(req kmsg.Request, done func(kmsg.Response, error)) {
		go func() { done(cl.Request(ctx, req)) }()
	})
}
