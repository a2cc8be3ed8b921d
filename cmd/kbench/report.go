package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// results is the outcome of a whole run, printed as a table and as JSON.
type results struct {
	RecordSize  int           `json:"record_size"`
	Conns       int           `json:"conns"`
	Partitions  int           `json:"partitions"`
	Rounds      int           `json:"rounds"`
	DurationSec float64       `json:"duration_s"`
	LatencyRate int           `json:"latency_rate_per_s"`
	CPUs        int           `json:"cpus"`
	GoVersion   string        `json:"go_version"`
	LoadStart   string        `json:"loadavg_start"`
	LoadEnd     string        `json:"loadavg_end"`
	Modes       []modeResult  `json:"modes"`
	Pinned      bool          `json:"pinned"`               // --pin: kproxy on its own CPU
	PinSpin     bool          `json:"pin_spin,omitempty"`   // --pin-spin: idle spinners kept both CPUs awake
	Groups      *groupsResult `json:"groups,omitempty"`     // --mode groups
	ManyConns   *connsResult  `json:"many_conns,omitempty"` // the conns mode (conns.go)
}

// modeResult holds one mode's paths and the proxy/direct ratios.
type modeResult struct {
	Mode  string       `json:"mode"`
	Paths []pathResult `json:"paths"`
	// Ratio is proxy MB/s over direct MB/s.
	Ratio float64 `json:"throughput_ratio"`
	// AddedP50Ms and AddedP99Ms are proxy minus direct latency at the
	// fixed moderate rate.
	AddedP50Ms float64 `json:"added_p50_ms"`
	AddedP99Ms float64 `json:"added_p99_ms"`
	// OpenLoop is the --rate latency run (rate.go).
	OpenLoop *openLoopResult `json:"open_loop,omitempty"`
	// TLSRatio is proxy-tls MB/s over proxy MB/s with --tls.
	TLSRatio float64 `json:"tls_over_plaintext_ratio,omitempty"`
	// Spreads are the per-round medians and ranges (rounds.go).
	Spreads []pathSpread `json:"per_round"`
}

