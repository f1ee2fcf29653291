package stdiofd

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRelayed(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for _, c := range []struct {
		name string
		open func() (*os.File, error)
		want bool
	}{
		{"a regular file", func() (*os.File, error) { return os.Open(file) }, true},
		{"/dev/null", func() (*os.File, error) { return os.Open(os.DevNull) }, false},
		{"/dev/zero", func() (*os.File, error) { return os.Open("/dev/zero") }, true},
		{"a pipe", func() (*os.File, error) {
			fd, err := unix.Dup(int(r.Fd()))
			return os.NewFile(uintptr(fd), "pipe"), err
		}, false},
		{"a Unix socket", func() (*os.File, error) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err == nil {
				unix.Close(fds[1])
			}
			return os.NewFile(uintptr(fds[0]), "socket"), err
		}, true},
		{"a TCP socket", func() (*os.File, error) {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			return os.NewFile(uintptr(fd), "tcp"), err
		}, true},
	} {
		f, err := c.open()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := Relayed(int(f.Fd()))
		f.Close()
		if err != nil || got != c.want {
			t.Errorf("%s: Mappable %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	// A file on a noexec mount (root mounts one; elsewhere, not tried).
	if os.Geteuid() != 0 {
		return
	}
	noexec := t.TempDir()
	if err := unix.Mount("tmpfs", noexec, "tmpfs", unix.MS_NOEXEC, "size=1m"); err != nil {
		t.Fatalf("mount a noexec tmpfs: %v", err)
	}
	defer unix.Unmount(noexec, unix.MNT_DETACH)
	f, err := os.Create(filepath.Join(noexec, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Its mount's flags can change after the check: still mappable.
	if got, err := Relayed(int(f.Fd())); err != nil || !got {
		t.Errorf("a file on a noexec mount: Mappable %v, %v; want true", got, err)
	}
}
