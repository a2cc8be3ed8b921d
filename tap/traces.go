package tap

import (
	"context"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/kproxy/kproxy/groupstate"
)

// Span names and kproxy-specific attribute keys of rebalance traces. Where
// OpenTelemetry's messaging conventions have a name (messaging.system,
// messaging.consumer.group.name, messaging.client.id, client.address,
// messaging.operation.name, messaging.destination.name), it is used.
const (
	// spanRebalance is the root of every rebalance trace; the group is
	// its messaging.consumer.group.name attribute, not part of the name,
	// so that span names stay few whatever the number of groups.
	spanRebalance = "rebalance"
	spanJoin      = "join"
	spanSync      = "sync"
	// spanReconcile is the phase of a KIP-848 rebalance: from the group
	// epoch's bump until every member holds its target (there is no
	// JoinGroup or SyncGroup round).
	spanReconcile = "reconcile"
	// spanAssign is the phase of a share group's (KIP-932) assignment
	// change: from the group epoch's bump until the simple assignor's
	// target for it is computed (at once when a member joins or changes
	// its subscription; at the next heartbeat after one leaves or
	// expires). Members move to their target at their own heartbeat,
	// without revocation, so there is no per-member span.
	spanAssign = "assign"
	// spanMember is one KIP-848 member's part of a reconciliation, a
	// child of the reconcile span.
	spanMember = "reconcile_member"
	// spanInitialDelay is the initial rebalance delay of a classic
	// group leaving Empty, a child of the join span.
	spanInitialDelay = "initial_delay"

	attrGeneration        = attribute.Key("kproxy.group.generation")
	attrPrevGeneration    = attribute.Key("kproxy.group.previous_generation")
	attrEpoch             = attribute.Key("kproxy.group.epoch")
	attrPrevEpoch         = attribute.Key("kproxy.group.previous_epoch")
	attrProtocolType      = attribute.Key("kproxy.group.protocol_type")
	attrProtocol          = attribute.Key("kproxy.group.protocol")
	attrAssignor          = attribute.Key("kproxy.group.assignor")
	attrLeader            = attribute.Key("kproxy.group.leader")
	attrMemberCount       = attribute.Key("kproxy.group.member_count")
	attrMemberID          = attribute.Key("kproxy.member.id")
	attrInstanceID        = attribute.Key("kproxy.member.instance_id")
	attrIsLeader          = attribute.Key("kproxy.member.leader")
	attrCauseMember       = attribute.Key("kproxy.rebalance.cause.member.id")
	attrCauseClient       = attribute.Key("kproxy.rebalance.cause.client.id")
	attrCauseHost         = attribute.Key("kproxy.rebalance.cause.client.address")
	attrCauseInstance     = attribute.Key("kproxy.rebalance.cause.instance_id")
	attrReason            = attribute.Key("kproxy.member.reason")
	attrPartitions        = attribute.Key("kproxy.member.assigned_partitions")
	attrTopics            = attribute.Key("kproxy.member.assigned_topics")
	attrAssignmentSize    = attribute.Key("kproxy.member.assignment_bytes")
	attrRevoking          = attribute.Key("kproxy.member.revoking_partitions")
	attrRevokingTopics    = attribute.Key("kproxy.member.revoking_topics")
	attrMemberEpoch       = attribute.Key("kproxy.member.epoch")
	attrMemberState       = attribute.Key("kproxy.member.state")
	attrJoinWait          = attribute.Key("kproxy.member.join_wait_ms")
	attrLastToJoin        = attribute.Key("kproxy.member.last_to_join")
	attrRejoinTook        = attribute.Key("kproxy.member.rejoin_ms")
	attrSyncWait          = attribute.Key("kproxy.member.sync_wait_ms")
	attrGaveUp            = attribute.Key("kproxy.member.revoked_partitions")
	attrGaveUpTopics      = attribute.Key("kproxy.member.revoked_topics")
	attrLastMember        = attribute.Key("kproxy.rebalance.last_member.id")
	attrLastClient        = attribute.Key("kproxy.rebalance.last_member.client.id")
	attrInitialDelay      = attribute.Key("kproxy.rebalance.initial_delay_ms")
	attrInitialWaited     = attribute.Key("kproxy.rebalance.initial_delay_waited_ms")
	attrHeartbeatInterval = attribute.Key("kproxy.group.heartbeat_interval_ms")
	attrSupersededBy      = attribute.Key("kproxy.rebalance.superseded_by.cause")
	attrUntraced          = attribute.Key("kproxy.rebalance.members_without_span")
)

