package changes

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// Rollback restores every path changed since the checkpoint ref names (an
// id or a name) to its state then, replaying the logs newest record first.
// The checkpoints after it are dropped; it stays, with nothing recorded.
// A path changed outside the view since the session last changed it is
// left as it is and reported, unless force. Run again after a crash, it
// ends in the same state.
func (s *Store) Rollback(ref string, force bool) (Result, error) {
	res := Result{Conflicts: []Conflict{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return res, errors.New("changes: store closed")
	}
	idx, err := s.find(ref)
	if err != nil {
		return res, err
	}
	cps := s.meta.Checkpoints[idx:]
	logs := make([][]record, len(cps))
	snaps := map[key][]state{}
	for i, cp := range cps {
		if logs[i], _, err = s.readLog(cp.Log); err != nil {
			return res, err
		}
		for _, r := range logs[i] {
			if r.K == kindBefore {
				k := key{r.S, r.P}
				snaps[k] = append(snaps[k], r.St)
			}
		}
	}
	res.Touched = touched(logs)
	rb := rollback{s: s, force: force, skip: map[key]bool{}, checked: map[key]bool{}, done: map[key]bool{}, snaps: snaps, res: &res}
	// The records between two moves (a segment) hold each path's state at
	// the segment's start: restored together, parents before children.
	// Segments and moves are undone newest first.
	for i := len(logs) - 1; i >= 0; i-- {
		var seg []record
		for j := len(logs[i]) - 1; j >= 0; j-- {
			switch r := logs[i][j]; r.K {
			case kindBefore:
				seg = append(seg, r)
			case kindMove:
				rb.segment(seg) // Moved began a new segment
				seg = nil
			case kindMoved:
				rb.segment(seg)
				seg = nil
				rb.unmove(r)
			}
		}
		rb.segment(seg)
	}
	rb.dirTimes()
	res.Restored = len(rb.done)
	// What a rollback left (conflicts) stays recorded: a forced one later
	// restores it to the same checkpoint's state.
	var kept []record
	seenKept := map[key]bool{}
	for _, recs := range logs {
		for _, r := range recs {
			k := key{r.S, r.P}
			if r.K == kindBefore && !rb.done[k] && !seenKept[k] {
				seenKept[k] = true
				kept = append(kept, r)
			}
		}
	}
	return res, s.finishRollback(idx, rb.done, kept)
}

// touched lists the paths the logs name, each once; a directory renamed
// back under both its names.
func touched(logs [][]record) []Touched {
	seen := map[Touched]bool{}
	var out []Touched
	add := func(t Touched) {
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	for _, recs := range logs {
		for _, r := range recs {
			switch r.K {
			case kindBefore:
				add(Touched{Space: r.S, Path: r.P})
			case kindMove, kindMoved:
				add(Touched{Space: r.S, Path: r.P, Moved: true})
				add(Touched{Space: r.S, Path: r.To, Moved: true})
			}
		}
	}
	return out
}

type rollback struct {
	s       *Store
	force   bool
	skip    map[key]bool // conflicts: left as they are, with what is below
	checked map[key]bool // the newest record of the path was checked
	done    map[key]bool
	snaps   map[key][]state
	dirs    []record // directories restored, their times set last
	res     *Result
}

func (rb *rollback) skipped(k key) bool {
	for c := range rb.skip {
		if c.space == k.space && under(k.path, c.path) {
			return true
		}
	}
	return false
}

func (rb *rollback) conflict(k key, reason string) {
	rb.skip[k] = true
	rb.res.Conflicts = append(rb.res.Conflicts, Conflict{Space: k.space, Path: k.path, Reason: reason})
}

// segment restores the paths of one segment: conflicts first, then what
// must go removed deepest first, then each path made what it was,
// shallowest first.
func (rb *rollback) segment(seg []record) {
	if len(seg) == 0 {
		return
	}
	s := rb.s
	var live []record
	for _, r := range seg {
		if _, ok := s.roots[r.S]; ok && rb.check(r) {
			live = append(live, r)
		}
	}
	sort.SliceStable(live, func(i, j int) bool { return depth(live[i].P) > depth(live[j].P) })
	for _, r := range live {
		k := key{r.S, r.P}
		if rb.skipped(k) {
			continue
		}
		cur, err := s.lstat(r.S, r.P)
		if err == nil && cur.T != "n" && cur.T != r.St.T {
			err = s.removeAt(r.S, r.P, cur)
		}
		if err != nil {
			rb.conflict(k, "not restored: "+err.Error())
		}
	}
	for i := len(live) - 1; i >= 0; i-- {
		r := live[i]
		k := key{r.S, r.P}
		if rb.skipped(k) {
			continue
		}
		cur, err := s.lstat(r.S, r.P)
		if err == nil {
			err = s.restore(r, cur)
		}
		if err != nil {
			rb.conflict(k, "not restored: "+err.Error())
			continue
		}
		rb.done[k] = true
		if r.St.T == "d" {
			rb.dirs = append(rb.dirs, r)
		}
	}
}

// check decides whether r's path may be restored: its newest record is
// checked against what the session left it as.
func (rb *rollback) check(r record) bool {
	k := key{r.S, r.P}
	if rb.skipped(k) {
		return false
	}
	if rb.checked[k] {
		return true
	}
	rb.checked[k] = true
	cur, err := rb.s.lstat(r.S, r.P)
	if err != nil {
		rb.conflict(k, "cannot be reached beneath the backing root: "+err.Error())
		return false
	}
	if rb.s.opts.Layer {
		// Only the session changes its layer (a commit or a discard drops
		// its checkpoints): nothing there can conflict.
		return true
	}
	left, known := rb.s.after[k]
	if sameAsLeft(cur, left, known) || rb.holdsAny(k, cur) {
		return true
	}
	if rb.force {
		// The daemon restores with its own authority: force never makes
		// it replace or remove what another user put there since (a
		// root-only file where the owner could not write).
		if o := rb.s.opts.Owner; o != nil && o.UID != 0 && cur.T != "n" && cur.UID != o.UID {
			rb.conflict(k, fmt.Sprintf("owned by uid %d now, not by the session's owner: not forced", cur.UID))
			return false
		}
		return true
	}
	reason := "changed outside the view since the session changed it"
	if !known {
		reason = "its state after the session's last change is not known (a crash); force restores it"
	}
	rb.conflict(k, reason)
	return false
}

// unmove undoes a move record.
func (rb *rollback) unmove(r record) {
	s := rb.s
	if _, ok := s.roots[r.S]; !ok {
		return
	}
	k, to := key{r.S, r.P}, key{r.S, r.To}
	if rb.skipped(k) || rb.skipped(to) {
		return
	}
	if err := s.unmove(r); err != nil {
		rb.conflict(to, err.Error())
		return
	}
	s.moveAfter(r.S, r.To, r.P, r.X)
	rb.checked[k], rb.checked[to] = true, true
	rb.done[k], rb.done[to] = true, true
}

func depth(p string) int { return strings.Count(p, "/") }

// removeAt removes what is at p of space (a directory only when empty,
// but in a layer).
func (s *Store) removeAt(space, p string, cur state) error {
	dir, name := split(p)
	pfd, err := safepath.Beneath(s.roots[space], dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("its directory: %w", err)
	}
	defer unix.Close(pfd)
	return s.remove(pfd, name, cur)
}

func (rb *rollback) holdsAny(k key, cur state) bool {
	for _, st := range rb.snaps[k] {
		if holds(cur, st) {
			return true
		}
	}
	return false
}

// dirTimes sets restored directories' mtimes once their entries are back;
// the oldest record of a directory is applied last.
func (rb *rollback) dirTimes() {
	for _, r := range rb.dirs {
		k := key{r.S, r.P}
		if rb.skip[k] {
			continue
		}
		setTimes(rb.s.roots[r.S], r.P, r.St.Mtime)
	}
}

func setTimes(root int, p string, mtime int64) {
	dir, name := split(p)
	pfd, err := safepath.Beneath(root, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return
	}
	defer unix.Close(pfd)
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime)}
	unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// unmove renames a moved directory back (or exchanges two names again).
// Run again after it was done, it does nothing.
func (s *Store) unmove(r record) error {
	root := s.roots[r.S]
	from, err := s.lstat(r.S, r.P)
	if err != nil {
		return err
	}
	to, err := s.lstat(r.S, r.To)
	if err != nil {
		return err
	}
	if !r.X && from.Ino == r.St.Ino && from.T == r.St.T && to.Ino != r.St.Ino {
		return nil // moved back already, or never moved (the rename failed)
	}
	if r.X && from.Ino == r.St.Ino && to.Ino == r.Ino2 {
		return nil
	}
	fdir, fname := split(r.P)
	tdir, tname := split(r.To)
	fd1, err := safepath.Beneath(root, fdir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("cannot be reached beneath the backing root: %w", err)
	}
	defer unix.Close(fd1)
	fd2, err := safepath.Beneath(root, tdir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("cannot be reached beneath the backing root: %w", err)
	}
	defer unix.Close(fd2)
	if r.X {
		switch {
		case from.Ino == r.St.Ino && to.Ino == r.Ino2:
			return nil // exchanged back already
		case from.Ino == r.Ino2 && to.Ino == r.St.Ino:
			return unix.Renameat2(fd2, tname, fd1, fname, unix.RENAME_EXCHANGE)
		}
		return errors.New("changed outside the view since the session exchanged it")
	}
	switch {
	case from.Ino == r.St.Ino && from.T != "n" && to.Ino != r.St.Ino:
		return nil // moved back already
	case to.Ino == r.St.Ino && to.T == r.St.T && from.T == "n":
		return unix.Renameat2(fd2, tname, fd1, fname, unix.RENAME_NOREPLACE)
	}
	return errors.New("changed outside the view since the session renamed it")
}

func split(p string) (dir, name string) {
	i := len(p) - 1
	for i > 0 && p[i] != '/' {
		i--
	}
	if i <= 0 {
		return "/", p[1:]
	}
	return p[:i], p[i+1:]
}

// testHookRestoring, if set, is called as a restore begins ("begin") and
// once it has made the entry anew ("made"): tests change the path then, as
// another process may.
var testHookRestoring func(p, stage string)

// restore makes p what r says it was; cur is what it is.
func (s *Store) restore(r record, cur state) error {
	if r.St.T == "n" && cur.T == "n" {
		return nil
	}
	if testHookRestoring != nil {
		testHookRestoring(r.P, "begin")
	}
	dir, name := split(r.P)
	pfd, err := safepath.Beneath(s.roots[r.S], dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("its directory: %w", err)
	}
	defer unix.Close(pfd)
	want := r.St
	switch want.T {
	case "n":
		return s.remove(pfd, name, cur)
	case "f":
		return s.restoreFile(pfd, name, r, cur)
	case "d":
		fresh := cur.T != "d"
		if fresh {
			if err := s.remove(pfd, name, cur); err != nil {
				return err
			}
			if err := unix.Mkdirat(pfd, name, want.Mode&0o777|0o700); err != nil {
				return err
			}
			made(r.P)
		}
		fd, err := openChecked(pfd, name, "d", cur.Ino, fresh)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := s.setOpaque(fd, want.Opq); err != nil {
			return err
		}
		return setMeta(fd, want, false)
	case "l":
		fresh := !(cur.T == "l" && cur.Link == want.Link)
		if fresh {
			if err := s.remove(pfd, name, cur); err != nil {
				return err
			}
			if err := unix.Symlinkat(want.Link, pfd, name); err != nil {
				return err
			}
			made(r.P)
		}
		if os.Geteuid() == 0 {
			fd, err := openChecked(pfd, name, "l", cur.Ino, fresh)
			if err != nil {
				return err
			}
			unix.Fchownat(fd, "", int(want.UID), int(want.GID), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
			unix.Close(fd)
		}
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(want.Mtime)}
		return unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	case "p":
		fresh := cur.T != "p"
		if fresh {
			if err := s.remove(pfd, name, cur); err != nil {
				return err
			}
			if err := unix.Mknodat(pfd, name, unix.S_IFIFO|want.Mode&0o777, 0); err != nil {
				return err
			}
			made(r.P)
		}
		fd, err := openChecked(pfd, name, "p", cur.Ino, fresh)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return setMeta(fd, want, false)
	case "w":
		if !s.opts.Layer {
			break
		}
		if cur.T != "w" {
			if err := s.remove(pfd, name, cur); err != nil {
				return err
			}
			if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
				return err
			}
			made(r.P)
		}
		return nil
	}
	return errors.New("a special file is not restored")
}

