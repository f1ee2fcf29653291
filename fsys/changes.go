package fsys

import (
	"errors"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Changes records what a view changes in its backing trees, so that it can
// be undone (the changes package, docs/changes.md). Every mutation calls
// Before, on the thread acting as the caller, once the choke point has
// decided it and before it is made: an error refuses the change (with the
// errno it wraps, EIO otherwise), so nothing is changed unrecorded. After
// (or Wrote, for a write through an open file) follows a change that was
// made. A directory's rename is announced by Moved and confirmed by
// Renamed. Armed is checked first, and is false until a checkpoint exists:
// before one, a change costs an atomic load or two.
type Changes interface {
	Armed() bool
	Before(space, path string) error
	Moved(space, from, to string, exchange bool) error
	Renamed(space, from, to string, exchange bool)
	After(space, path string)
	Wrote(space, path string, fd int)
}

// recorders holds the views' Changes: a view with none costs a mutation
// one atomic load (count).
type recorders struct {
	count atomic.Int32
	m     sync.Map // *View → Changes
}

// SetChanges gives the view its recorder (nil: none). The daemon sets it
// before the view is handed out and clears it when the session closes.
func (v *View) SetChanges(c Changes) {
	r := &v.host.recorders
	if c == nil {
		if _, ok := r.m.LoadAndDelete(v); ok {
			r.count.Add(-1)
		}
		return
	}
	if _, loaded := r.m.Swap(v, c); !loaded {
		r.count.Add(1)
	}
}

// recorder gives the view's recorder when it records (a checkpoint
// exists), else nil.
func (v *View) recorder() Changes {
	r := &v.host.recorders
	if r.count.Load() == 0 {
		return nil
	}
	c, ok := r.m.Load(v)
	if !ok {
		return nil
	}
	if ch := c.(Changes); ch.Armed() {
		return ch
	}
	return nil
}

// changing records p of sp before a change; a failure refuses it.
func (v *View) changing(sp space, p string) (Changes, syscall.Errno) {
	c := v.recorder()
	if c == nil {
		return nil, 0
	}
	if err := c.Before(sp.String(), p); err != nil {
		v.log.Warn("change not recorded; refused", "space", sp.String(), "path", p, "err", err)
		return nil, changeErrno(err)
	}
	return c, 0
}

// changed notes a change made after changing.
func changed(c Changes, sp space, p string) {
	if c != nil {
		c.After(sp.String(), p)
	}
}

func changeErrno(err error) syscall.Errno {
	var e unix.Errno
	if errors.As(err, &e) {
		switch e {
		case unix.ENOSPC, unix.EACCES, unix.EPERM, unix.ENOENT, unix.ELOOP, unix.ENOTDIR, unix.EXDEV:
			return e
		}
	}
	return syscall.EIO
}

// renaming records both names of a rename (a directory as a move).
func (v *View) renaming(sp space, from, to string, dirMoves, exchange bool) (Changes, syscall.Errno) {
	c := v.recorder()
	if c == nil {
		return nil, 0
	}
	s := sp.String()
	var err error
	if dirMoves {
		if !exchange {
			err = c.Before(s, to)
		}
		if err == nil {
			err = c.Moved(s, from, to, exchange)
		}
	} else {
		err = c.Before(s, from)
		if err == nil {
			err = c.Before(s, to)
		}
	}
	if err != nil {
		v.log.Warn("rename not recorded; refused", "space", s, "from", from, "to", to, "err", err)
		return nil, changeErrno(err)
	}
	return c, 0
}

// noteRenamed notes a rename made after renaming.
func noteRenamed(c Changes, sp space, from, to string, dirMoves, exchange bool) {
	if c == nil {
		return
	}
	s := sp.String()
	if dirMoves {
		c.Renamed(s, from, to, exchange)
	}
	c.After(s, from)
	c.After(s, to)
}

// writing records the file an open handle writes, before a write,
// truncate, chmod or allocate through it; p is its path now.
func (h *fileHandle) writing() (c Changes, p string, errno syscall.Errno) {
	v := h.node.view
	if v.recorder() == nil {
		return nil, "", 0
	}
	h.mu.Lock()
	p = h.last
	h.mu.Unlock()
	c, errno = v.changing(h.node.space, p)
	return c, p, errno
}

// wrote notes a change made through the handle.
func (h *fileHandle) wrote(c Changes, p string) {
	if c == nil {
		return
	}
	h.withFD(func(fd int) syscall.Errno {
		c.Wrote(h.node.space.String(), p, fd)
		return 0
	})
}
