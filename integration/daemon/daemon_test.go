package daemon

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/conformance"
	"github.com/condfs/condfs/internal/testenv"
)

const e2eConditions = `
[memories."/private/"]
when = "discord:dm"
action = "allow"

[workspace."/deploy/"]
when = "discord:guild:1"
action = "allow"

[blocks.dm]
when = "discord:dm"
action = "load"

[blocks.guild]
when = "discord:guild:1"
action = "load"

[blocks.broken]
when = "discord:guild:1"
action = "load"
`

const e2ePolicy = `
version: 1
roles:
  default:
    tools:
      refund:
        mode: allow
        constraints:
          - args.amount <= 100 or when("discord:dm")
`

// TestDaemonEndToEnd: two sessions with different contexts, each view its
// own; context switches; blocks; decisions with when() against the
// session; status; and the errors a client can provoke.
func TestDaemonEndToEnd(t *testing.T) {
	h := testenv.NewHome(t, e2eConditions, e2ePolicy)
	h.Write("memories/private/p.md", "p")
	h.Write("workspace/deploy/run.sh", "r")
	h.Write("blocks/conditional/dm.md", "+++\ndescription = \"dm block\"\n+++\nbe kind\n")
	h.Write("blocks/conditional/guild.md", "+++\ndescription = \"guild block\"\n+++\nbe brief\n")
	h.Write("blocks/conditional/broken.md", "no front matter\n")
	d := testenv.Start(t, h)
	dm := d.Open("dm", map[string]any{"kind": "discord", "channel_id": "7"})
	guild := d.Open("guild", map[string]any{"kind": "discord", "channel_id": "2", "guild_id": "1"})
	if !testenv.Exists(dm+"/memories/private/p.md") || testenv.Exists(dm+"/workspace/deploy/run.sh") {
		t.Fatal("dm view shows the wrong files")
	}
	if testenv.Exists(guild+"/memories/private/p.md") || !testenv.Exists(guild+"/workspace/deploy/run.sh") {
		t.Fatal("guild view shows the wrong files")
	}

	var blocks struct {
		Blocks []struct{ Name, Description, Body string }
		Errors []struct{ Name, File, Reason string }
	}
	d.Call("blocks.list", map[string]any{"session": "guild"}, &blocks)
	if len(blocks.Blocks) != 1 || blocks.Blocks[0].Name != "guild" || blocks.Blocks[0].Body != "be brief\n" ||
		len(blocks.Errors) != 1 || blocks.Errors[0].Name != "broken" {
		t.Fatalf("guild blocks: %+v", blocks)
	}
	d.Call("blocks.list", map[string]any{"context": []string{"discord:dm"}}, &blocks)
	if len(blocks.Blocks) != 1 || blocks.Blocks[0].Name != "dm" {
		t.Fatalf("explicit-context blocks: %+v", blocks)
	}

	type decision struct {
		Decision string   `json:"decision"`
		Role     *string  `json:"role"`
		Reasons  []string `json:"reasons"`
	}
	var dec decision
	d.Call("tool.decide", map[string]any{"session": "dm", "tool": "refund", "args": map[string]any{"amount": 500}}, &dec)
	if dec.Decision != "allow" {
		t.Fatalf("dm refund: %+v", dec)
	}
	d.Call("tool.decide", map[string]any{"session": "guild", "tool": "refund", "args": map[string]any{"amount": 500}}, &dec)
	if dec.Decision != "deny" || len(dec.Reasons) == 0 {
		t.Fatalf("guild refund: %+v", dec)
	}
	d.Call("tool.decide", map[string]any{"tool": "refund", "args": map[string]any{"amount": 500}}, &dec)
	if dec.Decision != "deny" || !strings.Contains(strings.Join(dec.Reasons, " "), "session") {
		t.Fatalf("sessionless refund: %+v", dec)
	}
	d.Call("tool.decide", map[string]any{"context": []string{"discord:dm"}, "tool": "refund", "args": map[string]any{"amount": 500}}, &dec)
	if dec.Decision != "allow" {
		t.Fatalf("explicit-context refund: %+v", dec)
	}
	// A request with a duplicate key at any depth is an invalid request,
	// never guessed at (control.md): in the arguments, and in the envelope,
	// where encoding/json would run the last "method".
	for _, line := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tool.decide","params":{"tool":"refund","args":{"amount":1,"amount":1000}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"status","method":"session.close","params":{"id":"dm"}}`,
		// Folded onto "args" by encoding/json, which kept the last: the
		// decision was the allowed amount's (the scanner compared exact keys).
		`{"jsonrpc":"2.0","id":1,"method":"tool.decide","params":{"tool":"refund","args":{"amount":1000},"argſ":{"amount":1}}}`,
	} {
		raw := rawCall(t, d.Socket, line)
		if !strings.Contains(raw, `"code":-32600`) || !strings.Contains(raw, "duplicate") {
			t.Fatalf("duplicate key: %s", raw)
		}
	}

	// Switching the dm session to the guild shows the guild's files at once.
	d.SetContext("dm", []string{"discord:guild:1", "discord:channel:3"})
	if testenv.Exists(dm+"/memories/private/p.md") || !testenv.Exists(dm+"/workspace/deploy/run.sh") {
		t.Fatal("view did not follow the context switch")
	}
	var got struct{ Atoms []string }
	d.Call("context.get", map[string]any{"session": "dm"}, &got)
	if strings.Join(got.Atoms, " ") != "discord:channel:3 discord:guild:1" {
		t.Fatalf("context.get: %v", got.Atoms)
	}
	var check struct {
		Decision string
		Rules    []struct{ Key string }
	}
	d.Call("path.check", map[string]any{"session": "guild", "space": "memories", "path": "private/p.md"}, &check)
	if check.Decision != "deny" || len(check.Rules) != 1 || check.Rules[0].Key != "/private/" {
		t.Fatalf("path.check: %+v", check)
	}

	var status struct {
		Version  string
		Sessions []struct{ ID string }
		Config   struct {
			Conditions struct {
				Path       string
				Generation int
				Error      *string
			}
			Policy struct{ Generation int }
		}
	}
	d.Call("status", map[string]any{}, &status)
	if status.Version == "" || len(status.Sessions) != 2 || status.Config.Conditions.Generation != 1 ||
		status.Config.Conditions.Error != nil || status.Config.Policy.Generation != 1 {
		t.Fatalf("status: %+v", status)
	}

	// Errors, each with the right code, and the connection stays usable.
	d.CallErr("context.set", map[string]any{"session": "nope", "context": []string{"tui"}}, control.CodeUnknownSession)
	d.CallErr("context.set", map[string]any{"session": "dm", "context": []string{"discord:role:1"}}, control.CodeInvalidParams)
	d.CallErr("session.open", map[string]any{"id": "x", "mount": h.Path("mnt/x")}, control.CodeInvalidParams)
	d.CallErr("session.open", map[string]any{"id": "bad id!", "mount": h.Path("mnt/y"), "context": []string{"tui"}}, control.CodeInvalidParams)
	d.CallErr("session.open", map[string]any{"id": "dm", "mount": h.Path("mnt/z"), "context": []string{"tui"}}, control.CodeSessionExists)
	d.CallErr("no.such.method", map[string]any{}, control.CodeMethodNotFound)
	d.CallErr("path.check", map[string]any{"context": []string{}, "space": "memories", "path": "a\x00b"}, control.CodeInvalidParams)

	conn, err := net.Dial("unix", d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	for _, tc := range []struct {
		line string
		code int
	}{
		{`{"jsonrpc":"2.0","id":1,"method":`, control.CodeParse},
		{`not json`, control.CodeParse},
		{`[1,2]`, control.CodeInvalidRequest},
		{`{"jsonrpc":"1.0","id":2,"method":"status"}`, control.CodeInvalidRequest},
		{`{"jsonrpc":"2.0","id":3,"method":"session.close","params":{"id":5}}`, control.CodeInvalidParams},
		{`{"jsonrpc":"2.0","id":4,"method":"status","params":{}}`, 0},
	} {
		fmt.Fprintln(conn, tc.line)
		answer, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: connection closed: %v", tc.line, err)
		}
		var resp struct {
			Error *control.Error `json:"error"`
		}
		json.Unmarshal([]byte(answer), &resp)
		if (tc.code == 0) != (resp.Error == nil) || (resp.Error != nil && resp.Error.Code != tc.code) {
			t.Fatalf("%s: %s, want code %d", tc.line, answer, tc.code)
		}
	}
	// An oversized line gets an error and the connection is closed.
	big := `{"jsonrpc":"2.0","id":9,"method":"status","params":{"pad":"` + strings.Repeat("x", control.MaxLine) + `"}}`
	fmt.Fprintln(conn, big)
	answer, _ := r.ReadString('\n')
	if !strings.Contains(answer, fmt.Sprint(control.CodeInvalidRequest)) {
		t.Fatalf("oversized line: %.200s", answer)
	}
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("connection still open after an oversized line")
	}
	// Other connections are unaffected.
	d.Call("status", map[string]any{}, nil)

	d.Call("session.close", map[string]any{"id": "dm"}, nil)
	if len(testenv.MountsUnder(h.Path("mnt/dm"))) != 0 {
		t.Fatal("session.close left the view mounted")
	}
	d.CallErr("session.close", map[string]any{"id": "dm"}, control.CodeUnknownSession)
}

