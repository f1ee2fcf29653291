package changes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// Record kinds, one JSON object a line in a log.
const (
	kindBefore = "before" // what a path was before its first change since the checkpoint (or the last move)
	kindMove   = "move"   // a directory about to be renamed (or two names exchanged)
	kindMoved  = "moved"  // the rename kindMove announced was made
	kindAfter  = "after"  // what the session left a path as
)

type record struct {
	K    string `json:"k"`
	S    string `json:"s"`
	P    string `json:"p"`
	To   string `json:"to,omitempty"`
	X    bool   `json:"x,omitempty"`  // a move was an exchange
	Ino2 uint64 `json:"i2,omitempty"` // a move: the inode at To before it
	St   state  `json:"st"`
	Blob string `json:"b,omitempty"`
}

// state is what a path is. Types: n none, f regular file, d directory,
// l symlink, p FIFO, w a layer's whiteout (Options.Layer), o anything
// else.
type state struct {
	T     string `json:"t"`
	Mode  uint32 `json:"m,omitempty"` // permission bits (07777)
	UID   uint32 `json:"u,omitempty"`
	GID   uint32 `json:"g,omitempty"`
	Ino   uint64 `json:"i,omitempty"`
	Size  uint64 `json:"z,omitempty"`
	Mtime int64  `json:"mt,omitempty"` // ns
	Ctime int64  `json:"ct,omitempty"` // ns
	Link  string `json:"l,omitempty"`
	Opq   bool   `json:"o,omitempty"` // a layer's directory hiding what is below it (Options.Layer)
}

var none = state{T: "n"}

func stateOf(st *unix.Stat_t) state {
	s := state{Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid, Ino: st.Ino, Size: uint64(st.Size),
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		s.T = "f"
	case unix.S_IFDIR:
		s.T, s.Size = "d", 0
	case unix.S_IFLNK:
		s.T = "l"
	case unix.S_IFIFO:
		s.T = "p"
	default:
		s.T = "o"
	}
	return s
}

// sameAsLeft: cur is the state the session left (after): the same inode,
// unchanged since (a directory by inode and mode: entries made in it change
// its times).
func sameAsLeft(cur state, left state, known bool) bool {
	if !known || cur.T != left.T {
		return false
	}
	switch cur.T {
	case "n":
		return true
	case "d":
		return cur.Ino == left.Ino && cur.Mode == left.Mode
	}
	return cur.Ino == left.Ino && cur.Size == left.Size && cur.Mtime == left.Mtime && cur.Ctime == left.Ctime
}

// holds: cur already holds what snap restores (a rollback run again).
func holds(cur, snap state) bool {
	if cur.T != snap.T {
		return false
	}
	switch cur.T {
	case "n":
		return true
	case "d", "p":
		return cur.Mode == snap.Mode && cur.Opq == snap.Opq
	case "w":
		return true
	case "l":
		return cur.Link == snap.Link
	}
	return cur.Size == snap.Size && cur.Mtime == snap.Mtime && cur.Mode == snap.Mode
}

// readLog parses a log; a torn last line (a crash while appending it) is
// ignored, any other bad line fails.
func (s *Store) readLog(name string) ([]record, int64, error) {
	data, err := s.readFile(name)
	if err != nil {
		return nil, 0, fmt.Errorf("changes: read %s: %w", name, err)
	}
	var recs []record
	lines := bytes.Split(data, []byte{'\n'})
	for i, line := range lines {
		if len(line) == 0 {
			continue
		}
		var r record
		if err := json.Unmarshal(line, &r); err != nil {
			if i == len(lines)-1 {
				break // torn: no newline after it
			}
			return nil, 0, fmt.Errorf("changes: %s line %d: %w", name, i+1, err)
		}
		recs = append(recs, r)
	}
	return recs, int64(len(data)), nil
}

