// Package fuseconn mounts FUSE connections and keeps them: a mount by a
// root daemon (mount(2)) or through fusermount3, the connection hub that
// serves many views over one connection, the notifications the kernel is
// sent (the epoch, expiring entries), and the dead mounts a crashed daemon
// leaves. It knows nothing of views: package fsys gives it the node tree to
// serve and the request path to wrap it in.
package fuseconn

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// Conn is one FUSE connection, the hub's or a view's own. It is mounted on
// a checked directory (mount(2) by a root daemon; fusermount3, which passes
// the fd back as libfuse does, by one without the privilege), served by
// go-fuse's bridge to the nodes wrapped as Options.Wrap says, and keeps the
// daemon's own dup of the /dev/fuse fd, for the notification go-fuse has no
// call for (FUSE_NOTIFY_INC_EPOCH), and the kernel's id of its mount, to
// unmount exactly it.
type Conn struct {
	mp         string
	server     *fuse.Server
	devFD      int
	mntID      uint64
	fusermount bool        // mounted by fusermount3
	epoch      atomic.Bool // the kernel accepts FUSE_NOTIFY_INC_EPOCH
	notify     *Notifier   // the nodes' calls into the kernel
	done       chan struct{}
}

// Options say how to mount a connection.
type Options struct {
	Mountpoint string // for messages, fusermount3 and its mount id
	MountFD    int    // the checked mountpoint directory, mounted on through its fd
	Root       fs.InodeEmbedder
	FS         *fs.Options
	// Wrap is what the server serves: bridge, go-fuse's bridge to Root's
	// nodes, which reach the kernel through n, wrapped as the caller
	// serves requests (n is to be given the server when the kernel's INIT
	// is answered: Notifier.Init).
	Wrap    func(bridge fuse.RawFileSystem, n *Notifier) fuse.RawFileSystem
	Private bool // make the mount private (the hub: nothing spreads in or out)
	// Fusermount lets a daemon that may not mount use fusermount3.
	Fusermount bool
	Log        *slog.Logger
}

// RawFS is what a connection mounted with o serves, its nodes reaching
// the kernel through n: the tests drive a node tree through it
// in-process, as the kernel would.
func (o Options) RawFS(n *Notifier) fuse.RawFileSystem {
	opts := *o.FS
	opts.ServerCallbacks = n
	return o.Wrap(fs.NewNodeFS(o.Root, &opts), n)
}

// Mount mounts a new connection serving o.Root and waits until the kernel
// has it.
func Mount(o Options) (*Conn, error) {
	c := &Conn{mp: o.Mountpoint, devFD: -1, notify: &Notifier{}, done: make(chan struct{})}
	mo := &o.FS.MountOptions
	fd, err := mountFUSE(o.MountFD, mo.AllowOther)
	if o.Fusermount && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)) {
		o.Log.Debug("no privilege to mount directly; using fusermount3", "mountpoint", o.Mountpoint, "err", err)
		fd, err = mountFusermount(o.Mountpoint, mo.AllowOther)
		c.fusermount = err == nil
	}
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", o.Mountpoint, err)
	}
	fail := func(err error) (*Conn, error) {
		c.UnmountPath()
		unix.Close(fd)
		if c.devFD >= 0 {
			c.notify.devFD.Store(0)
			unix.Close(c.devFD)
		}
		return nil, fmt.Errorf("mount %s: %w", o.Mountpoint, err)
	}
	if o.Private {
		if err := unix.Mount("", o.Mountpoint, "", unix.MS_PRIVATE, ""); err != nil {
			return fail(fmt.Errorf("make it private: %w", err))
		}
	}
	if c.devFD, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3); err != nil {
		c.devFD = -1
		return fail(fmt.Errorf("dup /dev/fuse: %w", err))
	}
	c.notify.devFD.Store(int32(c.devFD))
	server, err := fuse.NewServer(o.RawFS(c.notify), fmt.Sprintf("/dev/fd/%d", fd), mo)
	if err != nil {
		return fail(err)
	}
	c.server = server
	go func() {
		server.Serve()
		close(c.done)
	}()
	if err := server.WaitMount(); err != nil {
		c.UnmountPath()
		c.Release(time.Second, o.Log, nil)
		return nil, fmt.Errorf("mount %s: %w", o.Mountpoint, err)
	}
	if c.mntID, err = mountID(o.Mountpoint); err != nil {
		c.UnmountPath()
		c.Release(time.Second, o.Log, nil)
		return nil, fmt.Errorf("mount %s: find the new mount: %w", o.Mountpoint, err)
	}
	// Probe the epoch notification once; older kernels answer EINVAL.
	// CONDFS_INVALIDATION=entries forces the per-entry path, as on those
	// kernels (so that it can be tested and compared anywhere), and
	// entries-drop the per-entry path without FUSE_EXPIRE_ONLY, as on
	// kernels before 6.2; epoch the epoch wherever a view may bump it (a
	// connection per session: every switch; the shared one: reloads),
	// without FUSE_EXPIRE_ONLY (Notifier.Init), as for lost events.
	if inv := os.Getenv("CONDFS_INVALIDATION"); inv != "entries" && inv != "entries-drop" {
		err := incEpoch(c.devFD)
		c.epoch.Store(err == nil)
		if err != nil {
			o.Log.Info("kernel has no FUSE_NOTIFY_INC_EPOCH; using per-entry invalidation", "mountpoint", o.Mountpoint, "err", err)
		}
	}
	return c, nil
}

