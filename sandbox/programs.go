package sandbox

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A program of a tree the run shows whole (/usr and the library directories,
// outside the bin directories) can be handed to the ELF interpreter
// (/lib64/ld-linux-x86-64.so.2 /usr/lib/git-core/git), which maps it
// executable: Landlock governs execve, not mmap, and the interpreter itself
// must be executable for every dynamic program. So the run covers each such
// program with a noexec mount: the kernel refuses to map a file of a noexec
// mount executable, as it refuses to execve it. Shared libraries stay
// mappable; a subtree holding programs and no library is covered whole, one
// mount instead of one per program.
//
// Finding them reads the head of every file of those trees, which takes
// a second or more: the daemon does it once, serves runs from that index,
// and scans again in the background once it is programsMaxAge old. A program
// installed after the last scan is not covered until the next one
// (docs/sandbox.md).

// programsMaxAge is how long an index of the host's programs serves before
// the next run starts a new scan in the background.
const programsMaxAge = 10 * time.Minute

// libraryName matches the names shared libraries are installed under
// (libc.so.6, ld-linux-x86-64.so.2, _ssl.cpython-311-x86_64-linux-gnu.so,
// libstemmer.so.0d.0.0).
var libraryName = regexp.MustCompile(`\.so(\.[^/]*)?$`)

// programIndex is the daemon's index of the host's programs to cover.
type programIndex struct {
	mu       sync.Mutex
	covers   []string // sorted; files and directories
	at       time.Time
	err      error
	scanning bool
	done     chan struct{} // closed when the scan in progress ends
}

// hostPrograms is the one index of this process: the host's trees are the
// same for every run.
var hostPrograms programIndex

// get returns the paths to cover and when they were found, scanning first if there is no index yet
// (every caller waits for that one scan), and starting a background scan
// when the index is old.
func (x *programIndex) get() ([]string, time.Time, error) {
	x.mu.Lock()
	if x.at.IsZero() {
		if !x.scanning {
			x.start()
		}
		done := x.done
		x.mu.Unlock()
		<-done
		x.mu.Lock()
	}
	if !x.scanning && time.Since(x.at) > programsMaxAge {
		x.start()
	}
	covers, at, err := x.covers, x.at, x.err
	x.mu.Unlock()
	if err != nil {
		return nil, at, fmt.Errorf("index the host's programs: %w", err)
	}
	return covers, at, nil
}

// state reports the index without waiting for a scan.
func (x *programIndex) state() ProgramsIndex {
	x.mu.Lock()
	defer x.mu.Unlock()
	st := ProgramsIndex{Covers: len(x.covers), Indexed: indexedString(x.at)}
	if x.err != nil {
		st.Error = x.err.Error()
	}
	return st
}

func indexedString(at time.Time) string {
	if at.IsZero() {
		return ""
	}
	return at.UTC().Format(time.RFC3339Nano)
}

// start begins a scan; x.mu is held.
func (x *programIndex) start() {
	x.scanning = true
	x.done = make(chan struct{})
	go func() {
		covers, err := scanPrograms(shownRoots(), binDirs)
		x.mu.Lock()
		defer x.mu.Unlock()
		// A failed rescan keeps the last good index: the host's trees
		// did not become safer because one scan failed.
		if err == nil || x.at.IsZero() {
			x.covers, x.err = covers, err
		}
		x.at = time.Now()
		x.scanning = false
		close(x.done)
	}()
}

// shownRoots are the host trees a run shows whole: /usr and the library
// directories that are real directories (a usr-merge link is /usr's).
func shownRoots() []string {
	roots := []string{"/usr"}
	for _, d := range libDirs {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			roots = append(roots, d)
		}
	}
	return roots
}

// scanPrograms walks roots, staying on each root's mount (the run shows
// a root without its submounts) and leaving out the directories in skip, and
// returns the mounts that cover every program found: a directory whose
// subtree holds a program and no library, or else each program on its own.
// A directory it cannot list is covered whole; a file it cannot read is
// left out (the run's command, with no more rights than the daemon, cannot
// read it either); any other failure fails the scan.
func scanPrograms(roots, skip []string) ([]string, error) {
	var covers []string
	for _, r := range roots {
		fd, err := unix.Open(r, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		switch {
		case err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP:
			continue // not there, or a link (a usr-merge link is /usr's)
		case err != nil:
			return nil, fmt.Errorf("open %s: %w", r, err)
		}
		s := &scan{mnt: mountOf(fd), skip: skip, sem: make(chan struct{}, 4)}
		whole, _ := s.dir(r, fd)
		if s.err != nil {
			return nil, s.err
		}
		covers = append(append(covers, s.covers...), whole...)
	}
	sort.Strings(covers)
	return covers, nil
}

type scan struct {
	mnt  uint64 // the root's mount: the run shows it without submounts
	skip []string
	sem  chan struct{} // bounds the directories scanned at once

	mu     sync.Mutex
	covers []string
	err    error // the first failure other than a refused permission
}

func (s *scan) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// mountOf is the id of the mount fd is on (statx, Linux 5.8; 0 before,
// and then nothing is left out as another mount). A mount, not a device:
// a btrfs subvolume has its own st_dev on the same mount.
func mountOf(fd int) uint64 {
	var stx unix.Statx_t
	if unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx) != nil {
		return 0
	}
	return stx.Mnt_id
}

