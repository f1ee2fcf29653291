package fsys

import (
	"sync"

	"golang.org/x/sys/unix"
)

// Two files of a staged view can have one inode number: on the mount a
// file was copied up on (the layer's later mounts number the copy as its
// upper inode, changes.asMounter), overlayfs numbers the copy as the
// backing file it came from, and that backing file may be shown too, at
// another name (the backing tree's
// writer renamed it, as build tools install a binary, or a discard gave its
// name back). go-fuse makes one node of equal numbers, and an operation on
// a node acts on the file at its newest name, whichever name the caller
// used: the session's copy was read, and run, as the listed binary it was
// not.
//
// So in a space where hard links are hidden (decision.hidesLinked), the
// view gives each number one name (aliasSet): a regular file looked up at
// another name while the file at the name it has holds that number is
// hidden, as a hard-linked file is, until that name is gone. A rename
// through the view moves the name with the file.

// aliasSet holds, for each number (StableAttr.Ino) of a regular file of a
// staged space with hidden hard links, the name the view gives it: its
// directory's node and the name in it (the directory's path follows the
// view's renames).
type aliasSet struct {
	mu    sync.Mutex
	m     map[uint64]aliasName
	limit int // the size at which names of forgotten directories are dropped
}

type aliasName struct {
	dir  *node
	name string
}

// minAliasSweep is the fewest names kept before those of directories the
// kernel forgot are dropped; after a sweep, the set may double before the
// next (each name costs a sweep O(1), amortized).
const minAliasSweep = 1 << 16

// claim gives the regular file t (at name in dir) the number it has, and
// reports false, unless another file of that number is still at the name
// the number has: then t is hidden (true).
func (v *View) claim(dir *node, name string, t *target) bool {
	if !t.b.merged || t.st.Mode&unix.S_IFMT != unix.S_IFREG || !t.d.hidesLinked(dir.space) {
		return false
	}
	s := &v.aliases
	key := v.stableAttr(&t.st).Ino
	mine := aliasName{dir: dir, name: name}
	for {
		s.mu.Lock()
		e, ok := s.m[key]
		if !ok || e == mine {
			s.put(key, mine)
			s.mu.Unlock()
			return false
		}
		s.mu.Unlock()
		held := holds(e, t)
		s.mu.Lock()
		if s.m[key] != e {
			s.mu.Unlock()
			continue // named again meanwhile: look again
		}
		if !held {
			s.put(key, mine)
		}
		s.mu.Unlock()
		return held
	}
}

// renamed moves the name of the regular file st with a rename through the
// view.
func (v *View) renamed(st *unix.Stat_t, b *backing, dir *node, name string) {
	if !b.merged || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	s := &v.aliases
	s.mu.Lock()
	s.put(v.stableAttr(st).Ino, aliasName{dir: dir, name: name})
	s.mu.Unlock()
}

// put records a name; s.mu is held.
func (s *aliasSet) put(key uint64, e aliasName) {
	if s.m == nil {
		s.m = map[uint64]aliasName{}
	}
	if len(s.m) >= max(s.limit, minAliasSweep) {
		for k, o := range s.m {
			if o.dir.forgotten.Load() {
				delete(s.m, k)
			}
		}
		s.limit = 2 * len(s.m)
	}
	s.m[key] = e
}

// holds reports whether the name e still holds a file of t's number. A
// name that cannot be looked at (the caller may not search its
// directory) counts as held.
func holds(e aliasName, t *target) bool {
	if e.dir.forgotten.Load() {
		return false
	}
	dp, ok := e.dir.path()
	if !ok {
		return false
	}
	fd, err := t.b.open(join(dp, e.name), unix.O_PATH, 0)
	if err != nil {
		return err == unix.EACCES
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	return t.b.fstat(fd, &st) != nil || st.Dev == t.st.Dev && st.Ino == t.st.Ino
}