// MountID is the kernel's id of the connection's mount.
func (c *Conn) MountID() uint64 { return c.mntID }

// Epoch reports whether the kernel takes the epoch notification
// (BumpEpoch).
func (c *Conn) Epoch() bool { return c.epoch.Load() }

// Fusermount reports whether fusermount3 mounted the connection (and so
// must unmount it: FusermountUnmount).
func (c *Conn) Fusermount() bool { return c.fusermount }

// Notifier is the connection's calls into the kernel for its nodes.
func (c *Conn) Notifier() *Notifier { return c.notify }

// BumpEpoch invalidates every cached entry of the connection at once,
// where the kernel can, and reports whether it did.
func (c *Conn) BumpEpoch(log *slog.Logger) bool {
	if c == nil || !c.epoch.Load() {
		return false
	}
	err := incEpoch(c.devFD)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return true
	}
	log.Warn("FUSE_NOTIFY_INC_EPOCH failed; falling back to per-entry invalidation", "mountpoint", c.mp, "err", err)
	c.epoch.Store(false)
	return false
}

// UnmountPath unmounts what is mounted at the mountpoint's path, lazily:
// only for a mount just made, before anyone could swap the path.
func (c *Conn) UnmountPath() {
	if c.fusermount {
		FusermountUnmount(c.mp)
	} else {
		unix.Unmount(c.mp, unix.MNT_DETACH)
	}
}

// Release closes the daemon's fd, and runs after (if set), once the server
// has stopped: it waits up to patience for that, and leaves a goroutine to
// do it later (an open file keeps a detached mount's connection alive, and
// an operation in flight must not meet a reused fd number). It reports
// whether the server stopped within patience.
func (c *Conn) Release(patience time.Duration, log *slog.Logger, after func()) bool {
	closeFD := func() {
		if c.devFD >= 0 {
			c.notify.devFD.Store(0) // no notification after the fd is gone
			unix.Close(c.devFD)
			c.devFD = -1
		}
		if after != nil {
			after()
		}
	}
	if c.server == nil {
		closeFD()
		return true
	}
	select {
	case <-c.done:
		closeFD()
		return true
	case <-time.After(patience):
		log.Info("connection detached; it ends when its last open file is closed", "mountpoint", c.mp)
		go func() {
			<-c.done
			closeFD()
		}()
		return false
	}
}

// mountFUSE mounts a new FUSE connection on the directory mpfd and
// returns its /dev/fuse fd.
func mountFUSE(mpfd int, allowOther bool) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(mpfd, &st); err != nil {
		return -1, err
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/fuse: %w", err)
	}
	opts := []string{
		fmt.Sprintf("fd=%d", fd),
		fmt.Sprintf("rootmode=%o", st.Mode&unix.S_IFMT),
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		"default_permissions",
	}
	if allowOther {
		opts = append(opts, "allow_other")
	}
	// Mount on the checked directory itself, through its fd.
	err = unix.Mount("condfs", procPath(mpfd), "fuse.condfs", unix.MS_NOSUID|unix.MS_NODEV, strings.Join(opts, ","))
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// mountID is the kernel's id of the mount whose root is at p.
func mountID(p string) (uint64, error) {
	fd, err := safepath.OpenDir(p)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
		return 0, err
	}
	return stx.Mnt_id, nil
}

// incEpoch sends FUSE_NOTIFY_INC_EPOCH: the kernel then treats every dentry
// of this mount made before now, negative ones included, as invalid.
func incEpoch(devFD int) error {
	var hdr fuse.OutHeader
	hdr.Length = uint32(unsafe.Sizeof(hdr))
	hdr.Status = -fuse.NOTIFY_INC_EPOCH // the wire carries the code negated
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&hdr)), unsafe.Sizeof(hdr))
	for {
		_, err := unix.Write(devFD, buf)
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

// procPath names fd through /proc, to reach what it stands for by it.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }
