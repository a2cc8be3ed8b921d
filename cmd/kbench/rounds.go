package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// roundFigures are one path's figures in one round (one slice).
type roundFigures struct {
	MBps float64 `json:"mb_per_s"`
	// ProxyCPUPerGB is the CPU of the process behind the path (kproxy,
	// the relay, the peer) per GB; 0 on the direct path.
	ProxyCPUPerGB float64 `json:"proxy_cpu_s_per_gb"`
	// MachineCPUPerGB is every CPU's busy time (softirq included, from
	// /proc/stat) per GB: clients, broker, the proxy, the kernel's
	// network work, and whatever else runs on the machine.
	MachineCPUPerGB float64 `json:"machine_cpu_s_per_gb"`
	// SyscallsPerGB and SwitchesPerGB are the read/write system calls
	// and the context switches of the process behind the path per GB
	// (syscalls.go); 0 on the direct path.
	SyscallsPerGB float64 `json:"proc_syscalls_per_gb"`
	SwitchesPerGB float64 `json:"proc_ctx_switches_per_gb"`
}

func (s sample) round() roundFigures {
	gb := float64(s.payload) / 1e9
	r := roundFigures{MBps: mbps(s.payload, s.elapsed)}
	if gb > 0 {
		r.ProxyCPUPerGB = s.proxyCPU.Seconds() / gb
		r.MachineCPUPerGB = s.machCPU.Seconds() / gb
		r.SyscallsPerGB = float64(s.proc.syscalls) / gb
		r.SwitchesPerGB = float64(s.proc.switches) / gb
	}
	return r
}

// spread is the median and range of per-round figures.
type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{Median: m, Min: s[0], Max: s[len(s)-1]}
}

func (s spread) String() string {
	if s == (spread{}) {
		return "-"
	}
	return fmt.Sprintf("%.2f [%.2f-%.2f]", s.Median, s.Min, s.Max)
}

// pathSpread is one path's per-round figures, summarized.
type pathSpread struct {
	Path    string `json:"path"`
	MBps    spread `json:"mb_per_s"`
	ToDir   spread `json:"ratio_to_direct"`
	ToRelay spread `json:"ratio_to_relay,omitzero"`
	// ProxyCPU is the CPU s/GB of the process behind the path.
	ProxyCPU spread `json:"proxy_cpu_s_per_gb"`
	// MachineCPU is the machine's CPU s/GB; HopCPU that minus the direct
	// path's in the same round: what the hop costs the machine, kernel
	// included.
	MachineCPU spread `json:"machine_cpu_s_per_gb"`
	HopCPU     spread `json:"hop_cpu_s_per_gb"`
	// Syscalls and Switches are the process's read/write syscalls and
	// context switches per GB, in thousands.
	Syscalls spread `json:"proc_kilo_syscalls_per_gb"`
	Switches spread `json:"proc_kilo_ctx_switches_per_gb"`
}

// spreads summarizes the per-round figures of m's paths, ratios taken
// round by round against the direct path and the relay.
func (m *modeResult) spreads() {
	var dir, rel []roundFigures
	for _, p := range m.Paths {
		switch p.Path {
		case "direct":
			dir = p.Rounds
		case pathRelay:
			rel = p.Rounds
		}
	}
	m.Spreads = nil
	for _, p := range m.Paths {
		ps := pathSpread{Path: p.Path}
		var mb, toDir, toRel, pc, mc, hop, sc, sw []float64
		for i, r := range p.Rounds {
			mb = append(mb, r.MBps)
			mc = append(mc, r.MachineCPUPerGB)
			if p.Path != "direct" {
				pc = append(pc, r.ProxyCPUPerGB)
				sc = append(sc, r.SyscallsPerGB/1e3)
				sw = append(sw, r.SwitchesPerGB/1e3)
			}
			if i < len(dir) && p.Path != "direct" {
				if dir[i].MBps > 0 {
					toDir = append(toDir, r.MBps/dir[i].MBps)
				}
				hop = append(hop, r.MachineCPUPerGB-dir[i].MachineCPUPerGB)
			}
			if i < len(rel) && p.Path != pathRelay && p.Path != "direct" && rel[i].MBps > 0 {
				toRel = append(toRel, r.MBps/rel[i].MBps)
			}
		}
		ps.MBps, ps.ToDir, ps.ToRelay = spreadOf(mb), spreadOf(toDir), spreadOf(toRel)
		ps.ProxyCPU, ps.MachineCPU, ps.HopCPU = spreadOf(pc), spreadOf(mc), spreadOf(hop)
		ps.Syscalls, ps.Switches = spreadOf(sc), spreadOf(sw)
		m.Spreads = append(m.Spreads, ps)
	}
}

// printSpreads writes the per-round table of every mode.
func printSpreads(w io.Writer, modes []modeResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tpath\tMB/s\t/direct\t/relay\tproc CPU s/GB\tmachine CPU s/GB\thop CPU s/GB\tproc k-syscalls/GB\tproc k-ctxsw/GB\t")
	for _, m := range modes {
		for _, p := range m.Spreads {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", m.Mode, p.Path, p.MBps, p.ToDir, p.ToRelay, p.ProxyCPU, p.MachineCPU, p.HopCPU, p.Syscalls, p.Switches)
		}
	}
	tw.Flush()
	fmt.Fprintln(w, `Per round, median [min-max]. /direct, /relay: MB/s over that path's in the same
round. proc CPU: the process behind the path (/proc/PID/stat). machine CPU: every
CPU's user+nice+system+irq+softirq (/proc/stat), load generator and broker
included; hop CPU: machine CPU minus the direct path's in the same round.
proc k-syscalls: the process's read/write syscalls (/proc/PID/io syscr+syscw;
splice is not counted), k-ctxsw: its threads' context switches, thousands per GB.`)
}
