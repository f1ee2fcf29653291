package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestSessionDescriptors: on the shared connection a root daemon uses, a
// session holds no file descriptor of its own, and a daemon whose hard
// descriptor limit is 20,000 and cannot be raised (no CAP_SYS_RESOURCE, as
// in a container) serves at least 10,000 sessions by default. bench/scale
// opens the 10,000.
func TestSessionDescriptors(t *testing.T) {
	const n = 2000
	h := testenv.NewHome(t, "", "version: 1\n")
	d := testenv.StartUnder(t, h, testenv.NofileLimit(20000),
		"--connections=shared", "--log-level", "error")
	var st struct {
		Limits struct {
			MaxSessions int    `json:"max_sessions"`
			Connections string `json:"connections"`
		} `json:"limits"`
	}
	d.Call("status", map[string]any{}, &st)
	if st.Limits.Connections != "shared" || st.Limits.MaxSessions < 10000 {
		t.Errorf("under a hard limit of 20,000 descriptors: limits %+v, want max_sessions >= 10000", st.Limits)
	}
	fds := func() int {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.Cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	d.Open("warm", []string{"tui"}) // the first session makes what all share
	before := fds()
	for i := range n {
		d.Open(fmt.Sprintf("s%d", i), []string{"tui"})
	}
	after := fds()
	per := float64(after-before) / n
	t.Logf("%d sessions: %d -> %d descriptors, %.3f per session", n, before, after, per)
	if per*10000 > 20000-512 {
		t.Fatalf("%.3f descriptors per session: 10,000 sessions do not fit in 20,000", per)
	}
}

// TestOneUidCannotTakeEverySession: session.open was bounded by --max-sessions
// alone, and any admitted uid may open sessions of its own: uid 65534
// opened all of them, and every other user's session.open was refused
// (-32013) until it closed some. Each uid other than root and the
// daemon's may have opened at most --max-sessions-per-uid (default an
// eighth), and the last eighth is kept for root and the daemon's uid.
func TestOneUidCannotTakeEverySession(t *testing.T) {
	h := testenv.OpenHome(t, "")
	d := testenv.Start(t, h, "--allow-uid", "65534", "--allow-uid", "1000", "--socket-mode", "0666", "--max-sessions", "16")
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	open := func(uid int, id string) (string, error) {
		mnt := h.Path("mnt/" + id)
		os.MkdirAll(mnt, 0o755)
		os.Chown(mnt, uid, uid)
		out, err := testenv.CommandAs(uid, testenv.Condfs(), "ctl", "--socket", d.Socket,
			"open", id, mnt, "--context", "discord:dm").CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	opened := 0
	var refusal string
	for i := range 16 {
		out, err := open(testenv.Nobody, fmt.Sprintf("a%d", i))
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
	d.Open("root", testenv.DM)
}

// closeWhileHeld opens sessions of uid 65534 in turn, holds n files of
// each through its mount, closes the session and then the files; then a
// fresh session holds up to fresh files. It returns what the fresh one
// held and how many descriptors the daemon holds more than at the start.
func closeWhileHeld(t *testing.T, d *testenv.Daemon, n, fresh int) (got string, leaked int) {
	t.Helper()
	pid := d.Cmd.Process.Pid
	base := testenv.FDs(pid)
	for i := 0; i < 16; i++ {
		id := fmt.Sprintf("c%d", i)
		mnt := d.OpenFor(id, testenv.Nobody, testenv.DM)
		got, stop := testenv.HoldOpen(t, testenv.Nobody, mnt+"/workspace/w.txt", n)
		d.Call("session.close", map[string]any{"id": id}, nil)
		stop()
		time.Sleep(300 * time.Millisecond)
		t.Logf("cycle %d: %s; daemon fds %d (at start %d)", i, got, testenv.FDs(pid), base)
	}
	time.Sleep(2 * time.Second)
	leaked = testenv.FDs(pid) - base
	mnt := d.OpenFor("fresh", testenv.Nobody, testenv.DM)
	got, stop := testenv.HoldOpen(t, testenv.Nobody, mnt+"/workspace/w.txt", fresh)
	stop()
	t.Logf("fresh session: %s; daemon fds now %d (%d more than at start)", got, testenv.FDs(pid), leaked)
	return got, leaked
}

// TestLostReleasesReturnTheirRoom: a session closed while a local user holds
// files of its host mount open: the mount is detached, and when the user
// closes them the FUSE connection ends; RELEASEs still queued then are
// aborted by the kernel, so giveFile never runs (and the backing fds are
// never closed). Repeated, the daemon's room for open files is gone for
// good: every new view gets ENFILE.
func TestLostReleasesReturnTheirRoom(t *testing.T) {
	got, leaked := closeWhileHeld(t, testenv.LowNofileDaemon(t), 128, 1)
	if got != "held 1 err none" {
		t.Errorf("HOLE: after sessions were closed while files of their host mounts were open, a fresh session's first open fails (%s): the lost RELEASEs never gave their descriptors back (giveFile), %d daemon fds leaked", got, leaked)
	} else if leaked > 64 {
		t.Errorf("HOLE: sessions closed while files were open leaked %d daemon descriptors (RELEASE never seen)", leaked)
	}
}

// TestOneUidCannotTakeEveryViewsRoom: the bound is per view, and any allowed uid may
// open sessions of its own: one uid opening a dozen views, each at its
// share, takes the room of all views, and another user's session fails.
func TestOneUidCannotTakeEveryViewsRoom(t *testing.T) {
	d := testenv.LowNofileDaemon(t)
	victim := d.OpenFor("victim", 1000, testenv.DM)
	var stops []func()
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	for i := 0; i < 13; i++ {
		id := fmt.Sprintf("a%d", i)
		mnt := d.Home.Path("mnt/" + id)
		os.MkdirAll(mnt, 0o755)
		os.Chown(mnt, testenv.Nobody, testenv.Nobody)
		out, err := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "ctl", "--socket", d.Socket,
			"open", id, mnt, "--context", "discord:dm").CombinedOutput()
		if err != nil {
			t.Fatalf("65534 opens session %s: %v %s", id, err, out)
		}
		got, stop := testenv.HoldOpen(t, testenv.Nobody, mnt+"/workspace/w.txt", 200)
		stops = append(stops, stop)
		t.Logf("65534's session %s: %s", id, got)
	}
	got, stop := testenv.HoldOpen(t, 1000, victim+"/workspace/w.txt", 1)
	stop()
	t.Logf("uid 1000's session: %s", got)
	if got != "held 1 err none" {
		t.Errorf("HOLE: uid 65534 opened 13 sessions of its own and held its share in each: uid 1000's session cannot open a file (%s)", got)
	}
}

// TestLostReleasesReturnTheirRoomPerSession: TestLostReleasesReturnTheirRoom held on the
// shared connection (the hub keeps serving a closed view's RELEASEs). With
// a connection per session the view's connection ends when its last file
// is closed after the session closed; RELEASEs the kernel aborts then never
// give back what takeFile took, and what an owner holds is kept for the
// daemon's life: repeated, the uid is at its bound for good.
func TestLostReleasesReturnTheirRoomPerSession(t *testing.T) {
	d := testenv.LowNofileDaemon(t, "--connections=per-session")
	got, leaked := closeWhileHeld(t, d, 120, 120)
	for _, l := range strings.Split(d.Log(), "\n") {
		if strings.Contains(l, "open files refused") || strings.Contains(l, "detached") {
			t.Logf("log: %.300s", l)
		}
	}
	if got != "held 120 err none" {
		t.Errorf("HOLE: per-session connections: after sessions were closed while files were open, a fresh session of the same uid opens only %q: the lost RELEASEs' counts stay on the uid for the daemon's life", got)
	} else if leaked > 64 {
		t.Errorf("HOLE: per-session connections: sessions closed while files were open leaked %d daemon descriptors", leaked)
	}
}

// TestLostReleasesReturnTheirRoomUnprivileged: TestLostReleasesReturnTheirRoomPerSession on
// an unprivileged daemon (a connection per session, every view its own
// uid's): once the lost counts reach half the room, every session of the
// daemon is refused files for its life.
func TestLostReleasesReturnTheirRoomUnprivileged(t *testing.T) {
	a := testenv.StartUnprivHome(t, testenv.UnprivRules, nil)
	var r unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &r)
	share := max(int(r.Max)/16, 64) - 8 // under a view's share (fsys/files.go)
	for i := 0; i < 12; i++ {
		id := fmt.Sprintf("c%d", i)
		mnt := a.Home.Path("mnt/" + id)
		os.MkdirAll(mnt, 0o755)
		testenv.ChownTree(t, mnt, testenv.Nobody)
		if err := a.Call(t, "session.open", map[string]any{"id": id, "mount": mnt, "context": testenv.DM, "owner": testenv.Nobody}, nil); err != nil {
			t.Fatalf("open %s: %v", id, err)
		}
		got, stop := testenv.HoldOpen(t, testenv.Nobody, mnt+"/workspace/w.txt", share)
		a.Call(t, "session.close", map[string]any{"id": id}, nil)
		stop()
		time.Sleep(300 * time.Millisecond)
		t.Logf("cycle %d: %s", i, got)
	}
	time.Sleep(2 * time.Second)
	got, stop := testenv.HoldOpen(t, testenv.Nobody, a.Mnt+"/workspace/w.txt", 64)
	stop()
	t.Logf("the daemon's first session now: %s", got)
	if got != "held 64 err none" {
		t.Errorf("HOLE: unprivileged daemon: after sessions were closed while files were open, its other session cannot open a file (%s): the lost RELEASEs' counts are never given back", got)
	}
}
