// Package changes keeps what a direct session's view changes in its backing
// trees, so that it can be rolled back to a checkpoint (docs/changes.md).
//
// A Store is one session's: a directory under the daemon's state directory
// holding meta.json (the checkpoints, oldest first, each naming its log),
// one append-only log per checkpoint and blobs/ (saved contents). The view
// calls the recorder side (Armed, Before, Moved, After, Wrote) at its
// choke point for mutations; the control socket calls the rest (Create,
// List, Rollback, Diff).
//
// Fail-closed choices:
//   - Before is called before the change it records and the record is
//     written first: an error (ENOSPC beyond MaxBytes, a source the caller
//     cannot read) fails the change, so no change is ever made unrecorded.
//   - Every path of a backing tree is reached beneath its root with openat2
//     (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV): a symlink or a
//     mount swapped into a restored path's parent fails the restore of that
//     path (a conflict), never leads out of the tree.
//   - A path whose state differs from the one the session left is a
//     conflict, left alone unless forced; so is one whose last state is not
//     known (its record lost to a crash).
//   - A log that does not parse (but for a torn last line) makes Open fail:
//     nothing is restored from a record that cannot be trusted.
//
// Lock order: Store.mu is the only lock; it is held across the recorder's
// file I/O (one session's first changes after a checkpoint are serialized)
// and across a rollback (the view's changes wait for it).
package changes

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/internal/safepath"
)

// Options configure a Store.
type Options struct {
	// Dir is the session's directory (created 0700). What it holds is kept
	// (a session restored after a crash) unless Fresh.
	Dir   string
	Fresh bool
	// Roots are the backing directories by space name ("memories",
	// "workspace"); a space not named is never recorded nor restored.
	Roots map[string]string
	// MaxBytes bounds the logs and blobs (default 1 GiB); MaxCheckpoints
	// the checkpoints kept (default 64; creating one more drops the oldest).
	MaxBytes       int64
	MaxCheckpoints int
	// OnLimit, if set, is told of each change refused beyond MaxBytes.
	OnLimit func(space, path string)
	// Owner, if set, is whose authority Diff reads current content with
	// (asowner.go); nil: the daemon's.
	Owner *Owner
	// Layer: the roots are a staged session's overlayfs upper directories
	// (layer.go's layout), recorded and restored as the layer itself: a
	// whiteout is a state of its own, a directory's opaque mark part of
	// its state, and what a path held nothing at is removed whole (the
	// directories overlayfs copied up below it with it). A rollback of a
	// layer is made while nothing is mounted over it.
	Layer bool
	// Shared, if set, counts what every store of the same uid holds:
	// MaxBytes bounds that sum too, so that one uid's many sessions
	// cannot fill the state directory everyone's checkpoints live in.
	Shared *atomic.Int64
}

// Errors callers map to their own codes.
var (
	ErrUnknownCheckpoint = errors.New("unknown checkpoint")
	ErrBadName           = errors.New("bad checkpoint name")
)

// Checkpoint is one checkpoint. Changes counts the paths changed after it
// and before the next.
type Checkpoint struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Changes int       `json:"changes"`
}

// Conflict is a path a rollback left as it is.
type Conflict struct {
	Space  string `json:"space"`
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Result is what a rollback did.
type Result struct {
	Restored  int        `json:"restored"`
	Conflicts []Conflict `json:"conflicts"`
	// Touched is every path the rollback may have changed in the backing
	// trees (restored, or tried and left as a conflict), for the view to
	// drop what its kernel caches of them before the rollback answers.
	Touched []Touched `json:"-"`
}

// Touched is a path a rollback may have changed. Moved: a directory
// renamed back (the names below it changed with it).
type Touched struct {
	Space, Path string
	Moved       bool
}

// Use is what a Store holds.
type Use struct {
	Checkpoints int   `json:"checkpoints"`
	Bytes       int64 `json:"bytes"`
	MaxBytes    int64 `json:"max_bytes"`
}

type cpMeta struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	Log     string    `json:"log"`
}

type metaFile struct {
	Next        int      `json:"next"`
	Checkpoints []cpMeta `json:"checkpoints"`
}

type key struct{ space, path string }

// Store is one session's undo store.
type Store struct {
	opts  Options
	armed atomic.Bool // a checkpoint exists: the recorder records

	mu     sync.Mutex
	closed bool
	dirfd  int            // the store's directory (O_PATH)
	blobs  int            // blobs/ (O_PATH)
	roots  map[string]int // O_PATH fds of the backing roots
	meta   metaFile
	logFD  int                   // the newest checkpoint's log, O_APPEND; -1 without one
	seen   map[key]bool          // paths recorded in the newest log since its last move
	intent *record               // the rename Moved announced, until Renamed
	after  map[key]state         // what the session left each path as
	counts []map[key]bool        // per checkpoint, the paths its log records
	bytes  atomic.Int64          // logs and blobs (read without mu by Use)
	cps    atomic.Int32          // len(meta.Checkpoints), for Use
	blobN  int                   // the last blob number used
	logN   int                   // the last log number used
	sizes  map[string]int64      // each log's size, by file name
	blobOf map[string]blobRecord // blobs by log file name
}

