package expr

import (
	"fmt"
	"unicode/utf8"

	"github.com/condfs/condfs/constraints/internal/value"
)

// Limits on a constraint's shape, so that hostile text cannot exhaust the
// stack. Real constraints are far smaller.
const (
	MaxLen       = 64 << 10 // bytes of source text
	maxNesting   = 64       // parentheses and "not"
	MaxQuantDeep = 8        // quantifiers inside quantifiers
)

// Error is a parse or check error at a byte offset of the source.
type Error struct {
	Off int
	Msg string
}

func (e *Error) Error() string { return fmt.Sprintf("offset %d: %s", e.Off, e.Msg) }

// Warning is a lint finding that does not stop loading.
type Warning struct {
	Off int
	Msg string
}

type tokKind uint8

const (
	tEOF tokKind = iota
	tLParen
	tRParen
	tComma
	tOp   // == != < <= > >=
	tWord // identifier or dotted path starting with a word
	tElem // "." or ".a.b"
	tLit  // JSON literal
)

type token struct {
	kind tokKind
	pos  int
	end  int
	text string   // operator text, or the first word of a path
	segs []string // path segments after the first word (or after "." for elem)
	lit  value.Value
}

var literalLimits = value.Limits{MaxString: MaxLen, MaxDepth: 64}

type parser struct {
	src      string
	pos      int
	tok      token
	nesting  int
	quant    int
	inBody   bool
	warnings []Warning
}

// Parse parses one constraint. It checks the grammar and everything that
// needs no consts; see Check for the rest.
func Parse(src string) (n Node, warnings []Warning, err error) {
	if len(src) > MaxLen {
		return nil, nil, &Error{Off: 0, Msg: fmt.Sprintf("constraint longer than %d bytes", MaxLen)}
	}
	if !utf8.ValidString(src) {
		return nil, nil, &Error{Off: 0, Msg: "constraint is not valid UTF-8"}
	}
	p := &parser{src: src}
	defer func() {
		if r := recover(); r != nil {
			pe, ok := r.(*Error)
			if !ok {
				panic(r)
			}
			n, warnings, err = nil, nil, pe
		}
	}()
	p.next()
	if p.tok.kind == tEOF {
		p.fail(p.tok.pos, "empty constraint")
	}
	n = p.orExpr()
	if p.tok.kind != tEOF {
		p.fail(p.tok.pos, "unexpected %s", p.describe())
	}
	return n, p.warnings, nil
}

func (p *parser) fail(off int, format string, args ...any) {
	panic(&Error{Off: off, Msg: fmt.Sprintf(format, args...)})
}

