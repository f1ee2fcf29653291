package expr

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/condfs/condfs/constraints/internal/value"
	cctx "github.com/condfs/condfs/context"
)

// Tri is a Kleene truth value. The order False < Unknown < True makes "and"
// a minimum and "or" a maximum.
type Tri int8

// Truth values.
const (
	False Tri = iota
	Unknown
	True
)

func (t Tri) String() string {
	switch t {
	case False:
		return "false"
	case True:
		return "true"
	}
	return "unknown"
}

// Env is one evaluation's inputs plus scratch space. An Env is reused
// across calls (pooled by the caller), so evaluating allocates nothing.
type Env struct {
	Args  *value.Value // an object
	Ctx   *value.Value // an object
	Role  value.Value  // a string, or null when the caller gave none
	Tool  value.Value  // a string
	Atoms *cctx.Set    // the session's context; nil when there is none

	elem    [MaxQuantDeep]*value.Value
	scratch [2]value.Value // count() results of one comparison
	// Why holds the first reason a leaf was unknown (a precomputed string).
	Why string
}

// Program is a compiled constraint.
type Program struct {
	Src  string
	eval func(*Env) Tri
}

// Eval runs the program. Callers reset e.Why before a run if they use it.
func (p *Program) Eval(e *Env) Tri { return p.eval(e) }

// Compile checks n against consts (an object; nil means none) and builds
// its closures. Errors are load-time errors with offsets into the source.
func Compile(src string, n Node, consts *value.Value) (*Program, error) {
	c := &compiler{consts: consts}
	f, err := c.node(n)
	if err != nil {
		return nil, err
	}
	return &Program{Src: src, eval: f}, nil
}

type compiler struct {
	consts *value.Value
	quant  int // current quantifier depth
}

type valFn func(*Env) *value.Value

// operand is a compiled operand with its precomputed reasons.
type operand struct {
	f           valFn
	constant    bool         // f ignores the Env
	missing     string       // why, when f returns nil
	wrongType   string       // why, when the kind does not suit the operator
	constVal    *value.Value // when constant
	constNotSet bool         // constant and missing
}

func (c *compiler) node(n Node) (func(*Env) Tri, error) {
	switch n := n.(type) {
	case *Binary:
		l, err := c.node(n.L)
		if err != nil {
			return nil, err
		}
		r, err := c.node(n.R)
		if err != nil {
			return nil, err
		}
		if n.Op == "and" {
			return func(e *Env) Tri {
				a := l(e)
				if a == False {
					return False
				}
				return min(a, r(e))
			}, nil
		}
		return func(e *Env) Tri {
			a := l(e)
			if a == True {
				return True
			}
			return max(a, r(e))
		}, nil
	case *Not:
		x, err := c.node(n.X)
		if err != nil {
			return nil, err
		}
		return func(e *Env) Tri { return True - x(e) }, nil
	case *Compare:
		return c.compare(n)
	case *Call:
		return c.call(n)
	case *When:
		return c.when(n)
	case *Quant:
		return c.quantifier(n)
	}
	return nil, &Error{Off: n.Pos(), Msg: "internal: unknown node"}
}

// operand compiles o; slot is the scratch slot a count() result uses (0
// for a comparison's left side, 1 for its right).
func (c *compiler) operand(o Operand, slot int) (operand, error) {
	switch o := o.(type) {
	case *Lit:
		v := o.Val
		return operand{f: func(*Env) *value.Value { return &v }, constant: true, constVal: &v,
			wrongType: "literal " + o.Raw + " has the wrong type"}, nil
	case *Path:
		return c.path(o)
	case *Count:
		arg, err := c.path(o.Arg)
		if err != nil {
			return operand{}, err
		}
		name := "count(" + o.Arg.String() + ")"
		op := operand{
			missing:   o.Arg.String() + " is missing",
			wrongType: name + " needs an array, string or object",
		}
		// The result lives in a scratch slot until the comparison that
		// uses it has run.
		af := arg.f
		op.f = func(e *Env) *value.Value {
			v := af(e)
			if v == nil {
				return nil
			}
			n, ok := v.Count()
			if !ok {
				e.Why = firstWhy(e.Why, op.wrongType)
				return nil
			}
			e.scratch[slot] = value.MakeInt(int64(n))
			return &e.scratch[slot]
		}
		return op, nil
	}
	return operand{}, &Error{Off: o.Pos(), Msg: "internal: unknown operand"}
}

