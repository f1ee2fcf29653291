package acl

import (
	"errors"
	"net/netip"
	"strings"

	cctx "github.com/condfs/condfs/context"
)

// What a sandboxed run (condfs run) may execute: the [sandbox] table and
// the path rules of the Exec space.
//
// Paths here are absolute, as the run names them: host paths, except that
// /workspace/... and /memories/... name files of the session's view. A
// file may be executed when it is listed in binaries (exactly, or beneath
// a listed directory) and the exec rules allow its path in the context
// (the four steps of Decide). A view file must also be visible in the
// view, although a hidden one could not be reached anyway.
//
// A listed name that is a symlink (/usr/bin/python3 and the alternatives)
// stands for the file it resolves to. Decisions are made on the name; the
// caller that resolves it executes only the file the name resolves to
// (checked by device and inode at execution), never a file reached by
// another name unless that name is decided on its own.
//
// Fail-closed choices: no [sandbox] table allows nothing; a path that is
// relative, not canonical ("/usr/bin/../bin/x", "//", a trailing "/") or
// holds a NUL is never allowed (the caller resolves names, acl never does).

// Network is how a run reaches the network.
type Network string

// The network modes.
const (
	NetworkNone   Network = "none"   // its own namespace, loopback only (the default)
	NetworkHost   Network = "host"   // the host's network
	NetworkPolicy Network = "policy" // every connection decided by the egress gateway
)

// DefaultConnections bounds a run's open connections under NetworkPolicy
// when the table sets none.
const DefaultConnections = 256

// Sandbox is a loaded [sandbox] table. Like its Config it is immutable:
// accessors hand out copies.
type Sandbox struct {
	binaries     []string        // as written, canonical; directories end in "/"
	files        map[string]bool // listed files
	dirs         map[string]bool // listed directories, without the trailing "/" ("" for "/")
	network      Network
	memory       int64 // bytes; 0: unset
	tmpSize      int64 // bytes; 0: unset
	pids         int   // 0: unset
	connections  int
	reachPrivate []netip.Prefix
	hosts        string
	view         []viewEntry // the entries naming the view, for ExecListed
}

// viewEntry is a binaries entry naming the view: a path of space sp.
type viewEntry struct {
	sp   Space
	path string // canonical in the space, without a trailing "/"
	dir  bool
}

// Sandbox returns the [sandbox] table, or nil when the file has none: then
// no program may be executed and condfs run refuses.
func (c *Config) Sandbox() *Sandbox { return c.sandbox }

// Binaries lists the binaries entries in file order; directories end in "/".
func (s *Sandbox) Binaries() []string { return append([]string(nil), s.binaries...) }

// Network is the network mode (NetworkNone when unset).
func (s *Sandbox) Network() Network { return s.network }

// Memory is a run's memory limit in bytes, 0 when unset.
func (s *Sandbox) Memory() int64 { return s.memory }

// TmpSize bounds /tmp and /dev/shm together, in bytes; 0 when unset (the
// sandbox then applies its own default).
func (s *Sandbox) TmpSize() int64 { return s.tmpSize }

// Pids is a run's process limit, 0 when unset.
func (s *Sandbox) Pids() int { return s.pids }

// Connections bounds a run's open connections under NetworkPolicy.
func (s *Sandbox) Connections() int { return s.connections }

// ReachPrivate lists the private or local prefixes a run may reach under
// NetworkPolicy (single addresses as full-length prefixes).
func (s *Sandbox) ReachPrivate() []netip.Prefix {
	return append([]netip.Prefix(nil), s.reachPrivate...)
}

// Hosts is the hosts(5) file the egress gateway resolves names from before
// DNS under NetworkPolicy, or "".
func (s *Sandbox) Hosts() string { return s.hosts }

