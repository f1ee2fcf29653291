package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/conformance"
)

var diagRe = regexp.MustCompile(`(?m)^.+:\d+:\d+: .+$`)

// TestPolicyEvalConformance runs every shared constraints case through
// "condfs policy eval", exactly as the corpus README describes.
func TestPolicyEvalConformance(t *testing.T) {
	cases, err := conformance.Load("constraints.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	disputed, err := conformance.Disputed()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ran := 0
	for _, c := range cases {
		if why, ok := disputed[c.ID]; ok {
			t.Logf("disputed case %s: %s", c.ID, why)
			continue
		}
		if !c.Has("policy_yaml") {
			continue // daemon cases run against condfs serve
		}
		ran++
		t.Run(c.ID, func(t *testing.T) {
			t.Parallel()
			f := writeFile(t, dir, c.ID+".yaml", c.Str("policy_yaml"))
			args := []string{"policy", "eval", "--policy", f, "--tool", c.Str("tool"), "--args", string(c.Fields["args"])}
			if c.Has("roles") {
				var roles []string
				c.Decode("roles", &roles)
				for _, r := range roles {
					args = append(args, "--role", r)
				}
			} else if c.Has("role") {
				args = append(args, "--role", c.Str("role"))
			}
			if c.Has("ctx") {
				args = append(args, "--ctx", string(c.Fields["ctx"]))
			}
			if c.Has("context") {
				var atoms []string
				c.Decode("context", &atoms)
				for _, a := range atoms {
					args = append(args, "--context", a)
				}
			}
			r := condfs(t, nil, args...)
			want := c.Str("expect_decision")
			if want == "load_error" {
				if r.code != 2 || !strings.HasPrefix(r.stderr, f+":") || !diagRe.MatchString(r.stderr) {
					t.Fatalf("want exit 2 with FILE:LINE:COL, got %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
				}
				return
			}
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			var out struct {
				Decision string   `json:"decision"`
				Role     *string  `json:"role"`
				Reasons  []string `json:"reasons"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
				t.Fatalf("output %q: %v", r.stdout, err)
			}
			if out.Decision != want {
				t.Fatalf("decision %s, want %s (%q)", out.Decision, want, out.Reasons)
			}
			if raw, ok := c.Fields["deciding_role"]; ok {
				var wantRole *string
				json.Unmarshal(raw, &wantRole)
				if (wantRole == nil) != (out.Role == nil) || (wantRole != nil && *wantRole != *out.Role) {
					t.Fatalf("role %v, want %s", out.Role, raw)
				}
			}
		})
	}
	if ran < 400 {
		t.Fatalf("only %d cases ran", ran)
	}
}

func TestPolicyLint(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", "tools:\n  t: {mode: allow, constraints: [\"args.c == USD\"]}\n")
	r := condfs(t, nil, "policy", "lint", good)
	if r.code != 0 || !strings.Contains(r.stdout, good+`:2:45: warning: bare word USD: did you mean "USD"?`) {
		t.Fatalf("lint good: %d %q %q", r.code, r.stdout, r.stderr)
	}
	bad := writeFile(t, dir, "bad.yaml", "tools:\n  t: {mode: allow, contraints: []}\n  u: {mode: nope}\n")
	r = condfs(t, nil, "policy", "lint", bad)
	if r.code != 2 || strings.Count(r.stdout+r.stderr, bad+":") != 2 {
		t.Fatalf("lint bad: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := condfs(t, nil, "policy", "lint", dir+"/missing.yaml"); r.code != 2 || !strings.Contains(r.stderr, "missing.yaml") {
		t.Fatalf("lint missing: %+v", r)
	}
}

// TestPolicyEvalBatch replays 100k calls; each line gets exactly one
// decision, bad lines included.
func TestPolicyEvalBatch(t *testing.T) {
	dir := t.TempDir()
	f := writeFile(t, dir, "p.yaml", "tools:\n  t: {mode: allow, constraints: [\"args.n <= 50\"]}\n")
	var in strings.Builder
	const n = 100000
	for i := 0; i < n; i++ {
		switch i % 4 {
		case 0:
			fmt.Fprintf(&in, `{"tool":"t","args":{"n":%d}}`+"\n", i%100)
		case 1:
			fmt.Fprintf(&in, `{"roles":["x","y"],"tool":"t","args":{"n":%d},"ctx":{},"context":["tui"]}`+"\n", i%100)
		case 2:
			in.WriteString(`{"tool":"t","args":{"n":1,"n":2}}` + "\n")
		case 3:
			in.WriteString("not json\n")
		}
	}
	r := condfs(t, []byte(in.String()), "policy", "eval", "--policy", f, "--batch")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	i := 0
	for ; sc.Scan(); i++ {
		var d struct{ Decision string }
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		want := "deny"
		if i%4 < 2 && i%100 <= 50 {
			want = "allow"
		}
		if d.Decision != want {
			t.Fatalf("line %d: %s, want %s: %s", i+1, d.Decision, want, sc.Text())
		}
	}
	if i != n {
		t.Fatalf("%d decisions for %d lines", i, n)
	}
}

func TestHelp(t *testing.T) {
	r := condfs(t, nil, "help")
	if r.code != 0 || !strings.Contains(r.stdout, "does not\nconfine processes it did not start") || !strings.Contains(r.stdout, "policy") {
		t.Fatalf("help: %+v", r)
	}
	r = condfs(t, nil, "policy", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--batch") {
		t.Fatalf("policy --help: %+v", r)
	}
	if r := condfs(t, nil, "policy", "eval", "--tool", "x"); r.code != 2 || !strings.Contains(r.stderr, "--policy is required") {
		t.Fatalf("missing --policy: %+v", r)
	}
}
