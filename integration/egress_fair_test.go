package integration

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestAttackEgressNodeFair: four sessions, each at its own bound of 256
// idle connections, held all 1024 of the node's, and every other
// session's run could open none (a reset at once): four callers' load was
// every session's outage. The node's pool is now shared fairly: a session
// holding fewer takes the oldest connection of the session holding the
// most, which is cut and audited.
func TestAttackEgressNodeFair(t *testing.T) {
	d := egressHomeUnbounded(t)
	hog := egressHog + egressHogAlive
	type run struct {
		stdin io.Writer
		line  func() string
	}
	var hogs []run
	for i := range 4 {
		id := fmt.Sprintf("hog%d", i)
		d.openFor(id, nobody, dmCtx)
		stdin, line := egressLive(t, d, id, hog)
		t.Logf("session %s: %s", id, line())
		hogs = append(hogs, run{stdin, line})
	}
	var st struct {
		Egress struct {
			Connections int `json:"connections"`
			Max         int `json:"max_connections"`
		} `json:"egress"`
	}
	// A run's connect returns at the kernel's handshake; the daemon admits
	// each when it accepts it.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		d.call("status", map[string]any{}, &st)
		if st.Egress.Connections == st.Egress.Max || time.Now().After(deadline) {
			break
		}
	}
	if st.Egress.Connections != st.Egress.Max {
		t.Fatalf("the hogs hold %d of the node's %d connections; the test needs them all", st.Egress.Connections, st.Egress.Max)
	}
	d.openFor("victim", nobody, dmCtx)
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", condfsBin, "run", "--socket", d.socket, "--session", "victim", "--",
		"curl", "-sS", "--max-time", "10", "--noproxy", "*", "http://web.test/x")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "GET /x host=web.test") {
		t.Errorf("HOLE: four sessions hold all %d of the node's egress connections; another session's run: %s", st.Egress.Max, out)
	}
	// The hogs held all of the node's (each a fair part of it when that
	// is below 256: the bound follows the daemon's descriptors), and lost
	// exactly one to the victim, audited.
	alive := 0
	for i, r := range hogs {
		r.stdin.Write([]byte("\n"))
		l := r.line()
		t.Logf("session hog%d: %s", i, l)
		var n int
		fmt.Sscanf(l, "alive %d", &n)
		alive += n
	}
	if alive != st.Egress.Max-1 {
		t.Errorf("the hogs' connections alive: %d; want the node's %d less the victim's one", alive, st.Egress.Max)
	}
	if !strings.Contains(d.log(), "this session holds the most") {
		t.Errorf("no audited eviction:\n%s", d.log())
	}
}

// egressHomeUnbounded starts the egress servers and a daemon whose runs
// keep [sandbox] connections at its default (256), uid 65534 admitted,
// with the daemon's flags args added.
func egressHomeUnbounded(t *testing.T, args ...string) *daemon {
	t.Helper()
	n := newEgressNet(t)
	n.serve(t)
	h := openHome(t, "-")
	h.t = t
	hosts := h.write("config/hosts", egressHosts)
	h.write("config/conditions.toml", strings.Replace(egressRules(hosts), "connections = 8\n", "", 1)) // the default, 256
	h.write("config/policy.yaml", egressPolicy)
	os.Chmod(h.path("workspace"), 0o777)
	d := startDaemon(t, h, append([]string{"--allow-uid", "65534", "--socket-mode", "0666"}, args...)...)
	os.Chmod(h.path("run"), 0o755)
	return d
}

// egressHog, in a run, holds 256 connections to echo.test until a line
// comes on its stdin. It reports on one line ("holding N", and the error
// that stopped it): a reset seen while connecting (the pool's fair share
// evicting this run's newest) must not shift what a test reads next.
const egressHog = `
import socket, sys
cs, err = [], ""
for i in range(256):
    try:
        cs.append(socket.create_connection(("echo.test", 7000), timeout=5))
    except Exception as e:
        err = " (conn %d: %s)" % (i, type(e).__name__)
        break
print("holding %d%s" % (len(cs), err), flush=True)
sys.stdin.readline()
`

// egressHogN is egressHog holding n connections.
func egressHogN(n int) string {
	return strings.Replace(egressHog, "range(256)", fmt.Sprintf("range(%d)", n), 1)
}

// egressHogAlive, after egressHog, counts the connections still served
// when the line comes (each sends a control byte and reads the echo
// server's banner and the byte back) and prints "alive N".
const egressHogAlive = `alive = 0
for c in cs:
    try:
        c.settimeout(5)
        c.sendall(b"\x00")  # a control byte: classified "tcp" at once
        got = b""
        while not got.endswith(b"\x00"):  # the server's banner, then the echo
            b = c.recv(64)
            if not b:
                break
            got += b
        if got == b"banner\n\x00":
            alive += 1
    except OSError:
        pass
print("alive", alive, flush=True)
`
