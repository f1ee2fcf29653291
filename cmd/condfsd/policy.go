package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/condfs/condfs/constraints"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/cli"
)

func runPolicy(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" || args[0] == "help" {
		w := stdout
		if len(args) == 0 {
			w = stderr
		}
		fmt.Fprint(w, `Usage: condfs policy lint FILE
       condfs policy eval --policy FILE [--role R]... --tool T --args JSON [--ctx JSON] [--context ATOM]...
       condfs policy eval --policy FILE --batch < calls.jsonl
       condfs policy test --policy FILE [--coverage] TESTS...

lint   loads a policy file and prints every error and warning as FILE:LINE:COL: message.
eval   decides one tool call and prints {"decision","role","reasons"}; with --batch it
       reads JSON Lines requests {"role"|"roles","tool","args","ctx","context"} from
       stdin and prints one decision per line (replay a log of real calls against a
       new policy before you deploy it).

test   decides the cases of YAML test files (name, request, decision, reason) and
       prints each failure as FILE:LINE:COL, then "N passed, N failed"; --coverage
       lists the constraints no case made false.

Exit status: 0 for any decision (test: 1 when a case fails), 2 when the policy or a
test file fails to load.
`)
		if len(args) == 0 {
			return cli.Exit(cli.ExitUsage)
		}
		return nil
	}
	switch args[0] {
	case "lint":
		return policyLint(args[1:], stdout, stderr)
	case "eval":
		return policyEval(args[1:], stdout, stderr, os.Stdin)
	case "test":
		return policyTest(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "condfs policy: unknown subcommand %q (want lint, eval or test)\n", args[0])
	return cli.Exit(cli.ExitUsage)
}

// loadPolicy loads a policy, printing diagnostics; a load failure is exit 2.
func loadPolicy(path string, stderr io.Writer, warnings bool) (*constraints.Policy, error) {
	p, err := constraints.Load(path)
	if err != nil {
		var le *constraints.LoadError
		if errors.As(err, &le) {
			fmt.Fprintln(stderr, le.Error())
		} else {
			fmt.Fprintf(stderr, "%s:1:1: %v\n", path, err)
		}
		return nil, cli.Exit(cli.ExitUsage)
	}
	if warnings {
		for _, w := range p.Warnings() {
			fmt.Fprintln(stderr, w.String())
		}
	}
	return p, nil
}

func policyLint(args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlags("policy lint", "condfs policy lint FILE", "Load a policy file and print every error and warning.", stderr)
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return cli.UsageErr(stderr, fs, "want exactly one FILE")
	}
	p, err := loadPolicy(fs.Arg(0), stderr, false)
	if err != nil {
		return err
	}
	for _, w := range p.Warnings() {
		fmt.Fprintln(stdout, w.String())
	}
	if len(p.Warnings()) == 0 {
		fmt.Fprintf(stdout, "%s: ok\n", fs.Arg(0))
	}
	return nil
}

// writeJSON writes v as one line of JSON, without HTML escaping.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func policyEval(args []string, stdout, stderr io.Writer, stdin io.Reader) error {
	fs := cli.NewFlags("policy eval",
		"condfs policy eval --policy FILE [--role R]... --tool T --args JSON [--ctx JSON] [--context ATOM]...",
		"Decide a tool call against a policy, offline.", stderr)
	policy := fs.String("policy", "", "the policy file (YAML)")
	roles := fs.StringArray("role", nil, "a caller role; repeat for several, first allow wins")
	tool := fs.String("tool", "", "the tool name")
	argsJSON := fs.String("args", "{}", "the call's arguments, a JSON object")
	ctxJSON := fs.String("ctx", "", "caller attributes for ctx.*, a JSON object")
	atoms := fs.StringArray("context", nil, "an atom of the calling session (for when()); repeat; none means no session")
	batch := fs.Bool("batch", false, "read JSON Lines requests from stdin, print one decision per line")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *policy == "" {
		return cli.UsageErr(stderr, fs, "--policy is required")
	}
	p, err := loadPolicy(*policy, stderr, true)
	if err != nil {
		return err
	}
	if *batch {
		return evalBatch(p, stdin, stdout)
	}
	if *tool == "" {
		return cli.UsageErr(stderr, fs, "--tool is required (or use --batch)")
	}
	req := constraints.Request{Roles: *roles, Tool: *tool}
	var invalid []string
	a, err := constraints.ParseArgs([]byte(*argsJSON))
	if err != nil {
		invalid = append(invalid, "args: "+err.Error())
	}
	req.Args = &a
	if *ctxJSON != "" {
		c, err := constraints.ParseArgs([]byte(*ctxJSON))
		if err != nil {
			invalid = append(invalid, "ctx: "+err.Error())
		}
		req.Ctx = &c
	}
	if fs.Changed("context") {
		set, err := cctx.NewSet(*atoms)
		if err != nil {
			return cli.UsageErr(stderr, fs, "--context: %v", err)
		}
		req.Atoms = &set
	}
	if len(invalid) > 0 {
		req.Invalid = invalid[0]
	}
	return writeDecision(stdout, p.Decide(&req))
}

func writeDecision(w io.Writer, d constraints.Decision) error {
	if d.Reasons == nil {
		d.Reasons = []string{}
	}
	return writeJSON(w, d)
}

// evalBatch decides one request per input line. A bad line is denied with
// its reason; it never stops the run.
func evalBatch(p *constraints.Policy, stdin io.Reader, stdout io.Writer) error {
	in := bufio.NewReaderSize(stdin, 1<<16)
	out := bufio.NewWriterSize(stdout, 1<<16)
	defer out.Flush()
	for lineNo := 1; ; lineNo++ {
		line, tooLong, err := control.ReadLine(in, maxBatchLine, true)
		if line == nil && !tooLong && err == io.EOF {
			return out.Flush()
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("read stdin: %w", err)
		}
		var d constraints.Decision
		if tooLong {
			d = p.Decide(&constraints.Request{Invalid: fmt.Sprintf("line %d is over %d bytes", lineNo, maxBatchLine)})
		} else {
			req := constraints.DecodeBatchRequest(line)
			d = p.Decide(&req)
		}
		if err := writeDecision(out, d); err != nil {
			return err
		}
	}
}

// maxBatchLine bounds one request line: 1 MiB of args plus the rest.
const maxBatchLine = 2 << 20
