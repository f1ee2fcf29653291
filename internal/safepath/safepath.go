// Package safepath opens and makes directories named by absolute paths
// without following a symlink in any component, for the places where a
// path comes from a less trusted party (a mountpoint named over the control
// socket): a symlink swapped into the path can then never redirect the
// daemon's mount, mkdir or unmount.
package safepath

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// OpenDir opens a directory as O_PATH without following a symlink in any
// component.
func OpenDir(p string) (int, error) {
	for {
		fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("%s: %w (no symlink may be on the way)", p, err)
		}
		return fd, nil
	}
}

// MkdirAll creates p and its missing parents with mode, refusing a symlink
// in any component.
func MkdirAll(p string, mode uint32) error {
	p = filepath.Clean(p)
	if fd, err := OpenDir(p); err == nil {
		unix.Close(fd)
		return nil
	}
	parent := filepath.Dir(p)
	if parent != p {
		if err := MkdirAll(parent, mode); err != nil {
			return err
		}
	}
	pfd, err := OpenDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, filepath.Base(p), mode); err != nil && err != unix.EEXIST {
		return fmt.Errorf("mkdir %s: %w", p, err)
	}
	return nil
}

// Empty reports whether the directory an O_PATH fd stands for is empty.
func Empty(pathFD int) (bool, error) {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pathFD), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return false, err
		}
		if n <= 0 {
			return true, nil
		}
		for off := 0; off < n; {
			reclen := int(buf[off+16]) | int(buf[off+17])<<8
			name := buf[off+19 : off+reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if s := string(name); s != "." && s != ".." {
				return false, nil
			}
			off += reclen
		}
	}
}

// BeneathFlags are how Beneath resolves: never above dirfd, never through
// a symlink (one on the way fails with ELOOP), never across a mount.
const BeneathFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// Beneath opens rel (a canonical path within the tree, "/" or "" for its
// root) beneath dirfd with openat2 and BeneathFlags, adding O_CLOEXEC and
// O_NOFOLLOW: a symlink as the last component fails with ELOOP, unless
// flags has O_PATH, which then opens the link itself. The kernel's EAGAIN
// (a resolution that raced with a rename) and EINTR are retried.
func Beneath(dirfd int, rel string, flags int, mode uint32) (int, error) {
	p := rel
	for len(p) > 0 && p[0] == '/' {
		p = p[1:]
	}
	if p == "" {
		p = "."
	}
	for {
		fd, err := unix.Openat2(dirfd, p, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
			Mode:    uint64(mode),
			Resolve: BeneathFlags,
		})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}
