package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func exposition(m *Metrics) string {
	var b strings.Builder
	m.WriteTo(&b)
	return b.String()
}

// Label values outside their fixed sets are counted as "other", so no
// caller can grow the series.
func TestLabelsAreBounded(t *testing.T) {
	m := New(func() int { return 0 }, func() map[string]int64 { return map[string]int64{"somewhere": 2} })
	m.PathDenial("memories", "/etc/passwd")
	m.PathDenial("elsewhere", "lookup")
	m.PathDenial("elsewhere", "lookup")
	m.Reload("conditions", "surprise")
	m.SocketError(-1)
	m.Decision("maybe", "none")
	m.Egress("quic", "cut")
	m.Egress("https", "sideways")
	out := exposition(m)
	want := `# HELP condfs_path_denials_total Path requests the rules denied, by space and operation.
# TYPE condfs_path_denials_total counter
condfs_path_denials_total{space="memories",op="other"} 1
condfs_path_denials_total{space="other",op="lookup"} 2
`
	if !strings.Contains(out, want) {
		t.Errorf("no\n%s\nin\n%s", want, out)
	}
	for _, line := range []string{
		`condfs_config_reloads_total{file="conditions",outcome="other"} 1`,
		`condfs_socket_errors_total{code="other"} 1`,
		`condfs_tool_decisions_total{decision="other",role="none"} 1`,
		`condfs_egress_decisions_total{protocol="other",outcome="cut"} 1`,
		`condfs_egress_decisions_total{protocol="https",outcome="other"} 1`,
		`condfs_panics_recovered_total{where="other"} 2`,
	} {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("no %q in\n%s", line, out)
		}
	}
	var nilM *Metrics
	nilM.Decision("allow", "x") // a nil *Metrics records nothing, and does not panic
	nilM.Egress("tcp", "allow")
}

// The whole exposition is what Prometheus's own parser reads, with the
// values recorded: histograms cumulative, their count the +Inf bucket,
// label values escaped.
func TestExpositionParses(t *testing.T) {
	m := New(func() int { return 3 }, func() map[string]int64 { return nil })
	m.RegisterConfig("conditions", func() (uint64, time.Time) { return 2, time.Unix(1700000000, 0) })
	m.ContextSwitch(100 * time.Microsecond)
	m.ContextSwitch(time.Hour)
	for range 5 {
		m.FUSEOp("Lookup", time.Now())
	}
	m.Decision("allow", `a "quoted\role`+"\n")
	m.Conn()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(exposition(m)))
	if err != nil {
		t.Fatalf("%v\n%s", err, exposition(m))
	}
	sw := fams["condfs_context_switch_seconds"].GetMetric()[0].GetHistogram()
	if sw.GetSampleCount() != 2 || sw.GetSampleSum() < 3600 {
		t.Errorf("context switch histogram: count %d sum %v", sw.GetSampleCount(), sw.GetSampleSum())
	}
	var prev uint64
	for _, b := range sw.GetBucket() {
		if b.GetCumulativeCount() < prev {
			t.Errorf("buckets not cumulative: %v", sw.GetBucket())
		}
		prev = b.GetCumulativeCount()
	}
	if got := sw.GetBucket()[1].GetCumulativeCount(); got != 1 { // le=1e-4
		t.Errorf("le=%v: %d, want 1", sw.GetBucket()[1].GetUpperBound(), got)
	}
	if n := fams["condfs_fuse_op_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n != 5 {
		t.Errorf("fuse ops: %d", n)
	}
	if v := fams["condfs_sessions_open"].GetMetric()[0].GetGauge().GetValue(); v != 3 {
		t.Errorf("sessions open: %v", v)
	}
	if v := fams["condfs_config_generation"].GetMetric()[0].GetGauge().GetValue(); v != 2 {
		t.Errorf("generation: %v", v)
	}
	if v := fams["condfs_socket_connections_total"].GetMetric()[0].GetCounter().GetValue(); v != 1 {
		t.Errorf("connections: %v", v)
	}
	role := fams["condfs_tool_decisions_total"].GetMetric()[0].GetLabel()[1].GetValue()
	if role != `a "quoted\role`+"\n" {
		t.Errorf("role label read back as %q", role)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("no %s", name)
		}
	}
}

// BenchmarkFUSEOp: what timing one FUSE request costs the daemon (compare
// with a request's round trip, tens of microseconds; docs/performance.md).
func BenchmarkFUSEOp(b *testing.B) {
	m := New(func() int { return 0 }, func() map[string]int64 { return nil })
	b.ReportAllocs()
	for b.Loop() {
		m.FUSEOp("Lookup", time.Now())
	}
}
