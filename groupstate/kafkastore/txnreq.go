package kafkastore

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/clientpool"
)

// The transactional write path speaks the KIP-98 protocol as it was
// before KIP-890 part 2, whatever the client and the brokers could
// negotiate: partitions and groups are added to the transaction
// explicitly, and the producer epoch stays the same for every
// transaction of a claim. The versions are capped per request:
//
//	InitProducerId     <= 4  (v5+ belongs to KIP-890 / KIP-939)
//	AddPartitionsToTxn <= 3  (v4+ is the broker-to-broker batched form)
//	AddOffsetsToTxn    <= 3  (v4: KIP-890 error codes)
//	TxnOffsetCommit    <= 4  (v5: KIP-890 part 2 implicit group add)
//	EndTxn             <= 4  (v5: KIP-890 part 2, bumps the epoch per transaction)
//	Produce            <= 11 (v12: KIP-890 part 2 implicit partition add)
//
// kgo would send the highest version both sides know, and Client.Request
// ignores a version set on the request, so these requests go to one
// broker (Broker.Request) wrapped in capVersion; kgo negotiates below the
// cap. Transaction and group requests find their coordinator with
// FindCoordinator (routed by kgo) and are retried here when it moves.

// Version caps of the transactional requests; see above.
const (
	maxInitProducerIDVersion     = 4
	maxAddPartitionsToTxnVersion = 3
	maxAddOffsetsToTxnVersion    = 3
	maxTxnOffsetCommitVersion    = 4
	maxEndTxnVersion             = 4
	maxTxnProduceVersion         = 11
)

// Coordinator types of FindCoordinator.
const (
	coordinatorGroup int8 = 0
	coordinatorTxn   int8 = 1
)

// capVersion is a request whose version kgo negotiates no higher than
// max.
type capVersion struct {
	kmsg.Request
	max int16
}

// MaxVersion implements kmsg.Request.
func (c capVersion) MaxVersion() int16 { return min(c.max, c.Request.MaxVersion()) }

// coordKey names one coordinator in the Store's cache.
type coordKey struct {
	typ int8
	key string
}

// retriableCoordinatorCode reports whether code means: find the
// coordinator again (or wait for it) and retry. CONCURRENT_TRANSACTIONS
// means the coordinator is still completing the previous transaction of
// the id (or aborting a fenced one).
func retriableCoordinatorCode(code int16) bool {
	switch code {
	case kerr.NotCoordinator.Code, kerr.CoordinatorNotAvailable.Code, kerr.CoordinatorLoadInProgress.Code,
		kerr.ConcurrentTransactions.Code:
		return true
	}
	return false
}

// fencedCode reports whether code means the producer of a claim can no
// longer write: a newer InitProducerId for its transactional id fenced
// it, the broker aborted its transaction (timeout) and bumped the epoch,
// or it lost the right to use the id.
func fencedCode(code int16) bool {
	switch code {
	case kerr.ProducerFenced.Code, kerr.InvalidProducerEpoch.Code, kerr.InvalidTxnState.Code,
		kerr.TransactionalIDAuthorizationFailed.Code, kerr.InvalidProducerIDMapping.Code, kerr.UnknownProducerID.Code:
		return true
	}
	return false
}

// maxCoordinatorAttempts bounds the retries of one coordinator request
// (with backoff up to 500ms, about 10s in all) within its context.
const maxCoordinatorAttempts = 25

// coordinator returns the node of the coordinator of key, from the cache
// or FindCoordinator.
func (s *Store) coordinator(ctx context.Context, typ int8, key string) (int32, error) {
	k := coordKey{typ, key}
	s.mu.Lock()
	node, ok := s.coords[k]
	s.mu.Unlock()
	if ok {
		return node, nil
	}
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorType = typ
	req.CoordinatorKey = key
	req.CoordinatorKeys = []string{key}
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return 0, fmt.Errorf("find coordinator of %q: %w", key, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return 0, fmt.Errorf("find coordinator of %q: %w", key, err)
	}
	s.mu.Lock()
	s.coords[k] = resp.NodeID
	s.mu.Unlock()
	return resp.NodeID, nil
}

// forgetCoordinator drops a cached coordinator after an error.
func (s *Store) forgetCoordinator(typ int8, key string) {
	s.mu.Lock()
	delete(s.coords, coordKey{typ, key})
	s.mu.Unlock()
}

// coordRequest sends req, capped at maxVersion, to the coordinator of
// key and returns the response. code extracts the error code that
// decides a retry: a coordinator that moved, is loading or still
// completing a transaction (retriableCoordinatorCode), and a failed
// connection, are retried with backoff until ctx ends or
// maxCoordinatorAttempts. Every request sent this way must be safe to
// repeat (all the transaction requests are, for one producer epoch).
func (s *Store) coordRequest(ctx context.Context, typ int8, key string, req kmsg.Request, maxVersion int16, code func(kmsg.Response) int16) (kmsg.Response, error) {
	cl, put, err := s.lend(ctx)
	if err != nil {
		return nil, err
	}
	defer put()
	return s.coordRequestOn(ctx, cl, typ, key, req, maxVersion, code)
}

// lend returns a client for one request to a coordinator, on a
// connection no other request waits on (internal/clientpool), and the function
// that gives it back: one of the store's pooled clients, or the store's
// own client when it has no pool or its pool closed (kproxy stopping).
func (s *Store) lend(ctx context.Context) (*kgo.Client, func(), error) {
	if s.reqs == nil {
		return s.cl, func() {}, nil
	}
	cl, err := s.reqs.Get(ctx)
	if errors.Is(err, clientpool.ErrClosed) {
		return s.cl, func() {}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return cl, func() { s.reqs.Put(cl) }, nil
}

// lent is a kmsg.Requestor sending each request (kgo routes it to its
// group's coordinator) on a client of the store lent to it alone (lend).
type lent struct{ s *Store }

func (l lent) Request(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	cl, put, err := l.s.lend(ctx)
	if err != nil {
		return nil, err
	}
	defer put()
	return cl.Request(ctx, req)
}

// coordRequestOn is coordRequest sending on cl (the coordinator is still
// looked up through the store's client).
func (s *Store) coordRequestOn(ctx context.Context, cl *kgo.Client, typ int8, key string, req kmsg.Request, maxVersion int16, code func(kmsg.Response) int16) (kmsg.Response, error) {
	var last error
	for attempt := 0; attempt < maxCoordinatorAttempts; attempt++ {
		if attempt > 0 {
			if err := sleepCtx(ctx, backoff(attempt-1)); err != nil {
				return nil, fmt.Errorf("%w (last: %v)", err, last)
			}
		}
		node, err := s.coordinator(ctx, typ, key)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			last = err
			continue
		}
		resp, err := cl.Broker(int(node)).Request(ctx, capVersion{req, maxVersion})
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			s.forgetCoordinator(typ, key)
			last = err
			continue
		}
		c := code(resp)
		if !retriableCoordinatorCode(c) {
			return resp, nil
		}
		if c != kerr.ConcurrentTransactions.Code {
			s.forgetCoordinator(typ, key)
		}
		last = kerr.ErrorForCode(c)
	}
	if last == nil {
		last = errors.New("no attempt made")
	}
	return nil, last
}
