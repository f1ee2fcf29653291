package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Label values outside their fixed sets are counted as "other", so no
// caller can grow the series.
func TestLabelsAreBounded(t *testing.T) {
	m := New(func() int { return 0 }, func() map[string]int64 { return nil })
	m.PathDenial("memories", "/etc/passwd")
	m.PathDenial("elsewhere", "lookup")
	m.Reload("conditions", "surprise")
	m.SocketError(-1)
	m.Decision("maybe", "none")
	want := `
# HELP condfs_path_denials_total Path requests the rules denied, by space and operation.
# TYPE condfs_path_denials_total counter
condfs_path_denials_total{op="lookup",space="other"} 1
condfs_path_denials_total{op="other",space="memories"} 1
`
	if err := testutil.GatherAndCompare(m.reg, strings.NewReader(want), "condfs_path_denials_total"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"condfs_config_reloads_total", "condfs_socket_errors_total", "condfs_tool_decisions_total"} {
		if n := testutil.CollectAndCount(m.reg, name); n != 1 {
			t.Errorf("%s: %d series", name, n)
		}
	}
	var nilM *Metrics
	nilM.Decision("allow", "x") // a nil *Metrics records nothing, and does not panic
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
