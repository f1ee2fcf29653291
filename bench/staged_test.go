package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// The cost of a staged session (docs/changes.md, "Staged sessions"): a
// session "st" over the same tree whose view serves its layer merged over
// the backing tree, against the fixture's direct session, in one run:
//
//	cd bench && go test -run '^$' -bench Staged -benchtime 5x

var (
	stagedOnce sync.Once
	stagedMnt  string
	stagedErr  error
)

// stagedView opens session "st" (once), staged, in the fixture session's
// context, and gives its workspace.
func stagedView(b *testing.B) string {
	if fx == nil {
		b.Fatal("no FUSE fixture (run as root with -bench selecting FS)")
	}
	stagedOnce.Do(func() {
		mnt := filepath.Join(filepath.Dir(filepath.Dir(fx.mounts["condfs"])), "mnt-st")
		open := map[string]any{"id": "st", "mount": mnt, "context": []string{"discord:guild:7"}, "changes": "staged"}
		if benchUID > 0 {
			open["owner"] = benchUID
		}
		stagedErr = fx.ctl.Call("session.open", open, nil)
		stagedMnt = filepath.Join(mnt, "workspace")
	})
	if stagedErr != nil {
		b.Fatal(stagedErr)
	}
	return stagedMnt
}

// direct and staged: the fixture's view and the staged one.
func directAndStaged(b *testing.B, fn func(b *testing.B, dir string)) {
	if fx == nil {
		b.Fatal("no FUSE fixture (run as root with -bench selecting FS)")
	}
	for _, v := range []string{"condfs", "condfs-staged"} {
		b.Run(v, func(b *testing.B) {
			dir := fx.mounts["condfs"]
			if v == "condfs-staged" {
				dir = stagedView(b)
			}
			if err := asBenchUID(func() error { fn(b, dir); return nil }); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkStagedGrepR: BenchmarkMacroGrepR's warm grep -r -l over the Go
// source tree, through a direct view and through a staged one (nothing of
// the tree changed in the layer: every file is read from the backing tree
// through overlayfs).
func BenchmarkStagedGrepR(b *testing.B) { directAndStaged(b, grepR) }

// BenchmarkStagedCreateWrite: create, write 4 KiB and close a new file
// (kept), through a direct view and into a staged layer.
func BenchmarkStagedCreateWrite(b *testing.B) {
	directAndStaged(b, func(b *testing.B, dir string) {
		d := filepath.Join(dir, "data/create")
		buf := make([]byte, 4096)
		i := 0
		for b.Loop() {
			p := filepath.Join(d, fmt.Sprintf("st-%s-%d", filepath.Base(filepath.Dir(dir)), i))
			i++
			f, err := os.Create(p)
			if err != nil {
				b.Fatal(err)
			}
			f.Write(buf)
			f.Close()
		}
	})
}

// BenchmarkStagedReadUnchanged: open, read and close a file the staged
// session has not changed, against the same through a direct view.
func BenchmarkStagedReadUnchanged(b *testing.B) {
	directAndStaged(b, func(b *testing.B, dir string) {
		p := filepath.Join(dir, "data/file")
		buf := make([]byte, 64<<10)
		for b.Loop() {
			fd, err := syscall.Open(p, syscall.O_RDONLY, 0)
			if err != nil {
				b.Fatal(err)
			}
			syscall.Read(fd, buf)
			syscall.Close(fd)
		}
	})
}
