package changes

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/aymanbagabas/go-udiff"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

func utf8Valid(b []byte) bool { return utf8.Valid(b) }

func unifiedDiff(a, b, old, now string) string { return udiff.Unified(a, b, old, now) }

// Every path below is reached beneath a root with openat2 (no symlink on
// the way, never above the root, never across a mount), and each name is
// then changed relative to its parent's descriptor: a symlink or rename
// raced into the tree makes the step fail, it never leads elsewhere.

// openParent opens p's parent directory beneath root; name is p's last
// component.
func openParent(root int, p string) (pfd int, name string, err error) {
	dir := parentOf(p)
	name = p[strings.LastIndexByte(p, '/')+1:]
	pfd, err = safepath.Beneath(root, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	return pfd, name, err
}

// removeBeneath removes p beneath root, a directory with all below it.
func removeBeneath(root int, p string) error {
	pfd, name, err := openParent(root, p)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return removeTreeAt(pfd, name)
}

// errWritten: a file of the layer changed while a commit copied it.
var errWritten = errors.New("written while it was committed")

// removeTreeAt removes name in the directory pfd, a directory with all
// below it, never across a mount: a filesystem mounted on a directory of
// the tree (which the view never shows, nor overlayfs merges) is refused
// with EXDEV, not emptied with the daemon's authority.
func removeTreeAt(pfd int, name string) error {
	var pst, st unix.Stat_t
	if err := unix.Fstat(pfd, &pst); err != nil {
		return err
	}
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return err
	}
	if st.Dev != pst.Dev {
		return unix.EXDEV
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(pfd, name, 0); err != nil && err != unix.ENOENT {
			return err
		}
		return nil
	}
	dfd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	var dst unix.Stat_t
	if err := unix.Fstat(dfd, &dst); err != nil || dst.Dev != st.Dev || dst.Ino != st.Ino {
		unix.Close(dfd)
		return unix.EXDEV // swapped or mounted on since the stat
	}
	names, err := readNames(dfd)
	if err == nil {
		for _, n := range names {
			if err = removeTreeAt(dfd, n); err != nil {
				break
			}
		}
	}
	unix.Close(dfd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return err
	}
	return nil
}

