package authz

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// BenchmarkAllowed is the cost of one decision against a set of 1,000
// literal ACLs, what each group request pays per resource it names:
// scanning them all, and through the index a Cache builds.
func BenchmarkAllowed(b *testing.B) {
	s := &Set{}
	for i := range 1000 {
		s.ACLs = append(s.ACLs, ACL{Principal: fmt.Sprintf("User:u%d", i%50), Host: "*", ResourceType: kmsg.ACLResourceTypeGroup,
			ResourceName: fmt.Sprintf("g%d", i), Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationRead, Permission: kmsg.ACLPermissionTypeAllow})
	}
	for _, c := range []struct {
		name string
		set  Set
	}{{"scan", *s}, {"indexed", s.indexed()}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !c.set.Allowed("User:u7", "10.0.0.1", kmsg.ACLResourceTypeGroup, "g507", kmsg.ACLOperationRead) {
					b.Fatal("denied")
				}
			}
		})
	}
}
