package fsys

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadOnlyMmapAfterListing: a file held open for writing and mapped
// shared before a reload lists it (makes it read-only, decision.readOnly).
// The reload cuts the writable handle and drops the file's pages; while the
// writer stays open no handle reads the file, so its pages cannot come
// back for the held mapping to write without asking the daemon
// (fuse_page_mkwrite sends nothing). The threat: a read-only open brings
// a page back, the mapping writes "PWNED" into it, and the view shows (and
// a run executes) the writer's bytes, the backing file unchanged.
func TestReadOnlyMmapAfterListing(t *testing.T) {
	canMount(t)
	mem, work, mnt := t.TempDir(), t.TempDir(), t.TempDir()
	orig := "#!/bin/sh\necho trusted-tool\n" + strings.Repeat("#", 100) + "\n"
	os.WriteFile(filepath.Join(work, "later"), []byte(orig), 0o755)
	rules, host := testRulesHost(t, readOnlyRules)
	v, err := host.Mount(Options{Mountpoint: mnt, Memories: mem, Workspace: work, Rules: rules, Context: dm, Owner: uint32(os.Getuid())})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Unmount()

	held := exec.Command("python3", "-c", `import sys, os, mmap
fd = os.open("workspace/later", os.O_RDWR)
m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
print("open", flush=True)
sys.stdin.readline()
try:
    os.pwrite(fd, b"x", 0); print("pwrite: wrote", flush=True)
except OSError as e:
    print("pwrite:", e.strerror, flush=True)
try:
    r = os.open("workspace/later", os.O_RDONLY)
    print("read:", os.read(r, 20), flush=True)
except OSError as e:
    print("read:", e.strerror, flush=True)
print("writing the mapping", flush=True)
m[10:22] = b"echo PWNED; "
print("mapped write done", flush=True)
sys.stdin.readline()
`)
	held.Dir = mnt
	in, _ := held.StdinPipe()
	out, _ := held.StdoutPipe()
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { held.Process.Kill(); held.Wait() }()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "open" {
		t.Fatalf("held: %q", lines.Text())
	}
	listByReload(t, v, rules, readOnlyRules, "/workspace/later")
	in.Write([]byte("\n"))
	var got []string
	for lines.Scan() {
		got = append(got, lines.Text())
		if lines.Text() == "mapped write done" || lines.Text() == "writing the mapping" {
			break
		}
	}
	// The writer is open still (or killed by SIGBUS at its mapping).
	view := sh(t, mnt, "cat workspace/later 2>&1; sh workspace/later 2>&1")
	back, _ := os.ReadFile(filepath.Join(work, "later"))
	if strings.Contains(view, "PWNED") || string(back) != orig {
		t.Errorf("the listed file shows what a mapping held from before the listing wrote:\nwriter: %q\nview: %q\nbacking: %q", got, view, back)
	}
	held.Process.Kill()
	held.Wait()
	if view := sh(t, mnt, "cat workspace/later"); view != strings.TrimSpace(orig) {
		t.Errorf("after the writer: %q", view)
	}
}
