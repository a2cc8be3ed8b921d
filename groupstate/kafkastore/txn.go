package kafkastore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/internal/upstream"
)

// Transactional mode (docs/fleet.md, "Fencing and the write path"): the
// groups topic's partitions are owned one by one, each through its own
// transactional id (KIP-98). Claim fences the previous owner with
// InitProducerId, loads the partition's committed records into an index
// and commits an owner record; from then on every durable write of the
// partition's groups (group records, tombstones, offset commits as
// TxnOffsetCommit) rides in the partition's current transaction, and a
// call returns only once that transaction committed. One transaction is
// in flight per partition; writes arriving meanwhile form the next one
// (group commit).
//
// Failures. A write whose producer was fenced (PRODUCER_FENCED,
// INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING,
// UNKNOWN_PRODUCER_ID, TRANSACTIONAL_ID_AUTHORIZATION_FAILED) fails all
// the callers of its transaction with an error wrapping
// kerr.NotCoordinator. Any other failure of a transaction (a request that
// keeps failing, a produce error, the transaction timeout) aborts it when
// the producer may still talk, and fails its callers with an error
// wrapping kerr.CoordinatorNotAvailable: whether some of it became
// visible is then unknown to nobody but the broker, and the clients
// retry. In both cases the partition is dropped (writes queued behind
// the transaction fail with NOT_COORDINATOR) and OnFenced reports it, once
// per claim: the owner gives the partition up, or claims it again, which
// fences whatever is left and reloads what was committed. Drop and
// Release never call OnFenced.

// TxnOptions configures the transactional mode; zero values are
// defaults.
type TxnOptions struct {
	// TransactionalIDPrefix prefixes the transactional id of each
	// partition: Prefix + strconv.Itoa(p). "" means
	// "kproxy/<groups topic>/".
	TransactionalIDPrefix string
	// Linger is how long a partition's next transaction waits for more
	// writes before it starts when writes kept arriving during the
	// previous one (the first write on an idle partition goes at once);
	// 0 means 2ms, negative means no wait.
	Linger time.Duration
	// TransactionTimeout is the transaction timeout given to
	// InitProducerId: the broker aborts a transaction left open longer
	// (a lost owner's), and a transaction taking longer fails as fenced.
	// 0 means 15s.
	TransactionTimeout time.Duration
	// OnFenced is called, once per claim, when partition p was dropped
	// because its producer was fenced or one of its transactions failed.
	// Claimed(p) is already false. It runs on the store's goroutine and
	// must not block; it may start a new Claim on another goroutine.
	OnFenced func(p int32)
	// OnTransaction, when set, is told of every transaction of the
	// partitions' writes once it ended: how long it took from its first
	// request to EndTxn's answer, how many writes it carried, and its
	// error (nil when committed). It runs on the store's goroutine and
	// must not block (metrics).
	OnTransaction func(p int32, took time.Duration, writes int, err error)
}

// ownerKey is the key of the owner record each claim commits to its
// partition. It is not a group: loads never return it.
const ownerKey = "\x00owner"

// maxTxnRecordBytes bounds the record bytes of one transaction: writes
// beyond it wait for the next transaction (a single record larger than
// this goes alone). Operator-made topics may keep the broker's 1 MiB
// max.message.bytes.
const maxTxnRecordBytes = 1 << 20

// maxTxnWrites bounds the writes of one transaction.
const maxTxnWrites = 1000

// txnMode is the transactional state of a Store (nil in local mode).
type txnMode struct {
	opts TxnOptions // immutable after EnableTransactions; defaults filled

	mu    sync.Mutex         // guards parts
	parts map[int32]*txnPart // claimed, being claimed, or being released
}

// partState is where a claim stands.
type partState int8

const (
	partClaiming  partState = iota // fenced, loading, committing the owner record
	partClaimed                    // accepting writes
	partReleasing                  // Release: refusing writes, finishing the accepted ones
	partGone                       // dropped or released; the struct is dead
)

// String names the state, for errors and logs.
func (s partState) String() string {
	switch s {
	case partClaiming:
		return "claiming"
	case partClaimed:
		return "claimed"
	case partReleasing:
		return "releasing"
	case partGone:
		return "gone"
	}
	return "unknown"
}

