// Package acl holds the path rules and prompt-block rules of
// conditions.toml, compiled into an immutable Config that answers "may this
// context see this path?" on every FUSE lookup, and the [sandbox] table
// with the exec rules that answer "may a run in this context execute this
// file?" (sandbox.go).
//
// A Config is a snapshot: it is built whole, validated, and never changed.
// Hot reload builds a new one and swaps a pointer, so a reader sees either
// the old rules or the new ones, never a mix.
//
// Decision for a canonical path, given a context (conditions.md):
//  1. a matching deny rule whose condition holds: deny;
//  2. else a matching allow rule whose condition holds: allow;
//  3. else, if any rule matched the path: deny;
//  4. else: allow.
//
// A key ending in "/" is a prefix: it matches the directory itself and
// everything under it ("/" matches the whole space); any other key matches
// exactly one path.
package acl

import (
	"fmt"
	"path"
	"strings"

	"github.com/BurntSushi/toml"

	cctx "github.com/condfs/condfs/context"
)

// Space is a space of path rules: one of the two gated trees a view
// shows, or Exec, the programs a sandboxed run may execute (sandbox.go).
type Space uint8

// The spaces.
const (
	Memories Space = iota
	Workspace
	Exec
	numSpaces
)

func (s Space) String() string {
	switch s {
	case Memories:
		return "memories"
	case Workspace:
		return "workspace"
	case Exec:
		return "exec"
	}
	return fmt.Sprintf("space(%d)", uint8(s))
}

// ParseSpace reads the name of a view space, "memories" or "workspace".
// It never answers Exec: views look their root's names up with it, and
// exec is not a tree a view shows.
func ParseSpace(s string) (Space, error) {
	switch s {
	case "memories":
		return Memories, nil
	case "workspace":
		return Workspace, nil
	}
	return 0, fmt.Errorf("space %q: want memories or workspace", s)
}

// ParseRuleSpace reads the name of any space of path rules: "memories",
// "workspace" or "exec". For checks, not for views (see ParseSpace).
func ParseRuleSpace(s string) (Space, error) {
	if s == "exec" {
		return Exec, nil
	}
	if sp, err := ParseSpace(s); err == nil {
		return sp, nil
	}
	return 0, fmt.Errorf("space %q: want memories, workspace or exec", s)
}

// Spaces lists the view spaces in order (Exec is not one).
var Spaces = []Space{Memories, Workspace}

// Canon canonicalises a requested path: a leading "/" added, ".", ".." and
// "//" resolved lexically (".." never climbs above the space root),
// a trailing "/" dropped. A NUL byte is refused.
func Canon(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path contains a NUL byte")
	}
	return path.Clean("/" + p), nil
}

// Config is a loaded conditions.toml. It is immutable and safe for
// concurrent use.
type Config struct {
	file    string
	spaces  [numSpaces]*node
	ruled   [numSpaces]bool
	blocks  []blockRule
	sandbox *Sandbox // nil: no [sandbox] table, nothing may be executed
	changes *Changes // nil: no [changes] table, the defaults (changes.go)
	egress  *Egress  // nil: no [egress] table, no host inspected (egress.go)
	secrets []*Secret
	// secretAt is where each secret's hosts are, while loading.
	secretAt []toml.Primitive
}

type rule struct {
	key  string // as normalised, with a trailing "/" for prefixes
	deny bool
	cond cctx.Condition
}

type blockRule struct {
	name string
	cond cctx.Condition
}

// node is a trie node: one per path segment that some rule key names.
type node struct {
	children map[string]*node
	prefix   []rule // keys "<this>/": match this node and everything below
	exact    []rule // keys "<this>": match this node only
}

// Empty returns a Config with no rules: every path is allowed and no block
// is selected.
func Empty() *Config {
	c := &Config{}
	for i := range c.spaces {
		c.spaces[i] = &node{}
	}
	return c
}

// File is the path the config was loaded from ("" for none).
func (c *Config) File() string { return c.file }

// HasRules reports whether space s has any rule. In such a space, files
// with several hard links are hidden (their other name may be protected).
func (c *Config) HasRules(s Space) bool { return c.ruled[s] }

// Decide reports whether atoms may see the canonical path p of space s, and
// whether any rule matched p at all (a path that no rule matches can never
// change its decision). It does not allocate.
func (c *Config) Decide(s Space, p string, atoms cctx.Set) (allow, ruled bool) {
	n := c.spaces[s]
	matched, allowed := false, false
	if eval(n.prefix, atoms, &matched, &allowed) {
		return false, true
	}
	// Walk the segments of p ("/a/b" -> "a", "b") without splitting.
	for i := 1; i < len(p) && n.children != nil; {
		seg, next := segment(p, i)
		last := next == len(p)
		if n = n.children[seg]; n == nil {
			break
		}
		if eval(n.prefix, atoms, &matched, &allowed) {
			return false, true
		}
		if last {
			if eval(n.exact, atoms, &matched, &allowed) {
				return false, true
			}
			break
		}
		i = next
	}
	if allowed {
		return true, true
	}
	return !matched, matched
}

// segment returns the segment of canonical path p that starts at i and
// the index of the next one (len(p) after the last). Small enough to
// inline: it runs for every segment of every lookup.
func segment(p string, i int) (seg string, next int) {
	if j := strings.IndexByte(p[i:], '/'); j >= 0 {
		return p[i : i+j], i + j + 1
	}
	return p[i:], len(p)
}