func rawCall(t *testing.T, socket, line string) string {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, line)
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return answer
}

// TestNoPolicyDeniesAll runs the shared daemon cases: without a policy file
// every tool call is denied.
func TestNoPolicyDeniesAll(t *testing.T) {
	cases, err := conformance.Load("constraints.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	h := testenv.NewHome(t, "", "-")
	d := testenv.Start(t, h)
	ran := 0
	for _, c := range cases {
		if string(c.Fields["daemon"]) != "true" {
			continue
		}
		ran++
		params := map[string]any{"tool": c.Str("tool"), "args": c.Fields["args"]}
		if c.Has("roles") {
			params["roles"] = c.Fields["roles"]
		} else if c.Has("role") {
			params["role"] = c.Str("role")
		}
		if c.Has("ctx") {
			params["ctx"] = c.Fields["ctx"]
		}
		var dec struct {
			Decision string  `json:"decision"`
			Role     *string `json:"role"`
		}
		d.Call("tool.decide", params, &dec)
		if dec.Decision != c.Str("expect_decision") || dec.Role != nil {
			t.Errorf("%s: %+v, want %s", c.ID, dec, c.Str("expect_decision"))
		}
	}
	if ran == 0 {
		t.Fatal("no daemon cases in the corpus")
	}
}

// TestHotReload: each write style gives exactly one good reload; a broken
// file and a deleted file keep the last good config, with the error in
// status; a valid change applies and the views follow at once.
func TestHotReload(t *testing.T) {
	deny := "[memories.\"/private/\"]\nwhen = \"discord:dm\"\naction = \"allow\"\n"
	allow := "[memories.\"/private/\"]\nwhen = [\"discord:dm\", \"discord:guild:1\"]\naction = \"allow\"\n"
	for _, style := range []string{"inplace", "rename", "truncate", "configmap"} {
		t.Run(style, func(t *testing.T) {
			h := testenv.NewHome(t, "-", "version: 1\n")
			text := deny
			if style == "configmap" {
				testenv.ConfigmapWrite(t, h, &text, 1)
				os.Symlink("..data/conditions.toml", h.Path("config/conditions.toml"))
			} else {
				h.Write("config/conditions.toml", deny)
			}
			h.Write("memories/private/p.md", "p")
			d := testenv.Start(t, h)
			mnt := d.Open("s", testenv.Guild)
			if _, err := os.Stat(mnt + "/memories/private/p.md"); !errors.Is(err, syscall.ENOENT) {
				t.Fatalf("before: %v", err)
			}
			before := testenv.ConditionsStatus(d)
			text = allow
			testenv.WriteStyle(t, h, style, &text, 2)
			after := testenv.WaitReload(d, before, true)
			if after.Generation != before.Generation+1 {
				t.Fatalf("%s: generation %d -> %d, want exactly one reload", style, before.Generation, after.Generation)
			}
			if _, err := os.Stat(mnt + "/memories/private/p.md"); err != nil {
				t.Fatalf("after the reload the view still hides the file: %v", err)
			}
		})
	}
	t.Run("broken-then-deleted-then-fixed", func(t *testing.T) {
		h := testenv.NewHome(t, deny, "version: 1\n")
		h.Write("memories/private/p.md", "p")
		d := testenv.Start(t, h)
		mnt := d.Open("s", testenv.Guild)
		before := testenv.ConditionsStatus(d)
		broken := "[memories.\"/private/\"]\nwhen = \"discord:dm\"\naction = \"alow\"\n"
		testenv.WriteStyle(t, h, "rename", &broken, 2)
		st := testenv.WaitReload(d, before, false)
		if st.Generation != before.Generation || !strings.Contains(*st.Error, "conditions.toml:3:") {
			t.Fatalf("broken file: %+v", st)
		}
		if _, err := os.Stat(mnt + "/memories/private/p.md"); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("a broken file opened something: %v", err)
		}
		os.Remove(h.Path("config/conditions.toml"))
		time.Sleep(300 * time.Millisecond)
		st = testenv.ConditionsStatus(d)
		if st.Error == nil || !strings.Contains(*st.Error, "disappeared") {
			t.Fatalf("deleted file: %+v", st)
		}
		if _, err := os.Stat(mnt + "/memories/private/p.md"); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("a deleted file opened something: %v", err)
		}
		good := allow
		testenv.WriteStyle(t, h, "rename", &good, 3)
		st = testenv.WaitReload(d, st, true)
		if st.Generation != before.Generation+1 || st.Error != nil {
			t.Fatalf("fixed file: %+v", st)
		}
		if _, err := os.Stat(mnt + "/memories/private/p.md"); err != nil {
			t.Fatalf("valid change not applied: %v", err)
		}
	})
}

