package fuseconn

import (
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// ExpireTag begins the name the notifier is given for an entry to expire
// rather than drop (FUSE_NOTIFY_INVAL_ENTRY with FUSE_EXPIRE_ONLY, Linux ≥
// 6.2: the entry stays, and its next use looks it up again). go-fuse passes
// a node's entry notification on with the node's id and the name as it is,
// and has no call that expires; no name holds a slash, so a name that
// begins with one is never taken for a name.
const ExpireTag = "/expire/"

// Notifier is a connection's calls into the kernel for its nodes
// (fs.Options.ServerCallbacks): the server's own, and the expiring entry
// notification, which go-fuse has no call for, written on the daemon's dup
// of the connection's /dev/fuse fd as the epoch notification is.
type Notifier struct {
	server atomic.Pointer[fuse.Server] // set by Init
	devFD  atomic.Int32                // the daemon's dup of /dev/fuse; 0 until set
	// expires: the kernel offers FUSE_HAS_EXPIRE_ONLY (Linux ≥ 6.2), and
	// CONDFS_INVALIDATION is neither entries-drop (which behaves as older
	// kernels do, to test that path anywhere) nor epoch (which leaves the
	// epoch to invalidate wherever the kernel has it).
	expires atomic.Bool
}

var _ fs.ServerCallbacks = (*Notifier)(nil)

// Init takes the server once the kernel's INIT is answered.
func (n *Notifier) Init(s *fuse.Server) {
	n.server.Store(s)
	offered := s.KernelSettings().Flags64()&fuse.CAP_HAS_EXPIRE_ONLY != 0
	inv := os.Getenv("CONDFS_INVALIDATION")
	n.expires.Store(offered && inv != "entries-drop" && inv != "epoch")
}

// CanExpire reports whether entries can be expired (nil: a tree not
// mounted).
func (n *Notifier) CanExpire() bool { return n != nil && n.expires.Load() }

func (n *Notifier) EntryNotify(parent uint64, name string) fuse.Status {
	s := n.server.Load()
	if s == nil {
		return fuse.ENOSYS
	}
	if rest, ok := strings.CutPrefix(name, ExpireTag); ok {
		return fuse.Status(n.expire(parent, rest))
	}
	return s.EntryNotify(parent, name)
}

// expire sends FUSE_NOTIFY_INVAL_ENTRY with FUSE_EXPIRE_ONLY for parent's
// name.
func (n *Notifier) expire(parent uint64, name string) syscall.Errno {
	fd := n.devFD.Load()
	if fd <= 0 || !n.expires.Load() {
		return syscall.ENOSYS
	}
	type message struct {
		hdr   fuse.OutHeader
		entry fuse.NotifyInvalEntryOut
	}
	size := int(unsafe.Sizeof(message{}))
	buf := make([]byte, size+len(name)+1) // the name, NUL-terminated
	m := (*message)(unsafe.Pointer(&buf[0]))
	m.hdr.Length = uint32(len(buf))
	m.hdr.Status = -fuse.NOTIFY_INVAL_ENTRY // the wire carries the code negated
	m.entry = fuse.NotifyInvalEntryOut{Parent: parent, NameLen: uint32(len(name)), Flags: fuse.EXPIRE_ONLY}
	copy(buf[size:], name)
	for {
		_, err := unix.Write(int(fd), buf)
		if err == unix.EINTR {
			continue
		}
		if errno, ok := err.(syscall.Errno); ok {
			return errno
		}
		return 0
	}
}

func (n *Notifier) DeleteNotify(parent uint64, child uint64, name string) fuse.Status {
	if s := n.server.Load(); s != nil {
		return s.DeleteNotify(parent, child, name)
	}
	return fuse.ENOSYS
}

func (n *Notifier) InodeNotify(node uint64, off int64, length int64) fuse.Status {
	if s := n.server.Load(); s != nil {
		return s.InodeNotify(node, off, length)
	}
	return fuse.ENOSYS
}

func (n *Notifier) InodeRetrieveCache(node uint64, offset int64, dest []byte) (int, fuse.Status) {
	if s := n.server.Load(); s != nil {
		return s.InodeRetrieveCache(node, offset, dest)
	}
	return 0, fuse.ENOSYS
}

func (n *Notifier) InodeNotifyStoreCache(node uint64, offset int64, data []byte) fuse.Status {
	if s := n.server.Load(); s != nil {
		return s.InodeNotifyStoreCache(node, offset, data)
	}
	return fuse.ENOSYS
}
