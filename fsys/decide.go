package fsys

import (
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
)

// space is a rule space: memories or workspace, in the root's order.
type space = acl.Space

// spaceCount is how many spaces a view's root holds.
const spaceCount = 2

// spaceByName is the space a root entry names.
func spaceByName(name string) (space, bool) {
	sp, err := acl.ParseSpace(name)
	return sp, err == nil
}

// Rules gives the current path-rule snapshot. An atomic.Pointer[acl.Config]
// satisfies it; the daemon swaps the pointer on reload.
type Rules interface {
	Load() *acl.Config
}

// DenyFunc is told of a path the rules deny to a request, with the context
// it was decided in (Options.OnDeny).
type DenyFunc func(atoms cctx.Set, space acl.Space, path, op string)

// authority is what a view decides with: its rules and its context, and
// the count of their changes.
type authority struct {
	rules Rules
	atoms atomic.Pointer[cctx.Set]
	// changes counts the view's context switches and reloads: with the
	// host's renames, its generation (View.generation).
	changes atomic.Uint64
	// reloadOld: the rules before the reload being applied (Invalidate).
	reloadOld *acl.Config
}

// Invalidate drops the kernel's cached entries after the rules changed
// from old (nil: unknown, everything is dropped one by one).
func (v *View) Invalidate(old *acl.Config) error {
	v.authz.reloadOld = old
	return v.invalidate(false, nil)
}

// reloadedFrom is the decision with the rules before the reload being
// applied, and whether they are known.
func (v *View) reloadedFrom() (decision, bool) {
	d := v.decision()
	d.cfg, d.replaced = v.authz.reloadOld, nil
	return d, d.cfg != nil
}

// decision is the state one operation decides with, read once so that an
// operation never mixes two configs or two contexts, and the only code of
// the package that consults the rules (TestOnlyDecisionConsultsRules checks
// it). Each kind of decision is written here once:
//
//   - a path (path, shows, denial): the rules for the path and every
//     directory above it, in the view's context;
//   - what an entry is (hides): a symlink whose target is absolute or
//     leaves the space is hidden, and so is a regular file with more than
//     one name in a space with rules (the hard-link rule, hidesLinked: its
//     other name may be a protected file);
//   - a listed entry (listed), decided as its lookup would be;
//   - what a run may execute (readOnly, holdsReadOnly): read-only through
//     the view for every caller, and never moved;
//   - an open handle (handle), for the path its file has now;
//   - what the kernel's caches must lose when the context or the rules
//     change (sensitive, holdsRuled, changedFrom).
type decision struct {
	cfg       *acl.Config
	replaced  *acl.Config // Options.Replaced: the rules a reload is replacing, or nil
	atoms     cctx.Set
	hardlinks bool // Options.AllowHardlinks: the hard-link rule is off
}

func (v *View) decision() decision {
	d := decision{cfg: v.authz.rules.Load(), atoms: *v.authz.atoms.Load(), hardlinks: v.opts.AllowHardlinks}
	if v.opts.Replaced != nil {
		d.replaced = v.opts.Replaced.Load()
	}
	return d
}

// path decides the canonical path p of space sp: whether the view shows it,
// and whether some rule governs it or a directory above it (ruled).
func (d decision) path(sp acl.Space, p string) (vis, ruled bool) {
	return d.cfg.Visible(sp, p, d.atoms)
}

// shows reports whether the view shows p.
func (d decision) shows(sp acl.Space, p string) bool {
	vis, _ := d.path(sp, p)
	return vis
}

// denial is the answer to op on dir's name, which the rules hide: EACCES
// for I/O on a handle, and for making (or exchanging) a name in a
// directory the view shows; ENOENT otherwise, since hidden names do not
// exist.
func (d decision) denial(op opKind, sp acl.Space, dir, name string) syscall.Errno {
	switch op {
	case opIO:
		return syscall.EACCES
	case opCreate, opExchange:
		if name != "" && d.shows(sp, dir) {
			return syscall.EACCES
		}
	}
	return syscall.ENOENT
}

// hidesLinked is the hard-link rule: in a space with rules, a regular file
// with more than one name is hidden (its other name may be protected) and
// link(2) is refused. So it is, whatever Options.AllowHardlinks says, in a
// space where [sandbox] binaries lists paths (readOnly): a second name of
// a file a run may execute, made before it was listed, would write it.
func (d decision) hidesLinked(sp acl.Space) bool {
	return !d.hardlinks && d.cfg.HasRules(sp) || d.cfg.ListsView(sp) || d.replaced != nil && d.replaced.ListsView(sp)
}

