package egress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

// TestEgressNodePoolFairAmongSessions: four sessions, each at its own bound of 256
// idle connections, held all 1024 of the node's, and every other
// session's run could open none (a reset at once): four callers' load was
// every session's outage. The node's pool is shared fairly: a session
// holding fewer takes the oldest connection of the session holding the
// most, which is cut and audited.
func TestEgressNodePoolFairAmongSessions(t *testing.T) {
	d := egressHomeUnbounded(t)
	hog := egressHog + egressHogAlive
	type run struct {
		stdin io.Writer
		line  func() string
	}
	var hogs []run
	for i := range 4 {
		id := fmt.Sprintf("hog%d", i)
		d.OpenFor(id, testenv.Nobody, testenv.DM)
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
		d.Call("status", map[string]any{}, &st)
		if st.Egress.Connections == st.Egress.Max || time.Now().After(deadline) {
			break
		}
	}
	if st.Egress.Connections != st.Egress.Max {
		t.Fatalf("the hogs hold %d of the node's %d connections; the test needs them all", st.Egress.Connections, st.Egress.Max)
	}
	d.OpenFor("victim", testenv.Nobody, testenv.DM)
	cmd := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "run", "--socket", d.Socket, "--session", "victim", "--",
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
	if !strings.Contains(d.Log(), "this session holds the most") {
		t.Errorf("no audited eviction:\n%s", d.Log())
	}
}

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

// TestEgressNodePoolFairAmongOneUidsSessions: the node's pool is fair among sessions, and
// a uid may open as many sessions as it likes. uid 1000's one session holds
// 160 connections (under its own bound of 256, under a sixth of the node);
// uid 65534 opens eight sessions that each try to hold 256. Each session of
// 65534 that holds fewer cuts the session holding the most, until all hold
// about 1024/9: uid 1000's connections are cut though its uid holds far
// less than half of the node.
func TestEgressNodePoolFairAmongOneUidsSessions(t *testing.T) {
	d := egressHomeUnbounded(t, "--allow-uid", "1000")
	d.OpenFor("victim", 1000, testenv.DM)
	vin, vline := egressLiveAs(t, d, 1000, "victim", egressHogN(160)+egressHogAlive)
	t.Logf("uid 1000's session: %s", vline())
	var ins []io.WriteCloser
	for i := range 8 {
		id := fmt.Sprintf("sybil%d", i)
		d.OpenFor(id, testenv.Nobody, testenv.DM)
		in, line := egressLiveAs(t, d, testenv.Nobody, id, egressHogN(256)+egressHogAlive)
		t.Logf("65534's session %s: %s", id, line())
		ins = append(ins, in)
	}
	var st struct {
		Egress struct {
			Connections int `json:"connections"`
			Max         int `json:"max_connections"`
		} `json:"egress"`
	}
	time.Sleep(2 * time.Second)
	d.Call("status", map[string]any{}, &st)
	t.Logf("node: %d of %d connections", st.Egress.Connections, st.Egress.Max)
	vin.Write([]byte("\n"))
	got := vline()
	t.Logf("uid 1000's session after: %s", got)
	for _, in := range ins {
		in.Close()
	}
	if got != "alive 160" {
		t.Errorf("HOLE: uid 65534 opened 8 sessions of its own: uid 1000's only session, holding 160 of the node's %d connections, was cut (%s)", st.Egress.Max, got)
	}
}

// TestEgressPoolLeavesTheDaemonItsReserve: the file budget leaves the rest of the daemon
// a reserve of an eighth of RLIMIT_NOFILE (at least 512), but the node's
// egress pool admits 1024 connections whatever that limit, each holding a
// descriptor of the daemon's (its upstream socket; with the kernel's
// capture the run's side too). On a daemon whose limit is 2048, uid
// 65534's runs hold the node's connections: does uid 1000's session still
// open a file, and root's control call still work?
func TestEgressPoolLeavesTheDaemonItsReserve(t *testing.T) {
	n := newEgressNet(t)
	n.serve(t)
	h := testenv.OpenHome(t, "-")
	hosts := h.Write("config/hosts", egressHosts)
	h.Write("config/conditions.toml", strings.Replace(egressRules(hosts), "connections = 8\n", "", 1))
	h.Write("config/policy.yaml", egressPolicy)
	h.Write("workspace/w.txt", "work\n")
	os.Chmod(h.Path("workspace"), 0o777)
	os.MkdirAll(h.Path("mnt"), 0o777)
	d := testenv.StartUnder(t, h, testenv.NofileLimit(2048),
		"--allow-uid", "65534", "--allow-uid", "1000", "--socket-mode", "0666")
	os.Chmod(h.Path("run"), 0o755)
	pid := d.Cmd.Process.Pid
	victim := d.OpenFor("victim", 1000, testenv.DM)
	base := testenv.FDs(pid)
	var last func() string
	for i := range 4 {
		id := fmt.Sprintf("hog%d", i)
		d.OpenFor(id, testenv.Nobody, testenv.DM)
		_, line := egressLiveAs(t, d, testenv.Nobody, id, egressHog)
		if i < 3 {
			t.Logf("65534's session %s: %s; daemon fds %d (base %d)", id, line(), testenv.FDs(pid), base)
		}
		last = line
	}
	// While the last hog connects, uid 1000 opens a file of its session
	// again and again.
	failed := ""
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline) && failed == ""; {
		if got, stop := testenv.HoldOpen(t, 1000, victim+"/workspace/w.txt", 1); got != "held 1 err none" {
			failed = got
			stop()
		} else {
			stop()
		}
	}
	_ = last // hog3 may take minutes to finish connecting (the daemon is out of descriptors)
	t.Logf("65534's session hog3 connecting; daemon fds %d", testenv.FDs(pid))
	if failed != "" {
		t.Errorf("HOLE: while uid 65534's runs made egress connections, uid 1000's session could not open a file: %s", failed)
	}
	time.Sleep(2 * time.Second)
	var st struct {
		Egress struct {
			Connections int `json:"connections"`
		} `json:"egress"`
	}
	if c, err := control.Dial(d.Socket); err == nil {
		c.Call("status", map[string]any{}, &st)
		c.Close()
	}
	t.Logf("node connections %d; daemon fds %d (base %d)", st.Egress.Connections, testenv.FDs(pid), base)
	testenv.CheckOthersServed(t, d, victim, "uid 65534's runs hold the node's egress connections")
	t.Logf("the attack's checks are done at %s; cleanup follows", time.Now().Format(time.TimeOnly))
	var emfile []string
	for _, l := range strings.Split(d.Log(), "\n") {
		if strings.Contains(l, "too many open files") && len(emfile) < 6 {
			emfile = append(emfile, l)
		}
	}
	if len(emfile) > 0 {
		t.Errorf("HOLE: uid 65534's runs' egress connections ran the daemon out of descriptors (the file budget's reserve does not hold them):\n%s", strings.Join(emfile, "\n"))
	}
}
