package daemon

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// TestMetrics drives a real daemon (a view, context switches, denials,
// decisions, reloads good and bad, socket errors), scrapes its metrics
// socket and parses the exposition with the client library's parser.
func TestMetrics(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, e2ePolicy)
	h.Write("memories/private/p.md", "p")
	sock := h.Path("metrics.sock")
	d := testenv.Start(t, h, "--metrics", sock)
	mnt := d.Open("s", testenv.DM)
	if _, err := os.ReadFile(mnt + "/memories/private/p.md"); err != nil {
		t.Fatal(err)
	}
	d.SetContext("s", testenv.Guild)
	d.SetContext("s", testenv.DM)
	d.SetContext("s", testenv.Guild)
	os.Stat(mnt + "/memories/private/p.md") // denied: lookup
	var dec struct{ Decision string }
	d.Call("tool.decide", map[string]any{"session": "s", "tool": "refund", "args": map[string]any{"amount": 1}}, &dec)
	d.Call("tool.decide", map[string]any{"tool": "refund", "roles": []string{"no-such-role-" + strings.Repeat("x", 40)}, "args": map[string]any{"amount": 1}}, &dec)
	d.Call("tool.decide", map[string]any{"tool": "no_such_tool"}, &dec)
	d.CallErr("session.close", map[string]any{"id": "nope"}, -32001)
	h.Write("config/conditions.toml", "[memories.\"/x/\"]\nwhen = \"discord:dm\"\naction = \"allow\"\n")
	d.Call("config.reload", map[string]any{}, nil)
	h.Write("config/conditions.toml", "[broken")
	d.Call("config.reload", map[string]any{}, nil)

	fams := testenv.Scrape(t, sock)
	get := func(name string, labels map[string]string) float64 {
		t.Helper()
		f, ok := fams[name]
		if !ok {
			t.Fatalf("no metric %s", name)
		}
		for _, m := range f.GetMetric() {
			match := true
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				match = match && found
			}
			if !match {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
		return 0
	}
	checks := []struct {
		name   string
		labels map[string]string
		min    float64
	}{
		{"condfs_sessions_open", nil, 1},
		{"condfs_context_switch_seconds", nil, 3},
		{"condfs_path_denials_total", map[string]string{"space": "memories", "op": "lookup"}, 1},
		{"condfs_tool_decisions_total", map[string]string{"decision": "allow"}, 1},
		{"condfs_tool_decisions_total", map[string]string{"decision": "deny", "role": "none"}, 1},
		{"condfs_tool_decisions_total", map[string]string{"role": "unknown"}, 1},
		{"condfs_config_reloads_total", map[string]string{"file": "conditions", "outcome": "ok"}, 1},
		{"condfs_config_reloads_total", map[string]string{"file": "conditions", "outcome": "error"}, 1},
		{"condfs_config_generation", map[string]string{"file": "conditions"}, 2},
		{"condfs_config_last_good_load_timestamp_seconds", map[string]string{"file": "policy"}, float64(time.Now().Add(-time.Hour).Unix())},
		{"condfs_fuse_op_seconds", map[string]string{"op": "Lookup"}, 1},
		{"condfs_fuse_op_seconds", map[string]string{"op": "Read"}, 1},
		{"condfs_socket_connections_total", nil, 1},
		{"condfs_socket_errors_total", map[string]string{"code": "-32001"}, 1},
	}
	for _, c := range checks {
		if got := get(c.name, c.labels); got < c.min {
			t.Errorf("%s%v = %v, want at least %v", c.name, c.labels, got, c.min)
		}
	}
	if got := get("condfs_config_generation", map[string]string{"file": "conditions"}); got != 2 {
		t.Errorf("conditions generation %v after one good and one broken reload, want 2", got)
	}
	// No label value is a path, a session id or an argument.
	for name, f := range fams {
		if !strings.HasPrefix(name, "condfs_") {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				v := lp.GetValue()
				if strings.Contains(v, "/") || v == "s" || strings.Contains(v, "no-such-role") {
					t.Errorf("%s has label %s=%q", name, lp.GetName(), v)
				}
			}
		}
	}
}