func (p *parser) describe() string {
	switch p.tok.kind {
	case tEOF:
		return "end of constraint"
	case tWord, tElem, tLit, tOp:
		return fmt.Sprintf("%q", p.src[p.tok.pos:p.tok.end])
	}
	return fmt.Sprintf("%q", p.src[p.tok.pos:p.tok.end])
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdent(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// next lexes the next token into p.tok.
func (p *parser) next() {
	s := p.src
	for p.pos < len(s) && (s[p.pos] == ' ' || s[p.pos] == '\t' || s[p.pos] == '\n' || s[p.pos] == '\r') {
		p.pos++
	}
	start := p.pos
	if p.pos >= len(s) {
		p.tok = token{kind: tEOF, pos: start, end: start}
		return
	}
	c := s[p.pos]
	switch {
	case c == '(':
		p.pos++
		p.tok = token{kind: tLParen, pos: start, end: p.pos}
	case c == ')':
		p.pos++
		p.tok = token{kind: tRParen, pos: start, end: p.pos}
	case c == ',':
		p.pos++
		p.tok = token{kind: tComma, pos: start, end: p.pos}
	case c == '=' || c == '!' || c == '<' || c == '>':
		op := string(c)
		if p.pos+1 < len(s) && s[p.pos+1] == '=' {
			op += "="
		}
		switch op {
		case "=":
			p.fail(start, "'=' is not an operator: use '=='")
		case "!":
			p.fail(start, "'!' is not an operator: use 'not' or '!='")
		}
		p.pos += len(op)
		p.tok = token{kind: tOp, pos: start, end: p.pos, text: op}
	case c == '"' || c == '[' || c == '{' || c == '-' || (c >= '0' && c <= '9'):
		v, n, err := value.DecodePrefix(s[p.pos:], literalLimits)
		if err != nil {
			off := start
			if se, ok := err.(*value.SyntaxError); ok {
				off += se.Offset
			}
			p.fail(off, "invalid literal: %s", errMsg(err))
		}
		p.pos += n
		if p.pos < len(s) && (isIdent(s[p.pos]) || s[p.pos] == '.') {
			p.fail(p.pos, "unexpected %q after literal", s[p.pos])
		}
		p.tok = token{kind: tLit, pos: start, end: p.pos, lit: v}
	case c == '.':
		p.pos++
		segs := p.segments(true)
		p.tok = token{kind: tElem, pos: start, end: p.pos, segs: segs}
	case isIdentStart(c):
		for p.pos < len(s) && isIdent(s[p.pos]) {
			p.pos++
		}
		word := s[start:p.pos]
		var segs []string
		if p.pos < len(s) && s[p.pos] == '.' {
			p.pos++
			segs = p.segments(false)
		}
		p.tok = token{kind: tWord, pos: start, end: p.pos, text: word, segs: segs}
	case c == '&' || c == '|':
		p.fail(start, "%q is not an operator: use 'and' / 'or'", c)
	default:
		r, _ := utf8.DecodeRuneInString(s[p.pos:])
		p.fail(start, "unexpected character %q", r)
	}
}

// segments lexes "a.b.c" right after a dot. With optional, a dot followed
// by no name is the bare element ".".
func (p *parser) segments(optional bool) []string {
	s := p.src
	var segs []string
	for {
		if p.pos >= len(s) || !isIdentStart(s[p.pos]) {
			if optional && len(segs) == 0 {
				if p.pos < len(s) && s[p.pos] >= '0' && s[p.pos] <= '9' {
					p.fail(p.pos-1, "a number needs a leading digit (0.5, not .5)")
				}
				return nil
			}
			p.fail(p.pos, "expected a name after '.'")
		}
		st := p.pos
		for p.pos < len(s) && isIdent(s[p.pos]) {
			p.pos++
		}
		segs = append(segs, s[st:p.pos])
		if p.pos < len(s) && s[p.pos] == '.' {
			p.pos++
			continue
		}
		return segs
	}
}

func errMsg(err error) string {
	if se, ok := err.(*value.SyntaxError); ok {
		return se.Msg
	}
	return err.Error()
}

func (p *parser) isWord(w string) bool {
	return p.tok.kind == tWord && p.tok.text == w && p.tok.segs == nil
}

func (p *parser) enter(off int) {
	p.nesting++
	if p.nesting > maxNesting {
		p.fail(off, "constraint nested deeper than %d", maxNesting)
	}
}

func (p *parser) orExpr() Node {
	l := p.andExpr()
	for p.isWord("or") {
		pos := p.tok.pos
		p.bodyOp(pos, "or")
		p.next()
		r := p.andExpr()
		l = &Binary{Op: "or", L: l, R: r, P: pos}
	}
	return l
}

func (p *parser) andExpr() Node {
	l := p.notExpr()
	for p.isWord("and") {
		pos := p.tok.pos
		p.bodyOp(pos, "and")
		p.next()
		r := p.notExpr()
		l = &Binary{Op: "and", L: l, R: r, P: pos}
	}
	return l
}

func (p *parser) bodyOp(pos int, op string) {
	if p.inBody {
		p.fail(pos, "%q is not allowed inside an every/any body: write two quantifiers joined outside", op)
	}
}

func (p *parser) notExpr() Node {
	if p.isWord("not") {
		pos := p.tok.pos
		p.bodyOp(pos, "not")
		p.enter(pos)
		p.next()
		x := p.notExpr()
		p.nesting--
		return &Not{X: x, P: pos}
	}
	return p.primary()
}

var funcs = map[string]bool{"startswith": true, "endswith": true, "contains": true, "matches": true}

func (p *parser) primary() Node {
	t := p.tok
	if p.inBody && p.isWord("not") {
		p.bodyOp(t.pos, "not")
	}
	switch {
	case t.kind == tLParen:
		p.enter(t.pos)
		p.next()
		n := p.orExpr()
		p.expect(tRParen, "')'")
		p.nesting--
		return n
	case t.kind == tWord && t.segs == nil && p.peekParen():
		switch {
		case t.text == "every" || t.text == "any":
			return p.quantifier()
		case funcs[t.text]:
			return p.call()
		case t.text == "when":
			return p.when()
		case t.text == "count":
			// count(...) starts a comparison.
		default:
			p.fail(t.pos, "unknown function %q (known: startswith, endswith, contains, matches, count, every, any, when)", t.text)
		}
	}
	return p.comparison()
}

// peekParen reports whether the next non-space character is '('.
func (p *parser) peekParen() bool {
	i := p.pos
	for i < len(p.src) && (p.src[i] == ' ' || p.src[i] == '\t' || p.src[i] == '\n' || p.src[i] == '\r') {
		i++
	}
	return i < len(p.src) && p.src[i] == '('
}

func (p *parser) expect(k tokKind, what string) token {
	if p.tok.kind != k {
		p.fail(p.tok.pos, "expected %s, found %s", what, p.describe())
	}
	t := p.tok
	p.next()
	return t
}

func (p *parser) comparison() Node {
	l := p.operand()
	pos := p.tok.pos
	var op string
	switch {
	case p.tok.kind == tOp:
		op = p.tok.text
		p.next()
	case p.isWord("in"):
		op = "in"
		p.next()
	case p.isWord("not"):
		p.next()
		if !p.isWord("in") {
			p.fail(p.tok.pos, "expected 'in' after 'not', found %s", p.describe())
		}
		op = "not in"
		p.next()
	case p.tok.kind == tEOF:
		p.fail(p.tok.pos, "a value alone is not a constraint: compare it (==, <=, in, ...)")
	default:
		p.fail(p.tok.pos, "expected an operator, found %s", p.describe())
	}
	var r Operand
	if op == "in" || op == "not in" {
		r = p.inRight()
	} else {
		r = p.operand()
	}
	return &Compare{Op: op, L: l, R: r, P: pos}
}

// inRight parses the right side of in / not in: an array literal or
// exactly consts.NAME.
func (p *parser) inRight() Operand {
	t := p.tok
	switch {
	case t.kind == tLit && t.lit.Kind() == value.Array:
		p.next()
		return &Lit{Val: t.lit, Raw: p.src[t.pos:t.end], P: t.pos}
	case t.kind == tWord && t.text == RootConsts && len(t.segs) == 1:
		p.next()
		return &Path{Root: RootConsts, Segs: t.segs, P: t.pos}
	}
	p.fail(t.pos, "the right side of 'in' must be an array literal or consts.NAME")
	return nil
}

func (p *parser) operand() Operand {
	t := p.tok
	switch t.kind {
	case tLit:
		p.next()
		return &Lit{Val: t.lit, Raw: p.src[t.pos:t.end], P: t.pos}
	case tElem:
		return p.path()
	case tWord:
		if t.segs == nil {
			switch t.text {
			case "true", "false", "null":
				p.next()
				var v value.Value
				switch t.text {
				case "true":
					v = value.MakeBool(true)
				case "false":
					v = value.MakeBool(false)
				default:
					v = value.MakeNull()
				}
				return &Lit{Val: v, Raw: t.text, P: t.pos}
			case "count":
				if p.peekParen() {
					p.next()
					p.expect(tLParen, "'('")
					if p.tok.kind == tElem {
						// The grammar's count takes a path, never the
						// current element: count(path) only.
						p.fail(p.tok.pos, "count takes a path such as args.to; count(.) is not in the language")
					}
					arg := p.path()
					p.expect(tRParen, "')' (count takes one argument)")
					return &Count{Arg: arg, P: t.pos}
				}
			case "and", "or", "not", "in":
				p.fail(t.pos, "expected a value, found %q", t.text)
			}
		}
		return p.path()
	case tEOF:
		p.fail(t.pos, "expected a value, found end of constraint")
	}
	p.fail(t.pos, "expected a value, found %s", p.describe())
	return nil
}

// path parses a path or element operand (not a literal).
func (p *parser) path() *Path {
	t := p.tok
	switch t.kind {
	case tElem:
		if p.quant == 0 {
			p.fail(t.pos, "'.' is the current element and exists only inside every/any")
		}
		p.next()
		return &Path{Root: RootElem, Segs: t.segs, P: t.pos}
	case tWord:
		switch t.text {
		case "true", "false", "null", "and", "or", "not", "in":
			if t.segs == nil {
				p.fail(t.pos, "expected a path, found %q", t.text)
			}
		}
		if t.text == RootConsts && t.segs == nil {
			p.fail(t.pos, "consts needs a name: consts.NAME")
		}
		path := &Path{Root: t.text, Segs: t.segs, P: t.pos}
		if path.IsBare() {
			p.warnings = append(p.warnings, Warning{Off: t.pos, Msg: fmt.Sprintf("bare word %s: did you mean %q?", path.String(), path.String())})
		}
		p.next()
		return path
	}
	p.fail(t.pos, "expected a path, found %s", p.describe())
	return nil
}

func (p *parser) stringArg(what string) (string, int) {
	t := p.tok
	if t.kind != tLit || t.lit.Kind() != value.String {
		p.fail(t.pos, "%s must be a string literal", what)
	}
	p.next()
	return t.lit.Str(), t.pos
}

func (p *parser) call() Node {
	t := p.tok
	p.next()
	p.expect(tLParen, "'('")
	arg := p.path()
	p.expect(tComma, "',' ("+t.text+" takes a path and a string)")
	s, _ := p.stringArg("the second argument of " + t.text)
	p.expect(tRParen, "')'")
	return &Call{Fn: t.text, Arg: arg, Str: s, P: t.pos}
}

func (p *parser) when() Node {
	t := p.tok
	p.next()
	p.expect(tLParen, "'('")
	s, _ := p.stringArg("the argument of when")
	p.expect(tRParen, "')'")
	return &When{Cond: s, P: t.pos}
}

func (p *parser) quantifier() Node {
	t := p.tok
	p.next()
	p.expect(tLParen, "'('")
	coll := p.path()
	p.expect(tComma, "',' ("+t.text+" takes a collection and a body)")
	p.quant++
	if p.quant > MaxQuantDeep {
		p.fail(t.pos, "quantifiers nested deeper than %d", MaxQuantDeep)
	}
	saved := p.inBody
	p.inBody = true
	p.enter(t.pos)
	body := p.primary()
	if p.isWord("and") || p.isWord("or") {
		p.bodyOp(p.tok.pos, p.tok.text)
	}
	p.nesting--
	p.inBody = saved
	p.quant--
	p.expect(tRParen, "')'")
	return &Quant{Every: t.text == "every", Coll: coll, Body: body, P: t.pos}
}
