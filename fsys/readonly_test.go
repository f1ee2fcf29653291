package fsys

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/condfs/condfs/acl"
)

// readOnlyRules list paths of the view that a run may execute.
const readOnlyRules = `
[sandbox]
binaries = ["/bin/sh", "/workspace/bin/", "/workspace/tool.sh", "/workspace/tools/bin/"]
`

// listByReload applies, as a reload does, the rules text with path added
// to its [sandbox] binaries (text must list "/bin/sh").
func listByReload(t *testing.T, v *View, rules *atomic.Pointer[acl.Config], text, path string) {
	t.Helper()
	listed, err := acl.Parse("conditions.toml", []byte(strings.Replace(text, `"/bin/sh"`, `"/bin/sh", "`+path+`"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Invalidate(rules.Swap(listed)); err != nil {
		t.Fatal(err)
	}
}

// TestReadOnlyExecListed: what [sandbox] binaries lists of the view is
// read-only through the view, for every caller and in every context: no
// write, make, remove, rename onto or out of it, link, attribute change,
// and no move of a directory holding it; a second name of a file there
// hides it; a reload that lists a path cuts the files held open for
// writing there. Reading it, and everything else, stay as they were: an
// agent must not write and run its own copy of git from a listed
// directory.
func TestReadOnlyExecListed(t *testing.T) {
	canMount(t)
	mem, work, mnt := t.TempDir(), t.TempDir(), t.TempDir()
	for _, d := range []string{"bin", "tools/bin", "other"} {
		os.MkdirAll(filepath.Join(work, d), 0o755)
	}
	for _, f := range []string{"bin/x", "tool.sh", "tools/bin/y", "later"} {
		os.WriteFile(filepath.Join(work, f), []byte("#!/bin/sh\necho ran\n"), 0o755)
	}
	os.WriteFile(filepath.Join(work, "bin/linked"), []byte("two names\n"), 0o644)
	os.Link(filepath.Join(work, "bin/linked"), filepath.Join(work, "other/linked"))
	rules, host := testRulesHost(t, readOnlyRules)
	v, err := host.Mount(Options{Mountpoint: mnt, Memories: mem, Workspace: work, Rules: rules, Context: dm, Owner: uint32(os.Getuid())})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Unmount()

	const erofs = "Read-only file system"
	for _, c := range []struct{ script, want string }{
		{"cat workspace/bin/x workspace/tool.sh | grep -c ran", "2"},
		{"echo y > workspace/bin/x", erofs},
		{"echo y >> workspace/tool.sh", erofs},
		{"touch workspace/bin/new", erofs},
		{"mkdir workspace/bin/d", erofs},
		{"ln -s x workspace/bin/l", erofs},
		{"rm workspace/bin/x", erofs},
		{"rm workspace/tool.sh", erofs},
		{"mv workspace/bin/x workspace/other/x", erofs},
		{"mv workspace/bin workspace/b2", erofs},
		{"mv workspace/tools workspace/t2", erofs},
		{"mkdir workspace/t3 && mv -T workspace/t3 workspace/tools", erofs},
		{"echo z > workspace/other/z && mv workspace/other/z workspace/tool.sh", erofs},
		{"ln workspace/bin/x workspace/other/hard", "Operation not permitted"}, // the hard-link rule
		{"chmod 700 workspace/bin/x", erofs},
		{"touch -d 2001-01-01 workspace/tool.sh", erofs},
		{"truncate -s 0 workspace/tools/bin/y", erofs},
		{"cat workspace/bin/linked", "No such file"},
		{"echo ok > workspace/other/w && cat workspace/other/w && mv workspace/other/w workspace/w && rm workspace/w && echo done", "ok\ndone"},
	} {
		if got := sh(t, mnt, c.script+" 2>&1"); !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.script, got, c.want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(work, "bin/x")); string(b) != "#!/bin/sh\necho ran\n" {
		t.Errorf("bin/x in the backing: %q", b)
	}

	// A file held open for writing is cut off when a reload lists it.
	held := exec.Command("python3", "-c", `import sys
f = open("workspace/later", "a")
f.write("a"); f.flush()
print("open", flush=True)
sys.stdin.readline()
try:
    f.write("b"); f.flush(); print("wrote")
except OSError as e:
    print("cut", e.strerror)
`)
	held.Dir = mnt
	in, _ := held.StdinPipe()
	out, _ := held.StdoutPipe()
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "open" {
		t.Fatalf("held: %q", lines.Text())
	}
	listByReload(t, v, rules, readOnlyRules, "/workspace/later")
	in.Write([]byte("\n"))
	lines.Scan()
	got := lines.Text()
	held.Wait()
	if !strings.HasPrefix(got, "cut") {
		t.Errorf("a write through a handle after the reload listed its file: %q", got)
	}
}
