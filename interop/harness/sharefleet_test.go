package main

import (
	"strings"
	"testing"
)

// fleetEvents parses the lines of members m1 and m2 (m2 is the killed
// one) as the row does.
func fleetEvents(m1, m2 []string) []shareEvent {
	valueAt := map[[2]int64]string{}
	var evs []shareEvent
	for name, lines := range map[string][]string{"m1": m1, "m2": m2} {
		for _, e := range parseShareEvents(name, lines) {
			evs = append(evs, e)
			if !e.ack {
				valueAt[[2]int64{int64(e.partition), e.offset}] = e.value
			}
		}
	}
	evs = append(evs, parseShareAckErrors("m1", m1, valueAt)...)
	return append(evs, parseShareAckErrors("m2", m2, valueAt)...)
}

func TestCheckShareFleetLedger(t *testing.T) {
	values := []string{"s00001", "s00003", "s00007"}
	clean := shareLines(values)
	rep := checkShareFleetLedger(values, fleetEvents(clean, nil), nil, shareFleetSlack)
	if len(rep.violations) != 0 || len(rep.unsettled) != 0 || rep.accepted != 2 || rep.rejected != 1 || rep.redelivered != 1 || rep.beyondRule != 0 || rep.deliveries != 4 {
		t.Fatalf("clean run: %+v", rep)
	}

	// s00001 polled by the killed m2 and never acknowledged there; the
	// next owner hands it to m1 again.
	values = []string{"s00001"}
	m2 := []string{"REC 0 0 1 s00001 1000"}
	m1 := []string{"REC 0 0 2 s00001 2000", "ACK 2001 0 0 ACCEPT s00001",
		// The copy the next owner handed out before the accept,
		// polled after it: within the slack.
		"REC 0 0 3 s00001 2002"}
	rep = checkShareFleetLedger(values, fleetEvents(m1, m2), lastPoll(m2), shareFleetSlack)
	if len(rep.violations) != 0 || rep.accepted != 1 || rep.beyondRule != 1 {
		t.Fatalf("redelivered after the member's kill, one copy within the slack: %+v", rep)
	}
	// A delivery two above the accepted one, after the accept: a violation.
	rep = checkShareFleetLedger(values, fleetEvents(append(m1, "REC 0 0 4 s00001 2003"), m2), lastPoll(m2), shareFleetSlack)
	if !strings.Contains(strings.Join(rep.violations, "\n"), "after its ACCEPT of delivery 2") {
		t.Fatalf("delivery beyond the slack: violations %q", rep.violations)
	}

	for _, c := range []struct {
		name   string
		m1, m2 []string
		check  func(shareFleetReport) bool
	}{
		{name: "last delivered to the killed member", m2: []string{"REC 0 0 1 s00001 1000"},
			check: func(r shareFleetReport) bool { return r.killedLast == 1 && len(r.unsettled) == 0 }},
		// An earlier poll of the killed member: its answers were printed
		// (here another record's), so the record was never acknowledged.
		{name: "in an earlier poll of the killed member", m2: []string{"REC 0 0 1 s00001 1000", "REC 0 1 1 s00004 1000", "ACK 1001 0 1 ACCEPT s00004", "REC 0 2 1 s00005 1002"},
			check: func(r shareFleetReport) bool { return r.killedLast == 0 && len(r.unsettled) == 1 }},
		{name: "accept answered with an error (franz-go)", m1: []string{"REC 1 5 1 s00001 1000", "ERROR ack p1 5: NOT_LEADER_FOR_PARTITION"},
			check: func(r shareFleetReport) bool { return r.ambiguous == 1 && len(r.unsettled) == 0 }},
		{name: "commit threw (Java)", m1: []string{"REC 1 5 1 s00001 1000", "ERROR ack org.apache.kafka.common.errors.TimeoutException: x"},
			check: func(r shareFleetReport) bool { return r.ambiguous == 1 && len(r.unsettled) == 0 }},
		{name: "per-record error (Java)", m1: []string{"REC 1 5 1 s00001 1000", "ERROR ack my-topic-1 5 org.apache.kafka.common.errors.InvalidRecordStateException: x"},
			check: func(r shareFleetReport) bool { return r.ambiguous == 1 && len(r.unsettled) == 0 }},
		{name: "archived at the limit", m1: []string{"REC 0 0 1 s00001 1", "REC 0 0 2 s00001 2", "REC 0 0 3 s00001 3", "REC 0 0 4 s00001 4", "REC 0 0 5 s00001 5"},
			check: func(r shareFleetReport) bool { return r.archived == 1 && len(r.violations) == 0 }},
		{name: "delivered, never settled", m1: []string{"REC 0 0 1 s00001 1000"},
			check: func(r shareFleetReport) bool { return len(r.unsettled) == 1 }},
		{name: "never delivered", check: func(r shareFleetReport) bool { return len(r.unsettled) == 1 }},
		{name: "count repeated", m1: []string{"REC 0 0 1 s00001 1", "REC 0 0 1 s00001 2", "ACK 3 0 0 ACCEPT s00001"},
			check: func(r shareFleetReport) bool {
				return strings.Contains(strings.Join(r.violations, ""), "distinct counts")
			}},
		{name: "count above the limit", m1: []string{"REC 0 0 6 s00001 1", "ACK 3 0 0 ACCEPT s00001"},
			check: func(r shareFleetReport) bool {
				return strings.Contains(strings.Join(r.violations, ""), "within the limit")
			}},
		{name: "accepted twice", m1: []string{"REC 0 0 1 s00001 1", "ACK 2 0 0 ACCEPT s00001"}, m2: []string{"REC 0 0 2 s00001 1", "ACK 3 0 0 ACCEPT s00001"},
			check: func(r shareFleetReport) bool {
				return strings.Contains(strings.Join(r.violations, ""), "after ACCEPT answered OK")
			}},
		{name: "wrong final", m1: []string{"REC 0 0 1 s00001 1", "ACK 2 0 0 REJECT s00001"},
			check: func(r shareFleetReport) bool {
				return strings.Contains(strings.Join(r.violations, ""), "rule says ACCEPT")
			}},
	} {
		rep := checkShareFleetLedger(values, fleetEvents(c.m1, c.m2), lastPoll(c.m2), shareFleetSlack)
		if !c.check(rep) {
			t.Errorf("%s: %+v", c.name, rep)
		}
	}
}
