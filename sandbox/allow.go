package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"
)

// placeKind says how an allowed binary appears in the run.
type placeKind int

const (
	// placeBin: in a bin directory (a tmpfs of the run), present only while
	// allowed: its mount point is created and removed with it (ENOENT).
	placeBin placeKind = iota
	// placeShown: under /usr or a library directory, which the run shows
	// whole: bound over itself, executable only while allowed (the mount's
	// noexec is what changes), so neither execve nor the ELF interpreter
	// runs it otherwise.
	placeShown
	// placeOther: elsewhere; bound over an empty placeholder while allowed.
	// Landlock's rule for it names the host's file (slot.host), whatever
	// the run shows at its place when a command is confined.
	placeOther
	// placeView: a file or directory of the view (/workspace/..., /memories/...),
	// which the run shows noexec: while allowed, what the view shows there
	// is bound over itself read-only and executable (viewbin.go).
	placeView
)

// slot is one place of the run that may hold a binary.
type slot struct {
	place    string
	names    []string // the Spec.Binaries names that stand for it
	kind     placeKind
	binDir   string // placeBin: the bin directory holding it
	dir      bool
	spare    int // a detached clone of the source, ready to attach; placeView: the attached bind
	host     int // placeOther: an O_PATH descriptor of the host's file, for Landlock's rule; -1 otherwise
	attached bool
	// ghosts (placeView): binds of it the kernel took away while a command
	// ran, which no one can make noexec; withdrawing the slot while one is
	// kept ends the run (detachView).
	ghosts []int
}

// allowState is the init's live allowlist. It keeps a detached clone of
// every binary the run may ever hold (taken before pivot_root); attaching
// one moves its clone into place and clones the attached mount again, so the
// next attach after a removal has one. Only the control goroutine uses it
// once the command runs.
type allowState struct {
	slots []*slot
	owner Spec // whom the view admits: view binaries are bound as the owner
}

