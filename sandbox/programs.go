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

// get returns the paths to cover, scanning first if there is no index yet
// (every caller waits for that one scan), and starting a background scan
// when the index is old.
func (x *programIndex) get() ([]string, error) {
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
	covers, err := x.covers, x.err
	x.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("index the host's programs: %w", err)
	}
	return covers, nil
}

// state reports the index without waiting for a scan.
func (x *programIndex) state() ProgramsIndex {
	x.mu.Lock()
	defer x.mu.Unlock()
	st := ProgramsIndex{Covers: len(x.covers)}
	if !x.at.IsZero() {
		st.Indexed = x.at.UTC().Format(time.RFC3339)
	}
	if x.err != nil {
		st.Error = x.err.Error()
	}
	return st
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

// scanPrograms walks roots, staying on each root's filesystem (the run shows
// a root without its submounts) and leaving out the directories in skip, and
// returns the mounts that cover every program found: a directory whose
// subtree holds a program and no library, or else each program on its own.
// A directory or file it cannot read is left out (the run's command, with
// no more rights than the daemon, cannot read it either).
func scanPrograms(roots, skip []string) ([]string, error) {
	var covers []string
	for _, r := range roots {
		var st unix.Stat_t
		if err := unix.Lstat(r, &st); err != nil {
			if err == unix.ENOENT {
				continue
			}
			return nil, fmt.Errorf("stat %s: %w", r, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		fd, err := unix.Open(r, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", r, err)
		}
		s := &scan{dev: st.Dev, skip: skip, sem: make(chan struct{}, 4)}
		whole, _ := s.dir(r, fd)
		covers = append(append(covers, s.covers...), whole...)
	}
	sort.Strings(covers)
	return covers, nil
}

type scan struct {
	dev  uint64
	skip []string
	sem  chan struct{} // bounds the directories scanned at once

	mu     sync.Mutex
	covers []string
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
		return nil, false
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
			sub, err := unix.Openat(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			var st unix.Stat_t
			if unix.Fstat(sub, &st) != nil || st.Dev != s.dev {
				unix.Close(sub)
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
			switch elfKind(fd, e.Name()) {
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

type elfClass int

const (
	elfNone elfClass = iota
	elfProgram
	elfLibrary
)

// elfKind says whether p is an ELF file the interpreter could run (an
// executable, or a shared object not named as a library) or a library.
func elfKind(dir int, name string) elfClass {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return elfNone
	}
	defer unix.Close(fd)
	var h [20]byte
	if n, err := unix.Pread(fd, h[:], 0); err != nil || n < len(h) || string(h[:4]) != "\x7fELF" {
		return elfNone
	}
	var typ uint16
	switch h[5] {
	case 1:
		typ = binary.LittleEndian.Uint16(h[16:])
	case 2:
		typ = binary.BigEndian.Uint16(h[16:])
	default:
		return elfNone
	}
	switch typ {
	case 2: // ET_EXEC
		return elfProgram
	case 3: // ET_DYN: a PIE program or a shared library
		if libraryName.MatchString(name) {
			return elfLibrary
		}
		return elfProgram
	}
	return elfNone
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
