package fsys

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadOnlyLinkedWriterAfterListing: a session links a file under a second
// name and holds that name open for writing, in a space that lists no path
// for runs yet; then a reload lists the first name. The threat: the
// session removes its own name (not listed) and writes through the held
// handle, whose decision nothing changed; once closed,
// the listed path (one name again, no longer hidden) showed and ran the
// writer's bytes. A space that lists paths for runs now has the hard-link
// rule: every regular file with two names is hidden there and its
// handles are cut by the reload, so the second name can neither be
// written nor removed.
func TestReadOnlyLinkedWriterAfterListing(t *testing.T) {
	canMount(t)
	mem, work, mnt := t.TempDir(), t.TempDir(), t.TempDir()
	orig := "#!/bin/sh\necho trusted-tool\n"
	os.WriteFile(filepath.Join(work, "later"), []byte(orig), 0o755)
	const unlisted = "[sandbox]\nbinaries = [\"/bin/sh\"]\n"
	rules, host := testRulesHost(t, unlisted)
	v, err := host.Mount(Options{Mountpoint: mnt, Memories: mem, Workspace: work, Rules: rules, Context: dm, Owner: uint32(os.Getuid())})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Unmount()

	held := exec.Command("python3", "-c", `import sys, os
os.link("workspace/later", "workspace/alias")
fd = os.open("workspace/alias", os.O_WRONLY)
print("open", flush=True)
sys.stdin.readline()
try:
    os.unlink("workspace/alias"); print("unlink: ok", flush=True)
except OSError as e:
    print("unlink:", e.strerror, flush=True)
try:
    os.pwrite(fd, b"#!/bin/sh\necho PWNED_\n", 0); print("pwrite: wrote", flush=True)
except OSError as e:
    print("pwrite:", e.strerror, flush=True)
os.close(fd)
print("closed", flush=True)
sys.stdin.readline()
`)
	held.Dir = mnt
	in, _ := held.StdinPipe()
	out, _ := held.StdoutPipe()
	held.Stderr = os.Stderr
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { held.Process.Kill(); held.Wait() }()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "open" {
		t.Fatalf("held: %q", lines.Text())
	}
	listByReload(t, v, rules, unlisted, "/workspace/later")
	t.Logf("after listing, two names: %q", sh(t, mnt, "cat workspace/later 2>&1"))
	in.Write([]byte("\n"))
	var got []string
	for lines.Scan() {
		got = append(got, lines.Text())
		if lines.Text() == "closed" {
			break
		}
	}
	view := sh(t, mnt, "cat workspace/later 2>&1; sh workspace/later 2>&1")
	back, _ := os.ReadFile(filepath.Join(work, "later"))
	t.Logf("writer: %q\nview: %q\nbacking: %q", got, view, back)
	if strings.Contains(view, "PWNED") || string(back) != orig {
		t.Errorf("BROKE: the listed file was changed through the view after its listing:\nwriter: %q\nview: %q\nbacking: %q", got, view, back)
	}
}
