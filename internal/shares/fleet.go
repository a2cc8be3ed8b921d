package shares

// Share groups in a fleet. A share group has one owner, the kproxy whose
// engine holds its state (docs/fleet.md); its members may connect to any
// kproxy of the fleet. Each member's kproxy keeps the member's share
// sessions, fetches the records from the brokers and answers the client,
// as a single kproxy does; only the steps that read or change the group's
// state (SharePrepare, ShareInitialize, ShareAcquire, ShareAdvance,
// ShareReleaseMember) go to the owner, as kproxy messages on the peer
// wire. What crosses is offsets, acknowledgement batches and batch
// headers, never record bytes, so a group's records do not all pass
// through its owner.
//
// The owner answers an acknowledgement once its state is durable, as for
// a local member, and a write refused by the fleet's fencing is answered
// with an error: a member's kproxy never reports an acknowledgement as
// done that the owner did not store. A step that cannot reach the owner
// (none known within a second, the peer wire cut, no answer in time) is
// answered COORDINATOR_NOT_AVAILABLE; the client retries, and records it
// held come back to the group when their locks end or the next owner
// loads the group (acquisitions are not stored as held, docs/share-groups.md).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/share"
	"github.com/kproxy/kproxy/proxy"
)

// Ops are the engine's share-group steps the service uses
// (groupstate/share_ops.go). A *groupstate.Engine is Ops; in a fleet,
// Routed sends each step to the group's owner. done callbacks must not
// block.
type Ops interface {
	SharePrepare(group, member string, acks map[groupstate.ShareTP][]share.AckBatch, fetch []groupstate.ShareTP, done func(groupstate.SharePlan))
	ShareInitialize(group string, starts map[groupstate.ShareTP]int64, done func(code int16))
	ShareAcquire(group, member string, fetched map[groupstate.ShareTP]groupstate.ShareFetched, maxRecords int, mode share.AcquireMode, batchSize int, done func(map[groupstate.ShareTP][]share.Acquired, int16))
	ShareAdvance(group string, logStarts map[groupstate.ShareTP]int64)
	ShareReleaseMember(group, member string, partitions []groupstate.ShareTP)
}

var _ Ops = (*groupstate.Engine)(nil)

// Peers sends kproxy messages to the owners of groups (the fleet's
// router, proxy.Router.SendPeer).
type Peers interface {
	// SendPeer sends a message of type kind, at version, to the kproxy
	// that owns group and returns the payload of its answer.
	SendPeer(ctx context.Context, group, kind string, version int16, payload []byte) ([]byte, error)
}

// The share steps as peer-wire messages: their type names, all at
// version 0, with JSON payloads (the wire* types below).
const (
	MsgPrepare    = "share.prepare"
	MsgInitialize = "share.initialize"
	MsgAcquire    = "share.acquire"
	MsgAdvance    = "share.advance"
	MsgRelease    = "share.release"
)

// MsgKinds lists the message types PeerHandler serves.
var MsgKinds = []string{MsgPrepare, MsgInitialize, MsgAcquire, MsgAdvance, MsgRelease}

const (
	// ownerWait bounds how long a step waits for the fleet to name the
	// group's owner (the router's WaitForOwner).
	ownerWait = time.Second
	// peerCallTimeout bounds one step at a remote owner: a store write
	// (an acknowledgement waits for it) and the round trip.
	peerCallTimeout = 10 * time.Second
)

// Routed returns Ops that run each step on local when the fleet says the
// group is owned here, and at its owner otherwise. loc is the fleet's
// view of owners (the router's Locator).
func Routed(local Ops, loc proxy.Locator, peers Peers, log *slog.Logger) Ops {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &routed{local: local, loc: loc, peers: peers, log: log}
}

type routed struct {
	local Ops           // immutable
	loc   proxy.Locator // immutable
	peers Peers         // immutable
	log   *slog.Logger  // immutable

	// lastWarn (unix nanoseconds) and suppressed rate-limit the
	// warnings of failed steps: while an owner is gone every fetch of
	// its group fails one.
	lastWarn   atomic.Int64
	suppressed atomic.Int64
}