// txnPart is one claim of one partition. A new claim makes a new
// txnPart.
type txnPart struct {
	p    int32  // immutable
	txid string // immutable
	// ctx is cancelled when the claim ends (Drop, Release, failure), so
	// that its in-flight requests stop at once; immutable.
	ctx    context.Context
	cancel context.CancelFunc
	// pid and epoch are the claim's producer: written by Claim before
	// the state becomes partClaimed, read-only afterwards.
	pid   int64
	epoch int16
	// seq is the sequence number of the claim's next record in the
	// partition. It is owned by whoever runs the claim's transactions:
	// Claim, then the one flusher goroutine (flushing, below).
	seq int32
	// fenceOnce makes OnFenced fire once per claim.
	fenceOnce sync.Once

	mu    sync.Mutex // guards every field below
	state partState
	// index maps group → its last committed record (tombstoned groups
	// are absent); built by Claim, updated after each commit.
	index map[string][]byte
	// pending are the accepted writes not yet in a transaction.
	pending []*txnWrite
	// flushDone is non-nil while a flusher goroutine runs, and closed
	// when it ends.
	flushDone chan struct{}
}

// txnWrite is one caller's write, waiting for its transaction.
type txnWrite struct {
	group string
	// meta is set for a group record or tombstone.
	meta  bool
	value []byte // the record; nil = tombstone
	// offsets is set for an offset commit.
	offsets []kmsg.OffsetCommitRequestTopic
	done    chan txnResult // buffered (1); receives exactly one result
}

// txnResult is the outcome of one write.
type txnResult struct {
	topics []kmsg.OffsetCommitResponseTopic // per-partition results of an offset commit
	err    error
}

// recordBytes estimates the record bytes a write adds to a transaction.
func (w *txnWrite) recordBytes() int {
	if !w.meta {
		return 0
	}
	return len(w.group) + len(w.value) + 32
}

// EnableTransactions switches the store to transactional mode. It must
// be called before the store is used or shared; a second call is
// ignored. From then on every group record, tombstone and offset commit
// is written in the transaction of its groups partition, only claimed
// partitions accept writes and loads, and FetchOffsets requires stable
// offsets. Local mode (never calling it) is unchanged.
func (s *Store) EnableTransactions(o TxnOptions) {
	if s.txn != nil {
		s.log.Warn("kafkastore: EnableTransactions called twice; the second call is ignored")
		return
	}
	if o.TransactionalIDPrefix == "" {
		o.TransactionalIDPrefix = "kproxy/" + s.groupsTopic + "/"
	}
	switch {
	case o.Linger == 0:
		o.Linger = 2 * time.Millisecond
	case o.Linger < 0:
		o.Linger = 0
	}
	if o.TransactionTimeout <= 0 {
		o.TransactionTimeout = 15 * time.Second
	}
	s.txn = &txnMode{opts: o, parts: make(map[int32]*txnPart)}
}

// Partitions returns the partition count of the groups topic, creating
// the topic as a first load or write would.
func (s *Store) Partitions(ctx context.Context) (int, error) {
	m, err := s.groupsMeta(ctx)
	if err != nil {
		return 0, err
	}
	return len(m.leaders), nil
}

// TransactionalID returns the transactional id partition p writes
// through (transactional mode).
func (s *Store) TransactionalID(p int32) string {
	if s.txn == nil {
		return ""
	}
	return s.txn.opts.TransactionalIDPrefix + strconv.Itoa(int(p))
}