// appendRec writes r to the newest log (s.mu held).
func (s *Store) appendRec(r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("changes: %w", err)
	}
	data = append(data, '\n')
	if s.over(int64(len(data))) && r.K != kindAfter {
		return fmt.Errorf("changes: %d bytes held (this uid's sessions: %d), max_bytes %d: %w", s.bytes.Load(), s.sharedBytes(), s.opts.MaxBytes, unix.ENOSPC)
	}
	n, err := unix.Write(s.logFD, data)
	if err == nil && n != len(data) {
		err = unix.EIO
	}
	if err != nil {
		return fmt.Errorf("changes: append: %w", err)
	}
	s.addBytes(int64(n))
	s.sizes[s.meta.Checkpoints[len(s.meta.Checkpoints)-1].Log] += int64(n)
	return nil
}

func (s *Store) sharedBytes() int64 {
	if s.opts.Shared == nil {
		return s.bytes.Load()
	}
	return s.opts.Shared.Load()
}

// Armed reports whether a checkpoint exists: before one, the view calls
// nothing else (one atomic load per change).
func (s *Store) Armed() bool { return s != nil && s.armed.Load() }

// lstat states a path of a space beneath its root, as the current thread's
// credentials, never through a symlink on the way.
func (s *Store) lstat(space, p string) (state, error) {
	root, ok := s.roots[space]
	if !ok {
		return state{}, fmt.Errorf("changes: unknown space %q", space)
	}
	fd, err := safepath.Beneath(root, p, unix.O_PATH, 0)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return none, nil
	}
	if err == unix.ELOOP {
		// A symlink on the way (the last component is opened as the
		// link): no such path in the tree, as the view never follows one.
		return none, nil
	}
	if err != nil {
		return state{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return state{}, err
	}
	cur := stateOf(&st)
	if cur.T == "l" {
		if cur.Link, err = readlinkFD(fd); err != nil {
			return state{}, err
		}
	}
	s.layerState(fd, &st, &cur)
	return cur, nil
}

