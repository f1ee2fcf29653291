package expr

import (
	"strings"
	"testing"

	"github.com/condfs/condfs/constraints/internal/value"
	cctx "github.com/condfs/condfs/context"
)

func mustJSON(t testing.TB, s string) *value.Value {
	t.Helper()
	v, err := value.Decode(s, value.RequestLimits)
	if err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return &v
}

func eval(t *testing.T, src, args, consts string, atoms []string) (Tri, string) {
	t.Helper()
	n, _, err := Parse(src)
	if err != nil {
		t.Fatalf("parse %q: %v", src, err)
	}
	p, err := Compile(src, n, mustJSON(t, consts))
	if err != nil {
		t.Fatalf("compile %q: %v", src, err)
	}
	e := &Env{Args: mustJSON(t, args), Ctx: mustJSON(t, `{"dept":"eng"}`), Role: value.MakeString("ops"), Tool: value.MakeString("deploy")}
	if atoms != nil {
		s, err := cctx.NewSet(atoms)
		if err != nil {
			t.Fatal(err)
		}
		e.Atoms = &s
	}
	return p.Eval(e), e.Why
}

func TestEval(t *testing.T) {
	const T, F, U = True, False, Unknown
	tests := []struct {
		src, args string
		want      Tri
	}{
		// comparisons and exact numbers
		{`args.n == 5`, `{"n":5.0}`, T},
		{`args.n == 5`, `{"n":"5"}`, F},
		{`args.n != 5`, `{"n":true}`, T},
		{`args.n < 10`, `{"n":9.999999999999999999999}`, T},
		{`args.n > 18446744073709551615`, `{"n":18446744073709551616}`, T},
		{`args.n >= -1e-400`, `{"n":0}`, T},
		{`args.n <= 0.30000000000000004`, `{"n":0.3}`, T},
		{`args.n < 1`, `{"n":"0"}`, U},
		{`args.n < 1`, `{"n":true}`, U},
		{`args.s < "b"`, `{"s":"a"}`, T},
		{`args.s > "é"`, `{"s":"😀"}`, T},
		{`args.o == {"b":[1,2.0],"a":null}`, `{"o":{"a":null,"b":[1.0,2]}}`, T},
		{`args.o == {"a":1}`, `{"o":{"a":1,"b":1}}`, F},
		{`args.missing == null`, `{}`, U},
		{`args.n == null`, `{"n":null}`, T},
		// in / not in
		{`args.x in [1, "a", [true]]`, `{"x":[true]}`, T},
		{`args.x in [1]`, `{"x":1.0}`, T},
		{`args.x not in [1]`, `{"x":2}`, T},
		{`args.x not in [1]`, `{}`, U},
		{`args.x in consts.list`, `{"x":"b"}`, T},
		{`args.x in consts.scalar`, `{"x":"b"}`, U},
		// count
		{`count(args.s) == 3`, `{"s":"a😀b"}`, T},
		{`count(args.a) == count(args.o)`, `{"a":[1,2],"o":{"x":1,"y":2}}`, T},
		{`count(args.a) < count(args.o)`, `{"a":[1],"o":{"x":1,"y":2}}`, T},
		{`count(args.n) == 1`, `{"n":1}`, U},
		{`count(consts.list) == 2`, `{}`, T},
		// string functions
		{`startswith(args.p, "/tmp/")`, `{"p":"/tmp/x"}`, T},
		{`endswith(args.p, ".md")`, `{"p":"a.txt"}`, F},
		{`contains(args.p, "b")`, `{"p":["b"]}`, U},
		{`matches(args.p, "^[a-z]+$")`, `{"p":"abc"}`, T},
		{`matches(args.p, "[0-9]")`, `{"p":"a1b"}`, T},
		{`startswith(consts.str, "he")`, `{}`, T},
		// quantifiers
		{`every(args.a, . > 0)`, `{"a":[]}`, T},
		{`any(args.a, . > 0)`, `{"a":[]}`, F},
		{`every(args.a, . > 0)`, `{"a":[1,"x"]}`, U},
		{`every(args.a, . > 0)`, `{"a":[1,"x",-1]}`, F},
		{`any(args.a, . > 0)`, `{"a":["x",1]}`, T},
		{`any(args.a, . > 0)`, `{"a":["x",-1]}`, U},
		{`every(args.a, . > 0)`, `{"a":{"k":1}}`, U},
		{`every(args.g, any(.m, . == args.want))`, `{"g":[{"m":[1,2]},{"m":[2]}],"want":2}`, T},
		{`every(args.g, every(.m, any(.n, . == 1)))`, `{"g":[{"m":[{"n":[1]}]}]}`, T},
		{`any(args.items, .price.amount <= 5)`, `{"items":[{"price":{"amount":9}},{"price":{"amount":5}}]}`, T},
		{`every(args.items, (.ok == true))`, `{"items":[{"ok":true}]}`, T},
		// Kleene logic
		{`args.m == 1 or args.a == 1`, `{"a":1}`, T},
		{`args.m == 1 and args.a == 2`, `{"a":1}`, F},
		{`args.m == 1 and args.a == 1`, `{"a":1}`, U},
		{`not args.m == 1`, `{}`, U},
		{`not (args.a == 2)`, `{"a":1}`, T},
		{`args.a == 1 or args.a == 2 and args.b == 3`, `{"a":1}`, T},
		{`(args.a == 1 or args.a == 2) and args.b == 3`, `{"a":1}`, U},
		// facts
		{`role == "ops"`, `{}`, T},
		{`tool == "deploy"`, `{}`, T},
		{`ctx.dept == "eng"`, `{}`, T},
		{`ctx.none == "eng"`, `{}`, U},
		{`role.x == 1`, `{}`, U},
		{`args == {}`, `{}`, T},
		{`consts.obj.a == 1`, `{}`, T},
		{`consts.obj.nope == 1`, `{}`, U},
		// bare words are always missing
		{`args.c == USD`, `{"c":"USD"}`, U},
		{`not args.c == USD`, `{"c":"USD"}`, U},
	}
	consts := `{"list":["a","b"],"scalar":"b","str":"hello","obj":{"a":1}}`
	for _, tc := range tests {
		got, why := eval(t, tc.src, tc.args, consts, nil)
		if got != tc.want {
			t.Errorf("%s with %s = %s, want %s", tc.src, tc.args, got, tc.want)
		}
		if got == Unknown && why == "" {
			t.Errorf("%s with %s: unknown without a reason", tc.src, tc.args)
		}
	}
}