// TestPeerCredentials: a client running as another uid is refused before
// any request is read; --allow-uid lets it in.
func TestPeerCredentials(t *testing.T) {
	h := testenv.NewHome(t, "", "version: 1\n")
	// The socket directory must be reachable by the other user.
	os.Chmod(filepath.Dir(h.Root), 0o755)
	os.Chmod(h.Root, 0o755)
	os.MkdirAll(h.Path("run"), 0o755)
	d := testenv.Start(t, h, "--socket-mode", "0666")
	os.Chmod(filepath.Dir(testenv.Condfs()), 0o755)
	asNobody := func() string {
		out, _ := testenv.CommandAs(testenv.Nobody, testenv.Condfs(), "ctl", "--socket", d.Socket, "--json", "status").CombinedOutput()
		return string(out)
	}
	if out := asNobody(); !strings.Contains(out, "uid 65534 may not use this socket") {
		t.Fatalf("nobody was not refused: %s", out)
	}
	d.Stop()
	d2 := testenv.Start(t, h, "--socket-mode", "0666", "--allow-uid", "65534")
	_ = d2
	if out := asNobody(); !strings.Contains(out, `"version"`) {
		t.Fatalf("--allow-uid 65534 did not let nobody in: %s", out)
	}
}

// TestManyClients: 1,000 concurrent clients each make 100 decisions over
// their own connection; no error, and the daemon keeps no connection
// afterwards.
func TestManyClients(t *testing.T) {
	h := testenv.NewHome(t, "", e2ePolicy)
	d := testenv.Start(t, h)
	fdsBefore := countFDs(t, d.Cmd.Process.Pid)
	const clients, calls = 1000, 100
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := time.Now()
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := control.Dial(d.Socket)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for j := 0; j < calls; j++ {
				var dec struct{ Decision string }
				amount := (i*calls + j) % 200
				if err := c.Call("tool.decide", map[string]any{"tool": "refund", "args": map[string]any{"amount": amount}}, &dec); err != nil {
					errs <- err
					return
				}
				want := "deny"
				if amount <= 100 {
					want = "allow"
				}
				if dec.Decision != want {
					errs <- fmt.Errorf("amount %d: %s", amount, dec.Decision)
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d decisions from %d clients in %v", clients*calls, clients, time.Since(start))
	// Every connection is gone from the daemon once the clients left.
	deadline := time.Now().Add(5 * time.Second)
	for countFDs(t, d.Cmd.Process.Pid) > fdsBefore+2 {
		if time.Now().After(deadline) {
			t.Fatalf("daemon holds %d fds, had %d before: connections leak", countFDs(t, d.Cmd.Process.Pid), fdsBefore)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// countFDs counts a process's open fds, leaving out pipes: go-fuse keeps
// a pool of splice pipes whose size follows the load, not our bookkeeping.
// countWatches counts the inotify watches pid holds (fdinfo lists one
// "inotify wd:" line per watch).
func countWatches(t *testing.T, pid int) int {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, _ := os.ReadFile(dir + "/" + e.Name())
		n += strings.Count(string(b), "inotify wd:")
	}
	return n
}

func countFDs(t *testing.T, pid int) int {
	return len(listFDs(t, pid))
}

// listFDs names the process's open fds other than pipes, so that a leak
// report says what leaked.
func listFDs(t *testing.T, pid int) []string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var fds []string
	for _, e := range ents {
		if target, err := os.Readlink(dir + "/" + e.Name()); err == nil && !strings.HasPrefix(target, "pipe:") {
			fds = append(fds, e.Name()+" -> "+target)
		}
	}
	return fds
}

// TestSessionsDoNotLeak: opening and closing sessions leaves the daemon's
// fd count and mounts where they were.
func TestSessionsDoNotLeak(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/private/p.md", "p")
	d := testenv.Start(t, h)
	n := 0
	cycle := func() {
		mnt := d.Open("s", testenv.DM)
		if _, err := os.ReadFile(mnt + "/memories/private/p.md"); err != nil {
			t.Fatal(err)
		}
		// A directory of its own per session: its watch must go with it.
		n++
		h.Write(fmt.Sprintf("memories/d%d/x.md", n), "x")
		if _, err := os.ReadFile(fmt.Sprintf("%s/memories/d%d/x.md", mnt, n)); err != nil {
			t.Fatal(err)
		}
		d.SetContext("s", testenv.Guild)
		d.Call("session.close", map[string]any{"id": "s"}, nil)
	}
	for i := 0; i < 3; i++ {
		cycle()
	}
	beforeFDs := listFDs(t, d.Cmd.Process.Pid)
	before := len(beforeFDs)
	watchesBefore := countWatches(t, d.Cmd.Process.Pid)
	for i := 0; i < 20; i++ {
		cycle()
	}
	if w := countWatches(t, d.Cmd.Process.Pid); w > watchesBefore {
		t.Errorf("inotify watches %d -> %d over 20 sessions", watchesBefore, w)
	}
	// A shared connection closes a view's backing directories when the
	// kernel has forgotten its last node, which follows the unmount by a
	// few milliseconds.
	after := countFDs(t, d.Cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); after > before && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		after = countFDs(t, d.Cmd.Process.Pid)
	}
	if after > before {
		t.Fatalf("daemon fds %d -> %d over 20 sessions\nbefore: %q\nafter: %q", before, after, beforeFDs, listFDs(t, d.Cmd.Process.Pid))
	}
	if m := testenv.MountsUnder(h.Path("mnt")); len(m) != 0 {
		t.Fatalf("mounts left: %v", m)
	}
}

// TestCrash: kill -9 while a reader holds files open. The view fails
// closed (ENOTCONN) and a restart on the same mountpoint succeeds.
func TestCrash(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/private/p.md", "private")
	h.Write("memories/pub.md", "public")
	d := testenv.Start(t, h)
	mnt := d.Open("default", testenv.DM)
	held, err := os.Open(mnt + "/memories/private/p.md")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	d.Cmd.Process.Signal(syscall.SIGKILL)
	<-d.Exited()
	buf := make([]byte, 4)
	if _, err := held.ReadAt(buf, 0); err == nil {
		t.Fatal("a ruled file still reads after the daemon died")
	}
	for _, op := range []func() error{
		func() error { _, err := os.Stat(mnt + "/memories/pub.md"); return err },
		func() error { _, err := os.ReadDir(mnt + "/memories"); return err },
		func() error { _, err := os.Open(mnt + "/memories/pub.md"); return err },
	} {
		if err := op(); !errors.Is(err, syscall.ENOTCONN) {
			t.Fatalf("after the crash: %v, want ENOTCONN", err)
		}
	}
	os.Remove(d.Socket) // what a crash leaves may include the socket; the next start replaces it anyway
	d2 := testenv.Start(t, h, "--mount", mnt, "--context", "discord:dm")
	b, err := os.ReadFile(mnt + "/memories/private/p.md")
	if err != nil || string(b) != "private" {
		t.Fatalf("after restart: %q %v\n%s", b, err, d2.Log())
	}
	d2.Stop()
}

// TestStaleSocketAndLiveDaemon: a socket file left behind is replaced; a
// live daemon on the same path is refused.
func TestStaleSocketAndLiveDaemon(t *testing.T) {
	testenv.RequireFUSE(t)
	h := testenv.NewHome(t, "", "version: 1\n")
	os.MkdirAll(h.Path("run"), 0o700)
	l, err := net.Listen("unix", h.Path("run/condfs.sock"))
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // leaves the file, with nobody listening
	d := testenv.Start(t, h)
	out, err := exec.Command(testenv.Condfs(), "serve", "--root", h.Root, "--socket", d.Socket).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "live daemon") {
		t.Fatalf("second daemon on a live socket: %v %s", err, out)
	}
	d.Call("status", map[string]any{}, nil)
}

// TestCrashRestoresSessions: after kill -9, the next start restores every
// session from the state file, on its mountpoint and in its last context,
// before the socket accepts clients; a reader's fd from before the crash
// fails (ENOTCONN), never reads stale; a session that cannot be restored is
// reported in status.
func TestCrashRestoresSessions(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	h.Write("memories/private/p.md", "private")
	h.Write("memories/pub.md", "public")
	d := testenv.Start(t, h)
	dm := d.Open("dm", testenv.Guild)
	d.SetContext("dm", testenv.DM) // the last context is what comes back
	gone := d.Open("gone", testenv.Guild)
	held, err := os.Open(dm + "/memories/private/p.md")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	d.Cmd.Process.Signal(syscall.SIGKILL)
	<-d.Exited()
	// One mountpoint disappears while the daemon is down.
	syscall.Unmount(gone, syscall.MNT_DETACH)
	os.RemoveAll(gone)
	os.WriteFile(gone, []byte("now a file"), 0o644)
	os.Remove(d.Socket)
	d2 := testenv.Start(t, h)
	// The socket accepts only once the sessions are back: no wait here.
	if b, err := os.ReadFile(dm + "/memories/private/p.md"); err != nil || string(b) != "private" {
		t.Fatalf("the restored DM session: %q %v\n%s", b, err, d2.Log())
	}
	var res struct {
		Sessions []struct {
			ID    string   `json:"id"`
			Mount string   `json:"mount"`
			Atoms []string `json:"atoms"`
		} `json:"sessions"`
		RestoreErrors []string `json:"restore_errors"`
	}
	d2.Call("status", map[string]any{}, &res)
	if len(res.Sessions) != 1 || res.Sessions[0].ID != "dm" || res.Sessions[0].Mount != dm || strings.Join(res.Sessions[0].Atoms, " ") != "discord:channel:7 discord:dm discord:dm:7" {
		t.Fatalf("restored sessions: %+v", res.Sessions)
	}
	if len(res.RestoreErrors) != 1 || !strings.Contains(res.RestoreErrors[0], "gone") {
		t.Fatalf("restore errors: %q", res.RestoreErrors)
	}
	buf := make([]byte, 4)
	if _, err := held.ReadAt(buf, 0); err == nil {
		t.Fatal("an fd from before the crash still reads")
	}
	// A clean stop keeps the sessions too: a restart brings them back.
	d2.Stop()
	d3 := testenv.Start(t, h)
	if _, err := os.Stat(dm + "/memories/pub.md"); err != nil {
		t.Fatalf("after a clean restart: %v\n%s", err, d3.Log())
	}
	d3.Call("session.close", map[string]any{"id": "dm"}, nil)
	d3.Stop()
	d4 := testenv.Start(t, h)
	var res4 struct {
		Sessions []any `json:"sessions"`
	}
	d4.Call("status", map[string]any{}, &res4)
	if len(res4.Sessions) != 0 {
		t.Fatalf("a closed session came back: %v", res4.Sessions)
	}
}

// TestMaxSessions: beyond --max-sessions, session.open is refused with a
// clear error and nothing is mounted; closing one makes room again.
func TestMaxSessions(t *testing.T) {
	h := testenv.NewHome(t, testenv.PrivateRule, "version: 1\n")
	d := testenv.Start(t, h, "--max-sessions", "2")
	d.Open("a", testenv.DM)
	d.Open("b", testenv.DM)
	mnt := h.Path("mnt/c")
	e := d.CallErr("session.open", map[string]any{"id": "c", "mount": mnt, "context": testenv.DM}, control.CodeBusy)
	if !strings.Contains(e.Message, "too many sessions") || !strings.Contains(e.Message, "--max-sessions") {
		t.Fatalf("refusal does not say why: %q", e.Message)
	}
	if m := testenv.MountsUnder(mnt); len(m) != 0 {
		t.Fatalf("a refused session mounted %v", m)
	}
	d.Call("session.close", map[string]any{"id": "a"}, nil)
	d.Open("c", testenv.DM)
	var st struct {
		Limits struct {
			Open        int    `json:"sessions_open"`
			Max         int    `json:"max_sessions"`
			Connections string `json:"connections"`
		} `json:"limits"`
	}
	d.Call("status", map[string]any{}, &st)
	if st.Limits.Open != 2 || st.Limits.Max != 2 || st.Limits.Connections == "" {
		t.Fatalf("status limits = %+v, want 2 of 2", st.Limits)
	}
}
