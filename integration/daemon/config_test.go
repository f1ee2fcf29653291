package daemon

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestHostileConfigRefused: a few MB of nested "[" in conditions.toml, a
// 600-byte YAML alias bomb, a FIFO at a config path and an empty file on
// reload are each refused with an error, the last good config kept: none
// overflows the stack, exhausts memory, hangs status or drops every rule.
func TestHostileConfigRefused(t *testing.T) {
	h := testenv.OpenHome(t, testenv.PrivateRule)
	h.Write("memories/private/p.md", "p")
	d := testenv.Start(t, h)
	mnt := d.Open("s", testenv.Guild)
	status := func() (gen int, errMsg string) {
		var st struct {
			Config map[string]struct {
				Generation int     `json:"generation"`
				Error      *string `json:"error"`
			} `json:"config"`
		}
		d.Call("config.reload", map[string]any{}, nil)
		d.Call("status", map[string]any{}, &st)
		c := st.Config["conditions"]
		if c.Error != nil {
			errMsg = *c.Error
		}
		return c.Generation, errMsg + " | " + fmt.Sprint(st.Config["policy"].Error != nil)
	}
	check := func(what string) {
		t.Helper()
		if testenv.Exists(mnt + "/memories/private/p.md") {
			t.Fatalf("%s opened a denied path", what)
		}
		if !testenv.Exists(mnt + "/memories") {
			t.Fatalf("%s: the view stopped answering", what)
		}
	}
	h.Write("config/conditions.toml", strings.Repeat("[", 3<<20))
	if _, msg := status(); !strings.Contains(msg, "nested deeper") {
		t.Fatalf("deep TOML: %s", msg)
	}
	check("deep TOML")
	bomb := "version: 1\nconsts:\n  a: &a [x,x,x,x,x,x,x,x,x]\n"
	for i, c := range "bcdefghi" {
		prev := string("abcdefghi"[i])
		bomb += fmt.Sprintf("  %c: &%c [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n", c, c, prev, prev, prev, prev, prev, prev, prev, prev, prev)
	}
	bomb += "roles:\n  default:\n    tools: {}\n"
	h.Write("config/policy.yaml", bomb)
	if _, msg := status(); !strings.HasSuffix(msg, "true") {
		t.Fatalf("alias bomb loaded: %s", msg)
	}
	out, err := exec.Command(testenv.Condfs(), "policy", "lint", h.Path("config/policy.yaml")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "expand") {
		t.Fatalf("policy lint on an alias bomb: %v %s", err, out)
	}
	os.Remove(h.Path("config/conditions.toml"))
	if err := unix.Mkfifo(h.Path("config/conditions.toml"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() { _, msg := status(); done <- msg }()
	select {
	case msg := <-done:
		if !strings.Contains(msg, "regular file") {
			t.Fatalf("FIFO: %s", msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a FIFO at the config path hung status")
	}
	check("FIFO")
	os.Remove(h.Path("config/conditions.toml"))
	h.Write("config/conditions.toml", "")
	if _, msg := status(); !strings.Contains(msg, "empty") {
		t.Fatalf("empty conditions.toml: %s", msg)
	}
	check("empty conditions.toml")
}

// TestReloadFloodBounded: config.reload answers any admitted uid, and a
// forced reload drops every view's kernel caches (a hub epoch bump per
// view, every recorded listing) and re-applies every session's runs'
// binaries. uid 65534 loops config.reload: how much slower is uid 1000's
// walk of its own session's tree (warm, answered by the kernel's caches
// otherwise)? Measured: 10,784 walks in 3 s alone, 44 under the loop
// (245x); the same loop of "status" (as much socket traffic, no cache
// drop): 11,361, no slowdown. daemon.go mConfigReload checks no peer.
func TestReloadFloodBounded(t *testing.T) {
	d := testenv.LimitedDaemon(t, 4096)
	for i := 0; i < 50; i++ {
		d.Home.Write("workspace/tree/d"+strconv.Itoa(i)+"/f.txt", "x")
	}
	victim := d.OpenFor("victim", 1000, testenv.DM)
	walk := `
import os, sys, time
root = sys.argv[1]
def walk():
    n = 0
    for dp, dns, fns in os.walk(root):
        for f in fns:
            os.stat(os.path.join(dp, f)); n += 1
    return n
walk()
t0 = time.time(); k = 0
while time.time() - t0 < 3:
    walk(); k += 1
print("walks %d in 3s" % k)
`
	refused := testenv.PythonAs(t, testenv.Nobody, 30*time.Second, testenv.PyCall+`
print(call(conn(sys.argv[1]), "config.reload", {}))
`, d.Socket)
	if !strings.Contains(refused, "-32012") {
		t.Errorf("uid 65534's config.reload: %s; want -32012 (root and the daemon's uid only)", refused)
	}
	base := testenv.PythonAs(t, 1000, 30*time.Second, walk, victim+"/workspace/tree")
	flood := testenv.CommandAs(testenv.Nobody, "/usr/bin/python3", "-c", testenv.PyCall+`
c = conn(sys.argv[1])
n = 0
while True:
    r = call(c, "config.reload", {})
    n += 1
    if n == 1: print(r, file=sys.stderr, flush=True)
`, d.Socket)
	flood.Stderr = os.Stderr
	flood.Start()
	defer func() { flood.Process.Kill(); flood.Wait() }()
	time.Sleep(300 * time.Millisecond)
	under := testenv.PythonAs(t, 1000, 30*time.Second, walk, victim+"/workspace/tree")
	t.Logf("uid 1000's walks of its tree: alone %s; while uid 65534 loops config.reload: %s", base, under)
	var b, u int
	fmt.Sscanf(base, "walks %d", &b)
	fmt.Sscanf(under, "walks %d", &u)
	if u*4 < b {
		t.Errorf("HOLE: uid 65534's config.reload loop (open to every admitted uid) slowed uid 1000's session %dx (%s -> %s)", b/max(u, 1), base, under)
	}
}