// Rebalance outcomes, on the root span and the duration histogram.
const (
	outcomeCompleted  = "completed"
	outcomeAborted    = "aborted"
	outcomeEmpty      = "group_empty"
	outcomeDeleted    = "group_deleted"
	outcomeSuperseded = "superseded"
	outcomeShutdown   = "shutdown"
	outcomeUnloaded   = "unloaded"
	outcomeConverted  = "converted"
)

// Member events that arrive outside a rebalance are kept this long (and at
// most pendingMax per group), so that a rebalance they trigger right after
// can carry them.
const (
	pendingAge = 5 * time.Second
	pendingMax = 16
)

// maxMemberSpans bounds the reconcile_member spans of one rebalance.
const maxMemberSpans = 256

// Classic group states as the engine names them in Event.State.
const (
	statePreparing = "PreparingRebalance"
	stateEmpty     = "Empty"
)

// rebalanceTracker turns engine events into one trace per rebalance. It is
// owned by the tap goroutine: no method may be called from elsewhere.
type rebalanceTracker struct {
	tracer  trace.Tracer
	inst    *instruments
	open    map[string]*rebalance         // group -> rebalance in progress
	pending map[string][]groupstate.Event // group -> recent member events outside a rebalance
	// given is each classic group's assignment of its last completed
	// sync, member -> topic -> partitions, to tell what a member gave
	// up in the next one. Dropped when the group empties, is deleted,
	// converted or unloaded.
	given   map[string]map[string]map[string][]int32
	handled int    // events seen, to sweep pending now and then
	owner   string // this kproxy's id, on every root span; immutable
}

// rebalance is the trace state of one rebalance in progress.
type rebalance struct {
	ctx       context.Context // carries the root span
	root      trace.Span
	phase     trace.Span // the join, sync or reconcile child span
	phaseCtx  context.Context
	phaseName string
	phaseAt   time.Time // when the phase span started
	start     time.Time
	cause     string
	kind      string // groupstate.GroupTypeClassic, GroupTypeConsumer or GroupTypeShare

	// held are member events that arrived during this rebalance and are
	// not yet attached: the next event of the group says whether they
	// belong here or caused the rebalance that supersedes this one.
	held []groupstate.Event
	// supersededAt is set when the engine aborted this rebalance to
	// start another (a classic group's EventRebalanceAborted whose state
	// is PreparingRebalance): the next EventRebalanceStarted supersedes
	// it.
	supersededAt time.Time
	// prev is the rebalance this one superseded, still open until this
	// one proves to be more than the group emptying at the instant it
	// started (then prev ends group_empty and this one is dropped);
	// prevEnd is when prev was superseded, moved the member events this
	// one took from prev.
	prev    *rebalance
	prevEnd time.Time
	moved   []groupstate.Event
	// extra counts events this rebalance received besides moved ones.
	extra int
	// members are the KIP-848 members' reconcile_member spans, by
	// member id.
	members map[string]*memberSpan
	// untraced counts the members left without a span past
	// maxMemberSpans.
	untraced int
	// initialDelay is the initial rebalance delay's child span, open
	// until the join phase ends or the delay is over.
	initialDelay trace.Span
}

// memberSpan is one KIP-848 member's reconciliation within a rebalance.
type memberSpan struct {
	span  trace.Span // nil once the member holds its target
	state string     // the member's last reported state
}

// newRebalanceTracker returns a tracker creating spans with tracer.
func newRebalanceTracker(tracer trace.Tracer, inst *instruments, owner string) *rebalanceTracker {
	return &rebalanceTracker{
		owner:   owner,
		tracer:  tracer,
		inst:    inst,
		open:    map[string]*rebalance{},
		pending: map[string][]groupstate.Event{},
		given:   map[string]map[string]map[string][]int32{},
	}
}

// isMemberEvent reports whether kind is about one member joining or
// leaving the group.
func isMemberEvent(kind groupstate.EventKind) bool {
	switch kind {
	case groupstate.EventMemberJoined, groupstate.EventMemberLeft,
		groupstate.EventMemberExpired, groupstate.EventMemberFenced:
		return true
	}
	return false
}