type blobRecord struct {
	names []string
	size  int64
}

// Open opens (or makes) a session's store.
func Open(opts Options) (*Store, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 1 << 30
	}
	if opts.MaxCheckpoints <= 0 {
		opts.MaxCheckpoints = 64
	}
	if opts.Fresh {
		if err := os.RemoveAll(opts.Dir); err != nil {
			return nil, fmt.Errorf("changes: clear %s: %w", opts.Dir, err)
		}
	}
	if err := safepath.MkdirAll(filepath.Join(opts.Dir, "blobs"), 0o700); err != nil {
		return nil, fmt.Errorf("changes: %w", err)
	}
	s := &Store{opts: opts, dirfd: -1, blobs: -1, logFD: -1, roots: map[string]int{},
		seen: map[key]bool{}, after: map[key]state{}, sizes: map[string]int64{}, blobOf: map[string]blobRecord{}}
	if err := s.open(); err != nil {
		if opts.Shared != nil {
			opts.Shared.Add(-s.bytes.Load())
		}
		s.closeFDs()
		return nil, err
	}
	return s, nil
}

func (s *Store) open() error {
	var err error
	if s.dirfd, err = safepath.OpenDir(s.opts.Dir); err != nil {
		return fmt.Errorf("changes: %w", err)
	}
	if s.blobs, err = safepath.Beneath(s.dirfd, "blobs", unix.O_PATH|unix.O_DIRECTORY, 0); err != nil {
		return fmt.Errorf("changes: open blobs: %w", err)
	}
	for sp, dir := range s.opts.Roots {
		fd, err := safepath.OpenDir(dir)
		if err != nil {
			return fmt.Errorf("changes: backing %s: %w", sp, err)
		}
		s.roots[sp] = fd
	}
	return s.load()
}

func (s *Store) closeFDs() {
	for _, fd := range []int{s.dirfd, s.blobs, s.logFD} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	s.dirfd, s.blobs, s.logFD = -1, -1, -1
	for sp, fd := range s.roots {
		unix.Close(fd)
		delete(s.roots, sp)
	}
}

// addBytes counts n more bytes held (less when negative), in the
// store's count and its uid's.
func (s *Store) addBytes(n int64) {
	s.bytes.Add(n)
	if s.opts.Shared != nil {
		s.opts.Shared.Add(n)
	}
}

// over reports whether holding n more bytes would take the store, or its
// uid's stores together, past MaxBytes.
func (s *Store) over(n int64) bool {
	if s.bytes.Load()+n > s.opts.MaxBytes {
		return true
	}
	return s.opts.Shared != nil && s.opts.Shared.Load()+n > s.opts.MaxBytes
}

// Close releases the store's descriptors; what it holds stays (its uid's
// count no longer includes it).
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed && s.opts.Shared != nil {
		s.opts.Shared.Add(-s.bytes.Load())
	}
	s.closed = true
	s.armed.Store(false)
	s.closeFDs()
	return nil
}

// Remove closes the store and removes what it holds.
func (s *Store) Remove() error {
	s.Close()
	if err := os.RemoveAll(s.opts.Dir); err != nil {
		return fmt.Errorf("changes: remove %s: %w", s.opts.Dir, err)
	}
	return nil
}

