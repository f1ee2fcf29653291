package fsys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// A hub is one FUSE connection that serves the views of many sessions. Its
// mount, in a directory only root can enter, holds one directory per view;
// each view is that directory bind-mounted at the session's mountpoint.
//
// Why: go-fuse reads /dev/fuse with a blocking read(2), so every
// connection holds at least one OS thread while idle, and a connection per
// session runs the Go runtime out of threads at a few thousand sessions.
// One connection bounds the threads by go-fuse's reader limit whatever the
// session count. Bind mounts need CAP_SYS_ADMIN, so only a root daemon uses
// a hub; a daemon that is not root mounts a connection per view.
//
// Each view's nodes carry the view's own generation number, so two sessions
// over the same backing tree never share a node (go-fuse merges nodes with
// equal StableAttr). A context switch invalidates the entries of that view
// only, one by one (the epoch notification is per connection and would
// drop every session's cache); a reload, which concerns every view, may
// bump the epoch once.
type hub struct {
	dir     string
	root    *hubRoot
	conn    *conn
	dirFD   int // O_PATH fd of the mounted hub root, to reach views by name
	log     *slog.Logger
	seq     atomic.Uint64
	panics  atomic.Int64
	closing atomic.Bool
	closeMu sync.Once
	timeout time.Duration
	mu      sync.Mutex
	views   int
}

// hubOptions configure a hub.
type hubOptions struct {
	// Dir is the hub's mountpoint, created 0700 if missing. Callers never
	// use it; the views are reached through their own mountpoints.
	Dir string
	// AttrTimeout is the kernel's positive entry and attribute cache time
	// for every view of the hub; 0 means 1s.
	AttrTimeout time.Duration
	Logger      *slog.Logger
	Debug       bool
	// Observe, if set, is told of every FUSE request when it ends.
	Observe func(op string, start time.Time)
}

// hubRoot is the hub's mount root: one child per view, added and removed
// by the daemon only. Mode 0700 root with default_permissions: no caller
// but root walks through it, and root callers are refused by each view
// (admits) unless a view is theirs.
type hubRoot struct {
	fs.Inode
	mountedAt time.Time
}

var (
	_ fs.NodeGetattrer = (*hubRoot)(nil)
	_ fs.NodeReaddirer = (*hubRoot)(nil)
)

func (r *hubRoot) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o700
	out.Nlink = 2
	out.Uid, out.Gid = 0, 0
	out.SetTimes(&r.mountedAt, &r.mountedAt, &r.mountedAt)
	return 0
}

// Readdir lists nothing: the views are not there to be found.
func (r *hubRoot) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	return fs.NewListDirStream(nil), 0
}

// newHub mounts a hub at o.Dir. It needs a root daemon.
func newHub(o hubOptions) (*hub, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("fsys: a hub (shared connection) needs a root daemon (bind mounts need CAP_SYS_ADMIN)")
	}
	if o.AttrTimeout == 0 {
		o.AttrTimeout = DefaultAttrTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	h := &hub{dir: o.Dir, dirFD: -1, log: o.Logger, timeout: o.AttrTimeout}
	h.root = &hubRoot{mountedAt: time.Now()}
	if err := safepath.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("hub %s: %w", o.Dir, err)
	}
	if err := ClearStale(o.Dir); err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	zero := time.Duration(0)
	fsOpts := &fs.Options{
		EntryTimeout:    &h.timeout,
		AttrTimeout:     &h.timeout,
		NegativeTimeout: &zero,
		MountOptions:    viewMountOptions(true, o.Debug),
		RootStableAttr:  &fs.StableAttr{Ino: 1},
		// Modes reach the kernel as they are (see newView).
		NullPermissions: true,
	}
	mpfd, err := safepath.OpenDir(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("hub %s: %w", o.Dir, err)
	}
	c, err := mountConn(connOptions{
		mp: o.Dir, mpfd: mpfd, root: h.root, fsOpts: fsOpts, private: true, log: h.log,
		guard: guardFS{panics: &h.panics, log: h.log, observe: o.Observe},
	})
	unix.Close(mpfd)
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	h.conn = c
	if h.dirFD, err = safepath.OpenDir(o.Dir); err != nil {
		h.Close()
		return nil, fmt.Errorf("hub: %w", err)
	}
	h.log.Info("hub mounted", "dir", o.Dir, "inc_epoch", c.epoch.Load())
	return h, nil
}

