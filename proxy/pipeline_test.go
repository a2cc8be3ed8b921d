package proxy

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// TestPipelineBeyondInFlight: a client that writes more small requests
// at once than Config.MaxInFlight gets every answer. The reader, blocked
// on a full queue, must first send upstream the requests it buffered,
// whose responses the writer is waiting for.
func TestPipelineBeyondInFlight(t *testing.T) {
	up := startFakeUpstream(t)
	up.answer(codec.KeyFetch, 11, fetchResp(100))
	p := startProxy(t, []string{up.addr}, func(cfg *Config) {
		cfg.MetadataInterval = time.Hour
		cfg.MaxInFlight = 8
	})
	rc := dialRaw(t, p.Addr())
	f := kmsg.NewRequestFormatter()
	var frames []byte
	const n = 500
	for i := range n {
		frames = append(frames, f.AppendRequest(nil, fetchReq(11), int32(i))...)
	}
	if err := rc.roundTrip(frames, n); err != nil {
		t.Fatalf("%d pipelined fetches with at most 8 in flight: %v", n, err)
	}
}
