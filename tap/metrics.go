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
	attrPhase        = attribute.Key("kproxy.rebalance.phase")
	attrState        = attribute.Key("kproxy.group.state")
	attrKind         = attribute.Key("kproxy.event.kind")
	attrExpireReason = attribute.Key("kproxy.member.expire_reason")
	attrGroupKind    = attribute.Key("kproxy.group.kind")
	attrAckType      = attribute.Key("kproxy.share.ack_type")
)

// ackTypeNames name groupstate.ShareCounters.Acknowledged's indexes
// (KIP-932's acknowledgement types; renew is KIP-1222's).
var ackTypeNames = [5]string{"gap", "accept", "release", "reject", "renew"}

// instruments are tap's metric instruments. Immutable after
// newInstruments; the instruments themselves are safe for concurrent use.
type instruments struct {
	rebalances  metric.Int64Counter
	ended       metric.Int64Counter
	duration    metric.Float64Histogram
	phase       metric.Float64Histogram
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
	if in.ended, err = m.Int64Counter("kproxy.rebalances.ended",
		metric.WithDescription("Rebalances ended, by cause and outcome (completed, superseded, group_empty, ...)."),
		metric.WithUnit("{rebalance}")); err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.rebalances.ended: %w", err)
	}
	if in.duration, err = m.Float64Histogram("kproxy.rebalance.duration",
		metric.WithDescription("Time from the start of a rebalance to its end (Stable, aborted or empty), by cause and outcome."),
		metric.WithUnit("s")); err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.rebalance.duration: %w", err)
	}
	if in.phase, err = m.Float64Histogram("kproxy.rebalance.phase.duration",
		metric.WithDescription("Time a rebalance spent in one phase (join, sync, reconcile, assign); the last phase of a rebalance that did not complete is left out."),
		metric.WithUnit("s")); err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.rebalance.phase.duration: %w", err)
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

	sh, err := newShareInstruments(m)
	if err != nil {
		return nil, err
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
		if ss, ok := src.(ShareSource); ok {
			sh.observe(o, ss)
		}
		return nil
	}, append([]metric.Observable{groups, members, generation, forwarded, dropped, subDropped}, sh.all()...)...)
	if err != nil {
		return nil, fmt.Errorf("tap: registering gauge callback: %w", err)
	}
	return &in, nil
}

// shareInstruments are the share groups' (KIP-932) observable
// instruments, read from a ShareSource at collection time. Immutable
// after newShareInstruments.
type shareInstruments struct {
	acquired, redelivered, acked, lockTimeouts, archived, writes metric.Int64ObservableCounter
	writeTime                                                    metric.Float64ObservableCounter
	partitions, locked, available                                metric.Int64ObservableGauge
}

// newShareInstruments creates the share-group instruments on m.
func newShareInstruments(m metric.Meter) (*shareInstruments, error) {
	var sh shareInstruments
	counters := []struct {
		dst        *metric.Int64ObservableCounter
		name, desc string
		unit       string
	}{
		{&sh.acquired, "kproxy.share.records.acquired", "Share-group records acquired by a member (each delivery).", "{record}"},
		{&sh.redelivered, "kproxy.share.records.redelivered", "Share-group records acquired again (delivery count above 1); also in kproxy.share.records.acquired.", "{record}"},
		{&sh.acked, "kproxy.share.records.acknowledged", "Share-group records acknowledged, by type (gap, accept, release, reject, renew).", "{record}"},
		{&sh.lockTimeouts, "kproxy.share.records.lock_timeouts", "Share-group records released because their acquisition lock timed out.", "{record}"},
		{&sh.archived, "kproxy.share.records.archived_at_limit", "Share-group records archived because they were delivered share.delivery.count.limit times.", "{record}"},
		{&sh.writes, "kproxy.share.state.writes", "Share-group state records written to the groups topic.", "{write}"},
	}
	for _, c := range counters {
		v, err := m.Int64ObservableCounter(c.name, metric.WithDescription(c.desc), metric.WithUnit(c.unit))
		if err != nil {
			return nil, fmt.Errorf("tap: instrument %s: %w", c.name, err)
		}
		*c.dst = v
	}
	var err error
	if sh.writeTime, err = m.Float64ObservableCounter("kproxy.share.state.write.time",
		metric.WithDescription("Time spent writing share-group state records."),
		metric.WithUnit("s")); err != nil {
		return nil, fmt.Errorf("tap: instrument kproxy.share.state.write.time: %w", err)
	}
	gauges := []struct {
		dst        *metric.Int64ObservableGauge
		name, desc string
		unit       string
	}{
		{&sh.partitions, "kproxy.share.partitions", "Share-partitions of each share group (those its members fetched).", "{partition}"},
		{&sh.locked, "kproxy.share.records.locked", "Records of each share group acquired by a member and not yet acknowledged (in flight, under an acquisition lock).", "{record}"},
		{&sh.available, "kproxy.share.records.available", "Records of each share group's in-flight window waiting to be delivered (again).", "{record}"},
	}
	for _, g := range gauges {
		v, err := m.Int64ObservableGauge(g.name, metric.WithDescription(g.desc), metric.WithUnit(g.unit))
		if err != nil {
			return nil, fmt.Errorf("tap: instrument %s: %w", g.name, err)
		}
		*g.dst = v
	}
	return &sh, nil
}

// all lists the instruments for RegisterCallback.
func (sh *shareInstruments) all() []metric.Observable {
	return []metric.Observable{sh.acquired, sh.redelivered, sh.acked, sh.lockTimeouts, sh.archived, sh.writes,
		sh.writeTime, sh.partitions, sh.locked, sh.available}
}

// observe records src's share-group figures.
func (sh *shareInstruments) observe(o metric.Observer, src ShareSource) {
	c := src.ShareCounters()
	o.ObserveInt64(sh.acquired, c.Acquired)
	o.ObserveInt64(sh.redelivered, c.Redeliveries)
	for i, n := range c.Acknowledged {
		o.ObserveInt64(sh.acked, n, metric.WithAttributes(attrAckType.String(ackTypeNames[i])))
	}
	o.ObserveInt64(sh.lockTimeouts, c.LockTimeouts)
	o.ObserveInt64(sh.archived, c.ArchivedAtLimit)
	o.ObserveInt64(sh.writes, c.Writes)
	o.ObserveFloat64(sh.writeTime, c.WriteTime.Seconds())
	for _, g := range src.ShareGroupStats() {
		group := metric.WithAttributes(semconv.MessagingConsumerGroupName(g.Group))
		o.ObserveInt64(sh.partitions, int64(g.Partitions), group)
		o.ObserveInt64(sh.locked, g.Acquired, group)
		o.ObserveInt64(sh.available, g.Available, group)
	}
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
	attrs := metric.WithAttributes(attrCause.String(causeOrUnknown(cause)), attrOutcome.String(outcome))
	in.duration.Record(context.Background(), d.Seconds(), attrs)
	in.ended.Add(context.Background(), 1, attrs)
}

// recordPhase records how long a rebalance spent in phase.
func (in *instruments) recordPhase(phase string, d time.Duration) {
	if d < 0 {
		return
	}
	in.phase.Record(context.Background(), d.Seconds(), metric.WithAttributes(attrPhase.String(phase)))
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