// setOpaque gives a layer's directory (fd, O_PATH) overlayfs's opaque
// mark, or takes it away.
func (s *Store) setOpaque(fd int, opq bool) error {
	if !s.opts.Layer || opaqueFD(fd) == opq {
		return nil
	}
	if opq {
		return unix.Setxattr(procPath(fd), opaqueXattr, []byte("y"), 0)
	}
	return unix.Removexattr(procPath(fd), opaqueXattr)
}

func made(p string) {
	if testHookRestoring != nil {
		testHookRestoring(p, "made")
	}
}

// errSwapped: what a restore was to act on was replaced meanwhile.
var errSwapped = errors.New("replaced while it was being restored (left as it is)")

// openChecked opens name beneath pfd as O_PATH (a symlink itself) and
// makes sure it is what the restore means to act on, as the daemon: of
// type typ, and the inode it checked (ino), or, fresh, one it made itself
// (the daemon's, and a directory with nothing in it). Another process may
// rename anything it may onto the name meanwhile: the daemon must never
// rewrite, chown or chmod that.
func openChecked(pfd int, name, typ string, ino uint64, fresh bool) (int, error) {
	fd, err := safepath.Beneath(pfd, name, unix.O_PATH, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	ok := stateOf(&st).T == typ
	if fresh {
		ok = ok && int(st.Uid) == os.Geteuid() && (typ != "d" || emptyDir(fd))
	} else {
		ok = ok && st.Ino == ino
	}
	if !ok {
		unix.Close(fd)
		return -1, errSwapped
	}
	return fd, nil
}

// emptyDir reports whether the directory fd (O_PATH) holds no entry.
func emptyDir(fd int) bool {
	d, err := unix.Open(procPath(fd), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(d)
	buf := make([]byte, 4096)
	n, err := unix.Getdents(d, buf)
	if err != nil {
		return false
	}
	_, count, _ := unix.ParseDirent(buf[:n], -1, nil)
	return count == 0
}

// restoreFile writes a regular file's content back: into the same inode
// when p still holds the inode the record is of, with its owner (open
// descriptors read the restored content), else into a new file. Another
// inode at p is never written, chowned or chmodded: the session may hold
// it open (or the daemon would give a file the session can still write
// the record's owner and mode).
func (s *Store) restoreFile(pfd int, name string, r record, cur state) error {
	blob, err := safepath.Beneath(s.blobs, r.Blob, unix.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("saved content: %w", err)
	}
	defer unix.Close(blob)
	var fd int
	if cur.T == "f" && cur.Ino == r.St.Ino && cur.UID == r.St.UID && cur.GID == r.St.GID {
		// The inode checked, and no other put there since: opened by
		// path only to be checked, then reopened (the same inode).
		var pathFD int
		if pathFD, err = openChecked(pfd, name, "f", cur.Ino, false); err != nil {
			return err
		}
		fd, err = unix.Open(procPath(pathFD), unix.O_WRONLY|unix.O_TRUNC|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		unix.Close(pathFD)
	} else {
		if err := s.remove(pfd, name, cur); err != nil {
			return err
		}
		fd, err = safepath.Beneath(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NONBLOCK, 0o600)
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := copyFD(fd, blob); err != nil {
		return err
	}
	return setMeta(fd, r.St, true)
}

// setMeta sets owner (a root daemon), mode and mtime on fd (O_PATH unless
// open).
func setMeta(fd int, want state, open bool) error {
	if os.Geteuid() == 0 {
		if err := unix.Fchownat(fd, "", int(want.UID), int(want.GID), unix.AT_EMPTY_PATH); err != nil {
			return err
		}
	}
	var err error
	if open {
		err = unix.Fchmod(fd, want.Mode)
	} else {
		err = unix.Fchmodat(unix.AT_FDCWD, procPath(fd), want.Mode, 0)
	}
	if err != nil {
		return err
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(want.Mtime)}
	return unix.UtimesNanoAt(unix.AT_FDCWD, procPath(fd), ts, 0)
}

// remove removes what is at name (a directory only when empty, but in a
// layer: what a path held nothing at in a layer is the session's whole,
// the directories overlayfs copied up below it with it).
func (s *Store) remove(pfd int, name string, cur state) error {
	var err error
	switch cur.T {
	case "n":
		return nil
	case "d":
		if s.opts.Layer {
			return removeTreeAt(pfd, name)
		}
		err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
	default:
		err = unix.Unlinkat(pfd, name, 0)
	}
	if err == unix.ENOENT {
		return nil
	}
	return err
}

// finishRollback makes the rollback's end durable: checkpoint idx gets a
// new, empty log and the later ones go (meta.json replaced first; then the
// logs and blobs nothing names). What the session left the restored paths
// as is noted in the new log.
func (s *Store) finishRollback(idx int, done map[key]bool, kept []record) error {
	logName := "log-" + strconv.Itoa(s.logN+1)
	fd, err := safepath.Beneath(s.dirfd, logName, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("changes: new log: %w", err)
	}
	m := s.meta
	m.Checkpoints = append([]cpMeta(nil), m.Checkpoints[:idx+1]...)
	old := s.meta.Checkpoints[idx:]
	m.Checkpoints[idx].Log = logName
	if err := s.writeMeta(m); err != nil {
		unix.Close(fd)
		unix.Unlinkat(s.dirfd, logName, 0)
		return err
	}
	s.logN++
	s.meta = m
	s.cps.Store(int32(len(m.Checkpoints)))
	unix.Close(s.logFD)
	s.logFD = fd
	s.sizes[logName] = 0
	keep := map[string]bool{}
	for _, r := range kept {
		if r.Blob != "" {
			keep[r.Blob] = true
		}
	}
	for _, cp := range old {
		s.dropLogKeeping(cp.Log, keep)
	}
	s.counts = append(s.counts[:idx], map[key]bool{})
	s.seen = map[key]bool{}
	for _, r := range kept {
		if s.appendRec(r) != nil {
			continue
		}
		k := key{r.S, r.P}
		s.seen[k] = true
		s.counts[idx][k] = true
		if r.Blob != "" {
			br := s.blobOf[logName]
			br.names = append(br.names, r.Blob)
			br.size += inBlocks(int64(r.St.Size))
			s.blobOf[logName] = br
			s.addBytes(inBlocks(int64(r.St.Size)))
		}
	}
	// Every path the dropped logs noted keeps its last state in the new
	// log (an older checkpoint's rollback checks against it).
	for k := range done {
		if cur, err := s.lstat(k.space, k.path); err == nil {
			s.after[k] = cur
		} else {
			delete(s.after, k)
		}
	}
	for k, st := range s.after {
		s.appendRec(record{K: kindAfter, S: k.space, P: k.path, St: st})
	}
	return nil
}
