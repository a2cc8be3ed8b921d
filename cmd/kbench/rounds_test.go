package main

import (
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// user nice system idle iowait irq softirq steal
	got, err := parseProcStat("cpu  100 5 50 9000 70 3 40 11 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := 198 * time.Second / clockTicks; got != want { // 100+5+50+3+40
		t.Fatalf("busy %v, want %v", got, want)
	}
	if _, err := parseProcStat("intr 1 2 3\n"); err == nil {
		t.Fatal("no cpu line: no error")
	}
}

func TestSpreads(t *testing.T) {
	if got := spreadOf([]float64{3, 1, 2}); got != (spread{Median: 2, Min: 1, Max: 3}) {
		t.Fatalf("odd: %+v", got)
	}
	if got := spreadOf([]float64{4, 1, 2, 3}); got != (spread{Median: 2.5, Min: 1, Max: 4}) {
		t.Fatalf("even: %+v", got)
	}
	m := modeResult{Paths: []pathResult{
		{Path: "direct", Rounds: []roundFigures{{MBps: 100, MachineCPUPerGB: 1}, {MBps: 200, MachineCPUPerGB: 2}}},
		{Path: pathRelay, Rounds: []roundFigures{{MBps: 50, MachineCPUPerGB: 2}, {MBps: 100, MachineCPUPerGB: 3}}},
		{Path: "proxy", Rounds: []roundFigures{{MBps: 50, MachineCPUPerGB: 3}, {MBps: 50, MachineCPUPerGB: 3}}},
	}}
	m.spreads()
	p := m.Spreads[2]
	// Ratios are taken round by round: 0.5 and 0.25 to direct, 1 and 0.5 to the relay.
	if p.ToDir != (spread{Median: 0.375, Min: 0.25, Max: 0.5}) || p.ToRelay != (spread{Median: 0.75, Min: 0.5, Max: 1}) {
		t.Fatalf("proxy ratios: %+v", p)
	}
	if p.HopCPU != (spread{Median: 1.5, Min: 1, Max: 2}) {
		t.Fatalf("proxy hop CPU: %+v", p.HopCPU)
	}
	if r := m.Spreads[1]; r.ToRelay != (spread{}) {
		t.Fatalf("relay against itself: %+v", r.ToRelay)
	}
}
