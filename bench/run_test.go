package bench

import (
	"os"
	"os/exec"
	"testing"
	"time"
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
	h := newRunHome(b, "[sandbox]\nbinaries = [\"/usr/bin/true\", \"/bin/true\"]\n",
		"version: 1\nroles:\n  default:\n    tools:\n      exec: {mode: allow}\n")
	// Two paces: back to back, and with 50 ms between commands (not
	// timed), as an agent that reads each result before the next one
	// runs: condfs then begins each command in a sandbox built during the
	// pause (runs/warm.go), where back to back each run waits for it.
	each := func(b *testing.B, gap time.Duration, argv ...string) {
		for b.Loop() {
			if gap > 0 {
				b.StopTimer()
				time.Sleep(gap)
				b.StartTimer()
			}
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				b.Fatalf("%v: %v %s", argv, err, out)
			}
		}
	}
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Log("no bwrap on this machine: the comparison is skipped (apt-get install bubblewrap)")
	}
	for _, pace := range []struct {
		name string
		gap  time.Duration
	}{{"back-to-back", 0}, {"paced", 50 * time.Millisecond}} {
		b.Run(pace.name+"/direct", func(b *testing.B) { each(b, pace.gap, "/bin/true") })
		if bwrap != "" {
			b.Run(pace.name+"/bwrap", func(b *testing.B) {
				each(b, pace.gap, bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
					"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
					"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--", "/bin/true")
			})
		}
		b.Run(pace.name+"/condfs-run", func(b *testing.B) {
			each(b, pace.gap, h.run("/bin/true")...)
		})
	}
}
