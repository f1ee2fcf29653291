package expr

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/condfs/condfs/constraints/internal/value"
)

// A small tree-walking interpreter over the AST and plain Go values
// (encoding/json with UseNumber, numbers compared as big.Rat). It shares
// nothing with the compiler or the value package, so the differential test
// below checks one against the other.

type missingT struct{}

var missing = missingT{}

type interp struct {
	args, consts any
	elems        []any
}

func walk(v any, segs []string) any {
	for _, s := range segs {
		m, ok := v.(map[string]any)
		if !ok {
			return missing
		}
		if v, ok = m[s]; !ok {
			return missing
		}
	}
	return v
}

func (in *interp) operand(o Operand) any {
	switch o := o.(type) {
	case *Lit:
		return goValue(o.Raw)
	case *Count:
		v := in.operand(o.Arg)
		switch v := v.(type) {
		case string:
			return json.Number(fmt.Sprint(utf8.RuneCountInString(v)))
		case []any:
			return json.Number(fmt.Sprint(len(v)))
		case map[string]any:
			return json.Number(fmt.Sprint(len(v)))
		}
		return missing
	case *Path:
		switch o.Root {
		case RootArgs:
			return walk(in.args, o.Segs)
		case RootConsts:
			return walk(in.consts, o.Segs)
		case RootElem:
			return walk(in.elems[len(in.elems)-1], o.Segs)
		}
	}
	return missing
}

func rat(v any) (*big.Rat, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(string(n))
	return r, ok
}

func deepEq(a, b any) bool {
	if ra, ok := rat(a); ok {
		rb, ok := rat(b)
		return ok && ra.Cmp(rb) == 0
	}
	switch a := a.(type) {
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !deepEq(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || !deepEq(v, w) {
				return false
			}
		}
		return true
	case nil:
		return b == nil
	case bool, string:
		return a == b
	}
	return false
}

func tri(b bool) Tri {
	if b {
		return True
	}
	return False
}

func (in *interp) eval(n Node) Tri {
	switch n := n.(type) {
	case *Binary:
		l, r := in.eval(n.L), in.eval(n.R)
		if n.Op == "and" {
			return min(l, r)
		}
		return max(l, r)
	case *Not:
		return True - in.eval(n.X)
	case *Compare:
		l, r := in.operand(n.L), in.operand(n.R)
		if l == missing || r == missing {
			return Unknown
		}
		switch n.Op {
		case "==":
			return tri(deepEq(l, r))
		case "!=":
			return tri(!deepEq(l, r))
		case "in", "not in":
			list, ok := r.([]any)
			if !ok {
				return Unknown
			}
			found := false
			for _, e := range list {
				found = found || deepEq(l, e)
			}
			return tri(found == (n.Op == "in"))
		}
		var c int
		if ra, ok := rat(l); ok {
			rb, ok := rat(r)
			if !ok {
				return Unknown
			}
			c = ra.Cmp(rb)
		} else if sa, ok := l.(string); ok {
			sb, ok := r.(string)
			if !ok {
				return Unknown
			}
			c = strings.Compare(sa, sb)
		} else {
			return Unknown
		}
		switch n.Op {
		case "<":
			return tri(c < 0)
		case "<=":
			return tri(c <= 0)
		case ">":
			return tri(c > 0)
		}
		return tri(c >= 0)
	case *Call:
		s, ok := in.operand(n.Arg).(string)
		if !ok {
			return Unknown
		}
		switch n.Fn {
		case "startswith":
			return tri(strings.HasPrefix(s, n.Str))
		case "endswith":
			return tri(strings.HasSuffix(s, n.Str))
		case "contains":
			return tri(strings.Contains(s, n.Str))
		}
		return tri(regexp.MustCompile(n.Str).MatchString(s))
	case *Quant:
		list, ok := in.operand(n.Coll).([]any)
		if !ok {
			return Unknown
		}
		var res []Tri
		for _, e := range list {
			in.elems = append(in.elems, e)
			res = append(res, in.eval(n.Body))
			in.elems = in.elems[:len(in.elems)-1]
		}
		if n.Every {
			out := True
			for _, r := range res {
				out = min(out, r)
			}
			return out
		}
		out := False
		for _, r := range res {
			out = max(out, r)
		}
		return out
	}
	panic("unreachable")
}

func goValue(s string) any {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		panic(err)
	}
	return v
}

// Random generation.

type gen struct{ r *rand.Rand }

var (
	numbers = []string{"0", "1", "-1", "5", "5.0", "2.5", "1e3", "1000", "0.1", "9007199254740993", "9007199254740992", "18446744073709551616", "-0.0", "1e-400"}
	strs    = []string{`""`, `"a"`, `"b"`, `"ab"`, `"é"`, `"😀"`, `"a😀"`, `"5"`}
	fields  = []string{"a", "b", "c", "l"}
)