// Claimed reports whether partition p is claimed and accepting writes.
func (s *Store) Claimed(p int32) bool {
	tp := s.part(p)
	if tp == nil {
		return false
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.state == partClaimed
}

// ClaimedGroups returns the groups of claimed partition p whose last
// committed record match accepts, sorted; nil if p is not claimed here.
// It reads the claim's index (nothing is fetched).
func (s *Store) ClaimedGroups(p int32, match func(record []byte) bool) []string {
	tp := s.part(p)
	if tp == nil {
		return nil
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if tp.state != partClaimed {
		return nil
	}
	var out []string
	for group, rec := range tp.index {
		if match(rec) {
			out = append(out, group)
		}
	}
	slices.Sort(out)
	return out
}

// part returns the current claim of p, or nil.
func (s *Store) part(p int32) *txnPart {
	if s.txn == nil {
		return nil
	}
	s.txn.mu.Lock()
	defer s.txn.mu.Unlock()
	return s.txn.parts[p]
}

// forget removes tp from the claims if it is still p's.
func (s *Store) forget(tp *txnPart) {
	s.txn.mu.Lock()
	if s.txn.parts[tp.p] == tp {
		delete(s.txn.parts, tp.p)
	}
	s.txn.mu.Unlock()
}

// Claim makes this store the owner of groups partition p: InitProducerId
// for p's transactional id (retried while the coordinator moves, loads
// or still aborts the previous owner's transaction), which fences every
// earlier producer of p; a read_committed load of p to its last stable
// offset into the claim's index; then a transaction holding the owner
// record (key "\x00owner", value owner). Only once that committed is p
// claimed. Meanwhile writes and loads of p fail with an error wrapping
// kerr.CoordinatorLoadInProgress. A Claim of a partition claimed (or
// being claimed or released) here fails; Drop first. If the owner
// record cannot be committed because someone newer fenced us, the error
// wraps kerr.NotCoordinator.
func (s *Store) Claim(ctx context.Context, p int32, owner []byte) error {
	if s.txn == nil {
		return errors.New("kafkastore: Claim needs EnableTransactions")
	}
	n, err := s.Partitions(ctx)
	if err != nil {
		return fmt.Errorf("kafkastore: claiming partition %d: %w", p, err)
	}
	if p < 0 || int(p) >= n {
		return fmt.Errorf("kafkastore: claiming partition %d: %s has %d partitions", p, s.groupsTopic, n)
	}
	pctx, cancel := context.WithCancel(context.Background())
	tp := &txnPart{p: p, txid: s.TransactionalID(p), ctx: pctx, cancel: cancel, state: partClaiming}
	s.txn.mu.Lock()
	if cur := s.txn.parts[p]; cur != nil {
		s.txn.mu.Unlock()
		cancel()
		cur.mu.Lock()
		st := cur.state
		cur.mu.Unlock()
		return fmt.Errorf("kafkastore: claiming partition %d: already %s here", p, st)
	}
	s.txn.parts[p] = tp
	s.txn.mu.Unlock()

	if err := s.claim(ctx, tp, owner); err != nil {
		s.forget(tp)
		tp.mu.Lock()
		tp.state = partGone
		tp.index = nil
		tp.mu.Unlock()
		cancel()
		return fmt.Errorf("kafkastore: claiming partition %d: %w", p, err)
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if tp.state != partClaiming {
		// Dropped while claiming.
		return fmt.Errorf("kafkastore: claiming partition %d: dropped while claiming: %w", p, kerr.NotCoordinator)
	}
	tp.state = partClaimed
	s.log.Debug("kafkastore: claimed groups partition", "partition", p, "transactional_id", tp.txid,
		"producer_id", tp.pid, "producer_epoch", tp.epoch, "groups", len(tp.index))
	return nil
}

// claim runs the steps of Claim; tp is in partClaiming and nobody else
// touches its producer fields.
func (s *Store) claim(ctx context.Context, tp *txnPart, owner []byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(tp.ctx, cancel) // Drop cancels the claim
	defer stop()

	// 1. Fence.
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionalID = &tp.txid
	req.TransactionTimeoutMillis = int32(s.txn.opts.TransactionTimeout / time.Millisecond)
	req.ProducerID, req.ProducerEpoch = -1, -1
	raw, err := s.up.Request(ctx, upstream.CoordinatorTxn, tp.txid, req, maxInitProducerIDVersion, func(r kmsg.Response) int16 {
		return r.(*kmsg.InitProducerIDResponse).ErrorCode
	})
	if err != nil {
		return fmt.Errorf("init producer id of %q: %w", tp.txid, err)
	}
	resp := raw.(*kmsg.InitProducerIDResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("init producer id of %q: %w", tp.txid, err)
	}
	tp.pid, tp.epoch, tp.seq = resp.ProducerID, resp.ProducerEpoch, 0

	// 2. Load what was committed, up to the last stable offset: the
	// fence aborted the previous owner's open transaction.
	index, err := s.scanWithRetries(ctx, tp.p, func(key string) bool { return key != ownerKey })
	if err != nil {
		return fmt.Errorf("loading: %w", err)
	}
	tp.mu.Lock()
	tp.index = index
	tp.mu.Unlock()

	// 3. Commit the owner record.
	w := &txnWrite{group: ownerKey, meta: true, value: append([]byte{}, owner...), done: make(chan txnResult, 1)}
	if err := s.runTxn(ctx, tp, []*txnWrite{w}); err != nil {
		var te *txnError
		if errors.As(err, &te) && te.fenced {
			return fmt.Errorf("committing the owner record: someone newer holds the partition: %w (%v)", kerr.NotCoordinator, err)
		}
		actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if aerr := s.endTxn(actx, tp, false); aerr != nil {
			s.log.Warn("kafkastore: aborting a failed claim failed", "partition", tp.p, "err", aerr)
		}
		cancel()
		return fmt.Errorf("committing the owner record: %w", err)
	}
	if r := <-w.done; r.err != nil {
		return fmt.Errorf("committing the owner record: %w", r.err)
	}
	return nil
}

// Release gives partition p up gracefully: new writes and loads of p fail
// with an error wrapping kerr.NotCoordinator at once, the writes already
// accepted are committed (or fail) in the transactions under way, then
// the index is forgotten. If ctx ends first, p is dropped (Drop). A
// partition not claimed here is a no-op; one still being claimed is
// dropped.
func (s *Store) Release(ctx context.Context, p int32) {
	tp := s.part(p)
	if tp == nil {
		return
	}
	tp.mu.Lock()
	if tp.state == partClaiming {
		tp.mu.Unlock()
		s.Drop(p)
		return
	}
	if tp.state == partClaimed {
		tp.state = partReleasing
	}
	done := tp.flushDone
	tp.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			s.log.Warn("kafkastore: release of a groups partition timed out; dropping it", "partition", p, "err", ctx.Err())
		}
	}
	s.end(tp, kerr.NotCoordinator)
}

// Drop gives partition p up at once (its lease ran out, or it was
// fenced): writes and loads fail with an error wrapping
// kerr.NotCoordinator from now on, the open transaction is abandoned,
// never committed (the next owner's InitProducerId, or the transaction
// timeout, aborts it), its callers and the queued writes fail with
// NOT_COORDINATOR, and the index is forgotten. A claim under way fails.
func (s *Store) Drop(p int32) {
	if tp := s.part(p); tp != nil {
		s.end(tp, kerr.NotCoordinator)
	}
}

// end finishes claim tp: it forgets it, cancels its requests and fails
// its queued writes with code's error.
func (s *Store) end(tp *txnPart, code *kerr.Error) {
	s.forget(tp)
	tp.mu.Lock()
	tp.state = partGone
	tp.index = nil
	pending := tp.pending
	tp.pending = nil
	tp.mu.Unlock()
	tp.cancel()
	for _, w := range pending {
		w.done <- txnResult{err: fmt.Errorf("kafkastore: groups partition %d is no longer owned here: %w", tp.p, code)}
	}
}

// claimFor returns the claim of group's partition if it accepts work,
// or an error: NOT_COORDINATOR when p is not claimed here, and
// COORDINATOR_LOAD_IN_PROGRESS while it is being claimed. tp.mu is not
// held on return.
func (s *Store) claimFor(ctx context.Context, group string) (*txnPart, error) {
	n, err := s.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	p := GroupPartition(group, n)
	tp := s.part(p)
	if tp == nil {
		return nil, fmt.Errorf("kafkastore: groups partition %d of group %q is not owned here: %w", p, group, kerr.NotCoordinator)
	}
	return tp, nil
}

// stateErr is the error for work arriving at tp in state st (tp.mu
// held), nil when st accepts it.
func stateErr(tp *txnPart, group string, st partState) error {
	switch st {
	case partClaimed:
		return nil
	case partClaiming:
		return fmt.Errorf("kafkastore: groups partition %d of group %q is loading: %w", tp.p, group, kerr.CoordinatorLoadInProgress)
	default:
		return fmt.Errorf("kafkastore: groups partition %d of group %q is not owned here (%s): %w", tp.p, group, st, kerr.NotCoordinator)
	}
}

// txnSubmit queues w in its partition's next transaction and waits for
// the result. If ctx ends first, the write may still commit.
func (s *Store) txnSubmit(ctx context.Context, w *txnWrite) txnResult {
	if len(w.value) > groupRecordMaxBytes {
		return txnResult{err: fmt.Errorf("kafkastore: the record of group %q has %d bytes: %w", w.group, len(w.value), kerr.MessageTooLarge)}
	}
	tp, err := s.claimFor(ctx, w.group)
	if err != nil {
		return txnResult{err: err}
	}
	w.done = make(chan txnResult, 1)
	tp.mu.Lock()
	if err := stateErr(tp, w.group, tp.state); err != nil {
		tp.mu.Unlock()
		return txnResult{err: err}
	}
	tp.pending = append(tp.pending, w)
	if tp.flushDone == nil {
		done := make(chan struct{})
		tp.flushDone = done
		go s.flushLoop(tp, done)
	}
	tp.mu.Unlock()
	select {
	case r := <-w.done:
		return r
	case <-ctx.Done():
		return txnResult{err: fmt.Errorf("kafkastore: waiting for the transaction of group %q: %w", w.group, ctx.Err())}
	}
}

// flushLoop is the one flusher of claim tp (tp.flushDone == done): it
// runs transactions of the pending writes, one at a time, until none is
// left or the claim ends.
func (s *Store) flushLoop(tp *txnPart, done chan struct{}) {
	defer close(done)
	for first := true; ; first = false {
		// The first transaction of an idle partition goes out at once
		// (a lone commit waits for nobody); under load, when writes kept
		// arriving while the previous transaction ran, the next one
		// lingers to gather more of them into one transaction.
		if l := s.txn.opts.Linger; l > 0 && !first {
			tp.mu.Lock()
			idle := len(tp.pending) == 0
			tp.mu.Unlock()
			if !idle {
				_ = upstream.Sleep(tp.ctx, l)
			}
		}
		tp.mu.Lock()
		if tp.state == partGone || len(tp.pending) == 0 {
			// end() failed whatever was pending.
			tp.flushDone = nil
			tp.mu.Unlock()
			return
		}
		batch := takeBatch(&tp.pending)
		tp.mu.Unlock()

		ctx, cancel := context.WithTimeout(tp.ctx, s.txn.opts.TransactionTimeout)
		began := time.Now()
		err := s.runTxn(ctx, tp, batch)
		cancel()
		if f := s.txn.opts.OnTransaction; f != nil {
			f(tp.p, time.Since(began), len(batch), err)
		}
		if err != nil {
			s.failTxn(tp, batch, err)
			tp.mu.Lock()
			tp.flushDone = nil
			tp.mu.Unlock()
			return
		}
	}
}

// takeBatch removes the writes of the next transaction from the front of
// *pending.
func takeBatch(pending *[]*txnWrite) []*txnWrite {
	q := *pending
	n, bytes := 0, 0
	for n < len(q) && n < maxTxnWrites {
		b := q[n].recordBytes()
		if n > 0 && bytes+b > maxTxnRecordBytes {
			break
		}
		bytes += b
		n++
	}
	batch := append([]*txnWrite(nil), q[:n]...)
	clear(q[:n])
	*pending = q[n:]
	return batch
}

// txnError is a failed transaction; fenced says the producer can no
// longer write.
type txnError struct {
	fenced bool
	err    error
}

func (e *txnError) Error() string { return e.err.Error() }
func (e *txnError) Unwrap() error { return e.err }

// fenced wraps a fencing error code.
func fenced(what string, code int16) error {
	return &txnError{fenced: true, err: fmt.Errorf("%s: %w", what, kerr.ErrorForCode(code))}
}

// failTxn ends claim tp after its transaction of batch failed with err:
// the transaction is aborted when the producer may still talk, batch's
// callers fail (NOT_COORDINATOR if fenced or dropped, else
// COORDINATOR_NOT_AVAILABLE), the claim ends and OnFenced reports it.
func (s *Store) failTxn(tp *txnPart, batch []*txnWrite, err error) {
	tp.mu.Lock()
	dropped := tp.state == partGone
	tp.mu.Unlock()
	var te *txnError
	isFenced := errors.As(err, &te) && te.fenced
	if !isFenced && !dropped {
		ctx, cancel := context.WithTimeout(tp.ctx, 5*time.Second)
		if aerr := s.endTxn(ctx, tp, false); aerr != nil {
			s.log.Warn("kafkastore: aborting a failed transaction failed", "partition", tp.p, "err", aerr)
		}
		cancel()
	}
	code := kerr.CoordinatorNotAvailable
	if isFenced || dropped {
		code = kerr.NotCoordinator
	}
	cerr := fmt.Errorf("kafkastore: transaction of groups partition %d failed: %w (%v)", tp.p, code, err)
	if !dropped {
		// The claim ends before the batch's callers hear of the failure:
		// one that sees NOT_COORDINATOR and asks Claimed must hear false.
		s.log.Warn("kafkastore: dropping groups partition after a failed transaction", "partition", tp.p, "fenced", isFenced, "err", err)
		s.end(tp, kerr.NotCoordinator)
	}
	for _, w := range batch {
		w.done <- txnResult{err: cerr}
	}
	if dropped {
		return
	}
	if f := s.txn.opts.OnFenced; f != nil {
		tp.fenceOnce.Do(func() { f(tp.p) })
	}
}

// runTxn runs one transaction of claim tp holding batch and, once it
// committed, applies its records to the index and answers every write.
// On error nothing was answered.
func (s *Store) runTxn(ctx context.Context, tp *txnPart, batch []*txnWrite) error {
	var (
		recs    []kmsg.Record
		groups  []string // with offsets, in order
		inTxn   = make(map[string]bool)
		commits []*txnWrite
	)
	for _, w := range batch {
		if w.meta {
			recs = append(recs, kmsg.Record{Key: []byte(w.group), Value: w.value})
			continue
		}
		commits = append(commits, w)
		if !inTxn[w.group] {
			inTxn[w.group] = true
			groups = append(groups, w.group)
		}
	}
	if len(recs) > 0 {
		if err := s.addPartitionToTxn(ctx, tp); err != nil {
			return err
		}
		if err := s.produceTxn(ctx, tp, recs); err != nil {
			return err
		}
	}
	for _, g := range groups {
		if err := s.addOffsetsToTxn(ctx, tp, g); err != nil {
			return err
		}
	}
	results := make([][]kmsg.OffsetCommitResponseTopic, len(commits))
	errs := make([]error, len(commits))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, w := range commits {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i], errs[i] = s.txnOffsetCommit(ctx, tp, w.group, w.offsets)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, e := range errs {
			var te *txnError
			if errors.As(e, &te) && te.fenced {
				return e
			}
		}
		return err
	}
	tp.mu.Lock()
	gone := tp.state == partGone
	tp.mu.Unlock()
	if gone {
		return fmt.Errorf("groups partition %d was dropped: %w", tp.p, kerr.NotCoordinator)
	}
	if err := s.endTxn(ctx, tp, true); err != nil {
		return err
	}
	tp.mu.Lock()
	if tp.index != nil {
		for _, w := range batch {
			if !w.meta || w.group == ownerKey {
				continue
			}
			if w.value == nil {
				delete(tp.index, w.group)
			} else {
				tp.index[w.group] = w.value
			}
		}
	}
	tp.mu.Unlock()
	ci := 0
	for _, w := range batch {
		if w.meta {
			w.done <- txnResult{}
			continue
		}
		w.done <- txnResult{topics: results[ci]}
		ci++
	}
	return nil
}