func firstWhy(cur, s string) string {
	if cur != "" {
		return cur
	}
	return s
}

func (c *compiler) path(p *Path) (operand, error) {
	name := p.String()
	op := operand{missing: name + " is missing", wrongType: name + " has the wrong type"}
	segs := p.Segs
	switch p.Root {
	case RootConsts:
		v, err := c.resolveConst(p)
		if err != nil {
			return operand{}, err
		}
		op.constant = true
		if v == nil {
			op.constNotSet = true
			op.f = func(*Env) *value.Value { return nil }
			return op, nil
		}
		op.constVal = v
		op.f = func(*Env) *value.Value { return v }
		return op, nil
	case RootElem:
		if c.quant == 0 {
			return operand{}, &Error{Off: p.P, Msg: "'.' exists only inside every/any"}
		}
		d := c.quant - 1
		op.missing = name + " (of the current element) is missing"
		op.f = walker(func(e *Env) *value.Value { return e.elem[d] }, segs)
		return op, nil
	case RootArgs:
		op.f = walker(func(e *Env) *value.Value { return e.Args }, segs)
	case RootCtx:
		op.f = walker(func(e *Env) *value.Value { return e.Ctx }, segs)
	case RootRole:
		op.f = walker(func(e *Env) *value.Value { return &e.Role }, segs)
	case RootTool:
		op.f = walker(func(e *Env) *value.Value { return &e.Tool }, segs)
	default:
		// A bare word is a field of the root object, which has none but
		// the roots: always missing.
		op.constant = true
		op.constNotSet = true
		op.missing = fmt.Sprintf("bare word %s is not a value (did you mean %q?)", name, name)
		op.f = func(*Env) *value.Value { return nil }
	}
	return op, nil
}

// walker follows segs from root. Paths of one or two names, the common
// case, get straight-line code.
func walker(root valFn, segs []string) valFn {
	switch len(segs) {
	case 0:
		return root
	case 1:
		s0 := segs[0]
		return func(e *Env) *value.Value { return root(e).Field(s0) }
	case 2:
		s0, s1 := segs[0], segs[1]
		return func(e *Env) *value.Value {
			v := root(e).Field(s0)
			if v == nil {
				return nil
			}
			return v.Field(s1)
		}
	}
	return func(e *Env) *value.Value {
		v := root(e)
		for _, s := range segs {
			if v = v.Field(s); v == nil {
				return nil
			}
		}
		return v
	}
}

func (c *compiler) resolveConst(p *Path) (*value.Value, error) {
	var v *value.Value
	if c.consts != nil {
		v = c.consts.Field(p.Segs[0])
	}
	if v == nil {
		return nil, &Error{Off: p.P, Msg: fmt.Sprintf("undefined constant consts.%s", p.Segs[0])}
	}
	for _, s := range p.Segs[1:] {
		if v = v.Field(s); v == nil {
			return nil, nil
		}
	}
	return v, nil
}

// get evaluates an operand, recording why it is missing.
func get(e *Env, o *operand) *value.Value {
	v := o.f(e)
	if v == nil {
		e.Why = firstWhy(e.Why, o.missing)
	}
	return v
}

func (c *compiler) compare(n *Compare) (func(*Env) Tri, error) {
	l, err := c.operand(n.L, 0)
	if err != nil {
		return nil, err
	}
	r, err := c.operand(n.R, 1)
	if err != nil {
		return nil, err
	}
	switch n.Op {
	case "==", "!=":
		return equality(n.Op == "==", l, r), nil
	case "<", "<=", ">", ">=":
		return ordering(n, l, r), nil
	case "in", "not in":
		return membership(n.Op == "in", n.Op, l, r), nil
	}
	return nil, &Error{Off: n.P, Msg: "unknown operator " + n.Op}
}

// equality is == (want true) or != (want false).
func equality(want bool, l, r operand) func(*Env) Tri {
	return func(e *Env) Tri {
		a := get(e, &l)
		if a == nil {
			return Unknown
		}
		b := get(e, &r)
		if b == nil {
			return Unknown
		}
		if value.Equal(a, b) == want {
			return True
		}
		return False
	}
}

