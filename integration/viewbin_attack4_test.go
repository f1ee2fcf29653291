package integration

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestAtkViewBinLinkedWriterRun: before a reload lists /workspace/tool.sh, the
// session (65534, through its host view mount) gives it a second name and
// holds that name open for writing. The reload hides tool.sh (two names)
// and leaves the handle (its own name is not listed). The session then
// removes its name (not listed: allowed), writes through the held handle
// (its decision is cached; no event re-decides it), closes it: tool.sh has
// one name again, is shown, bound and run with the session's bytes.
func TestAtkViewBinLinkedWriterRun(t *testing.T) {
	// Before: the workspace lists no path for runs (so the hard-link
	// rule is off there, and the session may make a second name).
	before := strings.Replace(vb2Rules, `, "/workspace/bin/", "/workspace/tool.sh", "/workspace/link/"`, ``, 1)
	if before == vb2Rules {
		t.Fatalf("rules not changed: %s", before)
	}
	d, mnt := atk3Home(t, before)
	w := atk3Nobody(t, `
import os, sys, time
m = sys.argv[1] + "/workspace/"
os.link(m + "tool.sh", m + "alias")
fd = os.open(m + "alias", os.O_WRONLY)
print("held", flush=True)
for i in range(2000):
    try:
        os.close(os.open(m + "tool.sh", os.O_RDONLY)); time.sleep(0.01)
    except OSError as e:
        print("listed now: tool.sh", e.strerror, flush=True); break
for f in (lambda: os.unlink(m + "alias"), lambda: os.pwrite(fd, b"#!/bin/sh\necho PWNED-BY-SESSION\n", 0)):
    try:
        f()
    except OSError as e:
        print("refused:", e.strerror, flush=True)
os.close(fd)
print("done", flush=True)
`, mnt)
	if o, ok := waitLine(t, w, "held", 10*time.Second); !ok {
		t.Fatalf("%q", o)
	}
	vb2Reload(t, d, vb2Rules, 0)
	o, ok := waitLine(t, w, "done", 20*time.Second)
	t.Logf("writer:\n%s", o)
	if !ok {
		t.Fatal("writer did not finish")
	}
	out, code := condfsRun(t, d, "", "--", "/workspace/tool.sh")
	t.Logf("run (%d): %s", code, out)
	back, _ := os.ReadFile(d.home.path("workspace/tool.sh"))
	t.Logf("backing: %q", back)
	if strings.Contains(out, "PWNED") {
		t.Errorf("BROKE: a run executed bytes the session wrote into listed /workspace/tool.sh after its listing")
	}
}
