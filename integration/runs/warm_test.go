package runs

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

type runsStatus struct {
	Prepared   int `json:"prepared"`
	WarmStarts int `json:"warm_starts"`
	ColdStarts int `json:"cold_starts"`
	Discarded  int `json:"discarded"`
}

func runsOf(d *testenv.Daemon) runsStatus {
	var st struct {
		Runs runsStatus `json:"runs"`
	}
	d.Call("status", map[string]any{}, &st)
	return st.Runs
}

// waitPrepared waits until the session's next sandbox is kept.
func waitPrepared(d *testenv.Daemon, t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runsOf(d).Prepared == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no sandbox was kept")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Prepared counts one being readied too: give it the time to finish
	// (take waits for it anyway; this keeps the runs below warm starts).
	time.Sleep(200 * time.Millisecond)
}

// TestRunWarm: a run begun in the sandbox its session's previous run left
// (kept and readied once that run ended) is decided and shown as of when it
// comes: a switch or reload in between changes its binaries and view, its
// /tmp is its own (the previous run's file is gone), a killed run leaves
// nothing, and closing the session ends the sandbox waiting for a run.
func TestRunWarm(t *testing.T) {
	d, _ := testenv.RunHome(t)
	// A session's first run keeps nothing; its second keeps its sandbox.
	if _, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "true"); code != 0 {
		t.Fatalf("first run: exit %d", code)
	}
	time.Sleep(300 * time.Millisecond)
	if st := runsOf(d); st.Prepared != 0 {
		t.Errorf("a sandbox was kept after a session's first run: %+v", st)
	}
	out, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "echo mark > /tmp/mark; ls /usr/bin; ls /memories")
	if code != 0 || !strings.Contains(out, "cat") || !strings.Contains(out, "private") {
		t.Fatalf("DM run: exit %d %q", code, out)
	}
	waitPrepared(d, t)

	// Kept from the DM run, with cat attached; begun in a guild.
	d.SetContext("s", testenv.Guild)
	before := runsOf(d)
	out, code = testenv.CondfsRun(t, d, "", "--", "sh", "-c", "ls -A /tmp; echo --; ls /usr/bin; echo --; ls /memories")
	if after := runsOf(d); after.WarmStarts != before.WarmStarts+1 {
		t.Fatalf("the run after the switch was not begun in the kept sandbox: %+v then %+v", before, after)
	}
	parts := strings.Split(out, "--\n")
	if code != 0 || len(parts) != 3 {
		t.Fatalf("guild run: exit %d %q", code, out)
	}
	if parts[0] != "" {
		t.Errorf("/tmp of a new run holds %q", parts[0])
	}
	if strings.Contains(parts[1], "cat") || !strings.Contains(parts[1], "ls") {
		t.Errorf("guild run's /usr/bin: %q (cat is allowed only in DMs)", parts[1])
	}
	if strings.Contains(parts[2], "private") {
		t.Errorf("guild run's /memories: %q", parts[2])
	}
	// The command itself cannot reach cat either.
	if out, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "cat /memories/pub.md"); code != 127 || !strings.Contains(out, "not found") {
		t.Errorf("guild: cat through sh: exit %d %q, want 127 not found", code, out)
	}

	// A reload that changes [sandbox]: the sandbox kept with the old
	// binaries is not used.
	waitPrepared(d, t)
	before = runsOf(d)
	d.Home.Write("config/conditions.toml", strings.Replace(testenv.RunRules, `"/usr/bin/ls", `, "", 1))
	d.Call("config.reload", map[string]any{}, nil)
	out, code = testenv.CondfsRun(t, d, "", "--", "sh", "-c", "ls /; echo done")
	if after := runsOf(d); after.ColdStarts != before.ColdStarts+1 || after.Discarded <= before.Discarded {
		t.Errorf("after a reload of [sandbox]: %+v then %+v, want a fresh build and one discarded", before, after)
	}
	if code != 0 || !strings.Contains(out, "ls: not found") {
		t.Errorf("after the reload ls is still there: exit %d %q", code, out)
	}

	// A run that was killed leaves no sandbox for the next: the next is
	// built afresh and kept again.
	waitPrepared(d, t)
	if out, code := testenv.CondfsRun(t, d, "", "--timeout", "300ms", "--", "sleep", "30"); code != 124 {
		t.Fatalf("timeout: exit %d %q", code, out)
	}
	time.Sleep(300 * time.Millisecond)
	if st := runsOf(d); st.Prepared != 0 {
		t.Errorf("a killed run's sandbox was kept: %+v", st)
	}
	before = runsOf(d)
	if _, code := testenv.CondfsRun(t, d, "", "--", "sh", "-c", "true"); code != 0 {
		t.Fatalf("after the timeout: exit %d", code)
	}
	if after := runsOf(d); after.ColdStarts != before.ColdStarts+1 {
		t.Errorf("the run after a killed one: %+v then %+v, want a fresh build", before, after)
	}

	// Closing the session ends the sandbox that waits for its next run.
	waitPrepared(d, t)
	inits := sandboxInits(t, d.Cmd.Process.Pid)
	if len(inits) == 0 {
		t.Fatal("no init of a prepared sandbox among the daemon's children")
	}
	d.Call("session.close", map[string]any{"id": "s"}, nil)
	for _, pid := range inits {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("the prepared sandbox's init %d outlived its session", pid)
		}
	}
	if st := runsOf(d); st.Prepared != 0 {
		t.Errorf("after session.close: %+v", st)
	}
}

// sandboxInits are the daemon's children (its sandboxes' inits).
func sandboxInits(t *testing.T, daemon int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(daemon) {
			out = append(out, pid)
		}
	}
	return out
}
