package daemon

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

// TestUnprivilegedDaemon runs condfs serve as an ordinary user (uid 65534),
// with no special flags, as on a laptop: /dev/fuse 0666 and fusermount3
// installed, as every mainstream distribution ships them. The daemon
// mounts through fusermount3 and still holds the /dev/fuse connection, so
// it uses the epoch notification where the kernel has it; the "entries"
// run forces the per-entry invalidation of older kernels
// (CONDFS_INVALIDATION=entries). Both must show zero stale answers across
// context switches, and revoke a held file.
func TestUnprivilegedDaemon(t *testing.T) {
	testenv.RequireUnprivilegedFUSE(t)
	for _, inval := range []string{"epoch", "entries"} {
		t.Run(inval, func(t *testing.T) {
			h := testenv.OpenHome(t, testenv.PrivateRule)
			h.Write("memories/private/p.md", "secret")
			h.Write("memories/open.md", "open")
			os.MkdirAll(h.Path("run"), 0o755)
			os.MkdirAll(h.Path("mnt/v"), 0o755)
			testenv.ChownTree(t, h.Root, testenv.Nobody)
			sock := h.Path("run/condfs.sock")
			mnt := h.Path("mnt/v")
			cmd := testenv.CommandAs(testenv.Nobody,
				testenv.Condfs(), "serve", "--root", h.Root, "--socket", sock, "--mount", mnt,
				"--context", "discord:dm", "--context", "discord:dm:7", "--context", "discord:channel:7", "--log-level", "debug")
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + h.Root}
			if inval == "entries" {
				cmd.Env = append(cmd.Env, "CONDFS_INVALIDATION=entries")
			}
			logs := &testenv.LogBuffer{}
			cmd.Stdout, cmd.Stderr = logs, logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { cmd.Wait(); close(exited) }()
			defer func() {
				cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(20 * time.Second):
					cmd.Process.Kill()
					t.Error("the daemon did not stop on SIGTERM")
				}
				if m := testenv.MountsUnder(h.Root); len(m) > 0 {
					t.Errorf("views still mounted: %v", m)
				}
			}()
			var c *control.Client
			for i := 0; ; i++ {
				var err error
				if c, err = control.Dial(sock); err == nil {
					break
				}
				if i > 500 {
					t.Fatalf("no socket: %v\n%s", err, logs.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			defer c.Close()
			wantEpoch := `"inc_epoch":true`
			if inval == "entries" {
				wantEpoch = `"inc_epoch":false`
			}
			if !strings.Contains(logs.String(), wantEpoch) {
				t.Fatalf("the daemon's log has no %s:\n%s", wantEpoch, logs.String())
			}
			sh := testenv.StartShell(t)
			v := mnt + "/memories"
			ok, id := sh.Do("open", v+"/private/p.md")
			if !ok {
				t.Fatalf("open in a DM: %s", id)
			}
			set := func(atoms []string) {
				if err := c.Call("context.set", map[string]any{"session": "default", "context": atoms}, nil); err != nil {
					t.Fatal(err)
				}
			}
			stale := 0
			for i := 0; i < 30; i++ {
				set(testenv.Guild)
				if ok, _ := sh.Do("cat", v+"/private/p.md"); ok {
					stale++
				}
				if ok, res := sh.Do("ls", v); !ok || strings.Contains(res, "private") {
					stale++
				}
				if ok, _ := sh.Do("read", id); ok {
					stale++
				}
				if ok, _ := sh.Do("cat", v+"/open.md"); !ok {
					t.Fatal("an unruled file vanished")
				}
				set(testenv.DM)
				if ok, data := sh.Do("cat", v+"/private/p.md"); !ok || data != "secret" {
					t.Fatalf("switch %d: the DM file is not back: %s", i, data)
				}
			}
			if stale != 0 {
				t.Fatalf("%d stale answers after context switches", stale)
			}
		})
	}
}