func TestWhen(t *testing.T) {
	dm := []string{"discord:dm", "discord:dm:42", "discord:channel:42"}
	for _, tc := range []struct {
		src   string
		atoms []string
		want  Tri
	}{
		{`when("discord:dm")`, nil, Unknown},
		{`when("discord:dm")`, dm, True},
		{`when("!discord:dm")`, dm, False},
		{`when("!internal")`, []string{}, True},
		{`when("discord:guild:1") or args.a == 1`, nil, Unknown},
		{`not when("tui")`, nil, Unknown},
	} {
		got, _ := eval(t, tc.src, `{}`, `{}`, tc.atoms)
		if got != tc.want {
			t.Errorf("%s in %v = %s, want %s", tc.src, tc.atoms, got, tc.want)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{``, "empty"},
		{`args.a`, "alone"},
		{`args.a = 1`, "'='"},
		{`args.a == 1 && args.b == 2`, "not an operator"},
		{`args.a == 1 AND args.b == 2`, "expected"},
		{`args. a == 1`, "name after"},
		{`args.0a == 1`, "name after"},
		{`args.a == 'x'`, "unexpected character"},
		{`args.a == +1`, "unexpected character"},
		{`args.a == .5`, "leading digit"},
		{`args.a in args.b`, "right side of 'in'"},
		{`args.a in consts.x.y`, "right side of 'in'"},
		{`args.a in ["a", args.b]`, "invalid literal"},
		{`. == 1`, "only inside"},
		{`count(.) == 1`, "count(.) is not in the language"},
		// Forms outside the grammar (constraints spec): each production
		// checked, these are the ones a parser could let through.
		{`every(args.a, count(.) > 1)`, "count(.) is not in the language"},
		{`every(args.a, count(.x) > 1)`, "count(.) is not in the language"},
		{`count("abc") > 1`, "expected a path"},
		{`count(count(args.a)) > 1`, "count takes one argument"},
		{`(args.a) == 1`, "expected an operator"},
		{`args.a == (1)`, "expected a value"},
		{`-args.a == 1`, "invalid literal"},
		{`args["a"] == 1`, "expected an operator"},
		{`when("tui") == true`, "unexpected"},
		{`args.a == args.b == 1`, "unexpected"},
		{`startswith(args.a, args.b)`, "string literal"},
		{`startswith(args.a, 5)`, "string literal"},
		{`startswith("a", "b")`, "expected a path"},
		{`matches(args.a, "(?=x)")`, "RE2"},
		{`len(args.a) == 1`, "unknown function"},
		{`every(args.a, . == 1 and . == 2)`, "not allowed inside"},
		{`every(args.a, not . == 1)`, "not allowed inside"},
		{`any(args.a, (. == 1 or . == 2))`, "not allowed inside"},
		{`every(args.a)`, "expected ','"},
		{`when("discord:role:1")`, "when"},
		{`when("!!tui")`, "double negation"},
		{`when(args.a)`, "string literal"},
		{`args.a == consts.nope`, "undefined constant"},
		{`args.a == consts.nope.x`, "undefined constant"},
		{`args.a == consts`, "consts needs a name"},
		{`(args.a == 1`, "expected ')'"},
		{`args.a == 1)`, "unexpected"},
		{`args.a notin [1]`, "expected an operator"},
		{`args.a == "\x"`, "invalid literal"},
		{`args.a == {"k":1,"k":2}`, "duplicate key"},
		{strings.Repeat("(", 100) + "args.a == 1" + strings.Repeat(")", 100), "nested deeper"},
	} {
		n, _, err := Parse(tc.src)
		if err == nil {
			_, err = Compile(tc.src, n, mustJSON(t, `{"x":{"y":1}}`))
		}
		if err == nil {
			t.Errorf("%q: loaded, want an error containing %q", tc.src, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %q, want it to contain %q", tc.src, err, tc.want)
		}
	}
}

func TestWarnings(t *testing.T) {
	_, warns, err := Parse(`args.currency == USD or role == admin`)
	if err != nil {
		t.Fatal(err)
	}
	if len(warns) != 2 || warns[0].Msg != `bare word USD: did you mean "USD"?` || warns[1].Off != 32 {
		t.Fatalf("warnings %+v", warns)
	}
}

func TestErrorOffset(t *testing.T) {
	_, _, err := Parse(`args.a == 1 and args.b ~ 2`)
	e, ok := err.(*Error)
	if !ok || e.Off != 23 {
		t.Fatalf("error %v, want offset 23", err)
	}
}

func TestPrintRoundTrip(t *testing.T) {
	for _, src := range []string{
		`args.a == 1 or args.b == 2 and not (args.c == 3 or args.d in [1, 2])`,
		`(args.a == 1 or args.b == 2) and args.c != "x\"y"`,
		`every(args.g, any(.m, startswith(., "a")))`,
		`not not when("!internal")`,
		`count(args.a) <= consts.max and matches(args.s, "^a\\d+$")`,
		`USD == args.c`,
	} {
		n, _, err := Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		out := Print(n)
		n2, _, err := Parse(out)
		if err != nil {
			t.Fatalf("%q printed as %q which fails: %v", src, out, err)
		}
		if out2 := Print(n2); out2 != out {
			t.Fatalf("%q: print not stable: %q then %q", src, out, out2)
		}
	}
}