// warn logs a failed step, at most once a second.
func (r *routed) warn(msg string, err error) {
	now := time.Now().UnixNano()
	last := r.lastWarn.Load()
	if now-last < int64(time.Second) || !r.lastWarn.CompareAndSwap(last, now) {
		r.suppressed.Add(1)
		return
	}
	r.log.Warn(msg, "err", err, "suppressed", r.suppressed.Swap(0))
}

// owner locates group's owner, waiting up to ownerWait for one: local,
// or elsewhere; ok is false if none.
func (r *routed) owner(group string) (local bool, ok bool) {
	deadline := time.NewTimer(ownerWait)
	defer deadline.Stop()
	for {
		changed := r.loc.Changed() // before locating: no change is missed
		if local, _, ok = r.loc.Locate(group); ok {
			return local, true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false, false
		}
	}
}

// call runs one step at group's owner: it encodes in, sends it and
// decodes the answer into out. Errors say which step failed for which
// group.
func (r *routed) call(kind, group string, in, out any) error {
	payload, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encoding %s for group %q: %w", kind, group, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerCallTimeout)
	defer cancel()
	go r.abandonOnMove(ctx, cancel, group)
	ans, err := r.peers.SendPeer(ctx, group, kind, 0, payload)
	if err != nil {
		return fmt.Errorf("%s for group %q: %w", kind, group, err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(ans, out); err != nil {
		return fmt.Errorf("decoding the answer to %s for group %q: %w", kind, group, err)
	}
	return nil
}

// abandonOnMove cancels a step sent to group's owner once the fleet
// names another owner, or none, until ctx ends. An owner that lost the
// group mid-step (cut off from the brokers, its lease ran out) can hold
// the step until its store call gives up; whether the step took effect
// there is unknown either way (its state write may have landed before
// the lease ran out, and cannot after the next owner's claim fences
// it), so the step fails at once rather than at peerCallTimeout, and the
// client is answered as for any owner lost (ackLost).
func (r *routed) abandonOnMove(ctx context.Context, cancel context.CancelFunc, group string) {
	changed := r.loc.Changed()
	_, first, ok := r.loc.Locate(group)
	if !ok {
		return // SendPeer finds no owner either
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
		changed = r.loc.Changed()
		if local, addr, ok := r.loc.Locate(group); !ok || local || addr != first {
			cancel()
			return
		}
	}
}

func (r *routed) SharePrepare(group, member string, acks map[groupstate.ShareTP][]share.AckBatch, fetch []groupstate.ShareTP, done func(groupstate.SharePlan)) {
	local, ok := r.owner(group)
	switch {
	case local:
		r.local.SharePrepare(group, member, acks, fetch, done)
	case !ok:
		done(groupstate.SharePlan{Code: kerr.CoordinatorNotAvailable.Code})
	default:
		go func() {
			var out wirePlan
			if err := r.call(MsgPrepare, group, prepareMsg(group, member, acks, fetch), &out); err != nil {
				r.warn("shares: a share step at the group's owner failed", err)
				done(groupstate.SharePlan{Code: kerr.CoordinatorNotAvailable.Code})
				return
			}
			done(out.plan())
		}()
	}
}

func (r *routed) ShareInitialize(group string, starts map[groupstate.ShareTP]int64, done func(code int16)) {
	local, ok := r.owner(group)
	switch {
	case local:
		r.local.ShareInitialize(group, starts, done)
	case !ok:
		done(kerr.CoordinatorNotAvailable.Code)
	default:
		go func() {
			var out wireCode
			if err := r.call(MsgInitialize, group, wireInitialize{Group: group, Starts: tpOffsets(starts)}, &out); err != nil {
				r.warn("shares: a share step at the group's owner failed", err)
				done(kerr.CoordinatorNotAvailable.Code)
				return
			}
			done(out.Code)
		}()
	}
}

func (r *routed) ShareAcquire(group, member string, fetched map[groupstate.ShareTP]groupstate.ShareFetched, maxRecords int, mode share.AcquireMode, batchSize int, done func(map[groupstate.ShareTP][]share.Acquired, int16)) {
	local, ok := r.owner(group)
	switch {
	case local:
		r.local.ShareAcquire(group, member, fetched, maxRecords, mode, batchSize, done)
	case !ok:
		done(nil, kerr.CoordinatorNotAvailable.Code)
	default:
		go func() {
			in := wireAcquire{Group: group, Member: member, MaxRecords: maxRecords, Mode: mode, BatchSize: batchSize}
			for tp, f := range fetched {
				in.Fetched = append(in.Fetched, wireFetched{TP: wireTPOf(tp), FetchOffset: f.FetchOffset, Batches: f.Batches})
			}
			var out wireAcquired
			if err := r.call(MsgAcquire, group, in, &out); err != nil {
				r.warn("shares: a share step at the group's owner failed", err)
				done(nil, kerr.CoordinatorNotAvailable.Code)
				return
			}
			done(out.acquired(), out.Code)
		}()
	}
}

func (r *routed) ShareAdvance(group string, logStarts map[groupstate.ShareTP]int64) {
	local, ok := r.owner(group)
	switch {
	case local:
		r.local.ShareAdvance(group, logStarts)
	case ok:
		go func() {
			if err := r.call(MsgAdvance, group, wireInitialize{Group: group, Starts: tpOffsets(logStarts)}, nil); err != nil {
				r.warn("shares: a share step at the group's owner failed (the next fetch finds the log start again)", err)
			}
		}()
	}
}

func (r *routed) ShareReleaseMember(group, member string, partitions []groupstate.ShareTP) {
	local, ok := r.owner(group)
	switch {
	case local:
		r.local.ShareReleaseMember(group, member, partitions)
	case ok:
		go func() {
			in := wireRelease{Group: group, Member: member, Partitions: wireTPs(partitions)}
			if err := r.call(MsgRelease, group, in, nil); err != nil {
				r.warn("shares: releasing a closed session's records at the group's owner failed (their locks end them)", err)
			}
		}()
	default:
		r.warn("shares: no owner to release a closed session's records at (their locks end them)", fmt.Errorf("group %q, member %q: no owner within %v", group, member, ownerWait))
	}
}

// PeerHandler returns the handler of message type kind (one of MsgKinds)
// for the peer wire's registry: it runs the step another kproxy sent on
// local, the engine of this kproxy, and returns the answer's payload.
func PeerHandler(local Ops, kind string) func(ctx context.Context, version int16, payload []byte) ([]byte, error) {
	return func(ctx context.Context, version int16, payload []byte) ([]byte, error) {
		ch := make(chan peerAnswer, 1)
		handlePeer(local, kind, version, payload, func(b []byte, err error) { ch <- peerAnswer{b, err} })
		select {
		case a := <-ch:
			return a.payload, a.err
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w", kind, ctx.Err())
		}
	}
}

type peerAnswer struct {
	payload []byte
	err     error
}

// ErrMalformed is wrapped by the errors of a message that does not
// decode.
var ErrMalformed = errors.New("malformed share message")

// handlePeer serves one share step on local and answers through reply,
// once, from any goroutine.
func handlePeer(local Ops, kind string, version int16, payload []byte, reply func([]byte, error)) {
	if version != 0 {
		reply(nil, fmt.Errorf("%s v%d: this kproxy reads v0 only", kind, version))
		return
	}
	answer := func(v any) {
		b, err := json.Marshal(v)
		reply(b, err)
	}
	bad := func(err error) { reply(nil, fmt.Errorf("%w %s: %w", ErrMalformed, kind, err)) }
	switch kind {
	case MsgPrepare:
		var in wirePrepare
		if err := json.Unmarshal(payload, &in); err != nil {
			bad(err)
			return
		}
		acks := make(map[groupstate.ShareTP][]share.AckBatch, len(in.Acks))
		for _, a := range in.Acks {
			acks[a.TP.tp()] = a.Batches
		}
		local.SharePrepare(in.Group, in.Member, acks, in.fetch(), func(p groupstate.SharePlan) { answer(wirePlanOf(p)) })
	case MsgInitialize, MsgAdvance:
		var in wireInitialize
		if err := json.Unmarshal(payload, &in); err != nil {
			bad(err)
			return
		}
		starts := make(map[groupstate.ShareTP]int64, len(in.Starts))
		for _, s := range in.Starts {
			starts[s.TP.tp()] = s.Offset
		}
		if kind == MsgAdvance {
			local.ShareAdvance(in.Group, starts)
			answer(wireCode{})
			return
		}
		local.ShareInitialize(in.Group, starts, func(code int16) { answer(wireCode{Code: code}) })
	case MsgAcquire:
		var in wireAcquire
		if err := json.Unmarshal(payload, &in); err != nil {
			bad(err)
			return
		}
		fetched := make(map[groupstate.ShareTP]groupstate.ShareFetched, len(in.Fetched))
		for _, f := range in.Fetched {
			fetched[f.TP.tp()] = groupstate.ShareFetched{FetchOffset: f.FetchOffset, Batches: f.Batches}
		}
		local.ShareAcquire(in.Group, in.Member, fetched, in.MaxRecords, in.Mode, in.BatchSize,
			func(m map[groupstate.ShareTP][]share.Acquired, code int16) { answer(wireAcquiredOf(m, code)) })
	case MsgRelease:
		var in wireRelease
		if err := json.Unmarshal(payload, &in); err != nil {
			bad(err)
			return
		}
		parts := make([]groupstate.ShareTP, len(in.Partitions))
		for i, tp := range in.Partitions {
			parts[i] = tp.tp()
		}
		local.ShareReleaseMember(in.Group, in.Member, parts)
		answer(wireCode{})
	default:
		reply(nil, fmt.Errorf("unknown message type %q", kind))
	}
}

// The messages' JSON. A topic id is its 16 bytes (base64 in JSON).

type wireTP struct {
	Topic     []byte `json:"t"`
	Partition int32  `json:"p"`
}

func wireTPOf(tp groupstate.ShareTP) wireTP {
	return wireTP{Topic: tp.TopicID[:], Partition: tp.Partition}
}

func (w wireTP) tp() groupstate.ShareTP {
	var tp groupstate.ShareTP
	copy(tp.TopicID[:], w.Topic)
	tp.Partition = w.Partition
	return tp
}

func wireTPs(tps []groupstate.ShareTP) []wireTP {
	out := make([]wireTP, len(tps))
	for i, tp := range tps {
		out[i] = wireTPOf(tp)
	}
	return out
}

type wireOffset struct {
	TP     wireTP `json:"tp"`
	Offset int64  `json:"o"`
}

func tpOffsets(m map[groupstate.ShareTP]int64) []wireOffset {
	out := make([]wireOffset, 0, len(m))
	for tp, o := range m {
		out = append(out, wireOffset{wireTPOf(tp), o})
	}
	return out
}

type wireCodeTP struct {
	TP   wireTP `json:"tp"`
	Code int16  `json:"c"`
}

type wireAcks struct {
	TP      wireTP           `json:"tp"`
	Batches []share.AckBatch `json:"b"`
}

type wirePrepare struct {
	Group  string     `json:"group"`
	Member string     `json:"member"`
	Acks   []wireAcks `json:"acks,omitempty"`
	Fetch  []wireTP   `json:"fetch,omitempty"`
}

func prepareMsg(group, member string, acks map[groupstate.ShareTP][]share.AckBatch, fetch []groupstate.ShareTP) wirePrepare {
	in := wirePrepare{Group: group, Member: member, Fetch: wireTPs(fetch)}
	for tp, bs := range acks {
		in.Acks = append(in.Acks, wireAcks{TP: wireTPOf(tp), Batches: bs})
	}
	return in
}

func (w wirePrepare) fetch() []groupstate.ShareTP {
	out := make([]groupstate.ShareTP, len(w.Fetch))
	for i, tp := range w.Fetch {
		out[i] = tp.tp()
	}
	return out
}

type wirePlan struct {
	Code          int16                    `json:"code,omitempty"`
	AckCodes      []wireCodeTP             `json:"ack_codes,omitempty"`
	Offsets       []wireOffset             `json:"offsets,omitempty"`
	Uninitialized []wireTP                 `json:"uninitialized,omitempty"`
	FromLogStart  []wireTP                 `json:"from_log_start,omitempty"`
	Settings      groupstate.ShareSettings `json:"settings"`
}

func wirePlanOf(p groupstate.SharePlan) wirePlan {
	w := wirePlan{Code: p.Code, Offsets: tpOffsets(p.Offsets), Uninitialized: wireTPs(p.Uninitialized), Settings: p.Settings}
	for tp, c := range p.AckCodes {
		w.AckCodes = append(w.AckCodes, wireCodeTP{wireTPOf(tp), c})
	}
	for tp, yes := range p.FromLogStart {
		if yes {
			w.FromLogStart = append(w.FromLogStart, wireTPOf(tp))
		}
	}
	return w
}

func (w wirePlan) plan() groupstate.SharePlan {
	p := groupstate.SharePlan{Code: w.Code, Settings: w.Settings,
		AckCodes: make(map[groupstate.ShareTP]int16, len(w.AckCodes)),
		Offsets:  make(map[groupstate.ShareTP]int64, len(w.Offsets))}
	for _, c := range w.AckCodes {
		p.AckCodes[c.TP.tp()] = c.Code
	}
	for _, o := range w.Offsets {
		p.Offsets[o.TP.tp()] = o.Offset
	}
	for _, tp := range w.Uninitialized {
		p.Uninitialized = append(p.Uninitialized, tp.tp())
	}
	if len(w.FromLogStart) > 0 {
		p.FromLogStart = make(map[groupstate.ShareTP]bool, len(w.FromLogStart))
		for _, tp := range w.FromLogStart {
			p.FromLogStart[tp.tp()] = true
		}
	}
	return p
}

type wireCode struct {
	Code int16 `json:"code,omitempty"`
}

type wireInitialize struct {
	Group  string       `json:"group"`
	Starts []wireOffset `json:"starts"`
}

type wireFetched struct {
	TP          wireTP        `json:"tp"`
	FetchOffset int64         `json:"from"`
	Batches     []share.Batch `json:"batches"`
}

type wireAcquire struct {
	Group      string            `json:"group"`
	Member     string            `json:"member"`
	Fetched    []wireFetched     `json:"fetched"`
	MaxRecords int               `json:"max_records"`
	Mode       share.AcquireMode `json:"mode"`
	BatchSize  int               `json:"batch_size"`
}

type wireRanges struct {
	TP     wireTP           `json:"tp"`
	Ranges []share.Acquired `json:"r"`
}

type wireAcquired struct {
	Code     int16        `json:"code,omitempty"`
	Acquired []wireRanges `json:"acquired,omitempty"`
}

func wireAcquiredOf(m map[groupstate.ShareTP][]share.Acquired, code int16) wireAcquired {
	w := wireAcquired{Code: code}
	for tp, rs := range m {
		w.Acquired = append(w.Acquired, wireRanges{wireTPOf(tp), rs})
	}
	return w
}

func (w wireAcquired) acquired() map[groupstate.ShareTP][]share.Acquired {
	m := make(map[groupstate.ShareTP][]share.Acquired, len(w.Acquired))
	for _, r := range w.Acquired {
		m[r.TP.tp()] = r.Ranges
	}
	return m
}

type wireRelease struct {
	Group      string   `json:"group"`
	Member     string   `json:"member"`
	Partitions []wireTP `json:"partitions"`
}