// handle updates the traces for one event.
func (rt *rebalanceTracker) handle(ev groupstate.Event) {
	rt.handled++
	if rt.handled%1024 == 0 {
		rt.sweep(ev.Time)
	}
	rb := rt.open[ev.Group]
	if rb != nil && rb.prev != nil {
		if rt.collapse(rb, ev) {
			return
		}
	}
	if rb != nil && !isMemberEvent(ev.Kind) && !supersedes(ev) {
		rt.attachHeld(rb)
	}
	switch ev.Kind {
	case groupstate.EventRebalanceStarted:
		if rb == nil {
			rt.start(ev, nil)
			return
		}
		// The group went back to PreparingRebalance (classic) or its
		// epoch was bumped again (KIP-848) before this rebalance
		// finished: the new one links to it and takes the member
		// events that caused it. This one ends as superseded once the
		// new one is known to be real (see collapse).
		end := rb.supersededAt
		if end.IsZero() {
			end = ev.Time
		}
		held := rb.held
		rb.held = nil
		rt.pending[ev.Group] = append(rt.pending[ev.Group], held...)
		nrb := rt.start(ev, []trace.Link{{SpanContext: rb.root.SpanContext()}})
		nrb.prev, nrb.prevEnd, nrb.moved = rb, end, held
	case groupstate.EventMemberJoined, groupstate.EventMemberLeft,
		groupstate.EventMemberExpired, groupstate.EventMemberFenced:
		if rb != nil {
			rb.held = append(rb.held, ev)
			rb.extra++
			return
		}
		p := append(rt.pending[ev.Group], ev)
		if len(p) > pendingMax {
			p = p[len(p)-pendingMax:]
		}
		rt.pending[ev.Group] = p
	case groupstate.EventJoinCompleted:
		if rb == nil {
			return
		}
		rb.extra++
		rt.joinCompleted(rb, ev)
	case groupstate.EventSyncCompleted:
		now := map[string]map[string][]int32{}
		for i := range ev.Members {
			if tps, err := decodeAssignment(ev.ProtocolType, ev.Members[i].Assignment); err == nil && tps != nil {
				byTopic := map[string][]int32{}
				for _, tp := range tps {
					byTopic[tp.Topic] = tp.Partitions
				}
				now[ev.Members[i].MemberID] = byTopic
			}
		}
		if rb == nil {
			rt.given[ev.Group] = now
			return
		}
		if rb.phase != nil {
			for i := range ev.Members {
				m := &ev.Members[i]
				if at := m.SyncedAt; !at.IsZero() && !at.Before(rb.phaseAt) && !at.After(ev.Time) {
					// When the member's SyncGroup arrived: the leader's
					// is the one the group waited for.
					attrs := append(memberAttrs(m), attrSyncWait.Int64(at.Sub(rb.phaseAt).Milliseconds()))
					rb.phase.AddEvent("sync_received", trace.WithTimestamp(at), trace.WithAttributes(attrs...))
				}
				attrs := memberAttrs(m)
				attrs = append(attrs, assignmentAttrs(ev.ProtocolType, m.Assignment)...)
				attrs = append(attrs, rt.gaveUp(ev.Group, m.MemberID, now[m.MemberID])...)
				rb.phase.AddEvent("assignment", trace.WithTimestamp(ev.Time), trace.WithAttributes(attrs...))
			}
		}
		rt.given[ev.Group] = now
		rt.finish(ev.Group, rb, ev.Time, outcomeCompleted, "")
	case groupstate.EventMemberReconciling:
		if rb == nil || ev.Member == nil {
			return
		}
		rb.extra++
		rt.memberReconciling(rb, ev)
	case groupstate.EventAssignmentReconciled:
		// A KIP-848 group has no join or sync round: its rebalance ends
		// when every member holds its target at the new group epoch. A
		// share group's ends when the target for the new epoch is
		// computed.
		if rb == nil {
			return
		}
		rb.root.SetAttributes(
			attrEpoch.Int64(int64(ev.Generation)),
			attrMemberCount.Int(len(ev.Members)),
		)
		if ev.Protocol != "" {
			rb.root.SetAttributes(attrAssignor.String(ev.Protocol))
		}
		if rb.phase != nil {
			rb.phase.SetAttributes(attrMemberCount.Int(len(ev.Members)))
			for i := range ev.Members {
				m := &ev.Members[i]
				attrs := memberAttrs(m)
				attrs = append(attrs, assignmentAttrs("consumer", m.Assignment)...)
				rb.phase.AddEvent("assignment", trace.WithTimestamp(ev.Time), trace.WithAttributes(attrs...))
			}
		}
		rt.finish(ev.Group, rb, ev.Time, outcomeCompleted, "")
	case groupstate.EventRebalanceAborted:
		if rb == nil {
			return
		}
		switch ev.State {
		case statePreparing:
			// A classic group aborts a rebalance to start the next
			// one: EventRebalanceStarted follows.
			rb.supersededAt = ev.Time
			rb.root.SetAttributes(attrSupersededBy.String(causeOrUnknown(ev.Cause)))
		case stateEmpty:
			// No member rejoined: the group is empty.
			rt.finish(ev.Group, rb, ev.Time, outcomeEmpty, "")
		default:
			rt.finish(ev.Group, rb, ev.Time, outcomeAborted, "rebalance aborted: "+causeOrUnknown(ev.Cause))
		}
	case groupstate.EventGroupEmpty:
		if rb != nil {
			rt.finish(ev.Group, rb, ev.Time, outcomeEmpty, "")
		}
		delete(rt.pending, ev.Group)
		delete(rt.given, ev.Group)
	case groupstate.EventGroupDeleted:
		if rb != nil {
			rt.finish(ev.Group, rb, ev.Time, outcomeDeleted, "group deleted during the rebalance")
		}
		delete(rt.pending, ev.Group)
		delete(rt.given, ev.Group)
	case groupstate.EventGroupConverted:
		// The group changed protocol online (KIP-848's upgrade or
		// downgrade path): a rebalance under the old protocol ends here;
		// the group's next one is traced under the new protocol with the
		// conversion as its cause.
		if rb != nil {
			rt.finish(ev.Group, rb, ev.Time, outcomeConverted, "group converted: "+causeOrUnknown(ev.Cause))
		}
		rt.pending[ev.Group] = append(rt.pending[ev.Group], ev)
		delete(rt.given, ev.Group)
	case groupstate.EventGroupUnloaded:
		// The group moved to another kproxy of the fleet (or its state
		// was dropped after a failed write): this one's trace ends, the
		// new owner's engine carries on from the stored state.
		if rb != nil {
			rt.finish(ev.Group, rb, ev.Time, outcomeUnloaded, "group unloaded during the rebalance: "+causeOrUnknown(ev.Cause))
		}
		delete(rt.pending, ev.Group)
		delete(rt.given, ev.Group)
	}
}

