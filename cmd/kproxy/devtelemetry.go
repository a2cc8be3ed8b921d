package main

import (
	"math"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// devTelemetryOpts returns the kfake options that decide whether the
// in-memory cluster of `kproxy dev` offers KIP-714 client telemetry
// (GetTelemetrySubscriptions, PushTelemetry). With clientTelemetry
// false it does not offer them, and every other key and the feature
// table stay as kfake advertises them by default.
//
// kfake always offers telemetry and answers GetTelemetrySubscriptions
// with a 30 s push interval, the same as franz-go's default
// connection idle timeout (kgo.ConnIdleTimeout, 30 s). So each franz-go
// client's push connection is closed as idle between pushes, and the
// client dials a new one for the next push. Behind kproxy each of those
// connections is a new client session plus its upstream connection,
// with 256 KiB of socket buffers between them. Measured with 1,000 idle
// members: 15 new connections/s through kproxy. A Kafka broker
// advertises these APIs only when a client-metrics plugin is configured
// (KIP-714), and then with a default push interval of 5 minutes, so
// without them the dev cluster matches what `serve` sees from a default
// broker.
func devTelemetryOpts(clientTelemetry bool) []kfake.Opt {
	if clientTelemetry {
		return nil
	}
	return []kfake.Opt{kfake.MaxVersions(versionsWithoutTelemetry())}
}

// versionsWithoutTelemetry is a cap for kfake.MaxVersions that leaves
// every key at kfake's own maximum (kfake advertises min(cap, its max)
// and only keys it implements), except the two KIP-714 keys, which it
// removes. It starts from kversion.Stable because kfake takes its
// feature table from MaxVersions when that is set, and from Stable
// when it is not.
func versionsWithoutTelemetry() *kversion.Versions {
	vs := kversion.Stable()
	for k := int16(0); k <= kmsg.MaxKey; k++ {
		vs.SetMaxKeyVersion(k, math.MaxInt16)
	}
	vs.SetMaxKeyVersion(int16(kmsg.GetTelemetrySubscriptions), -1) // -1 removes the key
	vs.SetMaxKeyVersion(int16(kmsg.PushTelemetry), -1)
	return vs
}