// Panics counts the FUSE operations of the hub's views that panicked.
func (h *hub) Panics() int64 { return h.panics.Load() }

// Views is the number of views attached.
func (h *hub) Views() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.views
}

// attach adds v's root to the hub and bind-mounts it on the directory
// mpfd; it returns the mount's id.
func (h *hub) attach(v *View, mpfd int) error {
	if h.closing.Load() {
		return errors.New("hub is closing")
	}
	name := strconv.FormatUint(v.mnt.gen, 10)
	ch := h.root.NewPersistentInode(context.Background(), v.root, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: 1, Gen: v.mnt.gen})
	h.root.AddChild(name, ch, false)
	v.mnt.hubName = name
	h.mu.Lock()
	h.views++
	h.mu.Unlock()
	id, err := bindMount(h.dirFD, name, mpfd, v.opts.Mountpoint)
	if err != nil {
		h.detach(v)
		return err
	}
	v.mnt.id = id
	return nil
}

// bindMount mounts a clone of dirfd/name on mpfd (the directory at mp):
// open_tree and move_mount (Linux ≥ 5.2), else a bind mount through
// /proc/self/fd.
func bindMount(dirfd int, name string, mpfd int, mp string) (uint64, error) {
	tree, err := unix.OpenTree(dirfd, name, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err == nil {
		defer unix.Close(tree)
		var stx unix.Statx_t
		if err := unix.Statx(tree, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
			return 0, fmt.Errorf("statx the new mount: %w", err)
		}
		if err := unix.MoveMount(tree, "", mpfd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
			return 0, fmt.Errorf("move_mount: %w", err)
		}
		return stx.Mnt_id, nil
	}
	if !errors.Is(err, unix.ENOSYS) {
		return 0, fmt.Errorf("open_tree: %w", err)
	}
	src, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open the view in the hub: %w", err)
	}
	defer unix.Close(src)
	if err := unix.Mount(procPath(src), procPath(mpfd), "", unix.MS_BIND, ""); err != nil {
		return 0, fmt.Errorf("bind mount: %w", err)
	}
	return mountID(mp)
}

// detach removes v's root from the hub and asks the kernel to drop its
// dentry, so that its nodes are forgotten once nothing uses them; v's
// backing directories are closed then (rootNode.OnForget).
func (h *hub) detach(v *View) {
	if v.mnt.hubName == "" {
		return
	}
	ch := h.root.GetChild(v.mnt.hubName)
	h.root.RmChild(v.mnt.hubName)
	if errno := h.root.NotifyEntry(v.mnt.hubName); errno != 0 && errno != syscall.ENOENT {
		h.log.Debug("NotifyEntry", "view", v.mnt.hubName, "errno", errno)
	}
	if ch != nil {
		ch.ForgetPersistent()
	}
	h.mu.Lock()
	h.views--
	h.mu.Unlock()
}

// Close unmounts the hub and waits for its server to stop. Views still
// attached stop working (ENOTCONN).
func (h *hub) Close() error {
	var err error
	h.closeMu.Do(func() {
		h.closing.Store(true)
		if h.dirFD >= 0 {
			unix.Close(h.dirFD)
			h.dirFD = -1
		}
		if h.conn == nil {
			return
		}
		if e := unix.Unmount(h.dir, unix.MNT_DETACH); e != nil && e != unix.EINVAL {
			err = fmt.Errorf("unmount hub %s: %w", h.dir, e)
		}
		if !h.conn.release(10*time.Second, h.log, nil) {
			err = errors.Join(err, fmt.Errorf("unmount hub %s: server did not stop", h.dir))
		}
	})
	return err
}