// eval applies rules that match the path; it returns true on a deny.
func eval(rules []rule, atoms cctx.Set, matched, allowed *bool) bool {
	for i := range rules {
		*matched = true
		if rules[i].cond.Holds(atoms) {
			if rules[i].deny {
				return true
			}
			*allowed = true
		}
	}
	return false
}

// Match is one rule that matched a path, for Explain.
type Match struct {
	Key    string `json:"key"`
	Action string `json:"action"`
	When   string `json:"when"`
	Holds  bool   `json:"holds"`
}

// Explanation is a decision with the rules behind it.
type Explanation struct {
	Decision string  `json:"decision"`
	Path     string  `json:"path"`
	Rules    []Match `json:"rules"`
	Why      string  `json:"why"`
}

// Explain decides like Decide and lists every rule that matched, with
// whether its condition held.
func (c *Config) Explain(s Space, p string, atoms cctx.Set) Explanation {
	ex := Explanation{Path: p, Rules: []Match{}}
	add := func(rules []rule) {
		for _, r := range rules {
			action := "allow"
			if r.deny {
				action = "deny"
			}
			ex.Rules = append(ex.Rules, Match{Key: r.key, Action: action, When: r.cond.String(), Holds: r.cond.Holds(atoms)})
		}
	}
	n := c.spaces[s]
	add(n.prefix)
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	if p == "/" {
		segs = nil
	}
	for i, seg := range segs {
		if n = n.children[seg]; n == nil {
			break
		}
		add(n.prefix)
		if i == len(segs)-1 {
			add(n.exact)
		}
	}
	allow, _ := c.Decide(s, p, atoms)
	ex.Decision = "deny"
	if allow {
		ex.Decision = "allow"
	}
	switch {
	case len(ex.Rules) == 0:
		ex.Why = "no rule matches the path"
	default:
		ex.Why = "no matching rule's condition holds"
		for _, m := range ex.Rules {
			if m.Holds && m.Action == "deny" {
				ex.Why = "deny rule " + m.Key + " holds"
				break
			}
			if m.Holds {
				ex.Why = "allow rule " + m.Key + " holds"
			}
		}
	}
	return ex
}

// Visible reports whether p and every directory above it are allowed: what
// a view shows, since the kernel walks each directory on the way (and a
// process's cwd may sit inside a directory that has just been hidden). ruled
// reports whether any rule matched p or a directory above it. It does not
// allocate.
func (c *Config) Visible(s Space, p string, atoms cctx.Set) (visible, ruled bool) {
	n := c.spaces[s]
	matched, allowed := false, false
	if eval(n.prefix, atoms, &matched, &allowed) {
		return false, true
	}
	if matched && !allowed {
		return false, true // the space root itself is denied
	}
	for i := 1; i < len(p) && n.children != nil; {
		seg, next := segment(p, i)
		last := next == len(p)
		if n = n.children[seg]; n == nil {
			break
		}
		if eval(n.prefix, atoms, &matched, &allowed) {
			return false, true
		}
		// This level's own decision: the prefix rules so far (they match
		// every level below them) and its exact rules.
		em, ea := matched, allowed
		if eval(n.exact, atoms, &em, &ea) {
			return false, true
		}
		if em && !ea {
			return false, true
		}
		ruled = ruled || em
		if last {
			break
		}
		i = next
	}
	// Levels below the last trie node have no rules of their own and share
	// the prefix state already checked.
	return true, ruled || matched
}

// HasRulesUnder reports whether some rule key names p or a path below it.
// Renaming such a directory would carry protected paths out from under
// their rules, so views refuse it.
func (c *Config) HasRulesUnder(s Space, p string) bool {
	n := c.spaces[s]
	for i := 1; i < len(p); {
		seg, next := segment(p, i)
		if n = n.children[seg]; n == nil {
			return false
		}
		i = next
	}
	return len(n.prefix) > 0 || len(n.exact) > 0 || len(n.children) > 0
}

// ExplainView answers what a view does for a path as a client sends it: the
// path's own decision (Explain of its canonical form), and deny when any
// directory the kernel walks through on the way is hidden, including those
// a later ".." leaves again ("/private/../x" walks through /private).
func (c *Config) ExplainView(s Space, raw string, atoms cctx.Set) (Explanation, error) {
	canon, err := Canon(raw)
	if err != nil {
		return Explanation{}, err
	}
	ex := c.Explain(s, canon, atoms)
	var stack []string
	walked := func(dir string) bool {
		if vis, _ := c.Visible(s, dir, atoms); !vis {
			ex.Decision = "deny"
			ex.Why = "the directory " + dir + " on the way is hidden"
			return false
		}
		return true
	}
	if !walked("/") {
		return ex, nil
	}
	segs := strings.Split(raw, "/")
	// The last component is the path itself, decided above; every one
	// before it is a directory the walk goes through.
	for len(segs) > 0 && segs[len(segs)-1] == "" {
		segs = segs[:len(segs)-1]
	}
	for i, seg := range segs {
		switch seg {
		case "", ".":
			continue
		case "..":
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			continue
		}
		stack = append(stack, seg)
		if i == len(segs)-1 {
			break
		}
		if !walked("/" + strings.Join(stack, "/")) {
			return ex, nil
		}
	}
	if ex.Decision == "allow" {
		if vis, _ := c.Visible(s, canon, atoms); !vis {
			ex.Decision = "deny"
			ex.Why = "a directory above " + canon + " is hidden"
		}
	}
	return ex, nil
}
