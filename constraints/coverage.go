package constraints

import (
	"slices"
	"strings"
)

// Coverage records which constraints the requests decided through it made
// false, so that a policy's tests can show the rules no test ever
// exercised (a constraint never made false might as well not be there).
type Coverage struct {
	p         *Policy
	falsified map[*program]bool
}

// NewCoverage starts recording for p.
func (p *Policy) NewCoverage() *Coverage {
	return &Coverage{p: p, falsified: map[*program]bool{}}
}

// Decide decides r as Policy.Decide does, and records.
func (c *Coverage) Decide(r *Request) Decision { return c.p.decide(r, c) }

// Untested is a constraint no recorded request made false.
type Untested struct {
	Role string // the role
	Tool string // the tool; "" for a constraint every tool of the role runs, "*" for the role's default entry
	Src  string // the constraint as written
	Pos  Diag   // where (File, Line, Col)
}

// Untested lists the constraints no request made false, by role, then
// tool ("" first), then position.
func (c *Coverage) Untested() []Untested {
	var out []Untested
	for name, ro := range c.p.roles {
		for _, pr := range ro.pre {
			if pr != nil && !c.falsified[pr] {
				out = append(out, Untested{Role: name, Src: pr.Src, Pos: pr.pos})
			}
		}
		entries := map[string]*entry{}
		for tool, ent := range ro.tools {
			entries[tool] = ent
		}
		if ro.def != nil {
			entries["*"] = ro.def
		}
		for tool, ent := range entries {
			for _, pr := range ent.progs {
				if pr != nil && !c.falsified[pr] {
					out = append(out, Untested{Role: name, Tool: tool, Src: pr.Src, Pos: pr.pos})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Untested) int {
		if n := strings.Compare(a.Role, b.Role); n != 0 {
			return n
		}
		if n := strings.Compare(a.Tool, b.Tool); n != 0 {
			return n
		}
		if a.Pos.Line != b.Pos.Line {
			return a.Pos.Line - b.Pos.Line
		}
		return a.Pos.Col - b.Pos.Col
	})
	return out
}
