package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// franzProduce writes o.count records synchronously with franz-go: in one
// batch, or with o.intervalMS > 0 one record at a time, o.intervalMS apart,
// each acknowledged before the next (a steady stream during a fault).
func franzProduce(ctx context.Context, o options) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.bootstrap), kgo.ClientID(o.member),
		kgo.DefaultProduceTopic(o.topic), kgo.AllowAutoTopicCreation())
	if err != nil {
		return fmt.Errorf("franz client: %w", err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, o.count)
	for i := o.start; i < o.start+o.count; i++ {
		id := recordID(i)
		recs = append(recs, &kgo.Record{Key: []byte(id), Value: []byte(id)})
	}
	if o.intervalMS > 0 {
		for _, r := range recs {
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := cl.ProduceSync(pctx, r).FirstErr()
			cancel()
			if err != nil {
				return fmt.Errorf("franz produce %s: %w", r.Value, err)
			}
			time.Sleep(time.Duration(o.intervalMS) * time.Millisecond)
		}
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("franz produce: %w", err)
	}
	return nil
}

// classicWatch is a write hook that notices the classic group protocol:
// franz-go's ServerSideBalancer silently uses it when the cluster does not
// offer KIP-848 (ConsumerGroupHeartbeat v1), and a KIP-848 row must fail
// then rather than pass on the classic protocol. Its flag is written by
// the client's connection goroutines and read by the poll loop.
type classicWatch struct{ joined atomic.Bool }

// OnBrokerWrite implements kgo.HookBrokerWrite.
func (w *classicWatch) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 11 && err == nil { // JoinGroup
		w.joined.Store(true)
	}
}

// franzConsume joins the group with franz-go, commits after each poll and
// leaves cleanly when ctx is cancelled. With --assignor server-uniform it
// uses KIP-848 (kgo.ServerSideBalancer with the sticky balancer, so the
// broker's uniform assignor) and fails as soon as the client falls back to
// the classic protocol.
func franzConsume(ctx context.Context, o options, em *emitter) error {
	var owned ownedSet
	var cl *kgo.Client
	gen := func() int32 {
		_, g := cl.GroupMetadata()
		return g
	}
	report := func(ev string, add, remove []int32) {
		parts := owned.apply(add, remove, false)
		em.emit(ev, map[string]any{"generation": gen(), "partitions": parts})
	}
	balancer := kgo.RangeBalancer()
	var watch *classicWatch
	switch o.assignor {
	case "range":
	case "cooperative-sticky":
		balancer = kgo.CooperativeStickyBalancer()
	case "server-uniform":
		balancer = kgo.StickyBalancer()
		watch = &classicWatch{}
	default:
		return fmt.Errorf("unknown assignor %q", o.assignor)
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(o.bootstrap),
		kgo.ClientID(o.member),
		kgo.ConsumerGroup(o.group),
		kgo.ConsumeTopics(o.topic),
		kgo.Balancers(balancer),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(time.Duration(o.sessionMS) * time.Millisecond),
		kgo.HeartbeatInterval(time.Duration(o.heartbeatMS) * time.Millisecond),
		kgo.RebalanceTimeout(20 * time.Second),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			report("assigned", m[o.topic], nil)
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			report("revoked", nil, m[o.topic])
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			report("lost", nil, m[o.topic])
		}),
	}
	if o.instanceID != "" {
		opts = append(opts, kgo.InstanceID(o.instanceID))
	}
	if watch != nil {
		opts = append(opts, kgo.ServerSideBalancer(), kgo.WithHooks(watch))
	}
	var err error
	cl, err = kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("franz client: %w", err)
	}
	em.emit("ready", nil)
	defer func() {
		cl.AllowRebalance()
		cl.Close()
		em.emit("closed", nil)
	}()
	for ctx.Err() == nil {
		if watch != nil && watch.joined.Load() {
			return errors.New("KIP-848 unavailable: franz-go fell back to the classic protocol (it sent JoinGroup), so the cluster does not offer ConsumerGroupHeartbeat v1")
		}
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fetches := cl.PollRecords(pctx, 500)
		cancel()
		fetches.EachError(func(t string, p int32, err error) {
			if ctx.Err() == nil && err != context.DeadlineExceeded && err != context.Canceled {
				em.errorf("fetch %s/%d: %v", t, p, err)
			}
		})
		recs := fetches.Records()
		if len(recs) > 0 {
			err := franzCommit(ctx, cl, recs, em)
			if err != nil {
				em.errorf("commit: %v", err)
				// The batch is not committed, and the poll moved the
				// position past it: where this member still owns a
				// partition (a cooperative or KIP-848 rebalance keeps
				// it), read the batch again, as an application that
				// keeps its batch does. Without this a member that kept
				// its partitions skipped the batch for good (seen once,
				// KIP-848 directly against Kafka 4.1.1: 324 of 500
				// records consumed). SetOffsets leaves partitions this
				// member no longer consumes alone.
				rewind := map[string]map[int32]kgo.EpochOffset{}
				for _, r := range recs {
					if rewind[r.Topic] == nil {
						rewind[r.Topic] = map[int32]kgo.EpochOffset{}
					}
					if _, ok := rewind[r.Topic][r.Partition]; !ok {
						rewind[r.Topic][r.Partition] = kgo.EpochOffset{Epoch: -1, Offset: r.Offset}
					}
				}
				cl.SetOffsets(rewind)
			} else {
				offsets := map[string]int64{}
				for _, r := range recs {
					em.emit("record", map[string]any{"p": r.Partition, "o": r.Offset, "id": string(r.Value)})
					offsets[fmt.Sprint(r.Partition)] = r.Offset + 1
				}
				em.emit("commit", map[string]any{"offsets": offsets})
			}
		}
		cl.AllowRebalance()
	}
	return nil
}

