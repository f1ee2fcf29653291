package safepath

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestNoSymlinkAnywhere(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	os.Mkdir(real, 0o755)
	os.Symlink(real, filepath.Join(dir, "link"))
	if _, err := OpenDir(filepath.Join(dir, "link")); err == nil {
		t.Fatal("opened a symlink as the last component")
	}
	if err := MkdirAll(filepath.Join(dir, "link", "a", "b"), 0o755); err == nil {
		t.Fatal("made directories through a symlink")
	}
	if _, err := os.Stat(filepath.Join(real, "a")); err == nil {
		t.Fatal("a directory was created through the symlink")
	}
	if err := MkdirAll(filepath.Join(dir, "x", "y"), 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := OpenDir(filepath.Join(dir, "x", "y"))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if empty, err := Empty(fd); err != nil || !empty {
		t.Fatalf("new directory: empty %v %v", empty, err)
	}
	os.WriteFile(filepath.Join(dir, "x", "y", "f"), nil, 0o644)
	if empty, _ := Empty(fd); empty {
		t.Fatal("a directory with a file is empty")
	}
}