// MayReachPrivate reports whether reach_private lists addr. An IPv4-mapped
// IPv6 address is its IPv4 address; a zone is ignored.
func (s *Sandbox) MayReachPrivate(addr netip.Addr) bool {
	addr = addr.Unmap().WithZone("")
	for _, p := range s.reachPrivate {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// Listed reports whether the canonical absolute path p is listed in
// binaries, exactly or beneath a listed directory. It does not look at the
// exec rules.
func (s *Sandbox) Listed(p string) bool {
	if !execPathOK(p) {
		return false
	}
	return s.files[p] || s.beneathDir(p)
}

// beneathDir reports whether a directory above p is listed, from p's
// parent up to "/" ("").
func (s *Sandbox) beneathDir(p string) bool {
	for i := strings.LastIndexByte(p, '/'); i >= 0; i = strings.LastIndexByte(p[:i], '/') {
		if s.dirs[p[:i]] {
			return true
		}
	}
	return false
}

// execPathOK: p is absolute and canonical (Canon(p) == p), not "/", with
// no NUL. It does not allocate.
func execPathOK(p string) bool {
	if len(p) < 2 || p[0] != '/' || p[len(p)-1] == '/' || strings.IndexByte(p, 0) >= 0 {
		return false
	}
	for i := 1; i < len(p); {
		seg, next := segment(p, i)
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
		i = next
	}
	return true
}

// viewPath splits a path of the view (/workspace/x, /memories/x) into its
// space and the path in it.
func viewPath(p string) (Space, string, bool) {
	for _, v := range [...]struct {
		sp   Space
		root string
	}{{Memories, "/memories"}, {Workspace, "/workspace"}} {
		if p == v.root {
			return v.sp, "/", true
		}
		if len(p) > len(v.root) && p[len(v.root)] == '/' && p[:len(v.root)] == v.root {
			return v.sp, p[len(v.root):], true
		}
	}
	return 0, "", false
}

// ErrNoSandbox is why nothing may be executed under a conditions.toml
// without a [sandbox] table.
var ErrNoSandbox = errors.New("conditions.toml has no [sandbox] table: no binaries are allowed")

// ExecAllowed reports whether a run in context atoms may execute the file
// named p: p is canonical and absolute, listed in binaries, the exec rules
// allow it, and a file of the view is visible there. p is the name as
// listed or as found beneath a listed directory, not its symlink target
// (see the comment at the top of this file). It does not allocate: it may
// run for every execve.
//
// A p ending in "/" names a listed directory as a whole (a run makes it
// executable with one mount): allowed only where every path beneath it
// is (dirAllowed).
func (c *Config) ExecAllowed(atoms cctx.Set, p string) bool {
	if c.sandbox == nil {
		return false
	}
	if d, ok := strings.CutSuffix(p, "/"); ok {
		return c.dirAllowed(atoms, d)
	}
	if !c.sandbox.Listed(p) {
		return false
	}
	if allow, _ := c.Decide(Exec, p, atoms); !allow {
		return false
	}
	if sp, rest, ok := viewPath(p); ok {
		if vis, _ := c.Visible(sp, rest, atoms); !vis {
			return false
		}
	}
	return true
}

// dirAllowed: the directory d is listed (itself or beneath a listed
// directory), the view shows it if it is the view's, and the exec rules
// allow every path beneath it in the context: the path beneath that no
// rule key names, and every path that one does. A rule beneath d that
// denies (or matches and does not hold) keeps the whole directory from
// being executable: fail closed; list such files one by one instead.
func (c *Config) dirAllowed(atoms cctx.Set, d string) bool {
	if !execPathOK(d) || !c.sandbox.dirs[d] && !c.sandbox.beneathDir(d) {
		return false
	}
	if sp, rest, ok := viewPath(d); ok {
		if vis, _ := c.Visible(sp, rest, atoms); !vis {
			return false
		}
	}
	n := c.spaces[Exec]
	for i := 1; i < len(d) && n != nil; {
		seg, next := segment(d, i)
		n, i = n.children[seg], next
	}
	return c.allowedBeneath(atoms, d, n)
}

// allowedBeneath: every path beneath d is allowed; n is d's trie node (nil:
// no rule key lies beneath d). NUL names no key, so the decision for
// d+"/\x00" is the one for every path beneath d that no key names.
func (c *Config) allowedBeneath(atoms cctx.Set, d string, n *node) bool {
	if allow, _ := c.Decide(Exec, d+"/\x00", atoms); !allow {
		return false
	}
	if n == nil {
		return true
	}
	for seg, child := range n.children {
		p := d + "/" + seg
		if allow, _ := c.Decide(Exec, p, atoms); !allow || !c.allowedBeneath(atoms, p, child) {
			return false
		}
	}
	return true
}

// AllowedBinaries returns, in order, the names a run in context atoms may
// execute (ExecAllowed) among names: the files the caller found for the
// binaries entries, each by the name it is listed under.
func (c *Config) AllowedBinaries(atoms cctx.Set, names []string) []string {
	out := []string{}
	for _, n := range names {
		if c.ExecAllowed(atoms, n) {
			out = append(out, n)
		}
	}
	return out
}

// ExplainExec answers what ExecAllowed does for a path as a client sends
// it, with the exec rules that matched. The path must be absolute; it is
// canonicalised lexically first (Canon), which ExecAllowed itself never
// does.
func (c *Config) ExplainExec(raw string, atoms cctx.Set) (Explanation, error) {
	if !strings.HasPrefix(raw, "/") {
		return Explanation{}, errors.New("an exec path is absolute")
	}
	canon, err := Canon(raw)
	if err != nil {
		return Explanation{}, err
	}
	ex := c.Explain(Exec, canon, atoms)
	if ex.Decision == "deny" {
		return ex, nil
	}
	switch {
	case c.sandbox == nil:
		ex.Decision, ex.Why = "deny", ErrNoSandbox.Error()
	case !c.sandbox.Listed(canon):
		ex.Decision, ex.Why = "deny", canon+" is not listed in [sandbox] binaries"
	default:
		if sp, rest, ok := viewPath(canon); ok {
			if vis, _ := c.Visible(sp, rest, atoms); !vis {
				ex.Decision, ex.Why = "deny", "the view hides "+canon
			}
		}
	}
	return ex, nil
}

// ExecListed reports whether the canonical path p of view space sp lies at
// or beneath a binaries entry naming the view (/workspace/..., /memories/...).
// Such a path is read-only through the view for every caller, in every
// context: what a run may ever execute there, no session process may
// write, make, remove or move (docs/conditions.md). Without a [sandbox]
// table nothing is. It does not allocate: views ask it for listed entries.
func (c *Config) ExecListed(sp Space, p string) bool {
	if c.sandbox == nil {
		return false
	}
	for _, e := range c.sandbox.view {
		if e.sp == sp && (p == e.path || e.dir && beneath(p, e.path)) {
			return true
		}
	}
	return false
}

// ListsView reports whether a binaries entry names a path of view space
// sp: there, a file with two names may have one a run executes.
func (c *Config) ListsView(sp Space) bool {
	if c.sandbox == nil {
		return false
	}
	for _, e := range c.sandbox.view {
		if e.sp == sp {
			return true
		}
	}
	return false
}

// HoldsExecListed reports whether a binaries entry names a path of view
// space sp strictly beneath the canonical path p: such a directory never
// moves, nor does another take its name (its listed paths would then show
// what the mover chose).
func (c *Config) HoldsExecListed(sp Space, p string) bool {
	if c.sandbox == nil {
		return false
	}
	for _, e := range c.sandbox.view {
		if e.sp == sp && beneath(e.path, p) {
			return true
		}
	}
	return false
}

// beneath reports whether the canonical path p lies strictly beneath the
// canonical directory dir ("/" holds every other path).
func beneath(p, dir string) bool {
	if dir == "/" {
		return p != "/"
	}
	return len(p) > len(dir) && p[len(dir)] == '/' && p[:len(dir)] == dir
}
