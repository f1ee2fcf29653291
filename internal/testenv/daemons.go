package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
)

// LimitedDaemon: a root daemon admitting 65534 and 1000, views of peers
// under h/views, with the daemon's RLIMIT_NOFILE lowered to nofile (the
// default --max-sessions is derived from it).
func LimitedDaemon(t *testing.T, nofile int, extra ...string) *Daemon {
	return LimitedDaemonWith(t, RunRules, nofile, extra...)
}

// LimitedDaemonWith is LimitedDaemon with other rules.
func LimitedDaemonWith(t *testing.T, rules string, nofile int, extra ...string) *Daemon {
	h := OpenHome(t, rules)
	h.Write("config/policy.yaml", RunPolicy)
	h.Write("workspace/w.txt", "work\n")
	for _, p := range []string{"memories", "workspace", "mnt"} {
		os.MkdirAll(h.Path(p), 0o777)
		os.Chmod(h.Path(p), 0o777)
	}
	n := strconv.Itoa(nofile)
	d := StartUnder(t, h, []string{"prlimit", "--nofile=" + n + ":" + n, "--"},
		append([]string{"--allow-uid", "65534", "--allow-uid", "1000", "--socket-mode", "0666", "--mount-root", h.Path("views")}, extra...)...)
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	return d
}

// LowNofileDaemon: a root daemon whose RLIMIT_NOFILE is 2048 (a view's share
// 128, the room for all views about 1,500), 65534 admitted.
func LowNofileDaemon(t *testing.T, extra ...string) *Daemon {
	h := OpenHome(t, RunRules)
	h.Write("config/policy.yaml", RunPolicy)
	h.Write("memories/pub.md", "public\n")
	h.Write("workspace/w.txt", "work\n")
	for _, p := range []string{"memories", "workspace"} {
		os.Chmod(h.Path(p), 0o777)
	}
	os.MkdirAll(h.Path("mnt"), 0o777)
	d := StartUnder(t, h, NofileLimit(2048),
		append([]string{"--allow-uid", "65534", "--allow-uid", "1000", "--socket-mode", "0666"}, extra...)...)
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	return d
}

// CheckOthersServed checks that, while the attack holds, uid 1000's session (mounted at
// victim) opens a file and root's control call is answered.
func CheckOthersServed(t *testing.T, d *Daemon, victim, attack string) {
	t.Helper()
	got, stop := HoldOpen(t, 1000, victim+"/workspace/w.txt", 1)
	stop()
	t.Logf("uid 1000's session: %s", got)
	var err error
	if c, derr := control.Dial(d.Socket); derr != nil {
		err = derr
	} else {
		err = c.Call("status", nil, nil)
		c.Close()
	}
	t.Logf("root's status: %v", err)
	if got != "held 1 err none" {
		t.Errorf("HOLE: %s: uid 1000's session cannot open a file (%s)", attack, got)
	}
	if err != nil {
		t.Errorf("HOLE: %s: root's control call fails: %v", attack, err)
	}
}

// StartUnprivileged starts condfs serve on h as uid 65534 with its default
// session in a DM, and returns its socket and its log.
func StartUnprivileged(t *testing.T, h *Home) (string, func() string) {
	t.Helper()
	os.MkdirAll(h.Path("run"), 0o755)
	os.MkdirAll(h.Path("mnt/v"), 0o755)
	ChownTree(t, h.Root, Nobody)
	sock := h.Path("run/condfs.sock")
	serve := CommandAs(Nobody,
		Condfs(), "serve", "--root", h.Root, "--socket", sock, "--mount", h.Path("mnt/v"),
		"--context", "discord:dm", "--context", "discord:dm:7", "--log-level", "debug")
	serve.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + h.Root}
	logs := &LogBuffer{}
	serve.Stdout, serve.Stderr = logs, logs
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { serve.Wait(); close(exited) }()
	t.Cleanup(func() {
		serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			serve.Process.Kill()
		}
	})
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 500 {
			t.Fatalf("no socket:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return sock, logs.String
}
