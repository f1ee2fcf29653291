package fsys

import (
	"context"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// xattrs. A root daemon acting as a caller keeps CAP_SYS_ADMIN and
// CAP_SETFCAP, so a caller other than root may only touch the user.*
// namespace and POSIX ACLs; trusted.* (which needs CAP_SYS_ADMIN) is never
// listed or read for it, and security.* (file capabilities) never written.
func xattrAllowed(ctx context.Context, attr string, write bool) bool {
	if c, ok := fuse.FromContext(ctx); !ok || c.Uid == 0 {
		return true
	}
	switch {
	case strings.HasPrefix(attr, "user."),
		attr == "system.posix_acl_access", attr == "system.posix_acl_default":
		return true
	case strings.HasPrefix(attr, "security."):
		return !write
	}
	return false
}

// xattrTarget resolves the node for an xattr call, through enter. Symlinks
// carry no user xattrs on Linux; they answer as the kernel would (EPERM
// here, turned into each call's answer).
func (n *node) xattrTarget(ctx context.Context, op opKind) (target, syscall.Errno) {
	t, errno := n.enter(ctx, op, "")
	if errno != 0 {
		return t, errno
	}
	if t.st.Mode&unix.S_IFMT == unix.S_IFLNK {
		t.leave()
		return target{dirfd: -1, fd: -1}, syscall.EPERM
	}
	return t, 0
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if !xattrAllowed(ctx, attr, false) {
		return 0, syscall.ENODATA
	}
	t, errno := n.xattrTarget(ctx, opLookup)
	if errno == syscall.EPERM {
		return 0, syscall.ENODATA
	} else if errno != 0 {
		return 0, errno
	}
	defer t.leave()
	sz, err := unix.Getxattr(procPath(t.fd), attr, dest)
	return uint32(sz), errnoOf(err)
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	t, errno := n.xattrTarget(ctx, opLookup)
	if errno == syscall.EPERM {
		return 0, 0
	} else if errno != 0 {
		return 0, errno
	}
	defer t.leave()
	sz, err := unix.Listxattr(procPath(t.fd), nil)
	if err != nil {
		return 0, errnoOf(err)
	}
	buf := make([]byte, sz)
	sz, err = unix.Listxattr(procPath(t.fd), buf)
	if err != nil {
		return 0, errnoOf(err)
	}
	var list []byte
	for _, name := range strings.Split(string(buf[:sz]), "\x00") {
		if name != "" && xattrAllowed(ctx, name, false) {
			list = append(append(list, name...), 0)
		}
	}
	if len(dest) == 0 {
		return uint32(len(list)), 0
	}
	if len(list) > len(dest) {
		return uint32(len(list)), syscall.ERANGE
	}
	return uint32(copy(dest, list)), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if !xattrAllowed(ctx, attr, true) {
		return syscall.EPERM
	}
	t, errno := n.xattrTarget(ctx, opMutate)
	if errno != 0 {
		return errno
	}
	defer t.leave()
	return errnoOf(unix.Setxattr(procPath(t.fd), attr, data, int(flags)))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if !xattrAllowed(ctx, attr, true) {
		return syscall.EPERM
	}
	t, errno := n.xattrTarget(ctx, opMutate)
	if errno != 0 {
		return errno
	}
	defer t.leave()
	return errnoOf(unix.Removexattr(procPath(t.fd), attr))
}
