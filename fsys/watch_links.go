package fsys

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/fanotify"
)

// linkWatch tells the Watcher of link counts rising anywhere on the backing
// trees' filesystems. In a space with rules a file with several names is
// hidden (its other name may be protected), but link(2) raises no inotify
// event at the directories of the file's other names, and the new name may
// be in any directory, watched or not. A filesystem-wide fanotify mark
// (root only; FAN_REPORT_FID, Linux 5.1) reports every attribute change,
// link counts included. Without it, views check link counts themselves.
type linkWatch struct {
	f *os.File

	mu     sync.Mutex
	marked map[uint64]mark // by st_dev
	failed map[uint64]bool
	// shown: the regular files some view has shown in a space with rules
	// (by dev, ino). A file no view shows can get names without anyone
	// caring: other tenants of the filesystem must not drop every view's
	// cache by linking their own files. Beyond shownMax, every file counts.
	shown    map[[2]uint64]struct{}
	shownAll bool
	dead     bool // the fanotify fd failed: nothing is reported any more
}

const shownMax = 1 << 18

type mark struct {
	fd   int       // an O_PATH fd on the filesystem, for open_by_handle_at
	fsid unix.Fsid // how fanotify names the filesystem
}

// newLinkWatch starts a link watch where the daemon may mark filesystems
// (the integration tests' build can run as one that may not: hooks).
func newLinkWatch(hk hooks) *linkWatch {
	if hk.noLinkWatch {
		return nil
	}
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_FID|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY)
	if err != nil {
		return nil // not root, or an old kernel: views check link counts
	}
	return &linkWatch{f: os.NewFile(uintptr(fd), "fanotify"), marked: map[uint64]mark{}, failed: map[uint64]bool{}, shown: map[[2]uint64]struct{}{}}
}

// watches reports whether link counts on b's filesystem are reported,
// marking the filesystem the first time.
func (l *linkWatch) watches(b *backing) bool {
	if l == nil {
		return false
	}
	// A staged layer's files are its backing tree's (linkFS): the mark
	// is on that filesystem, never on the layer's overlayfs, whose
	// anonymous device later mounts use again and which a mark would hold
	// for the daemon's life.
	dev, dir := b.linkFS()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return false
	}
	if _, ok := l.marked[dev]; ok {
		return true
	}
	if l.failed[dev] {
		return false
	}
	err := unix.FanotifyMark(int(l.f.Fd()), unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, unix.FAN_ATTRIB, unix.AT_FDCWD, dir)
	if err != nil {
		// A filesystem without file handles (ENODEV, EOPNOTSUPP, EXDEV)
		// or a directory gone.
		l.failed[dev] = true
		return false
	}
	// open_by_handle_at takes no O_PATH fd.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		l.failed[dev] = true
		return false
	}
	var st unix.Stat_t
	var sf unix.Statfs_t
	if unix.Fstat(fd, &st) != nil || st.Dev != dev || unix.Fstatfs(fd, &sf) != nil {
		// Not the filesystem the device names (the directory was
		// replaced by a mountpoint meanwhile): not marked as that one.
		unix.Close(fd)
		l.failed[dev] = true
		return false
	}
	l.marked[dev] = mark{fd: fd, fsid: sf.Fsid}
	return true
}

// show records a regular file of b a view shows in a space with rules, by
// the device of b's linkFS: a staged layer shows a file the session has
// not changed with the backing tree's inode number (xino=off), and one it
// has changed is the layer's own, whose number an event never names but by
// chance (a cache dropped for nothing).
func (l *linkWatch) show(b *backing, st *unix.Stat_t) {
	if l == nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	dev, _ := b.linkFS()
	if !b.merged {
		dev = st.Dev
	}
	k := [2]uint64{dev, st.Ino}
	l.mu.Lock()
	if _, ok := l.shown[k]; !ok && !l.shownAll {
		if len(l.shown) >= shownMax {
			l.shownAll, l.shown = true, nil
		} else {
			l.shown[k] = struct{}{}
		}
	}
	l.mu.Unlock()
}

func (l *linkWatch) close() {
	l.f.Close()
	l.mu.Lock()
	for _, m := range l.marked {
		unix.Close(m.fd)
	}
	l.mu.Unlock()
}

// read reports, until the fanotify fd is closed, the filesystems (st_dev)
// on which a regular file now has several names; lost events report every
// marked filesystem.
func (l *linkWatch) read(linked func(devs map[uint64]bool)) {
	err := fanotify.Read(l.f, func(events []fanotify.Event) {
		devs := map[uint64]bool{}
		for _, ev := range events {
			if ev.Mask&unix.FAN_Q_OVERFLOW != 0 {
				for d := range l.all() {
					devs[d] = true
				}
				continue
			}
			if ev.Mask&unix.FAN_ONDIR != 0 {
				continue
			}
			if dev, ok := l.multiLinked(ev.Info); ok {
				devs[dev] = true
			}
		}
		if len(devs) > 0 {
			linked(devs)
		}
	})
	if !errors.Is(err, os.ErrClosed) {
		// No more reports: views check link counts themselves from now
		// on, and drop what they cached.
		l.mu.Lock()
		l.dead = true
		l.mu.Unlock()
		linked(l.all())
	}
}

func (l *linkWatch) all() map[uint64]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	devs := map[uint64]bool{}
	for d := range l.marked {
		devs[d] = true
	}
	return devs
}

// multiLinked decodes an event's file-id record and reports the device of
// the file it names when that is a regular file with several names now.
// What cannot be decoded or opened (a file gone since) is no such file.
func (l *linkWatch) multiLinked(info []byte) (uint64, bool) {
	id, handle, _, ok := fanotify.FileID(info, unix.FAN_EVENT_INFO_TYPE_FID)
	if !ok {
		return 0, false
	}
	l.mu.Lock()
	mountFD := -1
	for _, m := range l.marked {
		if m.fsid == id {
			mountFD = m.fd
		}
	}
	l.mu.Unlock()
	if mountFD < 0 {
		return 0, false
	}
	fd, err := unix.OpenByHandleAt(mountFD, handle, unix.O_PATH)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || !multiNamed(&st) {
		return 0, false
	}
	l.mu.Lock()
	_, shown := l.shown[[2]uint64{st.Dev, st.Ino}]
	shown = shown || l.shownAll
	l.mu.Unlock()
	return st.Dev, shown
}
