package main

import (
	"strings"
	"testing"
	"time"
)

// vp returns a consumer whose events are evs, folded as the reader
// goroutine folds them.
func vp(v *verifRun, name string, evs ...verifEvent) *verifProc {
	p := &verifProc{name: name, owned: map[int32]bool{}, exited: true}
	for _, e := range evs {
		v.observeLocked(p, e)
	}
	v.procs = append(v.procs, p)
	return p
}

func assigned(ts int64, parts ...int32) verifEvent {
	return verifEvent{Timestamp: ts, Name: "partitions_assigned", Partitions: tps(parts...)}
}

func revoked(ts int64, parts ...int32) verifEvent {
	return verifEvent{Timestamp: ts, Name: "partitions_revoked", Partitions: tps(parts...)}
}

func committed(ts int64, ok bool, po ...int64) verifEvent {
	e := verifEvent{Timestamp: ts, Name: "offsets_committed", Success: &ok}
	for i := 0; i+1 < len(po); i += 2 {
		e.Offsets = append(e.Offsets, verifPart{Partition: int32(po[i]), Offset: po[i+1]})
	}
	return e
}

func tps(parts ...int32) []verifPart {
	var out []verifPart
	for _, p := range parts {
		out = append(out, verifPart{Topic: "t", Partition: p})
	}
	return out
}

func TestVerifOwnership(t *testing.T) {
	tests := []struct {
		name string
		// build adds the consumers; kill, when > 0, is when c1 was SIGKILLed (ms).
		build func(v *verifRun)
		kill  int64
		want  string // substring of the first problem; "" = none
	}{
		{name: "cooperative hand-over", build: func(v *verifRun) {
			vp(v, "c1", assigned(100, 0, 1), revoked(200, 1), committed(150, true, 0, 5, 1, 7), revoked(900, 0))
			vp(v, "c2", assigned(250, 1), committed(300, true, 1, 9), revoked(900, 1))
		}},
		{name: "assigned before the other revoked", build: func(v *verifRun) {
			vp(v, "c1", assigned(100, 0, 1), revoked(300, 1), revoked(900, 0))
			vp(v, "c2", assigned(250, 1), revoked(900, 1))
		}, want: "p1 owned by c1 (100..300) and c2 (250..900) at once"},
		{name: "killed member's partitions taken after the kill", kill: 500, build: func(v *verifRun) {
			vp(v, "c1", assigned(100, 0))
			vp(v, "c2", assigned(100, 1), assigned(12000, 0), revoked(20000, 0, 1))
		}},
		{name: "killed member's partitions taken before the kill", kill: 500, build: func(v *verifRun) {
			vp(v, "c1", assigned(100, 0))
			vp(v, "c2", assigned(100, 1), assigned(400, 0), revoked(20000, 0, 1))
		}, want: "p0 owned by c1 (100..500) and c2 (400..20000) at once"},
		{name: "commit of a partition not owned", build: func(v *verifRun) {
			vp(v, "c1", assigned(100, 0), revoked(200, 0), committed(250, true, 0, 3))
		}, want: "c1 committed p0 at 250 (offset 3) without owning it"},
		{name: "failed commit of a partition not owned is no problem", build: func(v *verifRun) {
			vp(v, "c1", assigned(100, 0), revoked(200, 0), committed(250, false, 0, 3))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := &verifRun{}
			tc.build(v)
			if tc.kill > 0 {
				v.procs[0].killedAt = time.UnixMilli(tc.kill)
			}
			got := strings.Join(v.checkOwnershipLocked(), "; ")
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("problems %q, want %q", got, tc.want)
			}
		})
	}
}

func TestVerifCommits(t *testing.T) {
	v := &verifRun{}
	vp(v, "c1", committed(100, true, 0, 10, 1, 4), committed(200, true, 0, 20), committed(250, false, 0, 5))
	vp(v, "c2", committed(300, true, 0, 15, 1, 8))
	got := strings.Join(v.checkCommitsLocked(map[int32]int64{0: 15, 1: 8}), "; ")
	if want := "p0's committed offset went backwards: 20 by c1 at 200, then 15 by c2 at 300"; got != want {
		t.Fatalf("problems %q, want %q", got, want)
	}
	got = strings.Join(v.checkCommitsLocked(map[int32]int64{0: 15, 1: 9}), "; ")
	if !strings.Contains(got, "p1's last successful commit is not its end offset 9") {
		t.Fatalf("problems %q, want p1 short of its end offset", got)
	}
}