// addPartitionToTxn adds the groups partition of tp to its transaction.
func (s *Store) addPartitionToTxn(ctx context.Context, tp *txnPart) error {
	req := kmsg.NewPtrAddPartitionsToTxnRequest()
	req.TransactionalID, req.ProducerID, req.ProducerEpoch = tp.txid, tp.pid, tp.epoch
	req.Topics = []kmsg.AddPartitionsToTxnRequestTopic{{Topic: s.groupsTopic, Partitions: []int32{tp.p}}}
	raw, err := s.up.Request(ctx, upstream.CoordinatorTxn, tp.txid, req, maxAddPartitionsToTxnVersion, func(r kmsg.Response) int16 {
		resp := r.(*kmsg.AddPartitionsToTxnResponse)
		if resp.ErrorCode != 0 {
			return resp.ErrorCode
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					return p.ErrorCode
				}
			}
		}
		return 0
	})
	if err != nil {
		return fmt.Errorf("add partitions to txn %q: %w", tp.txid, err)
	}
	resp := raw.(*kmsg.AddPartitionsToTxnResponse)
	code := resp.ErrorCode
	found := false
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if t.Topic == s.groupsTopic && p.Partition == tp.p {
				found = true
				if code == 0 {
					code = p.ErrorCode
				}
			}
		}
	}
	switch {
	case fencedCode(code):
		return fenced("add partitions to txn "+tp.txid, code)
	case code != 0:
		return fmt.Errorf("add partitions to txn %q: %w", tp.txid, kerr.ErrorForCode(code))
	case !found:
		return fmt.Errorf("add partitions to txn %q: partition missing from the response", tp.txid)
	}
	return nil
}