// supersedes reports whether ev starts a rebalance that replaces the one
// in progress, so that its held member events move to the new one.
func supersedes(ev groupstate.Event) bool {
	switch ev.Kind {
	case groupstate.EventRebalanceStarted:
		return true
	case groupstate.EventRebalanceAborted:
		return ev.State == statePreparing
	}
	return false
}

// collapse settles a rebalance that superseded another (rb.prev) on the
// first event after its start. When the group empties at the instant rb
// started and nothing else happened in rb, rb was only the engine's
// bookkeeping on the way to Empty: rb's spans are dropped unended (the SDK
// exports ended spans only), and prev ends with outcome group_empty,
// keeping its member events. Otherwise prev ends as superseded. It
// reports whether ev was consumed.
func (rt *rebalanceTracker) collapse(rb *rebalance, ev groupstate.Event) bool {
	prev := rb.prev
	rb.prev = nil
	emptied := ev.Kind == groupstate.EventGroupEmpty ||
		(ev.Kind == groupstate.EventRebalanceAborted && ev.State == stateEmpty)
	if emptied && ev.Time.Equal(rb.start) && rb.extra == 0 {
		prev.held = append(prev.held, rb.moved...)
		rt.attachHeld(prev)
		rt.open[ev.Group] = prev
		rt.finish(ev.Group, prev, ev.Time, outcomeEmpty, "")
		if ev.Kind == groupstate.EventGroupEmpty {
			delete(rt.pending, ev.Group)
		}
		return true
	}
	rt.endSuperseded(prev, rb.prevEnd)
	return false
}

// endSuperseded ends prev, which a newer rebalance replaced at at.
func (rt *rebalanceTracker) endSuperseded(prev *rebalance, at time.Time) {
	rt.attachHeld(prev)
	rt.end(prev, at, outcomeSuperseded, "")
}

