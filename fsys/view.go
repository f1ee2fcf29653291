// Package fsys mounts a session's view: a FUSE filesystem whose root holds
// memories/ and workspace/ over real backing directories, in which every
// lookup, readdir, open and mutation is decided by the path rules (acl)
// against the session's current context.
//
// One choke point, (*node).resolve, computes the canonical path of what an
// operation names and asks the rules about it and about every directory
// above it; then the backing directory is reached beneath its root with
// openat2. Denied paths do not exist (ENOENT); mutations naming a denied
// path get EACCES.
//
// No stale authority: SetContext and Invalidate return only after the
// kernel's dentry caches have been invalidated, with FUSE_NOTIFY_INC_EPOCH
// where the kernel has it (Linux ≥ 6.16) and per-entry notifications
// otherwise. Negative entries are never cached. Files under a rule are
// opened with direct I/O and every read and write re-checks the rules, so
// an open handle is revoked at once; files under no rule use kernel
// passthrough for native speed, since their decision cannot change while
// the config stays the same.
package fsys

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
)

// Rules gives the current path-rule snapshot. An atomic.Pointer[acl.Config]
// satisfies it; the daemon swaps the pointer on reload.
type Rules interface {
	Load() *acl.Config
}

// Options configure a view.
type Options struct {
	Mountpoint string
	Memories   string // backing directory of memories/
	Workspace  string // backing directory of workspace/
	Rules      Rules
	Context    cctx.Set
	// AllowHardlinks turns off hiding of multiply-linked files and the
	// refusal of link() in spaces that have rules.
	AllowHardlinks bool
	// AllowOther lets users other than the daemon's use the view; the
	// kernel then checks the backing modes (default_permissions).
	AllowOther bool
	// AttrTimeout is the kernel's positive entry and attribute cache
	// time; 0 means 1s.
	AttrTimeout time.Duration
	// OnDeny, if set, is told of every path the rules deny to a request
	// that names it (lookup, mutation, or I/O on a revoked handle), for
	// the audit log. Entries left out of a listing are not reported.
	OnDeny func(ctx cctx.Set, space acl.Space, path, op string)
	Logger *slog.Logger
	// Debug logs every FUSE request.
	Debug bool
}

// View is one mounted session view.
type View struct {
	opts     Options
	rules    Rules
	ctx      atomic.Pointer[cctx.Set]
	spaces   [2]*backing
	root     *rootNode
	server   *fuse.Server
	devFD    int  // our own dup of the /dev/fuse fd, for notifications
	epoch    bool // the kernel accepts FUSE_NOTIFY_INC_EPOCH
	log      *slog.Logger
	closed   atomic.Bool
	unmounts sync.Once
	done     chan struct{}
	// mountedAt is the mount root's timestamp.
	mountedAt time.Time

	// reads counts READ requests the daemon served, for tests that prove
	// passthrough.
	reads atomic.Int64
}

// Mount mounts a view. A mountpoint left stale by a crashed daemon
// (ENOTCONN) is cleared first.
func Mount(opts Options) (*View, error) {
	if opts.Rules == nil {
		return nil, errors.New("fsys: Options.Rules is required")
	}
	if opts.AttrTimeout == 0 {
		opts.AttrTimeout = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	v := &View{opts: opts, rules: opts.Rules, devFD: -1, log: opts.Logger, done: make(chan struct{}), mountedAt: time.Now()}
	set := opts.Context
	v.ctx.Store(&set)
	for i, dir := range []string{opts.Memories, opts.Workspace} {
		b, err := openBacking(dir)
		if err != nil {
			v.closeBacking()
			return nil, err
		}
		v.spaces[i] = b
	}
	if err := ClearStale(opts.Mountpoint); err != nil {
		v.closeBacking()
		return nil, err
	}
	v.root = &rootNode{view: v}
	zero := time.Duration(0)
	fsOpts := &fs.Options{
		EntryTimeout:    &opts.AttrTimeout,
		AttrTimeout:     &opts.AttrTimeout,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName:        "condfs",
			Name:          "condfs",
			AllowOther:    opts.AllowOther,
			Options:       []string{"default_permissions"},
			MaxBackground: 64,
			EnableLocks:   true,
			// READDIRPLUS makes dentries from a listing decided before a
			// context switch but delivered after it, and the kernel stamps
			// them with the new epoch: they would answer stale. Plain
			// READDIR creates no dentries; every name is then looked up.
			DisableReadDirPlus: true,
			Debug:              opts.Debug,
		},
		RootStableAttr: &fs.StableAttr{Ino: 1},
	}
	if err := v.mount(fsOpts); err != nil {
		v.closeBacking()
		return nil, err
	}
	return v, nil
}