// produceTxn appends recs to the groups partition of tp as one
// transactional batch with the claim's next sequence numbers.
func (s *Store) produceTxn(ctx context.Context, tp *txnPart, recs []kmsg.Record) error {
	records := recordBatch(recs, time.Now().UnixMilli(), tp.pid, tp.epoch, tp.seq, true)
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			if err := upstream.Sleep(ctx, upstream.Backoff(attempt-1)); err != nil {
				return fmt.Errorf("transactional produce to %s[%d]: %w (last: %v)", s.groupsTopic, tp.p, err, last)
			}
		}
		m, err := s.groupsMeta(ctx)
		if err != nil {
			return err
		}
		req := kmsg.NewPtrProduceRequest()
		req.TransactionID = &tp.txid
		req.Acks = -1
		req.TimeoutMillis = 15000
		if dl, ok := ctx.Deadline(); ok {
			req.TimeoutMillis = int32(max(min(time.Until(dl), 15*time.Second), time.Millisecond) / time.Millisecond)
		}
		rt := kmsg.NewProduceRequestTopic()
		rt.Topic, rt.TopicID = s.groupsTopic, m.id
		rp := kmsg.NewProduceRequestTopicPartition()
		rp.Partition = tp.p
		rp.Records = records
		rt.Partitions = []kmsg.ProduceRequestTopicPartition{rp}
		req.Topics = []kmsg.ProduceRequestTopic{rt}
		// A resend after a lost answer carries the same sequence
		// numbers: the broker recognizes it as a duplicate. On a lent
		// client, so that the writes of other groups partitions, which
		// go to the same leader, do not wait out this one's acks=all
		// (internal/clientpool); tp has one produce in flight at a time, so
		// its sequence numbers still arrive in order.
		cl, put, err := s.up.Lend(ctx)
		if err != nil {
			return fmt.Errorf("transactional produce to %s[%d]: %w", s.groupsTopic, tp.p, err)
		}
		raw, err := cl.Broker(int(m.leaders[tp.p])).RetriableRequest(ctx, upstream.Capped(req, maxTxnProduceVersion))
		put()
		if err != nil {
			s.forgetGroupsMeta()
			if ctx.Err() != nil {
				return fmt.Errorf("transactional produce to %s[%d]: %w", s.groupsTopic, tp.p, err)
			}
			last = err
			continue
		}
		resp := raw.(*kmsg.ProduceResponse)
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return fmt.Errorf("transactional produce to %s[%d]: malformed produce response", s.groupsTopic, tp.p)
		}
		code := resp.Topics[0].Partitions[0].ErrorCode
		switch {
		case code == 0 || code == kerr.DuplicateSequenceNumber.Code:
			tp.seq += int32(len(recs))
			return nil
		case fencedCode(code):
			return fenced(fmt.Sprintf("transactional produce to %s[%d]", s.groupsTopic, tp.p), code)
		case retriableLeaderError(code):
			s.forgetGroupsMeta()
			last = kerr.ErrorForCode(code)
		default:
			return fmt.Errorf("transactional produce to %s[%d]: %w", s.groupsTopic, tp.p, kerr.ErrorForCode(code))
		}
	}
	return fmt.Errorf("transactional produce to %s[%d]: %w", s.groupsTopic, tp.p, last)
}

