package main

import (
	"fmt"
	"strings"
	"testing"
)

// shareLines is a clean explicit-ack run of values by one member: each
// value delivered, released once when it ends in 3, then accepted, or
// rejected when it ends in 7.
func shareLines(values []string) []string {
	var out []string
	ms := int64(1000)
	for i, v := range values {
		ms += 10
		out = append(out, fmt.Sprintf("REC 0 %d 1 %s %d", i, v, ms))
		if strings.HasSuffix(v, "3") {
			out = append(out, fmt.Sprintf("ACK %d 0 %d release %s", ms+1, i, v))
			out = append(out, fmt.Sprintf("REC 0 %d 2 %s %d", i, v, ms+2))
		}
		out = append(out, fmt.Sprintf("ACK %d 0 %d %s %s", ms+3, i, shareWant(v), v))
	}
	return out
}

func TestCheckShareLedger(t *testing.T) {
	values := []string{"s00001", "s00003", "s00007"}
	rep := checkShareLedger(values, parseShareEvents("m1", shareLines(values)))
	if len(rep.violations) != 0 || rep.final != 3 || rep.accepted != 2 || rep.rejected != 1 || rep.released != 1 || rep.redelivered != 1 || rep.deliveries != 4 {
		t.Fatalf("clean run: %+v", rep)
	}
	for _, c := range []struct {
		name, want string
		extra      []string // lines of a second member
		drop       string   // a line of m1's left out
	}{
		{name: "delivered after its accept", extra: []string{"REC 0 0 2 s00001 5000"}, want: "after its ACCEPT was answered"},
		{name: "count above the limit", extra: []string{"REC 0 0 6 s00001 900"}, want: "above the limit"},
		{name: "count skipped", drop: "REC 0 1 2 s00003 1022", want: "1 records released"},
		{name: "never final", drop: "ACK 1033 0 2 REJECT s00007", want: "never accepted or rejected"},
		{name: "wrong final", extra: []string{"ACK 900 0 0 REJECT s00001"}, want: "the consumers' rule says ACCEPT"},
	} {
		var lines []string
		for _, l := range shareLines(values) {
			if l != c.drop {
				lines = append(lines, l)
			}
		}
		if c.drop != "" && len(lines) == len(shareLines(values)) {
			t.Fatalf("%s: line %q not in the run", c.name, c.drop)
		}
		evs := append(parseShareEvents("m1", lines), parseShareEvents("m2", c.extra)...)
		rep := checkShareLedger(values, evs)
		if !strings.Contains(strings.Join(rep.violations, "\n"), c.want) {
			t.Errorf("%s: violations %q lack %q", c.name, rep.violations, c.want)
		}
	}
}
