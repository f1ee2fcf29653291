package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/condfs/condfs/constraints"
	"github.com/condfs/condfs/internal/cli"
	"github.com/condfs/condfs/internal/configfile"
)

// policyTestCase is one expected decision, with where it is written.
type policyTestCase struct {
	file, name  string
	line, col   int
	request     []byte // JSON, as tool.decide takes it (DecodeBatchRequest)
	requestText string // the request, for the failure line
	want        constraints.Mode
	reason      string // a substring some reason must hold, if set
}

// policyTest runs test files against a policy: one line per failure with
// the case's FILE:LINE:COL, then "N passed, N failed". Exit status 1 on a
// failure, 2 when the policy or a test file fails to load.
func policyTest(args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlags("policy test", "condfs policy test --policy FILE [--coverage] TESTS...",
		`Decide each case of the test files against the policy and compare. A test file is a YAML
list of cases:
  - name: a refund over the order total is denied
    request: {role: billing, tool: refund, args: {amount: 900, order_total: 100}, context: [discord:dm]}
    decision: deny
    reason: order_total        # optional: a substring of some reason
--coverage also lists, per role and tool, each constraint no case made false.`, stderr)
	policy := fs.String("policy", "", "the policy file (YAML)")
	coverage := fs.Bool("coverage", false, "list the constraints no case made false")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *policy == "" {
		return cli.UsageErr(stderr, fs, "--policy is required")
	}
	if fs.NArg() == 0 {
		return cli.UsageErr(stderr, fs, "give at least one test file")
	}
	p, err := loadPolicy(*policy, stderr, false)
	if err != nil {
		return err
	}
	var cases []policyTestCase
	for _, f := range fs.Args() {
		cs, err := loadPolicyTests(f)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return cli.Exit(cli.ExitUsage)
		}
		cases = append(cases, cs...)
	}
	cov := p.NewCoverage()
	passed, failed := 0, 0
	for _, c := range cases {
		req := constraints.DecodeBatchRequest(c.request)
		d := cov.Decide(&req)
		why := ""
		switch {
		case d.Decision != c.want:
			why = fmt.Sprintf("want %s, got %s", c.want, d.Decision)
		case c.reason != "" && !strings.Contains(strings.Join(d.Reasons, "\n"), c.reason):
			why = fmt.Sprintf("want a reason containing %q", c.reason)
		}
		if why == "" {
			passed++
			continue
		}
		failed++
		reasons, _ := json.Marshal(d.Reasons)
		fmt.Fprintf(stdout, "%s:%d:%d: %s: %s; request %s; reasons %s\n", c.file, c.line, c.col, c.name, why, c.requestText, reasons)
	}
	if *coverage {
		for _, u := range cov.Untested() {
			tool := u.Tool
			switch tool {
			case "":
				tool = "every tool"
			case "*":
				tool = "other tools"
			}
			fmt.Fprintf(stdout, "%s:%d:%d: role %s, %s: constraint `%s` was never false\n", u.Pos.File, u.Pos.Line, u.Pos.Col, u.Role, tool, u.Src)
		}
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return cli.Exit(1)
	}
	return nil
}

var caseKeys = map[string]bool{"name": true, "request": true, "decision": true, "reason": true}

// loadPolicyTests reads one test file; every error names FILE:LINE:COL.
func loadPolicyTests(file string) ([]policyTestCase, error) {
	data, err := configfile.Read(file)
	if err != nil {
		return nil, fmt.Errorf("%s:1:1: %v", file, err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	at := func(n *yaml.Node, format string, a ...any) error {
		return fmt.Errorf("%s:%d:%d: %s", file, n.Line, n.Column, fmt.Sprintf(format, a...))
	}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("%s:1:1: no test cases", file)
	}
	list := doc.Content[0]
	if list.Kind != yaml.SequenceNode {
		return nil, at(list, "a test file is a list of cases")
	}
	var out []policyTestCase
	for _, item := range list.Content {
		if item.Kind != yaml.MappingNode {
			return nil, at(item, "a case is a mapping with name, request, decision and optionally reason")
		}
		c := policyTestCase{file: file, line: item.Line, col: item.Column}
		seen := map[string]bool{}
		for i := 0; i+1 < len(item.Content); i += 2 {
			k, v := item.Content[i], item.Content[i+1]
			if !caseKeys[k.Value] {
				return nil, at(k, "unknown key %q (a case has name, request, decision, reason)", k.Value)
			}
			if seen[k.Value] {
				return nil, at(k, "duplicate key %q", k.Value)
			}
			seen[k.Value] = true
			switch k.Value {
			case "name", "reason":
				if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
					return nil, at(v, "%s must be a string", k.Value)
				}
				if k.Value == "name" {
					c.name = v.Value
				} else {
					c.reason = v.Value
				}
			case "decision":
				m, err := constraints.ParseMode(v.Value)
				if v.Kind != yaml.ScalarNode || err != nil {
					return nil, at(v, "decision must be allow, deny or approval_required")
				}
				c.want = m
			case "request":
				if v.Kind != yaml.MappingNode {
					return nil, at(v, "request must be a mapping (role or roles, tool, args, ctx, context)")
				}
				var req any
				if err := v.Decode(&req); err != nil {
					return nil, at(v, "request: %v", err)
				}
				j, err := json.Marshal(req)
				if err != nil {
					return nil, at(v, "request: %v (keys must be strings)", err)
				}
				c.request = j
				c.requestText = string(bytes.TrimSpace(j))
			}
		}
		for _, k := range []string{"name", "request", "decision"} {
			if !seen[k] {
				return nil, at(item, "case has no %s", k)
			}
		}
		out = append(out, c)
	}
	return out, nil
}
