package fuseconn

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

// A Hub is one FUSE connection that serves the views of many sessions. Its
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
type Hub struct {
	dir     string
	root    *hubRoot
	conn    *Conn
	dirFD   int // O_PATH fd of the mounted hub root, to reach views by name
	log     *slog.Logger
	seq     atomic.Uint64
	closing atomic.Bool
	closeMu sync.Once
	mu      sync.Mutex
	views   int
}

// HubOptions configure a hub.
type HubOptions struct {
	// Dir is the hub's mountpoint, created 0700 if missing. Callers never
	// use it; the views are reached through their own mountpoints.
	Dir string
	// FS are the options of the hub's nodes, every view's: the kernel's
	// cache times, the mount's options. Its root's StableAttr is the
	// hub's.
	FS *fs.Options
	// Wrap is how the hub's requests are served (Options.Wrap).
	Wrap   func(bridge fuse.RawFileSystem, n *Notifier) fuse.RawFileSystem
	Logger *slog.Logger
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

// NewHub mounts a hub at o.Dir. It needs a root daemon.
func NewHub(o HubOptions) (*Hub, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("fsys: a hub (shared connection) needs a root daemon (bind mounts need CAP_SYS_ADMIN)")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	h := &Hub{dir: o.Dir, dirFD: -1, log: o.Logger}
	h.root = &hubRoot{mountedAt: time.Now()}
	if err := safepath.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("hub %s: %w", o.Dir, err)
	}
	if err := ClearStale(o.Dir); err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	fsOpts := *o.FS
	fsOpts.RootStableAttr = &fs.StableAttr{Ino: 1}
	mpfd, err := safepath.OpenDir(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("hub %s: %w", o.Dir, err)
	}
	c, err := Mount(Options{
		Mountpoint: o.Dir, MountFD: mpfd, Root: h.root, FS: &fsOpts, Wrap: o.Wrap, Private: true, Log: h.log,
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
	h.log.Info("hub mounted", "dir", o.Dir, "inc_epoch", c.Epoch())
	return h, nil
}

// Dir is the hub's mountpoint.
func (h *Hub) Dir() string { return h.dir }

// NextGen is the generation of the next view's nodes: each view's own, so
// that two views over one backing tree never share a node (go-fuse merges
// nodes with equal StableAttr).
func (h *Hub) NextGen() uint64 { return h.seq.Add(1) + 1 }

// Conn is the hub's connection.
func (h *Hub) Conn() *Conn { return h.conn }

// Notifier is the hub's connection's calls into the kernel; nil before it
// is mounted.
func (h *Hub) Notifier() *Notifier {
	if h.conn == nil {
		return nil
	}
	return h.conn.notify
}

// Views is the number of views attached.
func (h *Hub) Views() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.views
}

// Attach adds root, a view's root whose nodes are of generation gen
// (NextGen), to the hub and bind-mounts it on the directory mpfd (the
// directory at mp); it returns the view's name in the hub (for Detach) and
// the mount's id.
func (h *Hub) Attach(gen uint64, root fs.InodeEmbedder, mpfd int, mp string) (name string, id uint64, err error) {
	if h.closing.Load() {
		return "", 0, errors.New("hub is closing")
	}
	name = strconv.FormatUint(gen, 10)
	ch := h.root.NewPersistentInode(context.Background(), root, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: 1, Gen: gen})
	h.root.AddChild(name, ch, false)
	h.mu.Lock()
	h.views++
	h.mu.Unlock()
	id, err = bindMount(h.dirFD, name, mpfd, mp)
	if err != nil {
		h.Detach(name)
		return "", 0, err
	}
	return name, id, nil
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

// Detach removes the view name (Attach) from the hub and asks the kernel
// to drop its dentry, so that its nodes are forgotten once nothing uses
// them (its root's OnForget then runs).
func (h *Hub) Detach(name string) {
	if name == "" {
		return
	}
	ch := h.root.GetChild(name)
	h.root.RmChild(name)
	if errno := h.root.NotifyEntry(name); errno != 0 && errno != syscall.ENOENT {
		h.log.Debug("NotifyEntry", "view", name, "errno", errno)
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
func (h *Hub) Close() error {
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
		// The kernel ends the connection once the last lazily detached
		// view bound from the hub lets go of it: seconds, on a heavily
		// loaded machine.
		if !h.conn.Release(30*time.Second, h.log, nil) {
			err = errors.Join(err, fmt.Errorf("unmount hub %s: server did not stop", h.dir))
		}
	})
	return err
}
