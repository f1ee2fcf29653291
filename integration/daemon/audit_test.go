package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
)

// TestAuditLog: every tool decision and every denied path goes to the
// --audit file as one JSON line with the session, atoms, target, decision
// and the deciding rule or reasons.
func TestAuditLog(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, e2ePolicy)
	h.Write("memories/private/p.md", "p")
	audit := h.Path("audit.jsonl")
	d := testenv.Start(t, h, "--audit", audit)
	mnt := d.Open("s", testenv.Guild)
	var dec struct{ Decision string }
	d.SetContext("s", []string{"discord:guild:9", "discord:channel:3"})
	d.Call("tool.decide", map[string]any{"session": "s", "tool": "refund", "args": map[string]any{"amount": 500}}, &dec)
	d.Call("path.check", map[string]any{"session": "s", "space": "memories", "path": "/private/p.md"}, nil)
	os.WriteFile(mnt+"/memories/private.md", nil, 0o644) // allowed: not audited as a deny
	os.ReadDir(mnt + "/memories")                        // hides private/ without naming it: no record
	if _, err := os.Stat(mnt + "/memories/private/p.md"); err == nil {
		t.Fatal("a denied path is visible")
	}
	if err := os.Mkdir(mnt+"/memories/private", 0o755); err == nil {
		t.Fatal("mkdir of a denied path succeeded")
	}
	d.Stop()
	data, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	var kinds, ops, flushed []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line is not JSON: %q", line)
		}
		if rec["session"] != "s" || rec["decision"] == nil || rec["atoms"] == nil {
			t.Fatalf("audit record lacks session, atoms or decision: %v", rec)
		}
		// Records carry the context in force when they were decided.
		if a := fmt.Sprint(rec["atoms"]); a != "[discord:channel:3 discord:guild:9]" {
			t.Fatalf("audit record with atoms %s, want the switched context", a)
		}
		if rec["flushed"] == true {
			// Told at the session's close: the repeats of a record
			// that no later record of it told.
			flushed = append(flushed, fmt.Sprint(rec["op"], " ", rec["suppressed"]))
			continue
		}
		switch rec["kind"] {
		case "tool":
			if rec["tool"] != "refund" || rec["decision"] != "deny" || rec["reasons"] == nil {
				t.Fatalf("tool record: %v", rec)
			}
		case "path":
			if rec["path"] != "/private/p.md" && rec["path"] != "/private" {
				t.Fatalf("path record: %v", rec)
			}
		}
		kinds = append(kinds, rec["kind"].(string)+":"+rec["decision"].(string))
		if op, ok := rec["op"].(string); ok {
			ops = append(ops, op)
		}
	}
	got := strings.Join(kinds, " ")
	for _, want := range []string{"tool:deny", "path:deny"} {
		if !strings.Contains(got, want) {
			t.Fatalf("audit has %q, want a %s record", got, want)
		}
	}
	// path.check, the stat (a lookup), and the mkdir (the kernel's lookup
	// of the same name within a second is suppressed by the rate limit,
	// then the create); the listing that hid private/ named nothing.
	if o := strings.Join(ops, " "); o != "check lookup create" {
		t.Fatalf("denied path records by op: %q", o)
	}
	// The suppressed lookup is counted: told when the session closed.
	if f := strings.Join(flushed, ", "); f != "lookup 1" {
		t.Fatalf("records told at the close: %q, want the suppressed lookup", f)
	}
}

// TestDecideAuditFloodBounded: "a process that names the same hidden path in a
// loop must not fill the disk" (daemon/audit.go) holds for path denials
// and connections, but every tool.decide is written whole (daemon.go
// decide: d.audit.Info("decide", ... "tool", req.Tool, "roles",
// req.Roles, ...)), and any admitted uid may call it with no session: a
// tool name and 15 roles of 60,000 characters each (within the request
// limits: strings 64 KiB, 32 roles, a 1 MiB line) make each record about
// 1 MB. One uid on 4 connections for 5 s: how much audit does it write?
func TestDecideAuditFloodBounded(t *testing.T) {
	h := testenv.OpenHome(t, testenv.RunRules)
	audit := h.Path("audit.log")
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666", "--audit", audit)
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	out := testenv.PythonAs(t, testenv.Nobody, 60*time.Second, `
import json, socket, sys, threading, time
big = "x" * 60000
line = (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tool.decide",
    "params": {"tool": big, "roles": [big + str(i) for i in range(15)], "args": {}}}) + "\n").encode()
n = [0]
def go():
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rb")
    end = time.time() + 5
    while time.time() < end:
        s.sendall(line); f.readline(); n[0] += 1
ts = [threading.Thread(target=go) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print("requests", n[0], "line", len(line))
`, d.Socket)
	st, err := os.Stat(audit)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attacker: %s; audit log: %d MiB", out, st.Size()>>20)
	if st.Size() > 50<<20 {
		t.Errorf("HOLE: one admitted uid wrote %d MiB of audit in 5 s with tool.decide (%s): about %d GiB an hour, the disk fills", st.Size()>>20, out, st.Size()*720>>30)
	}
}

// TestSessionlessDenialsCannotHideOthers: path.check with a context (no session) is
// audited as session "" (daemon.go mPathCheck -> auditPath(p.Session...)),
// and the denial limiter remembers at most 256 distinct denials per
// session, counting the rest as "unlisted" while those are recent
// (daemon/audit.go). "" is one key for every uid: uid 65534 checking
// distinct denied paths in a loop keeps it full, and root's own denied
// check of a path is no longer written (only counted). The audit's rule
// "one session's flood can neither hide another session's denials" does
// not hold between uids that check by context.
func TestSessionlessDenialsCannotHideOthers(t *testing.T) {
	h := testenv.OpenHome(t, testenv.RunRules)
	audit := h.Path("audit.log")
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666", "--audit", audit)
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	flood := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", testenv.PyCall+`
c = conn(sys.argv[1])
i = 0
while True:
    call(c, "path.check", {"context": ["tui"], "space": "memories", "path": "/private/flood%d" % (i % 300)})
    i += 1
`, d.Socket)
	flood.Start()
	defer func() { flood.Process.Kill(); flood.Wait() }()
	time.Sleep(2 * time.Second)
	var res struct {
		Decision string `json:"decision"`
	}
	d.Call("path.check", map[string]any{"context": []string{"tui"}, "space": "memories", "path": "/private/root-probe"}, &res)
	time.Sleep(500 * time.Millisecond)
	b, _ := os.ReadFile(audit)
	t.Logf("root's check: %s; audit lines: %d", res.Decision, strings.Count(string(b), "\n"))
	if res.Decision == "deny" && !strings.Contains(string(b), "root-probe") {
		t.Errorf("HOLE: root's denied path.check (/private/root-probe) is not in the audit log: uid 65534's flood of distinct denied checks filled the shared session \"\" record")
	}
}
