package tap

import (
	"context"
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
	spanJoin = "join"
	spanSync = "sync"

	attrGeneration     = attribute.Key("kproxy.group.generation")
	attrPrevGeneration = attribute.Key("kproxy.group.previous_generation")
	attrProtocolType   = attribute.Key("kproxy.group.protocol_type")
	attrProtocol       = attribute.Key("kproxy.group.protocol")
	attrLeader         = attribute.Key("kproxy.group.leader")
	attrMemberCount    = attribute.Key("kproxy.group.member_count")
	attrMemberID       = attribute.Key("kproxy.member.id")
	attrInstanceID     = attribute.Key("kproxy.member.instance_id")
	attrIsLeader       = attribute.Key("kproxy.member.leader")
	attrCauseMember    = attribute.Key("kproxy.rebalance.cause.member.id")
	attrCauseClient    = attribute.Key("kproxy.rebalance.cause.client.id")
	attrCauseHost      = attribute.Key("kproxy.rebalance.cause.client.address")
	attrCauseInstance  = attribute.Key("kproxy.rebalance.cause.instance_id")
	attrReason         = attribute.Key("kproxy.member.reason")
	attrPartitions     = attribute.Key("kproxy.member.assigned_partitions")
	attrTopics         = attribute.Key("kproxy.member.assigned_topics")
	attrAssignmentSize = attribute.Key("kproxy.member.assignment_bytes")
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

// rebalanceTracker turns engine events into one trace per rebalance. It is
// owned by the tap goroutine: no method may be called from elsewhere.
type rebalanceTracker struct {
	tracer  trace.Tracer
	inst    *instruments
	open    map[string]*rebalance         // group -> rebalance in progress
	pending map[string][]groupstate.Event // group -> recent member events outside a rebalance
	handled int                           // events seen, to sweep pending now and then
	owner   string                        // this kproxy's id, on every root span; immutable
}

// rebalance is the trace state of one rebalance in progress.
type rebalance struct {
	ctx       context.Context // carries the root span
	root      trace.Span
	phase     trace.Span // the join or sync child span
	phaseName string
	start     time.Time
	cause     string
}

// newRebalanceTracker returns a tracker creating spans with tracer.
func newRebalanceTracker(tracer trace.Tracer, inst *instruments, owner string) *rebalanceTracker {
	return &rebalanceTracker{
		owner:   owner,
		tracer:  tracer,
		inst:    inst,
		open:    map[string]*rebalance{},
		pending: map[string][]groupstate.Event{},
	}
}

// handle updates the traces for one event.
func (rt *rebalanceTracker) handle(ev groupstate.Event) {
	rt.handled++
	if rt.handled%1024 == 0 {
		rt.sweep(ev.Time)
	}
	rb := rt.open[ev.Group]
	switch ev.Kind {
	case groupstate.EventRebalanceStarted:
		var links []trace.Link
		if rb != nil {
			// The group went back to PreparingRebalance before the
			// previous rebalance finished: end it and link the new one.
			links = append(links, trace.Link{SpanContext: rb.root.SpanContext()})
			rt.finish(ev.Group, rb, ev.Time, outcomeSuperseded, "")
		}
		rt.start(ev, links)
	case groupstate.EventMemberJoined, groupstate.EventMemberLeft,
		groupstate.EventMemberExpired, groupstate.EventMemberFenced:
		if rb != nil {
			rb.root.AddEvent(ev.Kind.String(), trace.WithTimestamp(ev.Time), trace.WithAttributes(memberEventAttrs(ev)...))
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
			for i := range ev.Members {
				m := &ev.Members[i]
				attrs := append(memberAttrs(m), attrIsLeader.Bool(m.MemberID == ev.Leader))
				rb.phase.AddEvent("member", trace.WithTimestamp(ev.Time), trace.WithAttributes(attrs...))
			}
			rb.phase.End(trace.WithTimestamp(ev.Time))
		}
		_, rb.phase = rt.tracer.Start(rb.ctx, spanSync,
			trace.WithTimestamp(ev.Time),
			trace.WithAttributes(
				semconv.MessagingSystemKafka,
				semconv.MessagingConsumerGroupName(ev.Group),
				semconv.MessagingOperationName("sync_group"),
				attrGeneration.Int64(int64(ev.Generation)),
			))
		rb.phaseName = spanSync
	case groupstate.EventSyncCompleted:
		if rb == nil {
			return
		}
		if rb.phase != nil {
			for i := range ev.Members {
				m := &ev.Members[i]
				attrs := memberAttrs(m)
				attrs = append(attrs, assignmentAttrs(ev.ProtocolType, m.Assignment)...)
				rb.phase.AddEvent("assignment", trace.WithTimestamp(ev.Time), trace.WithAttributes(attrs...))
			}
		}
		rt.finish(ev.Group, rb, ev.Time, outcomeCompleted, "")
	case groupstate.EventAssignmentReconciled:
		// A KIP-848 group has no join or sync round: its rebalance ends
		// when every member holds its target at the new group epoch.
		if rb == nil {
			return
		}
		rb.root.SetAttributes(
			attrGeneration.Int64(int64(ev.Generation)),
			attrProtocol.String(ev.Protocol),
			attrMemberCount.Int(len(ev.Members)),
		)
		if rb.phase != nil {
			for i := range ev.Members {
				m := &ev.Members[i]
				attrs := memberAttrs(m)
				attrs = append(attrs, assignmentAttrs("consumer", m.Assignment)...)
				rb.phase.AddEvent("assignment", trace.WithTimestamp(ev.Time), trace.WithAttributes(attrs...))
			}
		}
		rt.finish(ev.Group, rb, ev.Time, outcomeCompleted, "")
	case groupstate.EventRebalanceAborted:
		if rb != nil {
			rt.finish(ev.Group, rb, ev.Time, outcomeAborted, "rebalance aborted: "+causeOrUnknown(ev.Cause))
		}
	case groupstate.EventGroupEmpty:
		if rb != nil {
			rt.finish(ev.Group, rb, ev.Time, outcomeEmpty, "group became empty during the rebalance")
		}
		delete(rt.pending, ev.Group)
	case groupstate.EventGroupDeleted:
		if rb != nil {
			rt.finish(ev.Group, rb, ev.Time, outcomeDeleted, "group deleted during the rebalance")
		}
		delete(rt.pending, ev.Group)
	case groupstate.EventGroupConverted:
		// The group changed protocol online (KIP-848's upgrade or
		// downgrade path): a rebalance under the old protocol ends here;
		// the group's next one is traced under the new protocol with the
		// conversion as its cause.
		if rb != nil {
			rt.finish(ev.Group, rb, ev.Time, outcomeConverted, "group converted: "+causeOrUnknown(ev.Cause))
		}
		rt.pending[ev.Group] = append(rt.pending[ev.Group], ev)
	case groupstate.EventGroupUnloaded:
		// The group moved to another kproxy of the fleet (or its state
		// was dropped after a failed write): this one's trace ends, the
		// new owner's engine carries on from the stored state.
		if rb != nil {
			rt.finish(ev.Group, rb, ev.Time, outcomeUnloaded, "group unloaded during the rebalance: "+causeOrUnknown(ev.Cause))
		}
		delete(rt.pending, ev.Group)
	}
}

// start opens the root and join spans of a rebalance.
func (rt *rebalanceTracker) start(ev groupstate.Event, links []trace.Link) {
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingConsumerGroupName(ev.Group),
		semconv.MessagingOperationName("rebalance"),
		attrCause.String(causeOrUnknown(ev.Cause)),
		attrPrevGeneration.Int64(int64(ev.Generation)),
	}
	if ev.ProtocolType != "" {
		attrs = append(attrs, attrProtocolType.String(ev.ProtocolType))
	}
	if rt.owner != "" {
		attrs = append(attrs, attrOwner.String(rt.owner))
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

	ctx, root := rt.tracer.Start(context.Background(), "rebalance "+ev.Group,
		trace.WithNewRoot(),
		trace.WithTimestamp(startAt),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...),
		trace.WithLinks(links...))
	for _, p := range early {
		root.AddEvent(p.Kind.String(), trace.WithTimestamp(p.Time), trace.WithAttributes(memberEventAttrs(p)...))
	}
	_, join := rt.tracer.Start(ctx, spanJoin,
		trace.WithTimestamp(ev.Time),
		trace.WithAttributes(
			semconv.MessagingSystemKafka,
			semconv.MessagingConsumerGroupName(ev.Group),
			semconv.MessagingOperationName("join_group"),
		))
	rt.open[ev.Group] = &rebalance{
		ctx:       ctx,
		root:      root,
		phase:     join,
		phaseName: spanJoin,
		start:     ev.Time,
		cause:     ev.Cause,
	}
}

// finish ends a rebalance's spans with its outcome and records its
// duration. A non-empty errMsg marks the spans as failed.
func (rt *rebalanceTracker) finish(group string, rb *rebalance, at time.Time, outcome, errMsg string) {
	if rb.phase != nil {
		if errMsg != "" {
			rb.phase.SetStatus(codes.Error, errMsg)
		}
		rb.phase.End(trace.WithTimestamp(at))
	}
	rb.root.SetAttributes(attrOutcome.String(outcome))
	if errMsg != "" {
		rb.root.SetStatus(codes.Error, errMsg)
	} else if outcome == outcomeCompleted {
		rb.root.SetStatus(codes.Ok, "")
	}
	rb.root.End(trace.WithTimestamp(at))
	if d := at.Sub(rb.start); d >= 0 {
		rt.inst.recordDuration(d, rb.cause, outcome)
	}
	delete(rt.open, group)
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