// addOffsetsToTxn adds group's offsets to the transaction of tp.
func (s *Store) addOffsetsToTxn(ctx context.Context, tp *txnPart, group string) error {
	req := kmsg.NewPtrAddOffsetsToTxnRequest()
	req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Group = tp.txid, tp.pid, tp.epoch, group
	raw, err := s.up.Request(ctx, upstream.CoordinatorTxn, tp.txid, req, maxAddOffsetsToTxnVersion, func(r kmsg.Response) int16 {
		return r.(*kmsg.AddOffsetsToTxnResponse).ErrorCode
	})
	if err != nil {
		return fmt.Errorf("add offsets of group %q to txn %q: %w", group, tp.txid, err)
	}
	code := raw.(*kmsg.AddOffsetsToTxnResponse).ErrorCode
	switch {
	case fencedCode(code):
		return fenced(fmt.Sprintf("add offsets of group %q to txn %q", group, tp.txid), code)
	case code != 0:
		return fmt.Errorf("add offsets of group %q to txn %q: %w", group, tp.txid, kerr.ErrorForCode(code))
	}
	return nil
}

// txnOffsetCommit stages group's offsets in the transaction of tp
// (generation -1, no member: the simple commit lag tools read) and
// returns the per-partition results. Partition errors other than fencing
// are results for the caller, not failures of the transaction.
func (s *Store) txnOffsetCommit(ctx context.Context, tp *txnPart, group string, topics []kmsg.OffsetCommitRequestTopic) ([]kmsg.OffsetCommitResponseTopic, error) {
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group = tp.txid, group
	req.ProducerID, req.ProducerEpoch = tp.pid, tp.epoch
	req.Generation, req.MemberID, req.InstanceID = -1, "", nil
	for _, t := range topics {
		rt := kmsg.NewTxnOffsetCommitRequestTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = p.Partition, p.Offset, p.LeaderEpoch, p.Metadata
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	raw, err := s.up.Request(ctx, upstream.CoordinatorGroup, group, req, maxTxnOffsetCommitVersion, func(r kmsg.Response) int16 {
		for _, t := range r.(*kmsg.TxnOffsetCommitResponse).Topics {
			for _, p := range t.Partitions {
				if upstream.RetriableCoordinatorCode(p.ErrorCode) {
					return p.ErrorCode
				}
			}
		}
		return 0
	})
	if err != nil {
		return nil, fmt.Errorf("txn offset commit of group %q: %w", group, err)
	}
	resp := raw.(*kmsg.TxnOffsetCommitResponse)
	out := make([]kmsg.OffsetCommitResponseTopic, 0, len(resp.Topics))
	for _, t := range resp.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			if fencedCode(p.ErrorCode) {
				return nil, fenced(fmt.Sprintf("txn offset commit of group %q", group), p.ErrorCode)
			}
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition, rp.ErrorCode = p.Partition, p.ErrorCode
			rt.Partitions = append(rt.Partitions, rp)
		}
		out = append(out, rt)
	}
	return out, nil
}

