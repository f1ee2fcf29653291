package metrics

import (
	"bufio"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// counterVec is a counter family; its series are made on first use and
// looked up without a lock (sync.Map: read-mostly, a fixed set of keys).
type counterVec struct {
	name, help string
	labels     []string
	series     sync.Map // key(values) -> *counter
}

type counter struct {
	values []string
	n      atomic.Uint64
}

func newCounterVec(name, help string, labels ...string) *counterVec {
	return &counterVec{name: name, help: help, labels: labels}
}

func (c *counterVec) inc(values ...string) {
	k := key(values)
	s, ok := c.series.Load(k)
	if !ok {
		s, _ = c.series.LoadOrStore(k, &counter{values: slices.Clone(values)})
	}
	s.(*counter).n.Add(1)
}

func (c *counterVec) write(w *strings.Builder) {
	all := collect[*counter](&c.series)
	if len(c.labels) > 0 && len(all) == 0 {
		return // a family is shown once it has a series
	}
	header(w, c.name, c.help, "counter")
	if len(c.labels) == 0 {
		var n uint64
		if len(all) > 0 {
			n = all[0].n.Load()
		}
		sample(w, c.name, nil, float64(n))
		return
	}
	for _, s := range all {
		sample(w, c.name, pairs(c.labels, s.values), float64(s.n.Load()))
	}
}

// histogramVec is a histogram family with fixed upper bounds.
type histogramVec struct {
	name, help string
	labels     []string
	bounds     []float64
	series     sync.Map // key(values) -> *histogram
}

type histogram struct {
	values  []string
	buckets []atomic.Uint64 // per bound, not cumulative; the last is above every bound
	sum     atomic.Uint64   // float64 bits
}

func newHistogramVec(name, help string, bounds []float64, labels ...string) *histogramVec {
	return &histogramVec{name: name, help: help, labels: labels, bounds: bounds}
}

func (h *histogramVec) get(values []string) *histogram {
	k := key(values)
	s, ok := h.series.Load(k)
	if !ok {
		s, _ = h.series.LoadOrStore(k, &histogram{values: slices.Clone(values), buckets: make([]atomic.Uint64, len(h.bounds)+1)})
	}
	return s.(*histogram)
}

func (h *histogramVec) observe(v float64, values ...string) {
	s := h.get(values)
	s.buckets[sort.SearchFloat64s(h.bounds, v)].Add(1)
	for {
		old := s.sum.Load()
		if s.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

func (h *histogramVec) write(w *strings.Builder) {
	all := collect[*histogram](&h.series)
	if len(h.labels) == 0 && len(all) == 0 {
		all = []*histogram{h.get(nil)}
	}
	if len(all) == 0 {
		return
	}
	header(w, h.name, h.help, "histogram")
	for _, s := range all {
		base := pairs(h.labels, s.values)
		// The count is the buckets' sum as read, so the +Inf bucket and
		// the count always agree within one exposition.
		var cum uint64
		for i, b := range h.bounds {
			cum += s.buckets[i].Load()
			sample(w, h.name+"_bucket", append(slices.Clone(base), "le", formatFloat(b)), float64(cum))
		}
		cum += s.buckets[len(h.bounds)].Load()
		sample(w, h.name+"_bucket", append(slices.Clone(base), "le", "+Inf"), float64(cum))
		sample(w, h.name+"_sum", base, math.Float64frombits(s.sum.Load()))
		sample(w, h.name+"_count", base, float64(cum))
	}
}

// collect lists a family's series in the order of their label values.
func collect[T interface{ labelValues() []string }](m *sync.Map) []T {
	var all []T
	m.Range(func(_, v any) bool { all = append(all, v.(T)); return true })
	sort.Slice(all, func(i, j int) bool { return slices.Compare(all[i].labelValues(), all[j].labelValues()) < 0 })
	return all
}

func (c *counter) labelValues() []string   { return c.values }
func (h *histogram) labelValues() []string { return h.values }

func key(values []string) string {
	if len(values) == 1 {
		return values[0]
	}
	return strings.Join(values, "\xff")
}

func pairs(names, values []string) []string {
	out := make([]string, 0, 2*len(names))
	for i, n := range names {
		out = append(out, n, values[i])
	}
	return out
}

func exponentialBuckets(start, factor float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = start
		start *= factor
	}
	return out
}

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
var valueEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

func header(w *strings.Builder, name, help, kind string) {
	w.WriteString("# HELP " + name + " " + helpEscaper.Replace(help) + "\n# TYPE " + name + " " + kind + "\n")
}

// sample writes one line; labels are name, value pairs.
func sample(w *strings.Builder, name string, labels []string, v float64) {
	w.WriteString(name)
	if len(labels) > 0 {
		w.WriteByte('{')
		for i := 0; i < len(labels); i += 2 {
			if i > 0 {
				w.WriteByte(',')
			}
			w.WriteString(labels[i] + `="` + valueEscaper.Replace(labels[i+1]) + `"`)
		}
		w.WriteByte('}')
	}
	w.WriteString(" " + formatFloat(v) + "\n")
}

func gauge(w *strings.Builder, name, help string, labels []string, v float64) {
	header(w, name, help, "gauge")
	sample(w, name, labels, v)
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// writeRuntime writes the Go runtime's and the process's own series, named
// as client_golang's collectors name them.
func writeRuntime(w *strings.Builder, started time.Time) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gauge(w, "go_goroutines", "Number of goroutines that currently exist.", nil, float64(runtime.NumGoroutine()))
	if n, ok := statusField("Threads:"); ok {
		gauge(w, "go_threads", "Number of OS threads created.", nil, n)
	}
	gauge(w, "go_memstats_heap_alloc_bytes", "Number of heap bytes allocated and currently in use.", nil, float64(ms.HeapAlloc))
	gauge(w, "go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use.", nil, float64(ms.HeapInuse))
	gauge(w, "go_memstats_sys_bytes", "Number of bytes obtained from system.", nil, float64(ms.Sys))
	header(w, "go_gc_cycles_total", "Completed GC cycles.", "counter")
	sample(w, "go_gc_cycles_total", nil, float64(ms.NumGC))

	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		header(w, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter")
		sample(w, "process_cpu_seconds_total", nil, cpu)
	}
	if rss, ok := statusField("VmRSS:"); ok {
		gauge(w, "process_resident_memory_bytes", "Resident memory size in bytes.", nil, rss*1024)
	}
	if vsz, ok := statusField("VmSize:"); ok {
		gauge(w, "process_virtual_memory_bytes", "Virtual memory size in bytes.", nil, vsz*1024)
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		gauge(w, "process_open_fds", "Number of open file descriptors.", nil, float64(len(ents)))
	}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
		gauge(w, "process_max_fds", "Maximum number of open file descriptors.", nil, float64(rl.Cur))
	}
	gauge(w, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.", nil, float64(started.UnixNano())/1e9)
}

// statusField reads a number of /proc/self/status ("Threads:", "VmRSS:"
// in kB).
func statusField(name string) (float64, bool) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name); ok {
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				return 0, false
			}
			n, err := strconv.ParseFloat(fields[0], 64)
			return n, err == nil
		}
	}
	return 0, false
}
