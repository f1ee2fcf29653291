package constraints

import (
	"encoding/json"
	"strings"
	"testing"

	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/internal/conformance"
)

// TestConformance runs every shared constraints case in-process: load the
// case's policy, decide its call, compare the decision and deciding role.
func TestConformance(t *testing.T) {
	cases, err := conformance.Load("constraints.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	disputed, err := conformance.Disputed()
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) < 100 {
		t.Fatalf("only %d cases read", len(cases))
	}
	for _, c := range cases {
		t.Run(c.ID, func(t *testing.T) {
			if why, ok := disputed[c.ID]; ok {
				t.Logf("disputed case %s: %s", c.ID, why)
				return
			}
			got, role := runCase(t, c)
			want := c.Str("expect_decision")
			if got != want {
				t.Fatalf("decision %s, want %s\n(note: %s)", got, want, c.Str("note"))
			}
			if c.Has("deciding_role") || (c.Fields["deciding_role"] != nil && want == "deny") {
				var wantRole *string
				_ = json.Unmarshal(c.Fields["deciding_role"], &wantRole)
				if (wantRole == nil) != (role == nil) || (wantRole != nil && *wantRole != *role) {
					t.Fatalf("role %v, want %v", deref(role), deref(wantRole))
				}
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

func runCase(t *testing.T, c conformance.Case) (string, *string) {
	t.Helper()
	var p *Policy
	if c.Has("policy_yaml") {
		var err error
		p, err = Parse("policy.yaml", []byte(c.Str("policy_yaml")))
		if err != nil {
			if !strings.Contains(err.Error(), "policy.yaml:") {
				t.Fatalf("load error without position: %v", err)
			}
			t.Logf("load error: %v", err)
			return "load_error", nil
		}
	} else {
		p = Empty()
	}
	req := Request{Tool: c.Str("tool")}
	if c.Has("roles") {
		if err := c.Decode("roles", &req.Roles); err != nil {
			t.Fatal(err)
		}
	} else if c.Has("role") {
		req.Roles = []string{c.Str("role")}
	}
	args, err := ParseArgs(c.Fields["args"])
	if err != nil {
		req.Invalid = err.Error()
	}
	req.Args = &args
	if c.Has("ctx") {
		ctx, err := ParseArgs(c.Fields["ctx"])
		if err != nil {
			req.Invalid = err.Error()
		}
		req.Ctx = &ctx
	}
	if c.Has("context") {
		var atoms []string
		if err := c.Decode("context", &atoms); err != nil {
			t.Fatal(err)
		}
		set, err := cctx.NewSet(atoms)
		if err != nil {
			t.Fatal(err)
		}
		req.Atoms = &set
	}
	d := p.Decide(&req)
	t.Logf("decision %s reasons %q", d.Decision, d.Reasons)
	return d.Decision.String(), d.Role
}