// load reads meta.json and the logs it names, and removes what it does not
// name (left by a crash during a rollback or a drop).
func (s *Store) load() error {
	data, err := s.readFile("meta.json")
	switch {
	case errors.Is(err, unix.ENOENT):
	case err != nil:
		return fmt.Errorf("changes: read meta.json: %w", err)
	default:
		if err := json.Unmarshal(data, &s.meta); err != nil {
			return fmt.Errorf("changes: %s/meta.json: %w", s.opts.Dir, err)
		}
	}
	logs := map[string]bool{}
	blobs := map[string]bool{}
	var pending *record // a rename announced last, maybe made
	for i, cp := range s.meta.Checkpoints {
		logs[cp.Log] = true
		if n, _ := strconv.Atoi(strings.TrimPrefix(cp.Log, "log-")); n > s.logN {
			s.logN = n
		}
		recs, size, err := s.readLog(cp.Log)
		if err != nil {
			return err
		}
		s.sizes[cp.Log] = size
		s.addBytes(size)
		paths := map[key]bool{}
		br := blobRecord{}
		if i == len(s.meta.Checkpoints)-1 {
			s.seen = map[key]bool{}
		}
		for _, r := range recs {
			k := key{r.S, r.P}
			switch r.K {
			case kindAfter:
				s.after[k] = r.St
			case kindBefore:
				paths[k] = true
				if r.Blob != "" {
					blobs[r.Blob] = true
					br.names = append(br.names, r.Blob)
					br.size += inBlocks(int64(r.St.Size))
					s.addBytes(inBlocks(int64(r.St.Size)))
				}
				if i == len(s.meta.Checkpoints)-1 {
					s.seen[k] = true
				}
			case kindMoved:
				s.moveAfter(r.S, r.P, r.To, r.X)
			case kindMove:
				paths[k] = true
				paths[key{r.S, r.To}] = true
				if i == len(s.meta.Checkpoints)-1 {
					s.seen = map[key]bool{}
				}
			}
		}
		s.blobOf[cp.Log] = br
		s.counts = append(s.counts, paths)
		if n := len(recs); i == len(s.meta.Checkpoints)-1 && n > 0 && recs[n-1].K == kindMove {
			pending = &recs[n-1]
		}
	}
	// What meta.json does not name goes.
	if ents, err := os.ReadDir(s.opts.Dir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "log-") && !logs[e.Name()] {
				unix.Unlinkat(s.dirfd, e.Name(), 0)
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(s.opts.Dir, "blobs")); err == nil {
		for _, e := range ents {
			if n, err := strconv.Atoi(e.Name()); err == nil && n > s.blobN {
				s.blobN = n
			}
			if !blobs[e.Name()] {
				unix.Unlinkat(s.blobs, e.Name(), 0)
			}
		}
	}
	s.cps.Store(int32(len(s.meta.Checkpoints)))
	if n := len(s.meta.Checkpoints); n > 0 {
		fd, err := safepath.Beneath(s.dirfd, s.meta.Checkpoints[n-1].Log, unix.O_WRONLY|unix.O_APPEND, 0)
		if err != nil {
			return fmt.Errorf("changes: open log: %w", err)
		}
		s.logFD = fd
		s.armed.Store(true)
		if r := pending; r != nil {
			// Killed between the rename and its note: made if the
			// tree says so.
			if _, ok := s.roots[r.S]; ok {
				from, _ := s.lstat(r.S, r.P)
				to, _ := s.lstat(r.S, r.To)
				if (!r.X && from.T == "n" && to.Ino == r.St.Ino) || (r.X && from.Ino == r.Ino2 && to.Ino == r.St.Ino) {
					s.renamed(*r)
				}
			}
		}
	}
	return nil
}

func (s *Store) readFile(name string) ([]byte, error) {
	fd, err := safepath.Beneath(s.dirfd, name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	buf := make([]byte, st.Size)
	n, err := f.ReadAt(buf, 0)
	if int64(n) != st.Size {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return buf, nil
}

// writeMeta replaces meta.json by rename: a crash leaves the old or the new.
func (s *Store) writeMeta(m metaFile) error {
	data, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("changes: %w", err)
	}
	fd, err := safepath.Beneath(s.dirfd, "meta.json.tmp", unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("changes: write meta: %w", err)
	}
	n, err := unix.Write(fd, data)
	unix.Close(fd)
	if err == nil && n != len(data) {
		err = unix.EIO
	}
	if err == nil {
		err = unix.Renameat(s.dirfd, "meta.json.tmp", s.dirfd, "meta.json")
	}
	if err != nil {
		return fmt.Errorf("changes: write meta: %w", err)
	}
	return nil
}

// ValidName reports whether name may name a checkpoint: 1 to 64 of
// A-Z a-z 0-9 _ . -, and not all digits (an id a later checkpoint may
// get: the checkpoint named so would shadow it).
func ValidName(name string) bool {
	if len(name) < 1 || len(name) > 64 {
		return false
	}
	digits := true
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
		digits = digits && c >= '0' && c <= '9'
	}
	return !digits
}

