package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPidsLimit: the lowest pids.max from the process's cgroup up, in a
// cgroup v1 pids hierarchy and in v2; "max" is no limit.
func TestPidsLimit(t *testing.T) {
	root := t.TempDir()
	set := func(dir, v string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dir, "pids.max"), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set("pids/system.slice", "300")
	set("pids/system.slice/condfs.service", "max")
	set("system.slice", "max")
	set("system.slice/condfs.service", "4096")
	for _, c := range []struct {
		cgroup string
		want   int
	}{
		{"8:pids:/system.slice/condfs.service\n1:cpu:/\n", 300},
		{"0::/system.slice/condfs.service\n", 4096},
		{"8:pids:/\n0::/\n", 0},
		{"", 0},
		{"8:cpu,pids:/system.slice/condfs.service\n0::/system.slice/condfs.service\n", 300},
	} {
		if got := pidsLimit(c.cgroup, root); got != c.want {
			t.Errorf("pidsLimit(%q) = %d, want %d", c.cgroup, got, c.want)
		}
	}
}
