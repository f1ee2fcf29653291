package changes

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func mkfifo(p string) error { return unix.Mkfifo(p, 0o644) }

// TestRestoreNeverActsOnAnInodeSwappedIn: between the moment a rollback
// looks at a path and the moment it writes it, another process may put a
// different file there (a rename in a directory it may write). The
// rollback, writing as the daemon, then never truncates, rewrites, chowns
// or chmods that file: it acts only on the inode it checked, or one it
// made itself.
func TestRestoreNeverActsOnAnInodeSwappedIn(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(v tview) error
	}{
		{"a file restored in place", func(v tview) error { return v.write("/f", "changed") }},
		{"a FIFO made again", func(v tview) error { return v.remove("/p") }},
		{"a directory made again", func(v tview) error { return v.remove("/d") }},
		{"a symlink made again", func(v tview) error { return v.remove("/l") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, root, _ := newStore(t, Options{})
			v := tview{t: t, s: s, root: root}
			must(t, os.WriteFile(filepath.Join(root, "f"), []byte("mine"), 0o644))
			must(t, os.Mkdir(filepath.Join(root, "d"), 0o755))
			must(t, os.Symlink("f", filepath.Join(root, "l")))
			must(t, mkfifo(filepath.Join(root, "p")))
			secret := filepath.Join(root, "secret")
			must(t, os.WriteFile(secret, []byte("SECRET"), 0o600))
			must(t, os.Chown(secret, 4242, 4242))
			for _, p := range []string{"f", "d", "l", "p"} {
				must(t, os.Lchown(filepath.Join(root, p), 65534, 65534))
			}
			_, _, err := s.Create("", time.Now())
			must(t, err)
			must(t, c.change(v))
			stage := "made"
			if c.name == "a file restored in place" {
				stage = "begin"
			}
			testHookRestoring = func(p, at string) {
				// The caller renames another user's file onto the name.
				if at == stage {
					os.Rename(secret, filepath.Join(root, p[1:]))
				}
			}
			defer func() { testHookRestoring = nil }()
			s.Rollback("1", false)
			var found bool
			for _, p := range []string{"secret", "f", "d", "l", "p"} {
				st, err := os.Lstat(filepath.Join(root, p))
				if err != nil || !st.Mode().IsRegular() || st.Size() != 6 {
					continue
				}
				b, _ := os.ReadFile(filepath.Join(root, p))
				if string(b) != "SECRET" {
					continue
				}
				found = true
				sys := st.Sys().(*syscall.Stat_t)
				if sys.Uid != 4242 || sys.Mode&0o7777 != 0o600 {
					t.Fatalf("the swapped-in file at %s was given uid %d mode %o", p, sys.Uid, sys.Mode&0o7777)
				}
			}
			if !found {
				t.Fatalf("the swapped-in file was truncated or rewritten")
			}
		})
	}
}

// TestRestoreNeverChownsADirectorySwappedIn: a directory another process
// renames onto the one a rollback just made again is never given the
// directory's recorded owner and mode.
func TestRestoreNeverChownsADirectorySwappedIn(t *testing.T) {
	s, root, _ := newStore(t, Options{})
	v := tview{t: t, s: s, root: root}
	must(t, os.Mkdir(filepath.Join(root, "d"), 0o755))
	must(t, os.Lchown(filepath.Join(root, "d"), 65534, 65534))
	other := filepath.Join(root, "other")
	must(t, os.Mkdir(other, 0o700))
	must(t, os.WriteFile(filepath.Join(other, "inside"), []byte("x"), 0o600))
	must(t, os.Chown(other, 4242, 4242))
	_, _, err := s.Create("", time.Now())
	must(t, err)
	must(t, v.remove("/d"))
	testHookRestoring = func(p, at string) {
		if at == "made" {
			d := filepath.Join(root, "d")
			if err := os.Rename(d, d+".made"); err != nil {
				t.Errorf("rename: %v", err)
			}
			if err := os.Rename(other, d); err != nil {
				t.Errorf("rename: %v", err)
			}
		}
	}
	defer func() { testHookRestoring = nil }()
	s.Rollback("1", false)
	var dst syscall.Stat_t
	must(t, syscall.Lstat(filepath.Join(root, "d"), &dst))
	if dst.Uid != 4242 || dst.Mode&0o7777 != 0o700 {
		t.Fatalf("the swapped-in directory was given uid %d mode %o", dst.Uid, dst.Mode&0o7777)
	}
}