// layerState marks, in a layer (Options.Layer), a whiteout and a
// directory's opaque mark.
func (s *Store) layerState(fd int, st *unix.Stat_t, cur *state) {
	if !s.opts.Layer {
		return
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0:
		*cur = state{T: "w", Ino: st.Ino, Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
	case cur.T == "d":
		cur.Opq = opaqueFD(fd)
	}
}

// opaqueFD reports whether the directory fd (O_PATH) carries overlayfs's
// opaque mark.
func opaqueFD(fd int) bool {
	buf := make([]byte, 8)
	n, err := unix.Getxattr(procPath(fd), opaqueXattr, buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

func readlinkFD(fd int) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// Before records what path p of space is, before its first change since
// the latest checkpoint (or the last move). It runs on the thread of the
// change, as its caller: the content is read with the caller's authority,
// and what cannot be read fails the change. Errors wrap an errno for the
// view to answer (ENOSPC beyond MaxBytes).
func (s *Store) Before(space, p string) error {
	if !s.Armed() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !s.armed.Load() {
		return nil
	}
	k := key{space, p}
	if s.seen[k] {
		return nil
	}
	if _, ok := s.roots[space]; !ok {
		return nil
	}
	r, err := s.snapshot(space, p)
	if err == nil {
		if err = s.appendRec(r); err != nil && r.Blob != "" {
			unix.Unlinkat(s.blobs, r.Blob, 0)
			s.addBytes(-inBlocks(int64(r.St.Size)))
		}
	}
	if err != nil {
		if errors.Is(err, unix.ENOSPC) && s.opts.OnLimit != nil {
			s.opts.OnLimit(space, p)
		}
		return err
	}
	if r.Blob != "" {
		br := s.blobOf[s.curLog()]
		br.names = append(br.names, r.Blob)
		br.size += inBlocks(int64(r.St.Size))
		s.blobOf[s.curLog()] = br
	}
	s.seen[k] = true
	s.counts[len(s.counts)-1][k] = true
	if s.opts.Layer && r.St.T == "d" {
		return s.whiteoutsBelow(space, p)
	}
	return nil
}

// whiteoutsBelow records the whiteouts in a layer's directory p: removing
// the directory (which overlayfs allows once it shows nothing) removes
// them with it, and a rollback that makes it again must hide again what
// they hid.
func (s *Store) whiteoutsBelow(space, p string) error {
	fd, err := safepath.Beneath(s.roots[space], p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil // not a directory it can list: nothing of it goes with it
	}
	names, err := readNames(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("changes: list %s%s: %w", space, p, err)
	}
	for _, name := range names {
		q := joinPath(p, name)
		k := key{space, q}
		if s.seen[k] {
			continue
		}
		cur, err := s.lstat(space, q)
		if err != nil || cur.T != "w" {
			continue
		}
		if err := s.appendRec(record{K: kindBefore, S: space, P: q, St: cur}); err != nil {
			return err
		}
		s.seen[k] = true
		s.counts[len(s.counts)-1][k] = true
	}
	return nil
}

func (s *Store) curLog() string { return s.meta.Checkpoints[len(s.meta.Checkpoints)-1].Log }

// snapshot reads what p is, saving a regular file's content as a blob.
func (s *Store) snapshot(space, p string) (record, error) {
	r := record{K: kindBefore, S: space, P: p}
	root := s.roots[space]
	fd, err := safepath.Beneath(root, p, unix.O_PATH, 0)
	if err == unix.ENOENT {
		r.St = none
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("changes: %s%s: %w", space, p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return r, fmt.Errorf("changes: %w", err)
	}
	r.St = stateOf(&st)
	s.layerState(fd, &st, &r.St)
	switch r.St.T {
	case "l":
		if r.St.Link, err = readlinkFD(fd); err != nil {
			return r, fmt.Errorf("changes: %w", err)
		}
	case "f":
		if s.over(inBlocks(int64(r.St.Size))) {
			return r, fmt.Errorf("changes: %s%s (%d bytes) would take the session, or its uid's sessions together, past max_bytes %d: %w", space, p, r.St.Size, s.opts.MaxBytes, unix.ENOSPC)
		}
		// Opened as the caller (the thread's credentials), read as the
		// daemon (the blob is the daemon's).
		src, err := unix.Open(procPath(fd), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
		if err != nil {
			return r, fmt.Errorf("changes: read %s%s: %w", space, p, err)
		}
		defer unix.Close(src)
		name := strconv.Itoa(s.blobN + 1)
		if err := asDaemon(func() error { return s.saveBlob(src, name) }); err != nil {
			return r, err
		}
		s.blobN++
		s.addBytes(inBlocks(int64(r.St.Size)))
		r.Blob = name
	}
	return r, nil
}

// asDaemon runs f on another goroutine: the current one may be locked to a
// thread acting as a caller (fsys's creds.go), and the store is the
// daemon's.
func asDaemon(f func() error) error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return <-ch
}

func (s *Store) saveBlob(src int, name string) error {
	dst, err := safepath.Beneath(s.blobs, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("changes: blob: %w", err)
	}
	err = copyFD(dst, src)
	if cerr := unix.Close(dst); err == nil {
		err = cerr
	}
	if err != nil {
		unix.Unlinkat(s.blobs, name, 0)
		return fmt.Errorf("changes: save content: %w", err)
	}
	return nil
}

// copyFD makes dst (empty, or truncated) hold src's content: a reflink
// where the filesystem clones, else an in-kernel copy, else read and write.
func copyFD(dst, src int) error {
	if unix.IoctlFileClone(dst, src) == nil {
		return nil
	}
	var off int64
	for {
		n, err := unix.CopyFileRange(src, &off, dst, nil, 1<<30, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if off == 0 && (err == unix.EXDEV || err == unix.EINVAL || err == unix.ENOSYS || err == unix.EOPNOTSUPP) {
				return copyPlain(dst, src)
			}
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

func copyPlain(dst, src int) error {
	buf := make([]byte, 128<<10)
	var off int64
	for {
		n, err := unix.Pread(src, buf, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if _, err := unix.Pwrite(dst, buf[:n], off); err != nil {
			return err
		}
		off += int64(n)
	}
}

func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// Moved records a directory's rename (or an exchange of two names) before
// it is made: its subtree moves with it, and a rollback renames it back.
// The paths recorded since the last move are recorded again after it.
func (s *Store) Moved(space, from, to string, exchange bool) error {
	if !s.Armed() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !s.armed.Load() {
		return nil
	}
	if _, ok := s.roots[space]; !ok || from == to {
		return nil
	}
	src, err := s.lstat(space, from)
	if err != nil {
		return fmt.Errorf("changes: %w", err)
	}
	dst, err := s.lstat(space, to)
	if err != nil {
		return fmt.Errorf("changes: %w", err)
	}
	r := record{K: kindMove, S: space, P: from, To: to, X: exchange, St: src, Ino2: dst.Ino}
	if err := s.appendRec(r); err != nil {
		return err
	}
	s.intent = &r
	s.seen = map[key]bool{}
	s.counts[len(s.counts)-1][key{space, from}] = true
	s.counts[len(s.counts)-1][key{space, to}] = true
	return nil
}

// Renamed tells that the rename Moved announced was made.
func (s *Store) Renamed(space, from, to string, exchange bool) {
	if !s.Armed() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !s.armed.Load() {
		return
	}
	r := s.intent
	s.intent = nil
	if r == nil || r.S != space || r.P != from || r.To != to || r.X != exchange {
		return
	}
	s.renamed(*r)
}

func (s *Store) renamed(r record) {
	space, from, to, exchange := r.S, r.P, r.To, r.X
	r.K = kindMoved
	if s.appendRec(r) != nil {
		// Not noted: what the session left below both names is unknown.
		for k := range s.after {
			if k.space == space && (under(k.path, from) || under(k.path, to)) {
				delete(s.after, k)
			}
		}
		return
	}
	s.moveAfter(space, from, to, exchange)
}

// After notes what the session left p as, after a change it made.
func (s *Store) After(space, p string) {
	if !s.Armed() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !s.armed.Load() {
		return
	}
	if _, ok := s.roots[space]; !ok {
		return
	}
	cur, err := s.lstat(space, p)
	if err != nil {
		delete(s.after, key{space, p}) // unknown: a conflict, unless forced
		return
	}
	s.noteAfter(key{space, p}, cur)
}

// Wrote is After for a change made through an open file, fd.
func (s *Store) Wrote(space, p string, fd int) {
	if !s.Armed() {
		return
	}
	var st unix.Stat_t
	err := unix.Fstat(fd, &st)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !s.armed.Load() {
		return
	}
	if _, ok := s.roots[space]; !ok {
		return
	}
	if err != nil {
		delete(s.after, key{space, p})
		return
	}
	s.noteAfter(key{space, p}, stateOf(&st))
}

func (s *Store) noteAfter(k key, cur state) {
	if old, ok := s.after[k]; ok && old == cur {
		return
	}
	if s.appendRec(record{K: kindAfter, S: k.space, P: k.path, St: cur}) != nil {
		delete(s.after, k)
		return
	}
	s.after[k] = cur
}

// under reports whether p is dir or below it.
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// moveAfter renames what the session left the paths below from as, to
// below to (both ways for an exchange): the names they have now.
func (s *Store) moveAfter(space, from, to string, exchange bool) {
	moved := map[key]state{}
	for k, st := range s.after {
		if k.space != space {
			continue
		}
		switch {
		case under(k.path, from) && from != "/":
			moved[key{space, to + k.path[len(from):]}] = st
			delete(s.after, k)
		case exchange && under(k.path, to) && to != "/":
			moved[key{space, from + k.path[len(to):]}] = st
			delete(s.after, k)
		}
	}
	for k, st := range moved {
		s.after[k] = st
	}
}
