package constraints

import (
	"fmt"
	"sync"

	"gopkg.in/yaml.v3"

	"github.com/condfs/condfs/constraints/internal/expr"
	"github.com/condfs/condfs/constraints/internal/value"
)

// Policy is a loaded, compiled policy. It is immutable and safe for
// concurrent use.
type Policy struct {
	roles    map[string]*role
	warnings []Diag
	envs     sync.Pool
}

type role struct {
	name  string
	tools map[string]*entry
	def   *entry
	pre   []*program // policy-wide constraints, then the role's
}

type entry struct {
	mode  Mode
	progs []*program
}

type program struct {
	*expr.Program
	falseReason string
	pos         Diag // where the constraint is written (Msg unused)
}

// Warnings returns the lint warnings found at load (bare words).
func (p *Policy) Warnings() []Diag { return p.warnings }

// Empty returns the policy used when there is no policy file: every call
// is denied.
func Empty() *Policy { return &Policy{roles: map[string]*role{}} }

type merged struct {
	tools  map[string]*rawEntry
	consts map[string]constDef
	def    *rawEntry
	cons   []*yaml.Node
}

func (l *loader) build(fileConsts map[string]constDef, fileConsOrd []string, fileDef *rawEntry,
	fileCons []*yaml.Node, roles map[string]*rawRole, order []string) *Policy {
	// Unknown parents and cycles.
	for _, name := range order {
		for _, p := range roles[name].inherits {
			if _, ok := roles[p.Value]; !ok {
				l.errAt(p, "role %s inherits unknown role %q", name, p.Value)
			}
		}
	}
	if len(l.errs) > 0 {
		return nil
	}
	g := &merger{l: l, roles: roles, state: map[string]int{}, memo: map[string]*merged{}}
	for _, name := range order {
		g.merge(name, roles[name].node)
	}
	if len(l.errs) > 0 {
		return nil
	}
	p := &Policy{roles: map[string]*role{}}
	for _, name := range order {
		if !roles[name].isMixin {
			p.roles[name] = l.compileRole(name, g.memo[name], fileConsts, fileDef, fileCons)
		}
	}
	if len(l.errs) > 0 {
		return nil
	}
	return p
}

// merger merges each role with the roles it inherits, each once, and
// reports a cycle where the inheritance has one.
type merger struct {
	l     *loader
	roles map[string]*rawRole
	state map[string]int // 0 new, 1 in progress, 2 done
	memo  map[string]*merged
}

// merge is role name with what it inherits (parents first, the role's own
// last, each constraint once); via is where the name was named.
func (g *merger) merge(name string, via *yaml.Node) *merged {
	switch g.state[name] {
	case 1:
		g.l.errAt(via, "inherits: cycle through role %q", name)
		return nil
	case 2:
		return g.memo[name]
	}
	g.state[name] = 1
	r := g.roles[name]
	m := &merged{tools: map[string]*rawEntry{}, consts: map[string]constDef{}}
	seenCons := map[*yaml.Node]bool{}
	add := func(tools map[string]*rawEntry, consts map[string]constDef, def *rawEntry, cons []*yaml.Node) {
		for k, v := range tools {
			m.tools[k] = v
		}
		for k, v := range consts {
			m.consts[k] = v
		}
		if def != nil {
			m.def = def
		}
		for _, c := range cons {
			if !seenCons[c] {
				seenCons[c] = true
				m.cons = append(m.cons, c)
			}
		}
	}
	for _, p := range r.inherits {
		pm := g.merge(p.Value, p)
		if pm == nil {
			g.state[name] = 2
			return nil
		}
		add(pm.tools, pm.consts, pm.def, pm.cons)
	}
	add(r.tools, r.consts, r.def, r.cons)
	g.state[name] = 2
	g.memo[name] = m
	return m
}

// compileRole compiles a merged role: the file's constraints, then the
// role's, its default (the file's when it has none) and its tools.
func (l *loader) compileRole(name string, m *merged, fileConsts map[string]constDef, fileDef *rawEntry, fileCons []*yaml.Node) *role {
	consts := constsObject(fileConsts, m.consts)
	out := &role{name: name, tools: map[string]*entry{}}
	for _, c := range fileCons {
		out.pre = append(out.pre, l.compile(c, consts))
	}
	for _, c := range m.cons {
		out.pre = append(out.pre, l.compile(c, consts))
	}
	def := m.def
	if def == nil {
		def = fileDef
	}
	out.def = l.compileEntry(def, consts)
	for tname, e := range m.tools {
		out.tools[tname] = l.compileEntry(e, consts)
	}
	return out
}

func constsObject(file, role map[string]constDef) *value.Value {
	members := make([]value.Member, 0, len(file)+len(role))
	for k, v := range file {
		if _, over := role[k]; !over {
			members = append(members, value.Member{Key: k, Val: v.val})
		}
	}
	for k, v := range role {
		members = append(members, value.Member{Key: k, Val: v.val})
	}
	obj, _ := value.MakeObject(members)
	return &obj
}

func (l *loader) compileEntry(e *rawEntry, consts *value.Value) *entry {
	if e == nil {
		return &entry{mode: Deny}
	}
	out := &entry{mode: e.mode}
	for _, c := range e.cons {
		out.progs = append(out.progs, l.compile(c, consts))
	}
	return out
}

func (l *loader) compile(c *yaml.Node, consts *value.Value) *program {
	n, ok := l.parse(c)
	if !ok {
		return nil
	}
	prog, err := expr.Compile(c.Value, n, consts)
	if err != nil {
		e := err.(*expr.Error)
		line, col := exprPos(c, e.Off)
		l.diag(&l.errs, line, col, fmt.Sprintf("constraint %s: %s", value.Quote(c.Value), e.Msg))
		return nil
	}
	return &program{Program: prog, falseReason: fmt.Sprintf("constraint `%s` is false", c.Value),
		pos: Diag{File: l.file, Line: c.Line, Col: c.Column}}
}
