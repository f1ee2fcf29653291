package integration

import (
	"fmt"
	"os"
	"testing"
)

// TestSessionDescriptors: on the shared connection a root daemon uses, a
// session holds no file descriptor of its own, and a daemon whose hard
// descriptor limit is 20,000 and cannot be raised (no CAP_SYS_RESOURCE, as
// in a container) serves at least 10,000 sessions by default. bench/scale
// opens the 10,000.
func TestSessionDescriptors(t *testing.T) {
	const n = 2000
	h := newHome(t, "", "version: 1\n")
	d := startDaemonUnder(t, h, []string{"prlimit", "--nofile=20000:20000", "setpriv", "--bounding-set=-sys_resource", "--"},
		"--connections=shared", "--log-level", "error")
	var st struct {
		Limits struct {
			MaxSessions int    `json:"max_sessions"`
			Connections string `json:"connections"`
		} `json:"limits"`
	}
	d.call("status", map[string]any{}, &st)
	if st.Limits.Connections != "shared" || st.Limits.MaxSessions < 10000 {
		t.Errorf("under a hard limit of 20,000 descriptors: limits %+v, want max_sessions >= 10000", st.Limits)
	}
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	d.open("warm", []string{"tui"}) // the first session makes what all share
	before := fds()
	for i := range n {
		d.open(fmt.Sprintf("s%d", i), []string{"tui"})
	}
	after := fds()
	per := float64(after-before) / n
	t.Logf("%d sessions: %d -> %d descriptors, %.3f per session", n, before, after, per)
	if per*10000 > 20000-512 {
		t.Fatalf("%.3f descriptors per session: 10,000 sessions do not fit in 20,000", per)
	}
}
