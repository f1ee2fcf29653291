// Package expr is the constraint language: lexer, parser (with byte
// offsets), AST printer, checker and closure compiler. The parser knows the
// grammar only; the checker resolves consts and reports the load-time
// errors that need them; the compiler turns a checked AST into closures
// that are built once and run many times.
package expr

import (
	"strings"

	"github.com/condfs/condfs/constraints/internal/value"
)

// Node is a boolean expression.
type Node interface {
	Pos() int
	node()
}

// Operand is a value-producing expression.
type Operand interface {
	Pos() int
	operand()
}

// Binary is "L and R" or "L or R".
type Binary struct {
	Op   string // "and" | "or"
	L, R Node
	P    int
}

// Not is "not X".
type Not struct {
	X Node
	P int
}

// Compare is "L op R"; Op is one of == != < <= > >= in "not in".
type Compare struct {
	Op   string
	L, R Operand
	P    int
}

// Call is startswith/endswith/contains/matches(Arg, "Str").
type Call struct {
	Fn  string
	Arg Operand // *Path
	Str string
	P   int
}

// When is when("COND").
type When struct {
	Cond string
	P    int
}

// Quant is every/any(Coll, Body).
type Quant struct {
	Every bool
	Coll  Operand // *Path
	Body  Node
	P     int
}

// Lit is a JSON literal; Raw is its source text.
type Lit struct {
	Val value.Value
	Raw string
	P   int
}

// Path is a value path. Root is "args", "ctx", "role", "tool", "consts",
// "." for the current quantifier element, or any other bare word (a field
// of the root object that never exists).
type Path struct {
	Root string
	Segs []string
	P    int
}

// Count is count(Arg).
type Count struct {
	Arg *Path
	P   int
}

func (n *Binary) Pos() int  { return n.P }
func (n *Not) Pos() int     { return n.P }
func (n *Compare) Pos() int { return n.P }
func (n *Call) Pos() int    { return n.P }
func (n *When) Pos() int    { return n.P }
func (n *Quant) Pos() int   { return n.P }
func (n *Lit) Pos() int     { return n.P }
func (p *Path) Pos() int    { return p.P }
func (n *Count) Pos() int   { return n.P }

func (*Binary) node()  {}
func (*Not) node()     {}
func (*Compare) node() {}
func (*Call) node()    {}
func (*When) node()    {}
func (*Quant) node()   {}

func (*Lit) operand()   {}
func (*Path) operand()  {}
func (*Count) operand() {}

// Known roots.
const (
	RootArgs   = "args"
	RootCtx    = "ctx"
	RootRole   = "role"
	RootTool   = "tool"
	RootConsts = "consts"
	RootElem   = "."
)

// IsBare reports whether the path starts at a bare word, which is always
// missing.
func (p *Path) IsBare() bool {
	switch p.Root {
	case RootArgs, RootCtx, RootRole, RootTool, RootConsts, RootElem:
		return false
	}
	return true
}

// String renders the path as source text.
func (p *Path) String() string {
	var b strings.Builder
	if p.Root == RootElem {
		b.WriteByte('.')
		b.WriteString(strings.Join(p.Segs, "."))
		return b.String()
	}
	b.WriteString(p.Root)
	for _, s := range p.Segs {
		b.WriteByte('.')
		b.WriteString(s)
	}
	return b.String()
}

// Print renders a node as source text that parses back to the same AST.
func Print(n Node) string {
	var b strings.Builder
	printNode(&b, n, 0)
	return b.String()
}

// precedence: or=1, and=2, not/primary=3.
func printNode(b *strings.Builder, n Node, ctxPrec int) {
	switch n := n.(type) {
	case *Binary:
		prec := 1
		if n.Op == "and" {
			prec = 2
		}
		if prec < ctxPrec {
			b.WriteByte('(')
		}
		printNode(b, n.L, prec)
		b.WriteString(" " + n.Op + " ")
		// Left-associative: the right side binds tighter.
		printNode(b, n.R, prec+1)
		if prec < ctxPrec {
			b.WriteByte(')')
		}
	case *Not:
		b.WriteString("not ")
		printNode(b, n.X, 3)
	case *Compare:
		printOperand(b, n.L)
		b.WriteString(" " + n.Op + " ")
		printOperand(b, n.R)
	case *Call:
		b.WriteString(n.Fn + "(")
		printOperand(b, n.Arg)
		b.WriteString(", ")
		value.AppendQuoted(b, n.Str)
		b.WriteByte(')')
	case *When:
		b.WriteString("when(")
		value.AppendQuoted(b, n.Cond)
		b.WriteByte(')')
	case *Quant:
		if n.Every {
			b.WriteString("every(")
		} else {
			b.WriteString("any(")
		}
		printOperand(b, n.Coll)
		b.WriteString(", ")
		printNode(b, n.Body, 3)
		b.WriteByte(')')
	}
}

func printOperand(b *strings.Builder, o Operand) {
	switch o := o.(type) {
	case *Lit:
		b.WriteString(o.Raw)
	case *Path:
		b.WriteString(o.String())
	case *Count:
		b.WriteString("count(")
		b.WriteString(o.Arg.String())
		b.WriteByte(')')
	}
}