// endTxn commits or aborts the transaction of tp.
func (s *Store) endTxn(ctx context.Context, tp *txnPart, commit bool) error {
	req := kmsg.NewPtrEndTxnRequest()
	req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = tp.txid, tp.pid, tp.epoch, commit
	what := "abort"
	if commit {
		what = "commit"
	}
	raw, err := s.up.Request(ctx, upstream.CoordinatorTxn, tp.txid, req, maxEndTxnVersion, func(r kmsg.Response) int16 {
		return r.(*kmsg.EndTxnResponse).ErrorCode
	})
	if err != nil {
		return fmt.Errorf("end txn %q (%s): %w", tp.txid, what, err)
	}
	code := raw.(*kmsg.EndTxnResponse).ErrorCode
	switch {
	case fencedCode(code):
		return fenced(fmt.Sprintf("end txn %q (%s)", tp.txid, what), code)
	case code != 0:
		return fmt.Errorf("end txn %q (%s): %w", tp.txid, what, kerr.ErrorForCode(code))
	}
	return nil
}

// txnLoad answers LoadGroupMetadata in transactional mode, from the
// index of the group's claimed partition.
func (s *Store) txnLoad(ctx context.Context, group string) ([]byte, bool, error) {
	tp, err := s.claimFor(ctx, group)
	if err != nil {
		return nil, false, err
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if err := stateErr(tp, group, tp.state); err != nil {
		return nil, false, err
	}
	rec, ok := tp.index[group]
	if !ok {
		return nil, false, nil
	}
	return append([]byte(nil), rec...), true, nil
}

// unstableRetry bounds how long FetchOffsets retries
// UNSTABLE_OFFSET_COMMIT in transactional mode.
const unstableRetry = 2 * time.Second

// txnFetchOffsets answers FetchOffsets in transactional mode: it requires
// stable offsets, so a commit still in a transaction is not read as
// missing, and retries UNSTABLE_OFFSET_COMMIT briefly; the last answer is
// returned as it is (partitions may still carry the error).
func (s *Store) txnFetchOffsets(ctx context.Context, group string, topics []kmsg.OffsetFetchRequestTopic) ([]kmsg.OffsetFetchResponseTopic, error) {
	deadline := time.Now().Add(unstableRetry)
	for attempt := 0; ; attempt++ {
		out, err := s.fetchOffsets(ctx, group, topics, true)
		if err != nil || !hasUnstable(out) || time.Now().After(deadline) {
			return out, err
		}
		if err := upstream.Sleep(ctx, upstream.Backoff(attempt)); err != nil {
			return out, nil
		}
	}
}

// hasUnstable reports whether any partition answered
// UNSTABLE_OFFSET_COMMIT.
func hasUnstable(topics []kmsg.OffsetFetchResponseTopic) bool {
	for _, t := range topics {
		for _, p := range t.Partitions {
			if p.ErrorCode == kerr.UnstableOffsetCommit.Code {
				return true
			}
		}
	}
	return false
}
