package expr

import (
	"testing"

	"github.com/condfs/condfs/constraints/internal/value"
)

// FuzzParse: no input panics the parser, checker, compiler or evaluator,
// and every accepted constraint prints back to text that parses to the
// same printed form.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`args.amount <= consts.max`,
		`every(args.to, endswith(., "@acme.com")) and count(args.to) <= 10`,
		`not (args.a == 1 or any(args.l, .x in [1, "a", {"k": null}]))`,
		`matches(args.id, "^inv_[0-9]+$") or when("!discord:nsfw")`,
		`args.n == 9223372036854775809 and args.f != -1.5e-3`,
	} {
		f.Add(s)
	}
	consts := mustJSON(f, `{"max": 500, "l": [1, 2], "o": {"k": "v"}}`)
	args := mustJSON(f, `{"amount": 5, "to": ["a@acme.com"], "a": 1, "l": [{"x": 1}, 2], "id": "inv_1", "n": 1, "f": 2}`)
	f.Fuzz(func(t *testing.T, src string) {
		n, _, err := Parse(src)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		out := Print(n)
		n2, _, err := Parse(out)
		if err != nil {
			t.Fatalf("%q printed as %q, which does not parse: %v", src, out, err)
		}
		if out2 := Print(n2); out2 != out {
			t.Fatalf("%q: printing is not stable: %q then %q", src, out, out2)
		}
		prog, err := Compile(src, n, consts)
		if err != nil {
			return
		}
		e := &Env{Args: args, Ctx: args, Role: value.MakeNull(), Tool: value.MakeString("t")}
		r1 := prog.Eval(e)
		prog2, err := Compile(out, n2, consts)
		if err != nil {
			t.Fatalf("%q compiles but its printed form %q does not: %v", src, out, err)
		}
		if r2 := prog2.Eval(e); r1 != r2 {
			t.Fatalf("%q = %s but printed %q = %s", src, r1, out, r2)
		}
	})
}
