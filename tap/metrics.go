package tap

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/kproxy/kproxy/groupstate"
)

// secondsBuckets are the histogram boundaries of every histogram in
// seconds: sub-millisecond request latencies up to five-minute rebalances.
var secondsBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
	0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
}

// Attribute keys tap uses besides the semantic-convention ones.
const (
	attrCause = attribute.Key("kproxy.rebalance.cause")
	// attrOwner is the id of the kproxy whose engine ran the rebalance
	// (the group's owner in a fleet).
	attrOwner        = attribute.Key("kproxy.owner")
	attrOutcome      = attribute.Key("kproxy.rebalance.outcome")
	attrState        = attribute.Key("kproxy.group.state")
	attrKind         = attribute.Key("kproxy.event.kind")
	attrExpireReason = attribute.Key("kproxy.member.expire_reason")
	attrGroupKind    = attribute.Key("kproxy.group.kind")
)

// instruments are tap's metric instruments. Immutable after
// newInstruments; the instruments themselves are safe for concurrent use.
type instruments struct {
	rebalances  metric.Int64Counter
	duration    metric.Float64Histogram
	expirations metric.Int64Counter
	events      metric.Int64Counter
	reg         metric.Registration
}

// newInstruments creates tap's instruments on m. The observable ones read
// t's GroupSource and drop counters at collection time.
func newInstruments(m metric.Meter, t *Tap) (*instruments, error) {
	var in instruments
	var err error
	if in.rebalances, err = m.Int64Counter("kproxy.rebalances",
		metric.WithDescription("Rebalances started, by group and cause."),
		metric.WithUnit("{rebalance}")); err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.rebalances: %w", err)
	}
	if in.duration, err = m.Float64Histogram("kproxy.rebalance.duration",
		metric.WithDescription("Time from the start of a rebalance to its end (Stable, aborted or empty), by cause and outcome."),
		metric.WithUnit("s")); err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.rebalance.duration: %w", err)
	}
	if in.expirations, err = m.Int64Counter("kproxy.member.expirations",
		metric.WithDescription("Members removed because a timer expired, by reason."),
		metric.WithUnit("{member}")); err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.member.expirations: %w", err)
	}
	if in.events, err = m.Int64Counter("kproxy.group.events",
		metric.WithDescription("Engine events seen by tap, by kind."),
		metric.WithUnit("{event}")); err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.group.events: %w", err)
	}

	groups, err := m.Int64ObservableGauge("kproxy.groups",
		metric.WithDescription("Groups known to the coordinator engine, by state."),
		metric.WithUnit("{group}"))
	if err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.groups: %w", err)
	}
	members, err := m.Int64ObservableGauge("kproxy.group.members",
		metric.WithDescription("Members of each group."),
		metric.WithUnit("{member}"))
	if err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.group.members: %w", err)
	}
	generation, err := m.Int64ObservableGauge("kproxy.group.generation",
		metric.WithDescription("Current generation of each group."),
		metric.WithUnit("{generation}"))
	if err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.group.generation: %w", err)
	}
	forwarded, err := m.Int64ObservableGauge("kproxy.groups.forwarded",
		metric.WithDescription("Groups whose requests kproxy forwards to the cluster's own coordinator, by the kind of group there (classic, consumer, share, streams)."),
		metric.WithUnit("{group}"))
	if err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.groups.forwarded: %w", err)
	}
	dropped, err := m.Int64ObservableCounter("kproxy.tap.events.dropped",
		metric.WithDescription("Engine events dropped because tap's queue was full."),
		metric.WithUnit("{event}"))
	if err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.tap.events.dropped: %w", err)
	}
	subDropped, err := m.Int64ObservableCounter("kproxy.tap.subscriber.dropped",
		metric.WithDescription("Events live-stream subscribers lost because they fell behind."),
		metric.WithUnit("{event}"))
	if err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.tap.subscriber.dropped: %w", err)
	}

	in.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(dropped, t.dropped.Load())
		o.ObserveInt64(subDropped, t.hub.droppedTotal())
		byKind := map[string]int64{}
		for _, g := range t.forwardedGroups() {
			byKind[g.Kind]++
		}
		for kind, n := range byKind {
			o.ObserveInt64(forwarded, n, metric.WithAttributes(attrGroupKind.String(kindOrUnknown(kind))))
		}
		src := t.groupSource()
		if src == nil {
			return nil
		}
		byState := map[string]int64{}
		for _, g := range src.Groups() {
			byState[g.State]++
			group := metric.WithAttributes(semconv.MessagingConsumerGroupName(g.Group))
			o.ObserveInt64(members, int64(len(g.Members)), group)
			o.ObserveInt64(generation, int64(g.Generation), group)
		}
		for state, n := range byState {
			o.ObserveInt64(groups, n, metric.WithAttributes(attrState.String(state)))
		}
		return nil
	}, groups, members, generation, forwarded, dropped, subDropped)
	if err != nil {
		return nil, fmt.Errorf("tap: registering gauge callback: %w", err)
	}
	return &in, nil
}

// recordEvent counts an engine event. Called on the tap goroutine.
func (in *instruments) recordEvent(ev groupstate.Event) {
	ctx := context.Background()
	in.events.Add(ctx, 1, metric.WithAttributes(attrKind.String(ev.Kind.String())))
	switch ev.Kind {
	case groupstate.EventRebalanceStarted:
		in.rebalances.Add(ctx, 1, metric.WithAttributes(
			semconv.MessagingConsumerGroupName(ev.Group),
			attrCause.String(causeOrUnknown(ev.Cause))))
	case groupstate.EventMemberExpired:
		in.expirations.Add(ctx, 1, metric.WithAttributes(attrExpireReason.String(causeOrUnknown(ev.Cause))))
	}
}

// recordDuration records how long a finished rebalance took.
func (in *instruments) recordDuration(d time.Duration, cause, outcome string) {
	in.duration.Record(context.Background(), d.Seconds(), metric.WithAttributes(
		attrCause.String(causeOrUnknown(cause)),
		attrOutcome.String(outcome)))
}

// kindOrUnknown keeps a forwarded group of unread kind visible.
func kindOrUnknown(k string) string {
	if k == "" {
		return "unknown"
	}
	return k
}

// causeOrUnknown keeps empty causes visible as "unknown".
func causeOrUnknown(c string) string {
	if c == "" {
		return "unknown"
	}
	return c
}
