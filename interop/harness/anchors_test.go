package main

import (
	"testing"
	"time"
)

// Output of Kafka 4.1.1's kafka-consumer-groups, for a group kproxy serves
// (the anchor, a static member) and one the cluster serves.
const (
	describeOffsetsOut = `
GROUP           TOPIC           PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG             CONSUMER-ID                             HOST            CLIENT-ID
g1              t1              0          100             100             0               m1-07f2f5a6-2aa9-432e-ae63-e6635e5da90d /127.0.0.1      m1
g1              t1              1          -               7               -               -                                       -               -`
	describeMembersAnchorOut = `
GROUP           CONSUMER-ID                                        GROUP-INSTANCE-ID HOST            CLIENT-ID       #PARTITIONS
g2              kproxy-anchor-196c01f0-b907-4556-8286-8ee8f6a22a73 kproxy-anchor     /127.0.0.1      kproxy          0`
	describeMembersOut = `
GROUP           CONSUMER-ID                             HOST            CLIENT-ID       #PARTITIONS
g1              m1-07f2f5a6-2aa9-432e-ae63-e6635e5da90d /127.0.0.1      m1              1`
	describeStateOut = `
GROUP           COORDINATOR (ID)          ASSIGNMENT-STRATEGY  STATE                #MEMBERS
g1              127.0.0.1:39092  (1)      range                Stable               1`
)

func TestParseDescribeOffsets(t *testing.T) {
	rows, err := parseDescribeOffsets(describeOffsetsOut, "g1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("got %d rows, want 2: %+v", len(rows), rows)
	}
	if r := rows[0]; r.topic != "t1" || r.partition != 0 || r.current != 100 || r.end != 100 || r.lag != 0 || r.cliID != "m1" {
		t.Errorf("row 0: %+v", r)
	}
	if r := rows[1]; r.partition != 1 || r.current != -1 || r.end != 7 || r.lag != -1 || r.cliID != "-" {
		t.Errorf("row 1: %+v", r)
	}
	if rows, _ := parseDescribeOffsets(describeOffsetsOut, "other"); len(rows) != 0 {
		t.Errorf("rows of another group: %+v", rows)
	}
}

func TestParseDescribeMembers(t *testing.T) {
	ms, err := parseDescribeMembers(describeMembersAnchorOut, "g2")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].instance != "kproxy-anchor" || ms[0].cliID != "kproxy" || ms[0].partitions != 0 {
		t.Errorf("anchor: %+v", ms)
	}
	ms, err = parseDescribeMembers(describeMembersOut, "g1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].instance != "" || ms[0].cliID != "m1" || ms[0].partitions != 1 {
		t.Errorf("dynamic member: %+v", ms)
	}
}

func TestParseDescribeState(t *testing.T) {
	state, n, err := parseDescribeState(describeStateOut, "g1")
	if err != nil || state != "Stable" || n != 1 {
		t.Errorf("got %q %d %v", state, n, err)
	}
	if _, _, err := parseDescribeState("Consumer group 'g1' has no active members.", "g1"); err == nil {
		t.Error("no state line: want an error")
	}
}

func TestFirstOwning(t *testing.T) {
	at := time.UnixMilli(1000)
	gen := int64(4)
	m := &member{events: []event{
		{TS: 1100, Ev: "assigned", Generation: &gen, Partitions: nil},
		{TS: 1350, Ev: "assigned", Generation: &gen, Partitions: []int32{5}},
		{TS: 6000, Ev: "assigned", Generation: &gen, Partitions: []int32{4, 5}},
	}}
	if d, ok := firstOwning(m, at); !ok || d != 350*time.Millisecond {
		t.Fatalf("first owning: %v %v, want 350ms", d, ok)
	}
	if _, ok := firstOwning(&member{events: m.events[:1]}, at); ok {
		t.Fatal("a member given nothing owns nothing")
	}
}
