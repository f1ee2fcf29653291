package fsys

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// conn is one FUSE connection, the hub's or a view's own. It is mounted on
// a checked directory (mount(2) by a root daemon; fusermount3, which passes
// the fd back as libfuse does, by one without the privilege), served by
// go-fuse through connFS and the guard, and keeps the daemon's own dup of
// the /dev/fuse fd, for the notification go-fuse has no call for
// (FUSE_NOTIFY_INC_EPOCH), and the kernel's id of its mount, to unmount
// exactly it.
type conn struct {
	mp         string
	server     *fuse.Server
	devFD      int
	mntID      uint64
	fusermount bool        // mounted by fusermount3
	epoch      atomic.Bool // the kernel accepts FUSE_NOTIFY_INC_EPOCH
	notify     *notifier   // the nodes' calls into the kernel
	done       chan struct{}
}

// connOptions say how to mount a connection.
type connOptions struct {
	mp      string // the mountpoint, for messages, fusermount3 and its mount id
	mpfd    int    // the checked mountpoint directory, mounted on through its fd
	root    fs.InodeEmbedder
	fsOpts  *fs.Options
	guard   guardFS // its RawFileSystem is set here
	private bool    // make the mount private (the hub: nothing spreads in or out)
	// fusermount lets a daemon that may not mount use fusermount3.
	fusermount bool
	log        *slog.Logger
}

// rawFS is what the connection's server serves: the guard, connFS, then
// go-fuse's bridge to the nodes, which reach the kernel through n.
func (o connOptions) rawFS(n *notifier) fuse.RawFileSystem {
	g := o.guard
	opts := *o.fsOpts
	opts.ServerCallbacks = n
	g.RawFileSystem = connFS{RawFileSystem: fs.NewNodeFS(o.root, &opts), notify: n}
	return g
}

// mountConn mounts a new connection serving o.root and waits until the
// kernel has it.
func mountConn(o connOptions) (*conn, error) {
	c := &conn{mp: o.mp, devFD: -1, notify: &notifier{}, done: make(chan struct{})}
	mo := &o.fsOpts.MountOptions
	fd, err := mountFUSE(o.mpfd, mo.AllowOther)
	if o.fusermount && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)) {
		o.log.Debug("no privilege to mount directly; using fusermount3", "mountpoint", o.mp, "err", err)
		fd, err = mountFusermount(o.mp, mo.AllowOther)
		c.fusermount = err == nil
	}
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", o.mp, err)
	}
	fail := func(err error) (*conn, error) {
		c.unmountPath()
		unix.Close(fd)
		if c.devFD >= 0 {
			c.notify.devFD.Store(0)
			unix.Close(c.devFD)
		}
		return nil, fmt.Errorf("mount %s: %w", o.mp, err)
	}
	if o.private {
		if err := unix.Mount("", o.mp, "", unix.MS_PRIVATE, ""); err != nil {
			return fail(fmt.Errorf("make it private: %w", err))
		}
	}
	if c.devFD, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3); err != nil {
		c.devFD = -1
		return fail(fmt.Errorf("dup /dev/fuse: %w", err))
	}
	c.notify.devFD.Store(int32(c.devFD))
	server, err := fuse.NewServer(o.rawFS(c.notify), fmt.Sprintf("/dev/fd/%d", fd), mo)
	if err != nil {
		return fail(err)
	}
	c.server = server
	go func() {
		server.Serve()
		close(c.done)
	}()
	if err := server.WaitMount(); err != nil {
		c.unmountPath()
		c.release(time.Second, o.log, nil)
		return nil, fmt.Errorf("mount %s: %w", o.mp, err)
	}
	if c.mntID, err = mountID(o.mp); err != nil {
		c.unmountPath()
		c.release(time.Second, o.log, nil)
		return nil, fmt.Errorf("mount %s: find the new mount: %w", o.mp, err)
	}
	// Probe the epoch notification once; older kernels answer EINVAL.
	// CONDFS_INVALIDATION=entries forces the per-entry path, as on those
	// kernels (so that it can be tested and compared anywhere), and
	// entries-drop the per-entry path without FUSE_EXPIRE_ONLY, as on
	// kernels before 6.2.
	if inv := os.Getenv("CONDFS_INVALIDATION"); inv != "entries" && inv != "entries-drop" {
		err := incEpoch(c.devFD)
		c.epoch.Store(err == nil)
		if err != nil {
			o.log.Info("kernel has no FUSE_NOTIFY_INC_EPOCH; using per-entry invalidation", "mountpoint", o.mp, "err", err)
		}
	}
	return c, nil
}

// bumpEpoch invalidates every cached entry of the connection at once,
// where the kernel can, and reports whether it did.
func (c *conn) bumpEpoch(log *slog.Logger) bool {
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

// unmountPath unmounts what is mounted at the mountpoint's path, lazily:
// only for a mount just made, before anyone could swap the path.
func (c *conn) unmountPath() {
	if c.fusermount {
		fusermountUnmount(c.mp)
	} else {
		unix.Unmount(c.mp, unix.MNT_DETACH)
	}
}

// release closes the daemon's fd, and runs after (if set), once the server
// has stopped: it waits up to patience for that, and leaves a goroutine to
// do it later (an open file keeps a detached mount's connection alive, and
// an operation in flight must not meet a reused fd number). It reports
// whether the server stopped within patience.
func (c *conn) release(patience time.Duration, log *slog.Logger, after func()) bool {
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
