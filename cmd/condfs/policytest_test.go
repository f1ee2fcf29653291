package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The shipped examples' tests pass and leave no constraint untested.
func TestPolicyTestExample(t *testing.T) {
	for _, dir := range []string{"../../examples/agent/config", "../../examples/egress"} {
		r := condfs(t, nil, "policy", "test", "--coverage", "--policy", dir+"/policy.yaml", dir+"/policy_test.yaml")
		if r.code != 0 || !strings.HasSuffix(strings.TrimSpace(r.stdout), " passed, 0 failed") || strings.Contains(r.stdout, "never false") {
			t.Fatalf("%s policy tests: code %d\n%s%s", dir, r.code, r.stdout, r.stderr)
		}
	}
}

func TestPolicyTestFailuresAndCoverage(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte(`version: 1
roles:
  default:
    tools:
      refund:
        mode: allow
        constraints:
          - args.amount <= 100
          - args.amount > 0
`), 0o644)
	tests := filepath.Join(dir, "t.yaml")
	os.WriteFile(tests, []byte(`- name: small
  request: {tool: refund, args: {amount: 5}}
  decision: allow
- name: wrongly expected
  request: {tool: refund, args: {amount: 500}}
  decision: allow
- name: wrong reason
  request: {tool: refund, args: {amount: 500}}
  decision: deny
  reason: no such words
`), 0o644)
	r := condfs(t, nil, "policy", "test", "--policy", pol, "--coverage", tests)
	if r.code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	want := []string{
		tests + ":4:3: wrongly expected: want allow, got deny; request {",
		tests + ":7:3: wrong reason: want a reason containing \"no such words\"",
		pol + ":9:13: role default, refund: constraint `args.amount > 0` was never false",
		"1 passed, 2 failed",
	}
	if len(lines) != len(want) {
		t.Fatalf("output:\n%s", r.stdout)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want prefix %q", i, lines[i], w)
		}
	}
	// A bad test file is a load error (exit 2) naming where.
	os.WriteFile(tests, []byte("- name: x\n  request: {tool: refund}\n  decison: allow\n"), 0o644)
	r = condfs(t, nil, "policy", "test", "--policy", pol, tests)
	if r.code != 2 || !strings.Contains(r.stderr, tests+":3:3: unknown key \"decison\"") {
		t.Fatalf("bad test file: code %d %q", r.code, r.stderr)
	}
	os.WriteFile(tests, []byte("- name: x\n  request: {tool: refund}\n"), 0o644)
	if r = condfs(t, nil, "policy", "test", "--policy", pol, tests); r.code != 2 || !strings.Contains(r.stderr, ":1:3: case has no decision") {
		t.Fatalf("case without decision: code %d %q", r.code, r.stderr)
	}
}