// readOnly reports whether p is at or beneath a path of the view that
// [sandbox] binaries lists: a run may execute it (in some context), so no
// one may write, make, remove or move it through the view (EROFS), and a
// regular file with another name there is hidden (that name may be
// writable), whatever the hard-link option says. While a reload is
// applied, what the rules it replaces list stays so: runs may still hold
// it bound executable until the new rules reach them.
func (d decision) readOnly(sp acl.Space, p string) bool {
	return d.cfg.ExecListed(sp, p) || d.replaced != nil && d.replaced.ExecListed(sp, p)
}

// holdsReadOnly reports whether a path below p is readOnly: such a
// directory never moves, nor does another take its name.
func (d decision) holdsReadOnly(sp acl.Space, p string) bool {
	return d.cfg.HoldsExecListed(sp, p) || d.replaced != nil && d.replaced.HoldsExecListed(sp, p)
}

// ruledSpace reports whether sp has rules at all: names below a directory
// that moves may then be decided differently.
func (d decision) ruledSpace(sp acl.Space) bool { return d.cfg.HasRules(sp) }

// hides applies the rules that depend on what an entry is (st), at path p:
// symlinks whose target is absolute or leaves the space, and multiply
// linked regular files under the hard-link rule. link reads a symlink's
// target when needed.
func (d decision) hides(sp acl.Space, p string, st *unix.Stat_t, link func() (string, error)) bool {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		target, err := link()
		return err != nil || escapes(p, target)
	case unix.S_IFREG:
		return multiNamed(st) && (d.hidesLinked(sp) || d.readOnly(sp, p))
	}
	return false
}

// listed decides an entry a listing hands out at path p, of dirent type
// typ: shown, and whether what it is must be read first and passed to
// hides (a symlink, an unknown type, or a regular file the hard-link rule
// may hide).
func (d decision) listed(sp acl.Space, p string, typ uint8) (show, check bool) {
	if !d.shows(sp, p) {
		return false, false
	}
	return true, typ == unix.DT_LNK || typ == unix.DT_UNKNOWN || (typ == unix.DT_REG && (d.hidesLinked(sp) || d.readOnly(sp, p)))
}

// handle decides an open file that is now at p with nlink names (named is
// false when it left the space or cannot be named: no authority); written:
// it, or another handle of its file, is open for writing, which a readOnly
// file may not be.
func (d decision) handle(sp acl.Space, p string, nlink uint64, named, written bool) bool {
	ro := d.readOnly(sp, p)
	return named && d.shows(sp, p) && !(nlink > 1 && (d.hidesLinked(sp) || ro)) && !(written && ro)
}

// sensitive reports whether a context switch can change what a listing of
// the directory p shows: a rule governs it or a path below it.
func (d decision) sensitive(sp acl.Space, p string) bool {
	_, ruled := d.path(sp, p)
	return ruled || d.holdsRuled(sp, p)
}

// holdsRuled reports whether a rule names a path below p: such a
// directory never moves (its protected paths would walk out from under
// their rules), and a switch must look below it for entries to drop.
func (d decision) holdsRuled(sp acl.Space, p string) bool { return d.cfg.HasRulesUnder(sp, p) }

// changedFrom reports whether p is decided differently by d than by old
// (the rules before a reload, in the same context): its visibility, its
// being ruled, or the hard-link rule of its space.
func (d decision) changedFrom(old decision, sp acl.Space, p string) bool {
	if old.hidesLinked(sp) != d.hidesLinked(sp) || old.readOnly(sp, p) != d.readOnly(sp, p) {
		return true
	}
	ov, or := old.path(sp, p)
	nv, nr := d.path(sp, p)
	return ov != nv || or != nr
}

// escapes reports whether a symlink at canonical path linkPath with the
// given target leaves its space: an absolute target, or one whose ".."
// climb above the space root (checked lexically; every further link on
// the way is checked where it stands).
func escapes(linkPath, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") {
		return true
	}
	dir, _ := split(linkPath)
	depth := 0
	if dir != "/" {
		depth = strings.Count(dir, "/")
	}
	for _, seg := range strings.Split(target, "/") {
		switch seg {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}