// Create makes a checkpoint: a new, empty log (nothing walks the trees).
// When MaxCheckpoints are kept already, the oldest is dropped and given
// back in dropped.
func (s *Store) Create(name string, now time.Time) (cp Checkpoint, dropped *Checkpoint, err error) {
	if name != "" && !ValidName(name) {
		return cp, nil, fmt.Errorf("%w %q: use 1 to 64 of A-Z a-z 0-9 _ . -, not all digits (ids are)", ErrBadName, name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return cp, nil, errors.New("changes: store closed")
	}
	for _, c := range s.meta.Checkpoints {
		if name != "" && (c.Name == name || c.ID == name) {
			return cp, nil, fmt.Errorf("%w: %q names a checkpoint already", ErrBadName, name)
		}
	}
	logName := "log-" + strconv.Itoa(s.logN+1)
	fd, err := safepath.Beneath(s.dirfd, logName, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return cp, nil, fmt.Errorf("changes: new log: %w", err)
	}
	m := s.meta
	m.Next++
	c := cpMeta{ID: strconv.Itoa(m.Next), Name: name, Created: now.UTC().Truncate(time.Second), Log: logName}
	m.Checkpoints = append(append([]cpMeta(nil), m.Checkpoints...), c)
	var drop []cpMeta
	if len(m.Checkpoints) > s.opts.MaxCheckpoints {
		drop = m.Checkpoints[:len(m.Checkpoints)-s.opts.MaxCheckpoints]
		m.Checkpoints = m.Checkpoints[len(drop):]
	}
	if err := s.writeMeta(m); err != nil {
		unix.Close(fd)
		unix.Unlinkat(s.dirfd, logName, 0)
		return cp, nil, err
	}
	s.logN++
	s.meta = m
	s.cps.Store(int32(len(m.Checkpoints)))
	if s.logFD >= 0 {
		unix.Close(s.logFD)
	}
	s.logFD = fd
	s.sizes[logName] = 0
	s.seen = map[key]bool{}
	s.counts = append(s.counts, map[key]bool{})
	for _, d := range drop {
		o := s.counts[0]
		s.counts = s.counts[1:]
		s.dropLog(d.Log)
		dc := Checkpoint{ID: d.ID, Name: d.Name, Created: d.Created, Changes: len(o)}
		dropped = &dc
	}
	s.armed.Store(true)
	return Checkpoint{ID: c.ID, Name: c.Name, Created: c.Created}, dropped, nil
}

// dropLog removes a log no checkpoint names and its blobs.
func (s *Store) dropLog(name string) { s.dropLogKeeping(name, nil) }

// dropLogKeeping is dropLog, keeping the blobs keep names (a newer log
// records them again).
func (s *Store) dropLogKeeping(name string, keep map[string]bool) {
	for _, b := range s.blobOf[name].names {
		if !keep[b] {
			unix.Unlinkat(s.blobs, b, 0)
		}
	}
	s.addBytes(-(s.blobOf[name].size + s.sizes[name]))
	delete(s.blobOf, name)
	delete(s.sizes, name)
	unix.Unlinkat(s.dirfd, name, 0)
}

// List gives the checkpoints, oldest first.
func (s *Store) List() []Checkpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Checkpoint, len(s.meta.Checkpoints))
	for i, c := range s.meta.Checkpoints {
		out[i] = Checkpoint{ID: c.ID, Name: c.Name, Created: c.Created, Changes: len(s.counts[i])}
	}
	return out
}

// Use gives what the store holds, without waiting for a rollback.
func (s *Store) Use() Use {
	return Use{Checkpoints: int(s.cps.Load()), Bytes: s.bytes.Load(), MaxBytes: s.opts.MaxBytes}
}

// find gives the index of the checkpoint ref names (an id or a name).
func (s *Store) find(ref string) (int, error) {
	for i, c := range s.meta.Checkpoints {
		if c.ID == ref || (c.Name != "" && c.Name == ref) {
			return i, nil
		}
	}
	return -1, fmt.Errorf("%w %q", ErrUnknownCheckpoint, ref)
}

// sortedKeys orders keys by space, then path.
func sortedKeys(m map[key]bool) []key {
	ks := make([]key, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].space != ks[j].space {
			return ks[i].space < ks[j].space
		}
		return ks[i].path < ks[j].path
	})
	return ks
}

// Drop forgets every checkpoint: a staged session's commit or discard
// changes the layer they were taken of, so none can be rolled back to.
// Dropped are given back, oldest first.
func (s *Store) Drop() ([]Checkpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("changes: store closed")
	}
	if len(s.meta.Checkpoints) == 0 {
		return nil, nil
	}
	m := s.meta
	m.Checkpoints = nil
	if err := s.writeMeta(m); err != nil {
		return nil, err
	}
	var dropped []Checkpoint
	for i, c := range s.meta.Checkpoints {
		dropped = append(dropped, Checkpoint{ID: c.ID, Name: c.Name, Created: c.Created, Changes: len(s.counts[i])})
		s.dropLog(c.Log)
	}
	s.armed.Store(false)
	if s.logFD >= 0 {
		unix.Close(s.logFD)
		s.logFD = -1
	}
	s.meta = m
	s.cps.Store(0)
	s.counts = nil
	s.seen = map[key]bool{}
	s.after = map[key]state{}
	s.intent = nil
	return dropped, nil
}