// attachHeld adds rb's held member events to its root span.
func (rt *rebalanceTracker) attachHeld(rb *rebalance) {
	for _, h := range rb.held {
		rb.root.AddEvent(h.Kind.String(), trace.WithTimestamp(h.Time), trace.WithAttributes(memberEventAttrs(h)...))
	}
	rb.held = nil
}

// settle attaches every held event and ends every superseded rebalance
// still waiting for its successor's first event: before a flush or at
// shutdown, when no further event may come soon.
func (rt *rebalanceTracker) settle() {
	for _, rb := range rt.open {
		if rb.prev != nil {
			rt.endSuperseded(rb.prev, rb.prevEnd)
			rb.prev = nil
		}
		rt.attachHeld(rb)
	}
}

// joinCompleted ends a classic rebalance's join phase and opens its sync
// phase. Each member's "member" event is stamped when its JoinGroup
// arrived, so the member the group waited for stands out.
func (rt *rebalanceTracker) joinCompleted(rb *rebalance, ev groupstate.Event) {
	rb.root.SetAttributes(
		attrGeneration.Int64(int64(ev.Generation)),
		attrProtocol.String(ev.Protocol),
		attrLeader.String(ev.Leader),
		attrMemberCount.Int(len(ev.Members)),
	)
	if ev.ProtocolType != "" {
		rb.root.SetAttributes(attrProtocolType.String(ev.ProtocolType))
	}
	if rb.phase != nil {
		rb.phase.SetAttributes(attrMemberCount.Int(len(ev.Members)), attrGeneration.Int64(int64(ev.Generation)))
		last := -1
		for i := range ev.Members {
			at := ev.Members[i].JoinedAt
			if !at.IsZero() && !at.Before(rb.start) && !at.After(ev.Time) &&
				(last < 0 || at.After(ev.Members[last].JoinedAt)) {
				last = i
			}
		}
		// Events go out in time order, each within the span: the
		// JoinGroup that started the rebalance arrived just before it.
		type stamped struct {
			name  string
			at    time.Time
			attrs []attribute.KeyValue
		}
		var evs []stamped
		for i := range ev.Members {
			m := &ev.Members[i]
			attrs := append(memberAttrs(m), attrIsLeader.Bool(m.MemberID == ev.Leader))
			at := ev.Time
			if j := m.JoinedAt; !j.IsZero() && !j.After(ev.Time) {
				at = j
				if j.Before(rb.start) {
					at = rb.start
				}
				attrs = append(attrs, attrJoinWait.Int64(at.Sub(rb.start).Milliseconds()))
			}
			if i == last {
				attrs = append(attrs, attrLastToJoin.Bool(true))
			}
			if a := m.AskedAt; !a.IsZero() && !a.Before(rb.start) && !a.After(at) {
				// The member was told to rejoin at a and took the rest:
				// a long rejoin_ms is a slow poll loop or revocation, a
				// late rejoin_requested a slow heartbeat.
				evs = append(evs, stamped{"rejoin_requested", a, memberAttrs(m)})
				attrs = append(attrs, attrRejoinTook.Int64(at.Sub(a).Milliseconds()))
			}
			evs = append(evs, stamped{"member", at, attrs})
		}
		slices.SortStableFunc(evs, func(a, b stamped) int { return a.at.Compare(b.at) })
		for _, e := range evs {
			rb.phase.AddEvent(e.name, trace.WithTimestamp(e.at), trace.WithAttributes(e.attrs...))
		}
		if last >= 0 {
			rb.phase.SetAttributes(attrLastMember.String(ev.Members[last].MemberID))
			if c := ev.Members[last].ClientID; c != "" {
				rb.phase.SetAttributes(attrLastClient.String(c))
			}
		}
		rt.endInitialDelay(rb, ev.Time)
		rb.phase.End(trace.WithTimestamp(ev.Time))
		rt.inst.recordPhase(rb.phaseName, ev.Time.Sub(rb.phaseAt))
	}
	rb.phaseAt = ev.Time
	rb.phaseCtx, rb.phase = rt.tracer.Start(rb.ctx, spanSync,
		trace.WithTimestamp(ev.Time),
		trace.WithAttributes(
			semconv.MessagingSystemKafka,
			semconv.MessagingConsumerGroupName(ev.Group),
			semconv.MessagingOperationName("sync_group"),
			attrGeneration.Int64(int64(ev.Generation)),
		))
	rb.phaseName = spanSync
}

