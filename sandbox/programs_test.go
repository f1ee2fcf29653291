package sandbox

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// elfFile writes an ELF header of type typ (2 executable, 3 shared object)
// at p, or a script when typ is 0.
func elfFile(t *testing.T, p string, typ uint16) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	b := []byte("#!/bin/sh\necho a script, not ELF\n")
	if typ != 0 {
		b = make([]byte, 64)
		copy(b, "\x7fELF\x02\x01\x01")
		binary.LittleEndian.PutUint16(b[16:], typ)
	}
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestScanPrograms: a subtree with programs and no library is covered
// whole; in one with a library each program is covered on its own, and a
// clean subdirectory whole; libraries, scripts and the skipped directories
// are left alone.
func TestScanPrograms(t *testing.T) {
	r := t.TempDir()
	elfFile(t, r+"/a/prog", 2)
	elfFile(t, r+"/a/deep/pie", 3)
	elfFile(t, r+"/a/script", 0)
	elfFile(t, r+"/b/libfoo.so.1", 3)
	elfFile(t, r+"/b/tool", 3)
	elfFile(t, r+"/b/c/helper", 2)
	elfFile(t, r+"/b/d/data", 0)
	elfFile(t, r+"/e/libstemmer.so.0d.0.0", 3)
	elfFile(t, r+"/e/_ssl.cpython-311-x86_64-linux-gnu.so", 3)
	elfFile(t, r+"/bin/prog", 2)
	elfFile(t, r+"/f/relocatable.o", 1)
	if err := os.Symlink(r+"/a/prog", r+"/e/link"); err != nil {
		t.Fatal(err)
	}
	got, err := scanPrograms([]string{r, r + "/missing"}, []string{r + "/bin"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{r + "/a", r + "/b/c", r + "/b/tool"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("covers:\n%v\nwant\n%v", got, want)
	}
	// A directory the daemon cannot list (0311: searchable, not readable)
	// may hold programs a command knows the names of: covered whole. Root
	// lists it, and covers its program alone beside its library.
	elfFile(t, r+"/locked/libz.so.1", 3)
	elfFile(t, r+"/locked/prog", 2)
	if err := os.Chmod(r+"/locked", 0o311); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(r+"/locked", 0o755)
	got, err = scanPrograms([]string{r}, []string{r + "/bin"})
	if err != nil {
		t.Fatal(err)
	}
	want = []string{r + "/a", r + "/b/c", r + "/b/tool", r + "/locked"}
	if os.Geteuid() == 0 {
		want[3] = r + "/locked/prog"
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("covers with an unlistable directory:\n%v\nwant\n%v", got, want)
	}
	// A tree without a library anywhere is covered from its root.
	only := t.TempDir()
	elfFile(t, only+"/x/y/prog", 2)
	if got, _ := scanPrograms([]string{only}, nil); !reflect.DeepEqual(got, []string{only}) {
		t.Errorf("covers of a tree of programs: %v", got)
	}
}

// hostProgram finds a program of a library directory on this host that the
// run's tests can call, or fails in CI (whose machines have git).
func hostProgram(t *testing.T) string {
	for _, p := range []string{"/usr/lib/git-core/git", "/usr/libexec/git-core/git"} {
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no git under /usr/lib/git-core: the loader cases cannot be shown (CI machines have it)")
	}
	t.Skip("no git program in a library directory on this host")
	return ""
}

// TestLoaderRunsNoProgram: the ELF interpreter, which every dynamic program
// needs executable, cannot be handed a program of the library directories
// that the run may not execute: not one outside binaries, not a listed one
// its context does not allow (which execve refuses too). Allowing it is
// live and reversible. Before the noexec covers both ran (the listed one by
// execve as well: Landlock let every listed binary run).
func TestLoaderRunsNoProgram(t *testing.T) {
	git := hostProgram(t)
	const ld = "/lib64/ld-linux-x86-64.so.2"
	spec := testSpec(t, "")
	spec.Binaries = append(append([]string{}, testBinaries...), git)
	s := startSession(t, spec)
	try := func(cmd string) string { return s.do(cmd + " --version >/dev/null 2>&1; echo $?") }
	if got := try(ld); got != "0" {
		t.Fatalf("the interpreter itself: exit %s", got)
	}
	if got := try(git); got != "126" {
		t.Errorf("listed, not allowed, by execve: exit %s, want 126", got)
	}
	if got := try(ld + " " + git); got != "127" {
		t.Errorf("listed, not allowed, through %s: exit %s, want 127 (cannot map)", ld, got)
	}
	if err := s.r.Allow(append(append([]string{}, testBinaries...), git)); err != nil {
		t.Fatal(err)
	}
	if got := try(git); got != "0" {
		t.Errorf("allowed, by execve: exit %s", got)
	}
	if got := try(ld + " " + git); got != "0" {
		t.Errorf("allowed, through the interpreter: exit %s", got)
	}
	if err := s.r.Allow(testBinaries); err != nil {
		t.Fatal(err)
	}
	if got := try(git); got != "126" {
		t.Errorf("allowed no more, by execve: exit %s, want 126", got)
	}
	if got := try(ld + " " + git); got != "127" {
		t.Errorf("allowed no more, through the interpreter: exit %s, want 127", got)
	}

	// Every program the index covers, not listed: none maps.
	covers, _, err := hostPrograms.get()
	if err != nil {
		t.Fatal(err)
	}
	var progs []string
	for _, c := range covers {
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() && !strings.HasPrefix(c, "/usr/local/") {
			progs = append(progs, c)
		}
		if len(progs) == 20 {
			break
		}
	}
	for _, p := range progs {
		got := s.do(ld + " " + p + " --version 2>&1 | cat; true")
		if !strings.Contains(got, "failed to map segment") && !strings.Contains(got, "wrong ELF class") {
			t.Errorf("%s through the interpreter: %q, want it not mapped", p, got)
		}
	}
}
