package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func newTestCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func apiVersions(t *testing.T, c *kfake.Cluster) *kmsg.ApiVersionsResponse {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DisableClientMetrics())
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName, req.ClientSoftwareVersion = "kproxy-test", "0"
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("ApiVersions: %v", err)
	}
	if resp.ErrorCode != 0 {
		t.Fatalf("ApiVersions error code %d", resp.ErrorCode)
	}
	return resp
}

// TestDevClusterOffersNoClientTelemetry: the dev cluster's ApiVersions
// answer is kfake's default one without the two KIP-714 keys, with the
// same versions of every other key and the same features; with
// --client-telemetry it is kfake's default answer.
func TestDevClusterOffersNoClientTelemetry(t *testing.T) {
	def := apiVersions(t, newTestCluster(t))
	telemetryKeys := map[int16]bool{int16(kmsg.GetTelemetrySubscriptions): true, int16(kmsg.PushTelemetry): true}
	for _, k := range def.ApiKeys {
		delete(telemetryKeys, k.ApiKey)
	}
	if len(telemetryKeys) != 0 {
		t.Fatalf("kfake's default answer lacks telemetry keys %v: this workaround may no longer be needed", telemetryKeys)
	}

	for _, on := range []bool{false, true} {
		got := apiVersions(t, newTestCluster(t, devTelemetryOpts(on)...))
		want := map[int16]kmsg.ApiVersionsResponseApiKey{}
		for _, k := range def.ApiKeys {
			if !on && (k.ApiKey == int16(kmsg.GetTelemetrySubscriptions) || k.ApiKey == int16(kmsg.PushTelemetry)) {
				continue
			}
			want[k.ApiKey] = k
		}
		if len(got.ApiKeys) != len(want) {
			t.Errorf("client-telemetry=%v: %d keys, want %d", on, len(got.ApiKeys), len(want))
		}
		for _, k := range got.ApiKeys {
			w, ok := want[k.ApiKey]
			if !ok {
				t.Errorf("client-telemetry=%v: key %d (%s) advertised, want it absent", on, k.ApiKey, kmsg.NameForKey(k.ApiKey))
				continue
			}
			if k.MinVersion != w.MinVersion || k.MaxVersion != w.MaxVersion {
				t.Errorf("client-telemetry=%v: %s versions %d..%d, kfake's default %d..%d", on, kmsg.NameForKey(k.ApiKey), k.MinVersion, k.MaxVersion, w.MinVersion, w.MaxVersion)
			}
		}
		if !sameFeatures(got, def) {
			t.Errorf("client-telemetry=%v: features %+v %+v, kfake's default %+v %+v", on, got.SupportedFeatures, got.FinalizedFeatures, def.SupportedFeatures, def.FinalizedFeatures)
		}
	}
}

func sameFeatures(a, b *kmsg.ApiVersionsResponse) bool {
	if len(a.SupportedFeatures) != len(b.SupportedFeatures) || len(a.FinalizedFeatures) != len(b.FinalizedFeatures) {
		return false
	}
	sup := map[string][2]int16{}
	for _, f := range b.SupportedFeatures {
		sup[f.Name] = [2]int16{f.MinVersion, f.MaxVersion}
	}
	for _, f := range a.SupportedFeatures {
		if v, ok := sup[f.Name]; !ok || v != [2]int16{f.MinVersion, f.MaxVersion} {
			return false
		}
	}
	fin := map[string][2]int16{}
	for _, f := range b.FinalizedFeatures {
		fin[f.Name] = [2]int16{f.MinVersionLevel, f.MaxVersionLevel}
	}
	for _, f := range a.FinalizedFeatures {
		if v, ok := fin[f.Name]; !ok || v != [2]int16{f.MinVersionLevel, f.MaxVersionLevel} {
			return false
		}
	}
	return true
}

// keyRecorder records the request keys a client writes.
type keyRecorder struct {
	mu   sync.Mutex // guards keys
	keys map[int16]int
}

func (r *keyRecorder) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	r.mu.Lock()
	r.keys[key]++
	r.mu.Unlock()
}

func (r *keyRecorder) count(key kmsg.Key) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.keys[int16(key)]
}

// telemetryRequests runs a franz-go producer with default options
// against c (kgo starts its KIP-714 loop on the first produce or fetch
// connection), produces a record every 50ms for up to d, and returns how
// many GetTelemetrySubscriptions requests it wrote.
func telemetryRequests(t *testing.T, c *kfake.Cluster, d time.Duration) int {
	t.Helper()
	rec := &keyRecorder{keys: map[int16]int{}}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.WithHooks(rec),
		kgo.DefaultProduceTopic("telemetry-test"))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cl.Close()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && rec.count(kmsg.GetTelemetrySubscriptions) == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr()
		cancel()
		if err != nil {
			t.Fatalf("produce: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return rec.count(kmsg.GetTelemetrySubscriptions)
}

// TestDevClusterClientsDoNotPushTelemetry: a default franz-go client
// subscribes to telemetry at once on kfake's default cluster (so the
// check below can fail), and never on the dev cluster.
func TestDevClusterClientsDoNotPushTelemetry(t *testing.T) {
	if n := telemetryRequests(t, newTestCluster(t, append(devTelemetryOpts(true), kfake.SeedTopics(1, "telemetry-test"))...), 5*time.Second); n == 0 {
		t.Fatal("with client telemetry on, the client sent no GetTelemetrySubscriptions within 5s")
	}
	if n := telemetryRequests(t, newTestCluster(t, append(devTelemetryOpts(false), kfake.SeedTopics(1, "telemetry-test"))...), 2*time.Second); n != 0 {
		t.Fatalf("dev cluster: the client sent %d GetTelemetrySubscriptions, want 0", n)
	}
}
