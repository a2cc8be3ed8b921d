package proxy

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// outcome is how one relayed request ended.
type outcome uint8

const (
	outcomeOK            outcome = iota // the owner answered
	outcomeEnvelopeError                // the owner refused the envelope
	outcomeBadResponse                  // the owner's answer did not decode
	outcomeUnreachable                  // the owner could not be dialled
	outcomeCut                          // the connection failed with the request in flight
	outcomeTimeout                      // no answer within the relay timeout
	outcomeClosed                       // the router closed
	outcomeNoOwner                      // no owner appeared within WaitForOwner
	outcomeSilent                       // the connection went silent (a keepalive unanswered) with the request in flight
	outcomeOwnerDown                    // failed at once: the owner is in an unreachable episode
	outcomeMemberExpired                // answered UNKNOWN_MEMBER_ID: the owner may have expired the member (relay_members.go)
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"ok", "envelope_error", "bad_response", "unreachable", "cut", "timeout", "closed", "no_owner", "silent", "owner_down", "member_expired"}

// String returns the outcome's name as it appears in metrics and logs.
func (o outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return "unknown"
}

// relayMetrics holds the router's instruments, with the attribute options
// of every (api, outcome) pair built once. Immutable after
// newRelayMetrics; the instruments are safe for concurrent use.
type relayMetrics struct {
	requests metric.Int64Counter
	duration metric.Float64Histogram
	// unreachable counts the unreachable episodes of owners, by the
	// outcome that began each (silent, cut, unreachable).
	unreachable metric.Int64Counter
	downOpts    [numOutcomes][]metric.AddOption
	addOpts     [][numOutcomes][]metric.AddOption    // by api key
	recordOpts  [][numOutcomes][]metric.RecordOption // by api key
}

func newRelayMetrics(mp metric.MeterProvider) *relayMetrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/kproxy/kproxy/proxy")
	x := &relayMetrics{}
	// Instrument creation only fails for invalid names; a failed
	// instrument is a no-op one.
	x.requests, _ = m.Int64Counter("kproxy.relay.requests",
		metric.WithDescription("Group requests relayed to the owning kproxy (and those that found no owner), by API and outcome."))
	x.duration, _ = m.Float64Histogram("kproxy.relay.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from relaying a group request to its owner's answer or failure, by API and outcome."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	x.unreachable, _ = m.Int64Counter("kproxy.relay.peer_unreachable",
		metric.WithDescription("Episodes in which an owning kproxy's peer connection failed (silent: a keepalive went unanswered; cut; unreachable: not dialled) and relayed requests for its groups failed at once until it answered again, by the outcome that began each."))
	for o := range numOutcomes {
		x.downOpts[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o.String())))}
	}
	x.addOpts = make([][numOutcomes][]metric.AddOption, 100)
	x.recordOpts = make([][numOutcomes][]metric.RecordOption, 100)
	for k := range x.addOpts {
		name := kmsg.NameForKey(int16(k))
		for o := range numOutcomes {
			set := attribute.NewSet(attribute.String("api", name), attribute.String("outcome", o.String()))
			x.addOpts[k][o] = []metric.AddOption{metric.WithAttributeSet(set)}
			x.recordOpts[k][o] = []metric.RecordOption{metric.WithAttributeSet(set)}
		}
	}
	return x
}

func (x *relayMetrics) record(key int16, o outcome, d time.Duration) {
	if key < 0 || int(key) >= len(x.addOpts) || o >= numOutcomes {
		return
	}
	ctx := context.Background()
	x.requests.Add(ctx, 1, x.addOpts[key][o]...)
	x.duration.Record(ctx, d.Seconds(), x.recordOpts[key][o]...)
}

// peerDown counts an unreachable episode that o began.
func (x *relayMetrics) peerDown(o outcome) {
	if o >= numOutcomes {
		return
	}
	x.unreachable.Add(context.Background(), 1, x.downOpts[o]...)
}