// removeLocal removes the directory dir and all below it, never across a
// mount (os.RemoveAll walks into one).
func removeLocal(dir string) error {
	pfd, err := unix.Open(filepath.Dir(dir), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return removeTreeAt(pfd, filepath.Base(dir))
}

func readNames(dfd int) ([]string, error) {
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(dfd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// mkParents makes the directories of dir missing beneath dst, as src has
// them.
func mkParents(src, dst int, dir string) error {
	if dir == "/" {
		return nil
	}
	cur, err := lowerState(dst, dir)
	if err != nil {
		return err
	}
	if cur.T == "d" {
		return nil
	}
	if err := mkParents(src, dst, parentOf(dir)); err != nil {
		return err
	}
	want, err := lowerState(src, dir)
	if err != nil {
		return err
	}
	if want.T != "d" {
		return unix.ENOTDIR
	}
	return copyEntry(src, dst, dir, want, cur, false, nil)
}

// copyEntry makes dst hold at p what src holds there (want; have is what
// dst has). A file, symlink or FIFO is made under a temporary name beside
// p and renamed over it, so that a reader sees the old entry or the new,
// never a part; a directory keeps what is in it when it was one already,
// and with deep is filled from src when it is made (discard puts back a
// removed directory whole; a commit takes what is below one path by path,
// each checked for conflicts).
//
// note, if set, is told of the temporary name before it is made (a
// commit's journal, layer_temps.go).
func copyEntry(src, dst int, p string, want, have state, deep bool, note func(dir, name string) error) error {
	pfd, name, err := openParent(dst, p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if want.T == "d" {
		if have.T != "d" {
			if have.T != "n" {
				if err := removeTreeAt(pfd, name); err != nil {
					return err
				}
			}
			if err := unix.Mkdirat(pfd, name, 0o700); err != nil && err != unix.EEXIST {
				return err
			}
		}
		dfd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		if err := unix.Fchown(dfd, int(want.UID), int(want.GID)); err != nil {
			return err
		}
		if err := unix.Fchmod(dfd, want.Mode); err != nil {
			return err
		}
		if have.T != "d" && deep {
			names, err := listDir(src, p)
			if err != nil {
				return err
			}
			for _, n := range names {
				cp := joinPath(p, n)
				w, err := lowerState(src, cp)
				if err != nil {
					return err
				}
				if w.T == "n" || w.T == "w" {
					continue
				}
				if err := copyEntry(src, dst, cp, w, none, true, note); err != nil {
					return err
				}
			}
		}
		return nil
	}
	tmp := tempName()
	if note != nil {
		if err := note(parentOf(p), tmp); err != nil {
			return err
		}
	}
	switch want.T {
	case "l":
		if err := unix.Symlinkat(want.Link, pfd, tmp); err != nil {
			return err
		}
		if err := unix.Fchownat(pfd, tmp, int(want.UID), int(want.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			unix.Unlinkat(pfd, tmp, 0)
			return err
		}
	case "f":
		if err := copyFile(src, p, pfd, tmp); err != nil {
			unix.Unlinkat(pfd, tmp, 0)
			return err
		}
	case "p":
		if err := unix.Mkfifoat(pfd, tmp, want.Mode); err != nil {
			return err
		}
		if err := unix.Fchownat(pfd, tmp, int(want.UID), int(want.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			unix.Unlinkat(pfd, tmp, 0)
			return err
		}
	default:
		return unix.EOPNOTSUPP
	}
	if have.T == "d" {
		if err := removeTreeAt(pfd, name); err != nil {
			unix.Unlinkat(pfd, tmp, 0)
			return err
		}
	}
	if testHookTemp != nil {
		testHookTemp(p, tmp)
	}
	if err := unix.Renameat(pfd, tmp, pfd, name); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return err
	}
	return nil
}

// testHookCopied, if set, is called once a file's content is copied,
// before the copy is checked against the file.
var testHookCopied func(p string)

// testHookTemp, if set, is called once a temporary is made, before it is
// renamed over p.
var testHookTemp func(p, tmp string)

// tempName is a name no one else picks: a commit's file before its rename.
func tempName() string {
	var b [8]byte
	rand.Read(b[:])
	return ".condfs-staged-" + hex.EncodeToString(b[:])
}

// copyFile writes a copy of p beneath src to a new file tmp in pfd, with
// the mode, owner and mtime of the file it copies, and syncs it before the
// rename that shows it. They are taken from the descriptor the content is
// read from, never from an earlier look at p: the session may have renamed
// its own file over p since, and would get another's owner and setuid bits.
func copyFile(src int, p string, pfd int, tmp string) error {
	in, err := safepath.Beneath(src, p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s is no longer a regular file: %w", p, unix.EAGAIN)
	}
	want := stateOf(&st)
	out, err := unix.Openat(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(out)
	if err := copyFD(out, in); err != nil {
		return err
	}
	if testHookCopied != nil {
		testHookCopied(p)
	}
	// A file written while it was copied would be committed torn: it is
	// left for a commit run again.
	var after unix.Stat_t
	if err := unix.Fstat(in, &after); err != nil {
		return err
	}
	if after.Size != st.Size || after.Mtim != st.Mtim || after.Ctim != st.Ctim {
		return errWritten
	}
	if err := unix.Fchown(out, int(want.UID), int(want.GID)); err != nil {
		return err
	}
	if err := unix.Fchmod(out, want.Mode); err != nil {
		return err
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(want.Mtime)}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(out), ts, 0); err != nil {
		return err
	}
	return unix.Fdatasync(out)
}
