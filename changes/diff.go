package changes

import (
	"bytes"
	"fmt"
	"sort"
	"unicode/utf8"

	"github.com/aymanbagabas/go-udiff"
	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// Change is one path's change, as `git status --short` shows it.
type Change struct {
	Space  string `json:"space"`
	Path   string `json:"path"`   // a directory's ends in "/"
	Change string `json:"change"` // added, modified, deleted
	Diff   string `json:"diff,omitempty"`
	Binary bool   `json:"binary,omitempty"`
}

// maxDiff is the largest file (either side) a content diff shows.
const maxDiff = 1 << 20

// Diff lists what changed since the checkpoint since names (the oldest
// when ""), comparing each recorded path's state then with its state now.
// visible says which paths the caller may see; the others are counted in
// hidden. With content, each changed text file carries a unified diff.
func (s *Store) Diff(since string, content bool, visible func(space, path string) bool) ([]Change, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Change{}
	if len(s.meta.Checkpoints) == 0 {
		if since != "" {
			return nil, 0, fmt.Errorf("%w %q", ErrUnknownCheckpoint, since)
		}
		return out, 0, nil
	}
	idx := 0
	if since != "" {
		var err error
		if idx, err = s.find(since); err != nil {
			return nil, 0, err
		}
	}
	was := map[key]record{}
	for _, cp := range s.meta.Checkpoints[idx:] {
		recs, _, err := s.readLog(cp.Log)
		if err != nil {
			return nil, 0, err
		}
		for _, r := range recs {
			switch r.K {
			case kindBefore:
				if _, ok := was[key{r.S, r.P}]; !ok {
					was[key{r.S, r.P}] = r
				}
			case kindMoved:
				if _, ok := was[key{r.S, r.P}]; !ok {
					was[key{r.S, r.P}] = record{S: r.S, P: r.P, St: r.St}
				}
				if _, ok := was[key{r.S, r.To}]; !ok {
					st := none
					if r.X || r.Ino2 != 0 {
						st = state{T: "o", Ino: r.Ino2}
					}
					was[key{r.S, r.To}] = record{S: r.S, P: r.To, St: st}
				}
			}
		}
	}
	keys := make(map[key]bool, len(was))
	for k := range was {
		keys[k] = true
	}
	hidden := 0
	for _, k := range sortedKeys(keys) {
		r := was[k]
		if _, ok := s.roots[k.space]; !ok {
			continue
		}
		cur, err := s.lstat(k.space, k.path)
		if err != nil {
			continue // not reachable beneath the root: not shown
		}
		c := Change{Space: k.space, Path: k.path}
		switch {
		case r.St.T == "n" && cur.T == "n":
			continue
		case r.St.T == "n":
			c.Change = "added"
		case cur.T == "n":
			c.Change = "deleted"
		case s.same(r, cur):
			continue
		default:
			c.Change = "modified"
		}
		if r.St.T == "d" || cur.T == "d" {
			c.Path += "/"
		}
		if visible != nil && !visible(k.space, k.path) {
			hidden++
			continue
		}
		if content && (r.St.T == "f" || cur.T == "f") {
			s.contentDiff(&c, r, cur)
		}
		out = append(out, c)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Space != out[j].Space {
			return out[i].Space < out[j].Space
		}
		return out[i].Path < out[j].Path
	})
	return out, hidden, nil
}

// same: cur holds what r recorded.
func (s *Store) same(r record, cur state) bool {
	if r.St.T != cur.T || r.St.Mode != cur.Mode {
		return false
	}
	switch cur.T {
	case "d", "p":
		return true
	case "l":
		return r.St.Link == cur.Link
	case "f":
		if r.Blob == "" || r.St.Size != cur.Size {
			return false
		}
		old, ok := s.readBlob(r.Blob, int64(r.St.Size))
		if !ok {
			return false
		}
		now, ok := s.readCurrent(r.S, r.P, int64(cur.Size))
		return ok && bytes.Equal(old, now)
	}
	return r.St.Ino == cur.Ino
}

func (s *Store) contentDiff(c *Change, r record, cur state) {
	var old, now []byte
	ok := true
	if r.St.T == "f" {
		if r.St.Size > maxDiff || r.Blob == "" {
			ok = false
		} else {
			old, ok = s.readBlob(r.Blob, int64(r.St.Size))
		}
	}
	if ok && cur.T == "f" {
		if cur.Size > maxDiff {
			ok = false
		} else {
			now, ok = s.readCurrent(r.S, r.P, int64(cur.Size))
		}
	}
	if !ok || !utf8.Valid(old) || !utf8.Valid(now) {
		c.Binary = true
		return
	}
	c.Diff = udiff.Unified("a"+r.P, "b"+r.P, string(old), string(now))
}

func (s *Store) readBlob(name string, size int64) ([]byte, bool) {
	fd, err := safepath.Beneath(s.blobs, name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, false
	}
	defer unix.Close(fd)
	return readAll(fd, size)
}

// readCurrent reads what p holds now, opened as the session's owner: a
// file the owner may not read is not shown (a root-only file someone else
// put at a path the session changed).
func (s *Store) readCurrent(space, p string, size int64) ([]byte, bool) {
	fd, err := -1, error(unix.EACCES)
	s.asOwner(func() {
		fd, err = safepath.Beneath(s.roots[space], p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	})
	if err != nil {
		return nil, false
	}
	defer unix.Close(fd)
	return readAll(fd, size)
}

func readAll(fd int, size int64) ([]byte, bool) {
	if size > maxDiff*4 {
		return nil, false
	}
	buf := make([]byte, size+1)
	var n int
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, false
		}
		if m == 0 {
			break
		}
		n += m
	}
	if int64(n) != size {
		return nil, false
	}
	return buf[:n], true
}
