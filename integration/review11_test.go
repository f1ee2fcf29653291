package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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

// TestAtk11OneUidAllSessions: session.open was bounded by --max-sessions
// alone, and any admitted uid may open sessions of its own: uid 65534
// opened all of them, and every other user's session.open was refused
// (-32013) until it closed some. Now each uid other than root and the
// daemon's may have opened at most --max-sessions-per-uid (default an
// eighth), and the last eighth is kept for root and the daemon's uid.
func TestAtk11OneUidAllSessions(t *testing.T) {
	h := openHome(t, "")
	d := startDaemon(t, h, "--allow-uid", "65534", "--allow-uid", "1000", "--socket-mode", "0666", "--max-sessions", "16")
	os.Chmod(filepath.Dir(d.socket), 0o755)
	open := func(uid int, id string) (string, error) {
		mnt := h.path("mnt/" + id)
		os.MkdirAll(mnt, 0o755)
		os.Chown(mnt, uid, uid)
		u := strconv.Itoa(uid)
		out, err := exec.Command("setpriv", "--reuid="+u, "--regid="+u, "--clear-groups", condfsBin, "ctl", "--socket", d.socket,
			"open", id, mnt, "--context", "discord:dm").CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	opened := 0
	var refusal string
	for i := range 16 {
		out, err := open(nobody, fmt.Sprintf("a%d", i))
		if err != nil {
			refusal = out
			break
		}
		opened++
	}
	t.Logf("uid 65534 opened %d of 16 sessions; then: %s", opened, refusal)
	if opened != 2 || !strings.Contains(refusal, "--max-sessions-per-uid") {
		t.Errorf("uid 65534 opened %d sessions of --max-sessions 16 (want 2, an eighth); then: %s", opened, refusal)
	}
	if out, err := open(1000, "victim"); err != nil {
		t.Errorf("HOLE: after uid 65534 opened its sessions, uid 1000 cannot open one: %s", out)
	}
	d.open("root", dmCtx)
}