// memberReconciling records one KIP-848 member's step: asked to revoke,
// done revoking, waiting for partitions others still hold, or holding
// its target. Each member has its own child span of the reconcile span,
// from the start of the rebalance until it holds its target.
func (rt *rebalanceTracker) memberReconciling(rb *rebalance, ev groupstate.Event) {
	m := ev.Member
	ms := rb.members[m.MemberID]
	if ms == nil && len(rb.members) >= maxMemberSpans {
		// A very large group: the SDK's span queue (2048 by default)
		// would drop spans. The rest of the members show only in the
		// reconcile span's final "assignment" events.
		rb.untraced++
		if rb.phase != nil {
			rb.phase.SetAttributes(attrUntraced.Int(rb.untraced))
		}
		return
	}
	if ms == nil {
		parent := rb.phaseCtx
		if parent == nil {
			parent = rb.ctx
		}
		attrs := append(memberAttrs(m), semconv.MessagingConsumerGroupName(ev.Group))
		_, sp := rt.tracer.Start(parent, spanMember,
			trace.WithTimestamp(rb.start),
			trace.WithAttributes(attrs...))
		ms = &memberSpan{span: sp}
		if rb.members == nil {
			rb.members = map[string]*memberSpan{}
		}
		rb.members[m.MemberID] = ms
	}
	wasRevoking := ms.state == "UNREVOKED_PARTITIONS"
	ms.state = m.State
	attrs := []attribute.KeyValue{attrMemberEpoch.Int64(int64(m.Epoch)), attrMemberState.String(m.State)}
	var name string
	switch {
	case len(m.Revoking) > 0:
		name = "revoke_requested"
		if tps, err := decodeAssignment("consumer", m.Revoking); err == nil {
			n, topics := countParts(tps)
			attrs = append(attrs, attrRevoking.Int(n), attrRevokingTopics.String(topics))
		}
	case m.State == "UNRELEASED_PARTITIONS":
		name = "waiting_for_partitions"
	default:
		name = "assigned"
	}
	if wasRevoking && len(m.Revoking) == 0 {
		if ms.span != nil {
			ms.span.AddEvent("revoked", trace.WithTimestamp(ev.Time), trace.WithAttributes(attrMemberEpoch.Int64(int64(m.Epoch))))
		}
	}
	attrs = append(attrs, assignmentAttrs("consumer", m.Assignment)...)
	target := ms.span
	if target == nil {
		target = rb.phase
	}
	if target != nil {
		target.AddEvent(name, trace.WithTimestamp(ev.Time), trace.WithAttributes(attrs...))
	}
	if m.State == "STABLE" && ms.span != nil {
		ms.span.SetAttributes(attrMemberEpoch.Int64(int64(m.Epoch)))
		ms.span.End(trace.WithTimestamp(ev.Time))
		ms.span = nil
	}
}

// gaveUp describes the partitions member held after the group's previous
// sync and does not hold in now: what the rebalance took from it.
func (rt *rebalanceTracker) gaveUp(group, member string, now map[string][]int32) []attribute.KeyValue {
	before := rt.given[group][member]
	n := 0
	var topics []string
	for topic, parts := range before {
		lost := 0
		for _, p := range parts {
			if !slices.Contains(now[topic], p) {
				lost++
			}
		}
		if lost > 0 {
			n += lost
			topics = append(topics, topic)
		}
	}
	if n == 0 {
		return nil
	}
	slices.Sort(topics)
	return []attribute.KeyValue{attrGaveUp.Int(n), attrGaveUpTopics.String(strings.Join(topics, ","))}
}

// countParts counts the partitions of tps and lists their topics.
func countParts(tps []TopicPartitions) (int, string) {
	n := 0
	topics := make([]string, 0, len(tps))
	for _, tp := range tps {
		n += len(tp.Partitions)
		topics = append(topics, tp.Topic)
	}
	return n, strings.Join(topics, ",")
}

