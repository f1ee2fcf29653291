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
	state := map[string]int{} // 0 new, 1 in progress, 2 done
	memo := map[string]*merged{}
	var merge func(name string, via *yaml.Node) *merged
	merge = func(name string, via *yaml.Node) *merged {
		switch state[name] {
		case 1:
			l.errAt(via, "inherits: cycle through role %q", name)
			return nil
		case 2:
			return memo[name]
		}
		state[name] = 1
		r := roles[name]
		m := &merged{tools: map[string]*rawEntry{}, consts: map[string]constDef{}}
		seenCons := map[*yaml.Node]bool{}
		addCons := func(cs []*yaml.Node) {
			for _, c := range cs {
				if !seenCons[c] {
					seenCons[c] = true
					m.cons = append(m.cons, c)
				}
			}
		}
		for _, p := range r.inherits {
			pm := merge(p.Value, p)
			if pm == nil {
				state[name] = 2
				return nil
			}
			for k, v := range pm.tools {
				m.tools[k] = v
			}
			for k, v := range pm.consts {
				m.consts[k] = v
			}
			if pm.def != nil {
				m.def = pm.def
			}
			addCons(pm.cons)
		}
		for k, v := range r.tools {
			m.tools[k] = v
		}
		for k, v := range r.consts {
			m.consts[k] = v
		}
		if r.def != nil {
			m.def = r.def
		}
		addCons(r.cons)
		state[name] = 2
		memo[name] = m
		return m
	}
	for _, name := range order {
		merge(name, roles[name].node)
	}
	if len(l.errs) > 0 {
		return nil
	}

	p := &Policy{roles: map[string]*role{}}
	for _, name := range order {
		r := roles[name]
		if r.isMixin {
			continue
		}
		m := memo[name]
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
		p.roles[name] = out
	}
	if len(l.errs) > 0 {
		return nil
	}
	return p
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