// franzCommit commits recs, retrying for up to 30 s while the error is
// one a coordinator that moves or restarts gives (kerr's retriable codes,
// or a try that ran out of time): an application keeps its batch rather
// than skipping it. Each failed try is reported as an error event. Other
// errors (a rebalance took the partitions) are returned at once.
func franzCommit(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, em *emitter) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := cl.CommitRecords(cctx, recs...)
		cancel()
		if err == nil {
			return nil
		}
		retry := kerr.IsRetriable(err) || errors.Is(err, context.DeadlineExceeded)
		if !retry || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		em.errorf("commit (retrying): %v", err)
		time.Sleep(200 * time.Millisecond)
	}
}

// franzShare is a share-group member (KIP-932, franz-go's share consumer)
// for the kinds rows (harness/kinds.go). It speaks the plain lines of the
// Java Share program, not the JSON of the other modes: "STARTED", one
// "REC partition offset deliveryCount value" per record, "BATCH n" after
// each non-empty poll, "ERROR text" for fetch errors. Each poll accepts
// the records of the one before (franz-go's default); after a batch it
// holds holdMS before polling again, so the harness can kill it holding
// acquired records. It runs until killed or ctx ends.
//
// With explicit, each record gets the ack of shareAckFor, the batch's
// acks are flushed (ShareAcknowledge) before the next poll, and each
// record of a partition whose acks were answered without error is
// printed "ACK ms partition offset STATUS value" (ms: wall clock after
// the flush); REC lines then end with the poll's wall-clock ms.
func franzShare(ctx context.Context, o options, holdMS int, explicit bool) error {
	// results is written by franz-go's ack callback and read after
	// FlushAcks returns, both under resultsMu.
	var (
		resultsMu sync.Mutex
		results   kgo.ShareAckResults
	)
	opts := []kgo.Opt{kgo.SeedBrokers(o.bootstrap), kgo.ClientID(o.member), kgo.ShareGroup(o.group), kgo.ConsumeTopics(o.topic)}
	if explicit {
		opts = append(opts, kgo.ShareAckCallback(func(_ *kgo.Client, rs kgo.ShareAckResults) {
			resultsMu.Lock()
			results = append(results, rs...)
			resultsMu.Unlock()
		}))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Println("STARTED")
	batches := 0
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		polled := time.Now().UnixMilli()
		var b strings.Builder
		fs.EachError(func(_ string, _ int32, err error) {
			if ctx.Err() == nil {
				fmt.Fprintf(&b, "ERROR %v\n", err)
			}
		})
		var recs []*kgo.Record
		fs.EachRecord(func(r *kgo.Record) {
			recs = append(recs, r)
			fmt.Fprintf(&b, "REC %d %d %d %s", r.Partition, r.Offset, r.DeliveryCount(), r.Value)
			if explicit {
				fmt.Fprintf(&b, " %d", polled)
			}
			b.WriteString("\n")
		})
		if len(recs) > 0 {
			batches++
			fmt.Fprintf(&b, "BATCH %d\n", batches)
		}
		os.Stdout.WriteString(b.String())
		if explicit && len(recs) > 0 {
			statuses := make([]kgo.AckStatus, len(recs))
			for i, r := range recs {
				statuses[i] = shareAckFor(string(r.Value), r.DeliveryCount())
				r.Ack(statuses[i])
			}
			resultsMu.Lock()
			results = results[:0]
			resultsMu.Unlock()
			fctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			err := cl.FlushAcks(fctx)
			cancel()
			now := time.Now().UnixMilli()
			b.Reset()
			resultsMu.Lock()
			answered := map[int32]error{}
			for _, r := range results {
				if prev, ok := answered[r.Partition]; !ok || prev == nil {
					answered[r.Partition] = r.Err
				}
			}
			resultsMu.Unlock()
			for i, r := range recs {
				perr, ok := answered[r.Partition]
				switch {
				case err != nil:
					fmt.Fprintf(&b, "ERROR ack p%d %d: flushing: %v\n", r.Partition, r.Offset, err)
				case !ok:
					fmt.Fprintf(&b, "ERROR ack p%d %d: no result for the partition\n", r.Partition, r.Offset)
				case perr != nil:
					fmt.Fprintf(&b, "ERROR ack p%d %d: %v\n", r.Partition, r.Offset, perr)
				default:
					fmt.Fprintf(&b, "ACK %d %d %d %s %s\n", now, r.Partition, r.Offset, ackName(statuses[i]), r.Value)
				}
			}
			os.Stdout.WriteString(b.String())
		}
		if len(recs) > 0 && holdMS > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(holdMS) * time.Millisecond):
			}
		}
	}
	return nil
}

// shareAckFor is the explicit ack of a record with value v on its
// delivery'th delivery: reject values ending in 7, release those ending
// in 3 on their first delivery, accept the rest (the Java Share
// program's rule).
func shareAckFor(v string, delivery int32) kgo.AckStatus {
	switch {
	case strings.HasSuffix(v, "7"):
		return kgo.AckReject
	case strings.HasSuffix(v, "3") && delivery == 1:
		return kgo.AckRelease
	}
	return kgo.AckAccept
}

// ackName names s as the Java client's AcknowledgeType does.
func ackName(s kgo.AckStatus) string {
	switch s {
	case kgo.AckAccept:
		return "ACCEPT"
	case kgo.AckRelease:
		return "RELEASE"
	case kgo.AckReject:
		return "REJECT"
	}
	return s.String()
}