// start opens the root and phase spans of a rebalance and returns it.
func (rt *rebalanceTracker) start(ev groupstate.Event, links []trace.Link) *rebalance {
	kind := ev.GroupType
	if kind == "" {
		kind = groupstate.GroupTypeClassic
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingConsumerGroupName(ev.Group),
		semconv.MessagingOperationName("rebalance"),
		attrCause.String(causeOrUnknown(ev.Cause)),
		attrGroupKind.String(kind),
	}
	epochs := kind == groupstate.GroupTypeConsumer || kind == groupstate.GroupTypeShare
	if epochs {
		// The event carries the bumped group epoch.
		attrs = append(attrs, attrEpoch.Int64(int64(ev.Generation)), attrPrevEpoch.Int64(int64(ev.Generation)-1))
		if ev.Protocol != "" {
			attrs = append(attrs, attrAssignor.String(ev.Protocol))
		}
	} else {
		attrs = append(attrs, attrPrevGeneration.Int64(int64(ev.Generation)))
	}
	if ev.ProtocolType != "" {
		attrs = append(attrs, attrProtocolType.String(ev.ProtocolType))
	}
	if rt.owner != "" {
		attrs = append(attrs, attrOwner.String(rt.owner))
	}
	if ev.InitialDelay > 0 {
		attrs = append(attrs, attrInitialDelay.Int64(ev.InitialDelay.Milliseconds()))
	}
	if m := ev.Member; m != nil {
		attrs = append(attrs, attrCauseMember.String(m.MemberID))
		if m.ClientID != "" {
			attrs = append(attrs, attrCauseClient.String(m.ClientID))
		}
		if m.ClientHost != "" {
			attrs = append(attrs, attrCauseHost.String(m.ClientHost))
		}
		if m.InstanceID != "" {
			attrs = append(attrs, attrCauseInstance.String(m.InstanceID))
		}
	}
	// Member events just before the rebalance usually caused it; the
	// root starts at the earliest of them so the trace shows them.
	startAt := ev.Time
	var early []groupstate.Event
	for _, p := range rt.pending[ev.Group] {
		if !p.Time.After(ev.Time) && ev.Time.Sub(p.Time) <= pendingAge {
			early = append(early, p)
			if p.Time.Before(startAt) {
				startAt = p.Time
			}
		}
	}
	delete(rt.pending, ev.Group)

	ctx, root := rt.tracer.Start(context.Background(), spanRebalance,
		trace.WithNewRoot(),
		trace.WithTimestamp(startAt),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...),
		trace.WithLinks(links...))
	for _, p := range early {
		root.AddEvent(p.Kind.String(), trace.WithTimestamp(p.Time), trace.WithAttributes(memberEventAttrs(p)...))
	}
	rb := &rebalance{
		ctx:   ctx,
		root:  root,
		start: ev.Time,
		cause: ev.Cause,
		kind:  kind,
	}
	phaseAttrs := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingConsumerGroupName(ev.Group),
	}
	switch kind {
	case groupstate.GroupTypeConsumer:
		rb.phaseName = spanReconcile
		phaseAttrs = append(phaseAttrs, attrEpoch.Int64(int64(ev.Generation)))
		if ev.HeartbeatInterval > 0 {
			// Members learn of their new target at their heartbeats:
			// a reconciliation of one interval or two is members
			// waiting for theirs, not kproxy.
			phaseAttrs = append(phaseAttrs, attrHeartbeatInterval.Int64(ev.HeartbeatInterval.Milliseconds()))
		}
	case groupstate.GroupTypeShare:
		rb.phaseName = spanAssign
		phaseAttrs = append(phaseAttrs, attrEpoch.Int64(int64(ev.Generation)))
	default:
		rb.phaseName = spanJoin
		phaseAttrs = append(phaseAttrs, semconv.MessagingOperationName("join_group"))
	}
	rb.phaseCtx, rb.phase = rt.tracer.Start(ctx, rb.phaseName,
		trace.WithTimestamp(ev.Time),
		trace.WithAttributes(phaseAttrs...))
	rb.phaseAt = ev.Time
	if ev.InitialDelay > 0 {
		rb.phase.SetAttributes(attrInitialDelay.Int64(ev.InitialDelay.Milliseconds()))
		_, rb.initialDelay = rt.tracer.Start(rb.phaseCtx, spanInitialDelay,
			trace.WithTimestamp(ev.Time),
			trace.WithAttributes(semconv.MessagingConsumerGroupName(ev.Group), attrInitialDelay.Int64(ev.InitialDelay.Milliseconds())))
	}
	rt.open[ev.Group] = rb
	return rb
}

// endInitialDelay ends the initial delay's span at the end of the delay,
// or at at when the join phase ends sooner.
func (rt *rebalanceTracker) endInitialDelay(rb *rebalance, at time.Time) {
	if rb.initialDelay == nil {
		return
	}
	// The delay ends when the join does: members joining during it
	// extend it (Kafka's InitialDelayedJoin), so it may have lasted
	// longer than group.initial.rebalance.delay.ms.
	rb.initialDelay.SetAttributes(attrInitialWaited.Int64(at.Sub(rb.start).Milliseconds()))
	rb.initialDelay.End(trace.WithTimestamp(at))
	rb.initialDelay = nil
}

