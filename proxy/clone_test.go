package proxy

import (
	"bytes"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// A request decoded from a buffer the proxy reuses keeps its bytes in a
// clone once the buffer is overwritten.
func TestCloneRequestOutlivesTheBuffer(t *testing.T) {
	buf := []byte("range-metadata")
	want := bytes.Clone(buf)
	req := kmsg.NewPtrJoinGroupRequest()
	req.SetVersion(5)
	req.Group = "g"
	req.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: buf}}

	c, ok := CloneRequest(req).(*kmsg.JoinGroupRequest)
	if !ok {
		t.Fatalf("clone is %T, want *kmsg.JoinGroupRequest", c)
	}
	copy(buf, "XXXXXXXXXXXXXX")
	if c.GetVersion() != 5 || c.Group != "g" || len(c.Protocols) != 1 {
		t.Fatalf("clone = v%d %q %d protocols, want v5 \"g\" 1", c.GetVersion(), c.Group, len(c.Protocols))
	}
	if got := c.Protocols[0].Metadata; !bytes.Equal(got, want) {
		t.Fatalf("clone metadata = %q after the buffer was reused, want %q", got, want)
	}
}