// mount does the mount(2) itself so that it holds the /dev/fuse fd (to send
// FUSE_NOTIFY_INC_EPOCH, which go-fuse has no call for), and hands go-fuse
// the connection as "/dev/fd/N". Without the privilege to mount, it falls
// back to fusermount and per-entry invalidation.
func (v *View) mount(fsOpts *fs.Options) error {
	mp := v.opts.Mountpoint
	rawFS := fs.NewNodeFS(v.root, fsOpts)
	fd, err := mountDirect(mp, &fsOpts.MountOptions)
	var server *fuse.Server
	if err == nil {
		dup, derr := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
		if derr != nil {
			unix.Unmount(mp, unix.MNT_DETACH)
			unix.Close(fd)
			return fmt.Errorf("mount %s: dup /dev/fuse: %w", mp, derr)
		}
		v.devFD = dup
		server, err = fuse.NewServer(rawFS, fmt.Sprintf("/dev/fd/%d", fd), &fsOpts.MountOptions)
		if err != nil {
			unix.Unmount(mp, unix.MNT_DETACH)
			unix.Close(fd)
			unix.Close(dup)
			v.devFD = -1
			return fmt.Errorf("mount %s: %w", mp, err)
		}
	} else if errors.Is(err, unix.EPERM) {
		v.log.Warn("no privilege to mount directly; using fusermount, with slower cache invalidation", "mountpoint", mp)
		server, err = fuse.NewServer(rawFS, mp, &fsOpts.MountOptions)
		if err != nil {
			return fmt.Errorf("mount %s: %w", mp, err)
		}
	} else {
		return fmt.Errorf("mount %s: %w", mp, err)
	}
	v.server = server
	go func() {
		server.Serve()
		close(v.done)
	}()
	if err := server.WaitMount(); err != nil {
		v.Unmount()
		return fmt.Errorf("mount %s: %w", mp, err)
	}
	// Probe the epoch notification once; older kernels answer EINVAL.
	if v.devFD >= 0 {
		err := v.incEpoch()
		v.epoch = err == nil
		if err != nil {
			v.log.Info("kernel has no FUSE_NOTIFY_INC_EPOCH; using per-entry invalidation", "err", err)
		}
	}
	v.log.Debug("view mounted", "mountpoint", mp, "inc_epoch", v.epoch)
	return nil
}

