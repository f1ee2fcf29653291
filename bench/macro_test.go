package bench

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// The macro benchmarks run an agent's real file work over a real tree: a
// copy of this Go toolchain's src/ (about 11,500 files, 157 MB), made at
// bench time in the workspace and committed into a git repository there.
// Two rules govern part of it: src/net/ is allowed in the session's guild
// (ruled, visible) and src/crypto/ only in a DM (hidden). Each workload runs
// natively, through go-fuse's loopback and through the condfs view, in one
// run (see docs/performance.md):
//
//	cd bench && go test -run '^$' -bench Macro -benchtime 5x

// macroRules are added to the fixture's conditions.toml.
const macroRules = `
[workspace."/src/net/"]
when = "discord:guild:7"
action = "allow"

[workspace."/src/crypto/"]
when = "discord:dm"
action = "allow"
`

var macroOnce struct {
	sync.Once
	err error
}

// macroTree copies GOROOT/src into the workspace and commits it.
func macroTree(b *testing.B) {
	macroOnce.Do(func() {
		goroot, err := exec.Command("go", "env", "GOROOT").Output()
		if err != nil {
			macroOnce.err = fmt.Errorf("go env GOROOT: %w", err)
			return
		}
		src := filepath.Join(strings.TrimSpace(string(goroot)), "src")
		dst := filepath.Join(fx.backing, "src")
		steps := [][]string{
			{"cp", "-a", src, dst},
			{"git", "-C", dst, "init", "-q"},
			{"git", "-C", dst, "-c", "user.name=bench", "-c", "user.email=bench@example.com", "add", "-A"},
			// The commit's automatic gc packs the loose objects in the
			// foreground: detached, it removed them while the first
			// variant's timed runs walked the tree.
			{"git", "-C", dst, "-c", "user.name=bench", "-c", "user.email=bench@example.com", "-c", "gc.autoDetach=false", "commit", "-q", "-m", "tree"},
		}
		for _, s := range steps {
			if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
				macroOnce.err = fmt.Errorf("%v: %v\n%s", s, err, out)
				return
			}
		}
		// Every variant may see the repository as the same user.
		exec.Command("git", "config", "--system", "--add", "safe.directory", "*").Run()
		os.MkdirAll(filepath.Join(fx.backing, "scratch"), 0o777)
		syscall.Sync()
	})
	if macroOnce.err != nil {
		b.Fatal(macroOnce.err)
	}
}

// walk lstats every entry below root, as find -type f -size +1k does.
func walk(b *testing.B, root string) (files int) {
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a hidden or vanished entry
		}
		var st syscall.Stat_t
		if syscall.Lstat(p, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
			files++
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return files
}

// dropDentries empties the kernel's dentry and inode caches (not the page
// cache): the next walk looks every name up again, on every variant.
func dropDentries(b *testing.B) {
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkMacroWalkCold(b *testing.B) {
	each(b, func(b *testing.B, dir string) {
		macroTree(b)
		root := filepath.Join(dir, "src")
		for b.Loop() {
			b.StopTimer()
			dropDentries(b)
			b.StartTimer()
			walk(b, root)
		}
	})
}

func BenchmarkMacroWalkWarm(b *testing.B) {
	each(b, func(b *testing.B, dir string) {
		macroTree(b)
		root := filepath.Join(dir, "src")
		for b.Loop() {
			b.StopTimer()
			walk(b, root) // the first of two walks in a row
			b.StartTimer()
			walk(b, root)
		}
	})
}

func BenchmarkMacroGrep(b *testing.B) {
	needle := []byte("func main")
	each(b, func(b *testing.B, dir string) {
		macroTree(b)
		root := filepath.Join(dir, "src")
		for b.Loop() {
			hits := 0
			filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return nil
				}
				if data, err := os.ReadFile(p); err == nil && bytes.Contains(data, needle) {
					hits++
				}
				return nil
			})
			if hits == 0 {
				b.Fatal("grep found nothing")
			}
		}
	})
}

// BenchmarkMacroGrepR is the stretch goal's workload as stated: GNU grep
// -r over the tree, warm (a first grep before the timed ones).
func BenchmarkMacroGrepR(b *testing.B) { each(b, grepR) }

// grepR times a warm grep -r -l over the Go source tree in the view dir.
func grepR(b *testing.B, dir string) {
	macroTree(b)
	root := filepath.Join(dir, "src")
	grep := func() {
		// grep exits 1 with no match and 2 on an unreadable file; what
		// counts is that it listed matches.
		out, err := exec.Command("grep", "-r", "-l", "func main", root).Output()
		if len(out) == 0 {
			b.Fatalf("grep -r found nothing: %v", err)
		}
	}
	grep()
	for b.Loop() {
		grep()
	}
}

func BenchmarkMacroGitStatus(b *testing.B) {
	each(b, func(b *testing.B, dir string) {
		macroTree(b)
		root := filepath.Join(dir, "src")
		for b.Loop() {
			cmd := exec.Command("git", "-C", root, "status", "--porcelain")
			cmd.Env = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("git status: %v\n%s", err, out)
			}
		}
	})
}

// BenchmarkMacroAgentMix: what an agent's file tools do: list a
// directory, read ten files from it, write one file, over and over.
func BenchmarkMacroAgentMix(b *testing.B) {
	dirs := []string{"strings", "net/http", "os", "bufio", "sort", "io", "bytes", "time"}
	each(b, func(b *testing.B, dir string) {
		macroTree(b)
		i := 0
		for b.Loop() {
			d := filepath.Join(dir, "src", dirs[i%len(dirs)])
			ents, err := os.ReadDir(d)
			if err != nil {
				b.Fatal(err)
			}
			read := 0
			for _, e := range ents {
				if read == 10 {
					break
				}
				if e.Type().IsRegular() {
					if _, err := os.ReadFile(filepath.Join(d, e.Name())); err != nil {
						b.Fatal(err)
					}
					read++
				}
			}
			out := filepath.Join(dir, "scratch", fmt.Sprintf("note%d.md", i%16))
			if err := os.WriteFile(out, []byte("agent note\n"), 0o644); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
