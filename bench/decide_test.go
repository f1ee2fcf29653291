// Package bench compares condfs's constraint engine with cel-go and
// expr-lang on the same rules, in the same run. It is its own module so
// that the product does not depend on either.
//
//	cd bench && go test -run '^$' -bench . -benchmem
package bench

import (
	"testing"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/vm"
	"github.com/google/cel-go/cel"

	"github.com/condfs/condfs/constraints"
)

// The Hexgate guide's worked example: refund and send_email.
const policy = `version: 1
roles:
  default:
    consts: {max_refund: 500}
    tools:
      send_email:
        mode: allow
        constraints:
          - count(args.to) <= 10
          - every(args.to, endswith(., "@acme.com"))
      refund:
        mode: approval_required
        constraints:
          - args.amount <= args.order_total
          - args.amount <= consts.max_refund or role == "billing"
`

const (
	celRefund  = `args.amount <= args.order_total && (args.amount <= 500 || role == "billing")`
	celEmail   = `size(args.to) <= 10 && args.to.all(t, t.endsWith("@acme.com"))`
	exprRefund = `args.amount <= args.order_total && (args.amount <= 500 || role == "billing")`
	exprEmail  = `len(args.to) <= 10 && all(args.to, {# endsWith "@acme.com"})`
)

func refundArgs() map[string]any { return map[string]any{"amount": 100, "order_total": 200} }
func emailArgs() map[string]any {
	return map[string]any{"to": []any{"a@acme.com", "b@acme.com", "c@acme.com"}}
}

func BenchmarkCondfs(b *testing.B) {
	p, err := constraints.Parse("policy.yaml", []byte(policy))
	if err != nil {
		b.Fatal(err)
	}
	refund, _ := constraints.ParseArgs([]byte(`{"amount": 100, "order_total": 200}`))
	email, _ := constraints.ParseArgs([]byte(`{"to": ["a@acme.com", "b@acme.com", "c@acme.com"]}`))
	reqs := []constraints.Request{{Tool: "refund", Args: &refund}, {Tool: "send_email", Args: &email}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if d := p.Decide(&reqs[i&1]); d.Decision == constraints.Deny {
			b.Fatal(d.Reasons)
		}
	}
}

func BenchmarkCELGo(b *testing.B) {
	env, err := cel.NewEnv(cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)), cel.Variable("role", cel.StringType))
	if err != nil {
		b.Fatal(err)
	}
	var progs []cel.Program
	for _, src := range []string{celRefund, celEmail} {
		ast, iss := env.Compile(src)
		if iss.Err() != nil {
			b.Fatal(iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			b.Fatal(err)
		}
		progs = append(progs, prg)
	}
	acts := []map[string]any{{"args": refundArgs(), "role": ""}, {"args": emailArgs(), "role": ""}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		out, _, err := progs[i&1].Eval(acts[i&1])
		if err != nil || out.Value() != true {
			b.Fatal(out, err)
		}
	}
}

func BenchmarkExprLang(b *testing.B) {
	envs := []map[string]any{{"args": refundArgs(), "role": ""}, {"args": emailArgs(), "role": ""}}
	var progs []*vm.Program
	for i, src := range []string{exprRefund, exprEmail} {
		p, err := expr.Compile(src, expr.Env(envs[i]), expr.AsBool())
		if err != nil {
			b.Fatal(err)
		}
		progs = append(progs, p)
	}
	var machine vm.VM
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		out, err := machine.Run(progs[i&1], envs[i&1])
		if err != nil || out != true {
			b.Fatal(out, err)
		}
	}
}
