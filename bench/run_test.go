package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
)

// BenchmarkRun: the cost of one command, /bin/true, three ways in one run:
// started directly, in bubblewrap with comparable confinement (new user,
// mount, PID, IPC, UTS and network namespaces, a read-only /usr, private
// /tmp, /proc and /dev; no seccomp, no Landlock), and through condfs run
// (a policy decision, the sandbox built, confined and torn down). Root.
//
//	cd bench && go test -run '^$' -bench Run -benchtime 100x
func BenchmarkRun(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("condfs run's benchmark needs root (it mounts a view)")
	}
	dir := b.TempDir()
	bin := filepath.Join(dir, "condfs")
	if err := build("..", "./cmd/condfs", bin); err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(dir, "home")
	for _, d := range []string{"config", "blocks/conditional", "memories", "workspace", "mnt"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "config/conditions.toml"), []byte("[sandbox]\nbinaries = [\"/usr/bin/true\", \"/bin/true\"]\n"), 0o644)
	os.WriteFile(filepath.Join(root, "config/policy.yaml"), []byte("version: 1\nroles:\n  default:\n    tools:\n      exec: {mode: allow}\n"), 0o644)
	sock := filepath.Join(root, "run/condfs.sock")
	d := exec.Command(bin, "serve", "--root", root, "--socket", sock, "--log-level", "error")
	if err := d.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { d.Process.Signal(os.Interrupt); d.Wait() }()
	var c *control.Client
	for i := 0; ; i++ {
		var err error
		if c, err = control.Dial(sock); err == nil {
			break
		}
		if i > 500 {
			b.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer c.Close()
	if err := c.Call("session.open", map[string]any{"id": "s", "mount": filepath.Join(root, "mnt/s"), "context": []string{"internal"}}, nil); err != nil {
		b.Fatal(err)
	}
	each := func(b *testing.B, argv ...string) {
		for b.Loop() {
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				b.Fatalf("%v: %v %s", argv, err, out)
			}
		}
	}
	b.Run("direct", func(b *testing.B) { each(b, "/bin/true") })
	if bwrap, err := exec.LookPath("bwrap"); err == nil {
		b.Run("bwrap", func(b *testing.B) {
			each(b, bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
				"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
				"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--", "/bin/true")
		})
	} else {
		b.Log("no bwrap on this machine: the comparison is skipped (apt-get install bubblewrap)")
	}
	b.Run("condfs-run", func(b *testing.B) { each(b, bin, "run", "--socket", sock, "--session", "s", "--", "/bin/true") })
}