// dir scans d. A subtree with programs and no library returns itself, for
// the caller to cover whole (or with a directory above it); one with a
// library reports lib and has put its programs and clean subdirectories in
// s.covers. Names are opened relative to their directory's descriptor: a
// walk of /usr opens each of its hundred thousand files.
func (s *scan) dir(d string, fd int) (whole []string, lib bool) {
	f := os.NewFile(uintptr(fd), d)
	defer f.Close()
	for _, k := range s.skip {
		if d == k {
			return nil, false
		}
	}
	ents, err := f.ReadDir(-1)
	if err != nil {
		// What could not be listed is covered whole: its programs
		// are unknown, and a command may know their names.
		return []string{d}, false
	}
	var progs []string // programs here
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		clean []string // subdirectories to cover whole
	)
	for _, e := range ents {
		p := filepath.Join(d, e.Name())
		switch {
		case e.Type().IsDir():
			sub, unlisted := s.open(fd, e.Name(), p)
			if unlisted {
				mu.Lock()
				clean = append(clean, p)
				mu.Unlock()
			}
			if sub < 0 {
				continue
			}
			merge := func(w []string, l bool) {
				mu.Lock()
				lib = lib || l
				clean = append(clean, w...)
				mu.Unlock()
			}
			select {
			case s.sem <- struct{}{}:
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-s.sem }()
					merge(s.dir(p, sub))
				}()
			default:
				merge(s.dir(p, sub))
			}
		case e.Type().IsRegular():
			kind, err := elfKind(fd, e.Name())
			if err != nil {
				s.fail(fmt.Errorf("read %s: %w", p, err))
			}
			switch kind {
			case elfProgram:
				progs = append(progs, p)
			case elfLibrary:
				mu.Lock()
				lib = true
				mu.Unlock()
			}
		}
	}
	wg.Wait()
	if !lib {
		if len(progs) > 0 || len(clean) > 0 {
			return []string{d}, false
		}
		return nil, false
	}
	s.mu.Lock()
	s.covers = append(append(s.covers, clean...), progs...)
	s.mu.Unlock()
	return nil, true
}

// open opens the subdirectory name of fd (at p) to scan it, or returns -1:
// unlisted when the daemon may not open it, which a command may still
// search (mode 0711), so it is covered whole; nothing for one on another
// mount or gone since it was listed.
func (s *scan) open(fd int, name, p string) (sub int, unlisted bool) {
	sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case err == unix.EACCES || err == unix.EPERM:
		return -1, true
	case err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP:
		return -1, false
	case err != nil:
		s.fail(fmt.Errorf("open %s: %w", p, err))
		return -1, false
	}
	if mountOf(sub) != s.mnt {
		unix.Close(sub)
		return -1, false
	}
	return sub, false
}

type elfClass int

const (
	elfNone elfClass = iota
	elfProgram
	elfLibrary
)

// elfKind says whether name (in dir) is an ELF file the interpreter could
// run (an executable, or a shared object not named as a library) or a
// library. A file the daemon may not read is neither (nor can the
// command, with no more rights, read it); any other failure is an error.
func elfKind(dir int, name string) (elfClass, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	switch {
	case err == unix.EACCES || err == unix.EPERM || err == unix.ENOENT || err == unix.ELOOP:
		return elfNone, nil
	case err != nil:
		return elfNone, err
	}
	defer unix.Close(fd)
	var h [20]byte
	n, err := unix.Pread(fd, h[:], 0)
	if err != nil {
		return elfNone, err
	}
	if n < len(h) || string(h[:4]) != "\x7fELF" {
		return elfNone, nil
	}
	var typ uint16
	switch h[5] {
	case 1:
		typ = binary.LittleEndian.Uint16(h[16:])
	case 2:
		typ = binary.BigEndian.Uint16(h[16:])
	default:
		return elfNone, nil
	}
	switch typ {
	case 2: // ET_EXEC
		return elfProgram, nil
	case 3: // ET_DYN: a PIE program or a shared library
		if libraryName.MatchString(name) {
			return elfLibrary, nil
		}
		return elfProgram, nil
	}
	return elfNone, nil
}

// coverNoexec mounts a noexec, read-only copy of p (under the new root n,
// a path the scan found) over itself. The path is resolved beneath n
// without following symlinks: the host may have changed since the scan,
// and a name that is gone or became a link has nothing of the scan's to
// cover.
func coverNoexec(n, p string) error {
	at, err := openBeneath(n, p)
	switch {
	case err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR:
		return nil
	case err != nil:
		return fmt.Errorf("open %s: %w", p, err)
	}
	defer unix.Close(at)
	var st unix.Stat_t
	if err := unix.Fstat(at, &st); err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG {
		return nil // a symlink opened with O_PATH|O_NOFOLLOW
	}
	fd, err := unix.OpenTree(at, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("clone %s: %w", p, err)
	}
	defer unix.Close(fd)
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: attrRO | unix.MOUNT_ATTR_NOEXEC}); err != nil {
		return fmt.Errorf("noexec %s: %w", p, err)
	}
	return attachAt(fd, at, p)
}

// openBeneath opens p (absolute, as in the run) under the new root n as an
// O_PATH descriptor, following no symlink: a host's /usr may hold absolute
// links, which would lead out of n.
func openBeneath(n, p string) (int, error) {
	root, err := unix.Open(n, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	return unix.Openat2(root, strings.TrimPrefix(p, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// attachAt moves the detached mount fd onto the place at (an O_PATH
// descriptor) names.
func attachAt(fd, at int, p string) error {
	if err := unix.MoveMount(fd, "", at, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach at %s: %w", p, err)
	}
	return nil
}
