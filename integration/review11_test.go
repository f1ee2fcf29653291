package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// procKB reads a field in kB (VmRSS, VmHWM) of /proc/PID/status.
func procKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestAtk11DecideMemory: a tool.decide request of 1 MiB whose arguments
// are arrays of 10,000 zeros (each within the spec's bounds) was decoded
// into 70 MB of values, and the control socket's strict check built
// another tree of 40 times the line: one uid's 120 connections sending
// them at once took the daemon from 15 MB to 6.6 GB (eleventh review), a
// load that would end every session with the daemon. A request's values
// are now bounded (65,536), the check keeps no tree, and large requests
// are decoded a few at a time.
func TestAtk11DecideMemory(t *testing.T) {
	h := openHome(t, "")
	d := startDaemon(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.socket), 0o755)
	pid := d.cmd.Process.Pid
	before := procKB(t, pid, "VmHWM")
	first, _ := converseAsNobody(t, "bigdecide", d.socket, "40", "2")
	after := procKB(t, pid, "VmHWM")
	var got struct {
		Answered int
		First    string
	}
	if err := json.Unmarshal([]byte(first), &got); err != nil {
		t.Fatalf("attacker: %q: %v", first, err)
	}
	t.Logf("uid 65534's 40 connections, 2 requests of 1 MiB each: %d answered (%.200s); daemon peak %d MB -> %d MB", got.Answered, got.First, before>>10, after>>10)
	if got.Answered != 80 || !strings.Contains(got.First, "more than 65536 values") {
		t.Errorf("the requests were not each denied for their values: %d answered, first %s", got.Answered, got.First)
	}
	if after-before > 1<<20 {
		t.Errorf("HOLE: one uid's 80 requests of 1 MiB took the daemon's peak memory from %d MB to %d MB", before>>10, after>>10)
	}
}