// pathResult is one path (direct or proxy) of one mode.
type pathResult struct {
	Path        string  `json:"path"`
	MBps        float64 `json:"mb_per_s"`
	PayloadGB   float64 `json:"payload_gb"`
	WireGB      float64 `json:"wire_gb"`
	Seconds     float64 `json:"seconds"`
	ClientErrs  int64   `json:"client_errors"`
	ProxyCPUSec float64 `json:"kproxy_cpu_s"`
	// ProxyCPUPerGB is kproxy CPU seconds per GB of record payload
	// moved; zero on the direct path.
	ProxyCPUPerGB float64 `json:"kproxy_cpu_s_per_gb"`
	// BenchCPUPerGB is kbench's own CPU (clients and broker) per GB.
	BenchCPUPerGB float64 `json:"bench_cpu_s_per_gb"`
	// MachineCPUPerGB is the whole machine's busy CPU per GB (rounds.go).
	MachineCPUPerGB float64        `json:"machine_cpu_s_per_gb"`
	Rounds          []roundFigures `json:"rounds"`
	// Latency at the fixed moderate rate, one request at a time.
	LatN     int     `json:"lat_n"`
	LatP50Ms float64 `json:"lat_p50_ms"`
	LatP99Ms float64 `json:"lat_p99_ms"`
	// Latency of the same requests under full load (queueing included).
	LoadedLatN     int     `json:"loaded_lat_n"`
	LoadedLatP50Ms float64 `json:"loaded_lat_p50_ms"`
	LoadedLatP99Ms float64 `json:"loaded_lat_p99_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func pathResultFrom(name string, s *sample, lat []time.Duration) pathResult {
	gb := float64(s.payload) / 1e9
	r := pathResult{
		Path:        name,
		MBps:        mbps(s.payload, s.elapsed),
		PayloadGB:   gb,
		WireGB:      float64(s.wire) / 1e9,
		Seconds:     s.elapsed.Seconds(),
		ClientErrs:  s.errs,
		ProxyCPUSec: s.proxyCPU.Seconds(),
	}
	if gb > 0 {
		r.ProxyCPUPerGB = s.proxyCPU.Seconds() / gb
		r.BenchCPUPerGB = s.selfCPU.Seconds() / gb
		r.MachineCPUPerGB = s.machCPU.Seconds() / gb
	}
	r.Rounds = s.rounds
	l := sortedCopy(lat)
	r.LatN, r.LatP50Ms, r.LatP99Ms = len(l), ms(percentile(l, 0.50)), ms(percentile(l, 0.99))
	ll := sortedCopy(s.lats)
	r.LoadedLatN, r.LoadedLatP50Ms, r.LoadedLatP99Ms = len(ll), ms(percentile(ll, 0.50)), ms(percentile(ll, 0.99))
	return r
}

func (m *modeResult) ratios() {
	var d, p *pathResult
	for i := range m.Paths {
		switch m.Paths[i].Path {
		case "direct":
			d = &m.Paths[i]
		case "proxy":
			p = &m.Paths[i]
		}
	}
	m.spreads()
	if d == nil || p == nil {
		return
	}
	for _, t := range m.Paths {
		if t.Path == pathTLS && p.MBps > 0 {
			m.TLSRatio = t.MBps / p.MBps
		}
	}
	if d.MBps > 0 {
		m.Ratio = p.MBps / d.MBps
	}
	m.AddedP50Ms = p.LatP50Ms - d.LatP50Ms
	m.AddedP99Ms = p.LatP99Ms - d.LatP99Ms
}

// print writes the human-readable table.
func (r *results) print(w io.Writer) {
	fmt.Fprintf(w, "kbench: %d B records, %d conn(s), %d partitions, %d rounds, %.0fs measured per path per mode; latency at %d req/s one at a time\n",
		r.RecordSize, r.Conns, r.Partitions, r.Rounds, r.DurationSec, r.LatencyRate)
	fmt.Fprintf(w, "machine: %d CPUs, %s, load average %s at start, %s at end\n\n", r.CPUs, r.GoVersion, r.LoadStart, r.LoadEnd)
	if r.ManyConns != nil {
		r.ManyConns.print(w)
		fmt.Fprintln(w)
		if len(r.Modes) == 0 {
			return
		}
	}
	r.printExtra(w) // pinning, groups (groups.go)
	if len(r.Modes) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tpath\tMB/s\tp50 ms\tp99 ms\tloaded p50 ms\tloaded p99 ms\tkproxy CPU s/GB\tbench CPU s/GB\terrors\t")
	for _, m := range r.Modes {
		for _, p := range m.Paths {
			cpu := "-"
			if p.Path != "direct" {
				cpu = fmt.Sprintf("%.3f", p.ProxyCPUPerGB)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.3f\t%.3f\t%.2f\t%.2f\t%s\t%.2f\t%d\t\n",
				m.Mode, p.Path, p.MBps, p.LatP50Ms, p.LatP99Ms, p.LoadedLatP50Ms, p.LoadedLatP99Ms, cpu, p.BenchCPUPerGB, p.ClientErrs)
		}
		fmt.Fprintf(tw, "%s\tproxy/direct\t%.2fx\t%+.3f\t%+.3f\t\t\t\t\t\t\n", m.Mode, m.Ratio, m.AddedP50Ms, m.AddedP99Ms)
		if m.TLSRatio > 0 {
			fmt.Fprintf(tw, "%s\ttls/plaintext\t%.2fx\t\t\t\t\t\t\t\t\n", m.Mode, m.TLSRatio)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	printSpreads(w, r.Modes)
	fmt.Fprintln(w)
	fmt.Fprintln(w, strings.TrimSpace(`
MB/s: record value bytes (1e6) per second at full load. p50/p99: end-to-end
request latency (kgo HookBrokerE2E) at the fixed rate; "loaded" is the same
under full load. CPU s/GB: CPU seconds per 1e9 payload bytes moved, kproxy
from /proc/PID/stat (10 ms ticks), bench = this process (clients + broker).`))
	for _, m := range r.Modes {
		verdict := func(ok bool) string {
			if ok {
				return "ok"
			}
			return "MISSED"
		}
		var cpu float64 = math.NaN()
		for _, p := range m.Paths {
			if p.Path == "proxy" {
				cpu = p.ProxyCPUPerGB
			}
		}
		fmt.Fprintf(w, "goals %s: ratio %.2fx >= 0.85 %s; kproxy %.3f CPU s/GB < 0.5 %s; p99 added %+.3f ms < 0.2 %s\n",
			m.Mode, m.Ratio, verdict(m.Ratio >= 0.85), cpu, verdict(cpu < 0.5), m.AddedP99Ms, verdict(m.AddedP99Ms < 0.2))
	}
	for _, m := range r.Modes {
		m.OpenLoop.print(w, m.Mode)
	}
}