func TestVerifConsumed(t *testing.T) {
	v := &verifRun{}
	prod := &verifProc{name: "producer"}
	for o := int64(0); o < verifRecords; o++ {
		prod.events = append(prod.events, verifEvent{Name: "producer_send_success", Partition: int32(o % 2), Offset: o / 2})
	}
	half := int64(verifRecords / 2)
	vp(v, "c1", verifEvent{Name: "records_consumed", Partitions: []verifPart{{Partition: 0, Count: half, MinOffset: 0, MaxOffset: half - 1}}})
	c2 := vp(v, "c2", verifEvent{Name: "records_consumed", Partitions: []verifPart{{Partition: 1, Count: half, MinOffset: 0, MaxOffset: half - 1}}})
	n, dups, problems := v.checkConsumedLocked(prod)
	if n != verifRecords || dups != 0 || len(problems) > 0 {
		t.Fatalf("consumed %d dups %d problems %v, want all, none, none", n, dups, problems)
	}
	// A range that claims fewer records than it spans hides a skipped one;
	// a record nobody consumed is missing.
	c2.events[0].Partitions[0] = verifPart{Partition: 1, Count: half - 2, MinOffset: 0, MaxOffset: half - 2}
	n, _, problems = v.checkConsumedLocked(prod)
	got := strings.Join(problems, "; ")
	if n != verifRecords-1 || !strings.Contains(got, "a gap") || !strings.Contains(got, "1 acknowledged records never consumed, e.g. p1@9999") {
		t.Fatalf("consumed %d problems %q, want a gap and p1@9999 missing", n, got)
	}
}

func TestDiffNormalize(t *testing.T) {
	names := diffNames{pairs: [][2]string{{"t1-cg-missing", "<group-missing>"}, {"t1-cg", "<group>"}, {"t1", "<topic>"}}}
	direct := `
GROUP           TOPIC  PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  CONSUMER-ID                                   HOST            CLIENT-ID
t1-cg           t1     1          55              55              0    m1-0b1c2d3e-1111-2222-3333-444455556666       /127.0.0.1      m1
t1-cg           t1     0          49              49              0    m1-0b1c2d3e-1111-2222-3333-444455556666       /127.0.0.1      m1

GROUP  COORDINATOR (ID)          ASSIGNMENT-STRATEGY  STATE  #MEMBERS
t1-cg  127.0.0.1:29092  (1)      range                Stable 1
Error: org.apache.kafka.common.errors.GroupNotEmptyException: The group is not empty.`
	kp := `
GROUP  TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
t1-cg  t1    0         49             49             0   AbCdEfGhIjKlMnOpQrStUv== /127.0.0.2 m1
t1-cg  t1    1         55             55             0   AbCdEfGhIjKlMnOpQrStUv== /127.0.0.2 m1

GROUP  COORDINATOR (ID)          ASSIGNMENT-STRATEGY  STATE  #MEMBERS
t1-cg  127.0.0.1:21200  (1000)      range                Stable 1
Error: org.apache.kafka.common.errors.GroupNotEmptyException: The group is not empty.`
	a, b := diffNormalize(direct, names), diffNormalize(kp, names)
	if a != b {
		t.Fatalf("normalized outputs differ:\n%s\n---\n%s", a, b)
	}
	if !strings.Contains(a, "GroupNotEmptyException: The group is not empty.") || !strings.Contains(a, "<group> <topic> 0 49 49 0 <member-id> <addr> m1") {
		t.Fatalf("normalized too much:\n%s", a)
	}
	// What is not an address, id or name stays: a different lag or
	// state is a difference.
	if diffNormalize(strings.Replace(kp, "Stable", "Empty", 1), names) == a {
		t.Fatal("a different state normalized away")
	}
	if diffNormalize(strings.Replace(kp, "55             0", "55             1", 1), names) == a {
		t.Fatal("a different lag normalized away")
	}
}

func TestListFilter(t *testing.T) {
	names := diffNames{pairs: [][2]string{{"g1-kip848", "<group-kip848>"}, {"g1", "<group>"}, {"t1", "<topic>"}}}
	out := "GROUP     STATE\nother     Stable\ng1        Empty\ng1-kip848 Stable\nt1 Stable\n(exit 0)"
	want := "GROUP STATE\n<group-kip848> Stable\n<group> Empty\n(exit 0)"
	if got := diffNormalize(listFilter(out, names), names); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