// finish ends a rebalance's spans with its outcome, records its duration
// and forgets it.
func (rt *rebalanceTracker) finish(group string, rb *rebalance, at time.Time, outcome, errMsg string) {
	rt.attachHeld(rb)
	rt.end(rb, at, outcome, errMsg)
	if rt.open[group] == rb {
		delete(rt.open, group)
	}
}

// end ends rb's spans with its outcome and records its duration. A
// non-empty errMsg marks the spans as failed. A rebalance that ended
// because its group emptied at the instant it started waited for nothing:
// it is traced but not counted in the duration histogram.
func (rt *rebalanceTracker) end(rb *rebalance, at time.Time, outcome, errMsg string) {
	rt.endInitialDelay(rb, at)
	for _, ms := range rb.members {
		if ms.span != nil {
			ms.span.End(trace.WithTimestamp(at))
			ms.span = nil
		}
	}
	if rb.phase != nil {
		if errMsg != "" {
			rb.phase.SetStatus(codes.Error, errMsg)
		}
		rb.phase.End(trace.WithTimestamp(at))
		rb.phase = nil
		if errMsg == "" && outcome == outcomeCompleted {
			rt.inst.recordPhase(rb.phaseName, at.Sub(rb.phaseAt))
		}
	}
	rb.root.SetAttributes(attrOutcome.String(outcome))
	if outcome == outcomeEmpty {
		rb.root.SetAttributes(attrMemberCount.Int(0))
	}
	if errMsg != "" {
		rb.root.SetStatus(codes.Error, errMsg)
	} else if outcome == outcomeCompleted {
		rb.root.SetStatus(codes.Ok, "")
	}
	rb.root.End(trace.WithTimestamp(at))
	d := at.Sub(rb.start)
	if d > 0 || (d == 0 && outcome != outcomeEmpty) {
		rt.inst.recordDuration(d, rb.cause, outcome)
	}
}

// sweep forgets pending member events too old to be attached to a
// rebalance, so groups that never rebalance again hold nothing.
func (rt *rebalanceTracker) sweep(now time.Time) {
	for g, evs := range rt.pending {
		if len(evs) == 0 || now.Sub(evs[len(evs)-1].Time) > pendingAge {
			delete(rt.pending, g)
		}
	}
}

// closeAll ends every rebalance still open; used at shutdown.
func (rt *rebalanceTracker) closeAll() {
	rt.settle()
	now := time.Now()
	for g, rb := range rt.open {
		rt.finish(g, rb, now, outcomeShutdown, "kproxy shut down during the rebalance")
	}
}

// memberAttrs describes a member with semantic-convention names where
// they exist.
func memberAttrs(m *groupstate.Member) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attrMemberID.String(m.MemberID)}
	if m.ClientID != "" {
		attrs = append(attrs, semconv.MessagingClientID(m.ClientID))
	}
	if m.ClientHost != "" {
		attrs = append(attrs, semconv.ClientAddress(m.ClientHost))
	}
	if m.InstanceID != "" {
		attrs = append(attrs, attrInstanceID.String(m.InstanceID))
	}
	return attrs
}

// memberEventAttrs describes a member event (joined, left, expired,
// fenced).
func memberEventAttrs(ev groupstate.Event) []attribute.KeyValue {
	var attrs []attribute.KeyValue
	if ev.Member != nil {
		attrs = memberAttrs(ev.Member)
	}
	if ev.Cause != "" {
		attrs = append(attrs, attrReason.String(ev.Cause))
	}
	return attrs
}

// assignmentAttrs summarises a member's assignment: its size and, for the
// consumer protocol, the partitions it was given.
func assignmentAttrs(protocolType string, assignment []byte) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attrAssignmentSize.Int(len(assignment))}
	tps, err := decodeAssignment(protocolType, assignment)
	if err != nil || tps == nil {
		return attrs
	}
	n := 0
	topics := make([]string, 0, len(tps))
	for _, tp := range tps {
		n += len(tp.Partitions)
		topics = append(topics, tp.Topic)
	}
	return append(attrs, attrPartitions.Int(n), attrTopics.String(strings.Join(topics, ",")))
}
