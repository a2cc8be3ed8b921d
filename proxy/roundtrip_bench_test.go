//go:build unix

package proxy

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// BenchmarkForwardRoundTrip is one small fetch at a time through one
// session to a broker whose per-request path costs almost nothing, so
// that the time per op is mostly the proxy's (and the loopback's): each
// request finds the session waiting between frames, holding no buffer.
// processCPU returns this process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkForwardRoundTrip(b *testing.B) {
	for _, size := range []int{100, 64 << 10} {
		b.Run(fmt.Sprintf("response=%d", size), func(b *testing.B) {
			up := startFakeUpstream(b)
			up.answer(codec.KeyFetch, 11, fetchResp(size))
			p := startProxy(b, []string{up.addr}, func(cfg *Config) { cfg.MetadataInterval = time.Hour })
			rc := dialRaw(b, p.Addr())
			frame := kmsg.NewRequestFormatter().AppendRequest(nil, fetchReq(11), 1)
			if err := rc.roundTrip(frame, 1); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				if err := rc.roundTrip(frame, 1); err != nil {
					b.Fatal(err)
				}
			}
			// CPU time (client, proxy and broker together) varies less
			// than wall time on a shared machine.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
