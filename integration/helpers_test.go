// Package integration mounts real views (FUSE, as root) and drives real
// daemons over real sockets. In CI (CI=true) a test that cannot mount
// fails; elsewhere it skips with a loud reason.
package integration

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/fsys"
)

// requireFUSE fails in CI and skips elsewhere when FUSE mounts are not
// possible here.
func requireFUSE(t testing.TB) {
	t.Helper()
	why := ""
	switch {
	case os.Geteuid() != 0:
		why = "integration tests need root to mount FUSE views"
	default:
		if _, err := os.Stat("/dev/fuse"); err != nil {
			why = "no /dev/fuse: " + err.Error()
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s", why)
	}
	t.Skipf("SKIPPING FUSE TEST: %s (in CI this fails)", why)
}

type rig struct {
	t       testing.TB
	root    string
	mem, ws string
	mnt     string
	rules   *atomic.Pointer[acl.Config]
	view    *fsys.View
}

func atoms(t testing.TB, a ...string) cctx.Set {
	t.Helper()
	s, err := cctx.NewSet(a)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newRig lays out backing directories, loads conditions and mounts a view.
func newRig(t testing.TB, conditions string, ctx cctx.Set, mod ...func(*fsys.Options)) *rig {
	t.Helper()
	requireFUSE(t)
	r := &rig{t: t, root: t.TempDir()}
	r.mem = filepath.Join(r.root, "memories")
	r.ws = filepath.Join(r.root, "workspace")
	r.mnt = filepath.Join(r.root, "mnt")
	for _, d := range []string{r.mem, r.ws, r.mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := acl.Parse("conditions.toml", []byte(conditions))
	if err != nil {
		t.Fatal(err)
	}
	r.rules = new(atomic.Pointer[acl.Config])
	r.rules.Store(cfg)
	opts := fsys.Options{Mountpoint: r.mnt, Memories: r.mem, Workspace: r.ws, Rules: r.rules, Context: ctx}
	for _, m := range mod {
		m(&opts)
	}
	v, err := fsys.Mount(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.view = v
	t.Cleanup(func() {
		if err := v.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return r
}

// file writes a backing file.
func (r *rig) file(space, rel, text string) {
	r.t.Helper()
	p := filepath.Join(r.root, space, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) view_(space, rel string) string { return filepath.Join(r.mnt, space, rel) }
