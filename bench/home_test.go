package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
)

// runHome is a daemon of the benchmark's own, for condfs run: condfs
// built into a temporary directory, a home whose config holds conditions
// and policy, and session "s" (context internal) open. It is stopped with
// b.
type runHome struct {
	bin, root, sock string
}

func newRunHome(b *testing.B, conditions, policy string, serve ...string) *runHome {
	b.Helper()
	dir := b.TempDir()
	h := &runHome{bin: filepath.Join(dir, "condfs"), root: filepath.Join(dir, "home")}
	if err := buildCondfs(dir); err != nil {
		b.Fatal(err)
	}
	for _, d := range []string{"config", "blocks/conditional", "memories", "workspace", "mnt"} {
		os.MkdirAll(filepath.Join(h.root, d), 0o755)
	}
	os.WriteFile(filepath.Join(h.root, "config/conditions.toml"), []byte(conditions), 0o644)
	os.WriteFile(filepath.Join(h.root, "config/policy.yaml"), []byte(policy), 0o644)
	h.sock = filepath.Join(h.root, "run/condfs.sock")
	args := append([]string{"serve", "--root", h.root, "--socket", h.sock, "--log-level", "error",
		"--audit", filepath.Join(dir, "audit.log")}, serve...)
	d := exec.Command(h.bin, args...)
	d.Stderr = os.Stderr
	if err := d.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Process.Signal(os.Interrupt); d.Wait() })
	var c *control.Client
	for i := 0; ; i++ {
		var err error
		if c, err = control.Dial(h.sock); err == nil {
			break
		}
		if i > 500 {
			b.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer c.Close()
	if err := c.Call("session.open", map[string]any{"id": "s", "mount": filepath.Join(h.root, "mnt/s"), "context": []string{"internal"}}, nil); err != nil {
		b.Fatal(err)
	}
	return h
}

// run is the argv of condfs run in session s.
func (h *runHome) run(argv ...string) []string {
	return append([]string{h.bin, "run", "--socket", h.sock, "--session", "s", "--"}, argv...)
}