// ordering is <, <=, > or >=, of two numbers or two strings.
func ordering(n *Compare, l, r operand) func(*Env) Tri {
	typeWhy := n.Op + " needs two numbers or two strings: " + Print(n) + " compares other types"
	test := map[string]func(int) bool{
		"<": func(c int) bool { return c < 0 }, "<=": func(c int) bool { return c <= 0 },
		">": func(c int) bool { return c > 0 }, ">=": func(c int) bool { return c >= 0 },
	}[n.Op]
	return func(e *Env) Tri {
		a := get(e, &l)
		if a == nil {
			return Unknown
		}
		b := get(e, &r)
		if b == nil {
			return Unknown
		}
		cmp, ok := value.Compare(a, b)
		if !ok {
			e.Why = firstWhy(e.Why, typeWhy)
			return Unknown
		}
		if test(cmp) {
			return True
		}
		return False
	}
}

// membership is in (in true) or not in, of a value in an array.
func membership(in bool, op string, l, r operand) func(*Env) Tri {
	hit, miss := True, False
	if !in {
		hit, miss = False, True
	}
	listWhy := "the right side of " + op + " is not an array"
	return func(e *Env) Tri {
		a := get(e, &l)
		if a == nil {
			return Unknown
		}
		list := get(e, &r)
		if list == nil {
			return Unknown
		}
		if list.Kind() != value.Array {
			e.Why = firstWhy(e.Why, listWhy)
			return Unknown
		}
		elems := list.Elems()
		for i := range elems {
			if value.Equal(a, &elems[i]) {
				return hit
			}
		}
		return miss
	}
}

func (c *compiler) call(n *Call) (func(*Env) Tri, error) {
	arg, err := c.operand(n.Arg, 0)
	if err != nil {
		return nil, err
	}
	typeWhy := n.Fn + "() needs a string: " + n.Arg.(*Path).String() + " is not one"
	var test func(string) bool
	s := n.Str
	switch n.Fn {
	case "startswith":
		test = func(v string) bool { return strings.HasPrefix(v, s) }
	case "endswith":
		test = func(v string) bool { return strings.HasSuffix(v, s) }
	case "contains":
		test = func(v string) bool { return strings.Contains(v, s) }
	case "matches":
		re, err := regexp.Compile(s)
		if err != nil {
			return nil, &Error{Off: n.P, Msg: fmt.Sprintf("matches: invalid RE2 pattern %q: %v", s, err)}
		}
		test = re.MatchString
	default:
		return nil, &Error{Off: n.P, Msg: "unknown function " + n.Fn}
	}
	return func(e *Env) Tri {
		v := get(e, &arg)
		if v == nil {
			return Unknown
		}
		if v.Kind() != value.String {
			e.Why = firstWhy(e.Why, typeWhy)
			return Unknown
		}
		if test(v.Str()) {
			return True
		}
		return False
	}, nil
}

func (c *compiler) when(n *When) (func(*Env) Tri, error) {
	cond, err := cctx.ParseCond(n.Cond)
	if err != nil {
		return nil, &Error{Off: n.P, Msg: "when: " + err.Error()}
	}
	why := "when(" + value.Quote(n.Cond) + ") needs a session: the call names none"
	return func(e *Env) Tri {
		if e.Atoms == nil {
			e.Why = firstWhy(e.Why, why)
			return Unknown
		}
		if cond.Holds(*e.Atoms) {
			return True
		}
		return False
	}, nil
}

func (c *compiler) quantifier(n *Quant) (func(*Env) Tri, error) {
	coll, err := c.operand(n.Coll, 0)
	if err != nil {
		return nil, err
	}
	d := c.quant
	if d >= MaxQuantDeep {
		return nil, &Error{Off: n.P, Msg: "quantifiers nested too deep"}
	}
	c.quant++
	body, err := c.node(n.Body)
	c.quant--
	if err != nil {
		return nil, err
	}
	name := "every"
	if !n.Every {
		name = "any"
	}
	typeWhy := name + "() needs an array: " + n.Coll.(*Path).String() + " is not one"
	every := n.Every
	return func(e *Env) Tri {
		v := get(e, &coll)
		if v == nil {
			return Unknown
		}
		if v.Kind() != value.Array {
			e.Why = firstWhy(e.Why, typeWhy)
			return Unknown
		}
		elems := v.Elems()
		saved := e.elem[d]
		res := True
		if !every {
			res = False
		}
		for i := range elems {
			e.elem[d] = &elems[i]
			t := body(e)
			if every && t == False || !every && t == True {
				res = t
				break
			}
			if t == Unknown {
				res = Unknown
			}
		}
		e.elem[d] = saved
		return res
	}, nil
}