func mountDirect(mp string, mo *fuse.MountOptions) (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(mp, &st); err != nil {
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
	if mo.AllowOther {
		opts = append(opts, "allow_other")
	}
	err = unix.Mount("condfs", mp, "fuse.condfs", unix.MS_NOSUID|unix.MS_NODEV, strings.Join(opts, ","))
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// incEpoch sends FUSE_NOTIFY_INC_EPOCH: the kernel then treats every dentry
// of this mount made before now, negative ones included, as invalid.
func (v *View) incEpoch() error {
	var hdr fuse.OutHeader
	hdr.Length = uint32(unsafe.Sizeof(hdr))
	hdr.Status = -fuse.NOTIFY_INC_EPOCH // the wire carries the code negated
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&hdr)), unsafe.Sizeof(hdr))
	for {
		_, err := unix.Write(v.devFD, buf)
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

// auditDeny reports a denial with the context it was decided in.
func (v *View) auditDeny(ctx cctx.Set, sp acl.Space, path, op string) {
	if v.opts.OnDeny != nil {
		v.opts.OnDeny(ctx, sp, path, op)
	}
}

// Context returns the view's current context.
func (v *View) Context() cctx.Set { return *v.ctx.Load() }

// Mountpoint is where the view is mounted.
func (v *View) Mountpoint() string { return v.opts.Mountpoint }

// SetContext switches the view's context. When it returns, no kernel cache
// answers for a path whose decision changed, and open handles on newly
// denied files fail their next read or write.
func (v *View) SetContext(set cctx.Set) error {
	v.ctx.Store(&set)
	return v.Invalidate()
}

// Invalidate drops the kernel's cached entries after the rules changed.
func (v *View) Invalidate() error {
	if v.closed.Load() {
		return errors.New("view is unmounted")
	}
	if v.epoch {
		if err := v.incEpoch(); err == nil {
			return nil
		} else if !errors.Is(err, unix.ENOENT) {
			v.log.Warn("FUSE_NOTIFY_INC_EPOCH failed; falling back to per-entry invalidation", "err", err)
			v.epoch = false
		}
	}
	v.invalidateEntries(v.root.EmbeddedInode())
	return nil
}

// invalidateEntries walks the inode tree and invalidates every cached
// child entry, deepest first so that parents are dropped last.
func (v *View) invalidateEntries(dir *fs.Inode) {
	for name, child := range dir.Children() {
		if child.IsDir() {
			v.invalidateEntries(child)
		}
		if errno := dir.NotifyEntry(name); errno != 0 && errno != syscall.ENOENT {
			v.log.Debug("NotifyEntry", "name", name, "errno", errno)
		}
	}
}

// EpochInvalidation reports whether the kernel supports the epoch
// notification on this view.
func (v *View) EpochInvalidation() bool { return v.epoch }

// DaemonReads counts READ requests the daemon served (files under no rule
// use passthrough and never reach it).
func (v *View) DaemonReads() int64 { return v.reads.Load() }

// Unmount unmounts the view and waits for its server to stop.
func (v *View) Unmount() error {
	var err error
	v.unmounts.Do(func() {
		v.closed.Store(true)
		mp := v.opts.Mountpoint
		if v.devFD >= 0 {
			// We mounted it, so we unmount it; MNT_DETACH lets a busy
			// mount go once its last user leaves.
			if e := unix.Unmount(mp, 0); e != nil {
				if e2 := unix.Unmount(mp, unix.MNT_DETACH); e2 != nil && e2 != unix.EINVAL {
					err = fmt.Errorf("unmount %s: %w", mp, e2)
				}
			}
		} else if v.server != nil {
			if e := v.server.Unmount(); e != nil {
				err = fmt.Errorf("unmount %s: %w", mp, e)
			}
		}
		if v.server != nil {
			select {
			case <-v.done:
			case <-time.After(10 * time.Second):
				err = errors.Join(err, fmt.Errorf("unmount %s: server did not stop", mp))
			}
		}
		if v.devFD >= 0 {
			unix.Close(v.devFD)
			v.devFD = -1
		}
		v.closeBacking()
	})
	return err
}

func (v *View) closeBacking() {
	for i, b := range v.spaces {
		if b != nil {
			b.close()
			v.spaces[i] = nil
		}
	}
}

// ClearStale unmounts a mountpoint left behind by a crashed daemon: a
// FUSE mount whose connection is gone (ENOTCONN). The mount root's own
// attributes may still be cached, so liveness is probed with statfs, which
// always reaches the daemon. A live mount there is an error: two views on
// one mountpoint would hide each other.
func ClearStale(mp string) error {
	for i := 0; i < 8; i++ {
		fstype, mounted := mountType(mp)
		if !mounted || !strings.HasPrefix(fstype, "fuse") {
			return nil
		}
		var sfs unix.Statfs_t
		err := unix.Statfs(mp, &sfs)
		if err == nil {
			return fmt.Errorf("%s is already a live %s mount; unmount it or pick another mountpoint", mp, fstype)
		}
		if !errors.Is(err, unix.ENOTCONN) && !errors.Is(err, unix.ECONNABORTED) {
			return fmt.Errorf("probe %s: %w", mp, err)
		}
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			// Without privilege, fusermount3 can clear a FUSE mount of ours.
			if out, err2 := exec.Command("fusermount3", "-u", "-z", mp).CombinedOutput(); err2 != nil {
				return fmt.Errorf("clear stale mount %s: %v; fusermount3: %v %s", mp, err, err2, out)
			}
		}
	}
	return fmt.Errorf("clear stale mounts on %s: too many stacked", mp)
}

// mountType reports the filesystem type mounted exactly at mp, from
// /proc/self/mountinfo (the last, i.e. topmost, entry wins).
func mountType(mp string) (string, bool) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false
	}
	fstype, found := "", false
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 10 || unescapeMount(fields[4]) != mp {
			continue
		}
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" && i+1 < len(fields) {
				fstype, found = fields[i+1], true
				break
			}
		}
	}
	return fstype, found
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