func (g *gen) literal(depth int) string {
	switch g.r.IntN(7) {
	case 0, 1:
		return numbers[g.r.IntN(len(numbers))]
	case 2, 3:
		return strs[g.r.IntN(len(strs))]
	case 4:
		return []string{"true", "false", "null"}[g.r.IntN(3)]
	case 5:
		if depth > 1 {
			return "1"
		}
		var parts []string
		for range g.r.IntN(3) {
			parts = append(parts, g.literal(depth+1))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	if depth > 1 {
		return `"x"`
	}
	var parts []string
	for i, f := range fields[:g.r.IntN(3)] {
		_ = i
		parts = append(parts, fmt.Sprintf("%q:%s", f, g.literal(depth+1)))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func (g *gen) path(quant int) string {
	if quant > 0 && g.r.IntN(2) == 0 {
		if g.r.IntN(2) == 0 {
			return "."
		}
		return "." + fields[g.r.IntN(len(fields))]
	}
	p := "args." + fields[g.r.IntN(len(fields))]
	if g.r.IntN(4) == 0 {
		p += "." + fields[g.r.IntN(len(fields))]
	}
	if g.r.IntN(8) == 0 {
		p = "consts." + []string{"n", "s", "l"}[g.r.IntN(3)]
	}
	return p
}

func (g *gen) operand(quant int) string {
	switch g.r.IntN(4) {
	case 0:
		return g.literal(0)
	case 1:
		return "count(" + g.path(0) + ")" // count takes a path, never the element
	}
	return g.path(quant)
}

func (g *gen) primary(quant, depth int) string {
	switch g.r.IntN(6) {
	case 0:
		fn := []string{"startswith", "endswith", "contains", "matches"}[g.r.IntN(4)]
		arg := []string{`"a"`, `""`, `"é"`, `"b"`}[g.r.IntN(4)]
		if fn == "matches" {
			arg = []string{`"^a"`, `"[0-9]"`, `"."`, `"b$"`}[g.r.IntN(4)]
		}
		return fn + "(" + g.path(quant) + ", " + arg + ")"
	case 1:
		if quant < 3 {
			q := []string{"every", "any"}[g.r.IntN(2)]
			return q + "(" + g.path(quant) + ", " + g.primary(quant+1, depth+1) + ")"
		}
	case 2:
		var parts []string
		for range g.r.IntN(3) {
			parts = append(parts, g.literal(1))
		}
		op := []string{" in ", " not in "}[g.r.IntN(2)]
		if g.r.IntN(3) == 0 {
			return g.operand(quant) + op + "consts.l"
		}
		return g.operand(quant) + op + "[" + strings.Join(parts, ", ") + "]"
	}
	op := []string{"==", "!=", "<", "<=", ">", ">="}[g.r.IntN(6)]
	return g.operand(quant) + " " + op + " " + g.operand(quant)
}

func (g *gen) expr(depth int) string {
	if depth > 3 {
		return g.primary(0, depth)
	}
	switch g.r.IntN(5) {
	case 0:
		return g.expr(depth+1) + " and " + g.expr(depth+1)
	case 1:
		return g.expr(depth+1) + " or " + g.expr(depth+1)
	case 2:
		return "not (" + g.expr(depth+1) + ")"
	}
	return g.primary(0, depth)
}

func (g *gen) args() string {
	var parts []string
	for _, f := range fields {
		if g.r.IntN(5) == 0 {
			continue
		}
		v := g.literal(0)
		if f == "l" || g.r.IntN(3) == 0 {
			var elems []string
			for range g.r.IntN(4) {
				elems = append(elems, g.literal(0))
			}
			v = "[" + strings.Join(elems, ",") + "]"
		}
		parts = append(parts, fmt.Sprintf("%q:%s", f, v))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestDifferential checks the closure compiler against the interpreter on
// random expressions and random arguments.
func TestDifferential(t *testing.T) {
	const consts = `{"n": 5, "s": "a", "l": [1, "a", 5.0, null]}`
	g := gen{r: rand.New(rand.NewPCG(1, 2))}
	cv := mustJSON(t, consts)
	samples, truths := 0, map[Tri]int{}
	for i := 0; i < 3000; i++ {
		src := g.expr(0)
		n, _, err := Parse(src)
		if err != nil {
			t.Fatalf("generated %q does not parse: %v", src, err)
		}
		prog, err := Compile(src, n, cv)
		if err != nil {
			t.Fatalf("generated %q does not compile: %v", src, err)
		}
		for j := 0; j < 10; j++ {
			args := g.args()
			e := &Env{Args: mustJSON(t, args), Ctx: mustJSON(t, `{}`), Role: value.MakeNull(), Tool: value.MakeString("t")}
			got := prog.Eval(e)
			in := &interp{args: goValue(args), consts: goValue(consts)}
			want := in.eval(n)
			if got != want {
				var buf bytes.Buffer
				fmt.Fprintf(&buf, "%s\nargs %s\ncompiled %s, interpreted %s", src, args, got, want)
				t.Fatal(buf.String())
			}
			samples++
			truths[got]++
		}
	}
	// The generator must exercise all three truth values, or the test
	// proves little.
	for _, v := range []Tri{True, False, Unknown} {
		if truths[v] < samples/20 {
			t.Fatalf("only %d of %d samples were %s", truths[v], samples, v)
		}
	}
	t.Logf("%d samples agree: %v", samples, truths)
}