func newAllowState(entries []binEntry, h *hostLayout, owner Spec) (*allowState, error) {
	al := &allowState{owner: owner}
	byPlace := map[string]*slot{}
	for _, e := range entries {
		if e.View {
			// A slot of its own per name: "/workspace/x/" and
			// "/workspace/x" are decided apart, and each binds only
			// what is of its kind. Nothing to clone ahead: the view's
			// files come and go.
			al.slots = append(al.slots, &slot{place: e.Place, names: []string{e.Name}, dir: e.Dir, spare: -1, host: -1, kind: placeView})
			continue
		}
		if sl, ok := byPlace[e.Place]; ok {
			sl.names = append(sl.names, e.Name)
			continue
		}
		sl := &slot{place: e.Place, names: []string{e.Name}, dir: e.Dir, spare: -1, host: -1, kind: placeOther}
		for _, d := range h.binDirs {
			if under(e.Place, d) && (sl.binDir == "" || len(d) > len(sl.binDir)) {
				sl.kind, sl.binDir = placeBin, d
			}
		}
		attrs := uint64(attrRO)
		if sl.kind != placeBin && h.shown(e.Place) {
			if !h.shown(e.Source) {
				continue // a link out of the shown trees, dangling in the run
			}
			// It is bound over the file it names, which the run shows.
			sl.place, sl.kind = e.Source, placeShown
			attrs |= unix.MOUNT_ATTR_NOEXEC
			if other, ok := byPlace[sl.place]; ok {
				other.names = append(other.names, e.Name)
				continue
			}
		}
		fd, err := cloneTree(e.Source, attrs)
		if err != nil {
			al.close()
			return nil, err
		}
		sl.spare = fd
		byPlace[sl.place] = sl
		al.slots = append(al.slots, sl)
		if sl.kind == placeOther {
			h, err := unix.Open(e.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
			if err != nil {
				al.close()
				return nil, fmt.Errorf("open %s: %w", e.Source, err)
			}
			sl.host = h
		}
	}
	sort.Slice(al.slots, func(i, j int) bool { return al.slots[i].place < al.slots[j].place })
	return al, nil
}

func (al *allowState) close() {
	for _, sl := range al.slots {
		sl.dropGhosts()
		if sl.spare >= 0 {
			unix.Close(sl.spare)
			sl.spare = -1
		}
		if sl.host >= 0 {
			unix.Close(sl.host)
			sl.host = -1
		}
	}
}

// execRules are the files and directories outside the bin directories and
// the view that Landlock lets a command execute: each binary listed
// elsewhere by its host file (a descriptor's /proc name, the host's tree
// being gone after pivot_root), attached or not when the command is
// confined. A rule naming what the place showed then would name the
// placeholder while the binary was withdrawn, and the command would be
// refused it after the context allowed it again. Between a withdrawal
// and the next attach the binary is reachable only through its detached
// bind, which is noexec (removeAll).
func (al *allowState) execRules() []string {
	var out []string
	for _, sl := range al.slots {
		switch sl.kind {
		case placeOther:
			out = append(out, "/proc/thread-self/fd/"+strconv.Itoa(sl.host))
		case placeShown:
			out = append(out, sl.place)
		}
	}
	return out
}

// attachShown binds each binary of the shown trees over itself under the
// new root n, not executable until set allows it. In order of place, so a
// listed file inside a listed directory lies above the directory's mount.
func (al *allowState) attachShown(n string) error {
	for _, sl := range al.slots {
		if sl.kind != placeShown {
			continue
		}
		at, err := openBeneath(n, sl.place)
		if err != nil {
			return fmt.Errorf("open %s: %w", sl.place, err)
		}
		err = attachAt(sl.spare, at, sl.place)
		unix.Close(at)
		if err != nil {
			return err
		}
		unix.Close(sl.spare)
		sl.spare = -1
	}
	return nil
}

// placeholders creates, under the new root n, the empty files and
// directories that binaries outside the bin directories are bound over.
func (al *allowState) placeholders(n string) error {
	for _, sl := range al.slots {
		if sl.kind != placeOther {
			continue
		}
		p := n + sl.place
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if sl.dir {
			if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
		} else if err := os.WriteFile(p, nil, 0o444); err != nil {
			return err
		}
	}
	return nil
}

// set makes exactly the slots named in names attached: removals first, so
// a failure part way never leaves more than was allowed before. live: a
// command may be running, which may hold a view bind the kernel took away
// (detachView).
func (al *allowState) set(names []string, live bool) error {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	allowed := func(sl *slot) bool {
		for _, n := range sl.names {
			if want[n] {
				return true
			}
		}
		return false
	}
	rw := writableDirs{}
	err := al.removeAll(allowed, rw, live)
	if err == nil {
		err = al.addAll(allowed, rw)
	}
	if e := rw.close(); err == nil {
		err = e
	}
	return err
}

// removeAll detaches every slot not allowed, and every view binary (bound
// anew by addAll if still allowed: the view may show another file there).
func (al *allowState) removeAll(allowed func(*slot) bool, rw writableDirs, live bool) error {
	for _, sl := range al.slots {
		if sl.kind == placeView {
			if err := sl.detachView(live, allowed(sl)); err != nil {
				return err
			}
			continue
		}
		if !sl.attached || allowed(sl) {
			continue
		}
		if sl.kind == placeShown {
			if err := setExec(sl.place, false); err != nil {
				return err
			}
			sl.attached = false
			continue
		}
		// Noexec first: a descriptor opened through the bind while it
		// was allowed (O_RDONLY or O_PATH, a /proc/PID/exe, a cwd) keeps
		// the detached mount, and execve, fexecve and the ELF
		// interpreter's mapping all ask that mount.
		if err := setExec(sl.place, false); err != nil {
			return err
		}
		if err := unix.Unmount(sl.place, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			return fmt.Errorf("unbind %s: %w", sl.place, err)
		}
		sl.attached = false
		if sl.kind == placeBin {
			if err := rw.open(sl.binDir); err != nil {
				return err
			}
			if err := unix.Unlink(sl.place); err != nil {
				return fmt.Errorf("remove %s: %w", sl.place, err)
			}
		}
	}
	return nil
}

// addAll attaches every allowed slot not attached.
func (al *allowState) addAll(allowed func(*slot) bool, rw writableDirs) error {
	for _, sl := range al.slots {
		if sl.attached || !allowed(sl) {
			continue
		}
		switch sl.kind {
		case placeShown:
			if err := setExec(sl.place, true); err != nil {
				return err
			}
			sl.attached = true
			continue
		case placeView:
			if err := sl.attachView(al.owner); err != nil {
				return err
			}
			continue
		case placeBin:
			if err := rw.open(sl.binDir); err != nil {
				return err
			}
			if err := sl.makeTarget(); err != nil {
				return err
			}
		}
		if err := sl.attach(); err != nil {
			return err
		}
	}
	return nil
}

// writableDirs are the bin directories an update made writable, each once.
type writableDirs map[string]bool

func (rw writableDirs) open(d string) error {
	if rw[d] {
		return nil
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, d, 0, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("writable %s: %w", d, err)
	}
	rw[d] = true
	return nil
}

// close makes them read-only again, reporting the first failure.
func (rw writableDirs) close() error {
	var err error
	for d := range rw {
		if e := setRO(d); e != nil && err == nil {
			err = e
		}
	}
	return err
}

// setExec makes the mount at place (a shown binary's own) executable or not.
func setExec(place string, exec bool) error {
	a := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOEXEC}
	if exec {
		a = &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_NOEXEC}
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, place, unix.AT_SYMLINK_NOFOLLOW, a); err != nil {
		return fmt.Errorf("exec %v %s: %w", exec, place, err)
	}
	return nil
}

// makeTarget creates the empty file a bin-directory binary is bound over.
func (sl *slot) makeTarget() error {
	if err := os.MkdirAll(filepath.Dir(sl.place), 0o755); err != nil {
		return err
	}
	fd, err := unix.Open(sl.place, unix.O_CREAT|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o555)
	if err != nil {
		return fmt.Errorf("create %s: %w", sl.place, err)
	}
	return unix.Close(fd)
}

// attach moves the spare clone into place and takes a new spare from it.
func (sl *slot) attach() error {
	if err := attach(sl.spare, sl.place); err != nil {
		return err
	}
	sl.attached = true
	fd, err := unix.OpenTree(unix.AT_FDCWD, sl.place, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("clone %s again: %w", sl.place, err)
	}
	unix.Close(sl.spare)
	sl.spare = fd
	return nil
}
