package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/condfs/condfs/acl"
	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/internal/cli"
	"github.com/condfs/condfs/runs"
)

// loadConditions loads conditions.toml; a failure prints FILE:LINE:COL and
// is exit 2.
func loadConditions(path string, stderr io.Writer) (*acl.Config, error) {
	c, err := acl.Load(path)
	if err != nil {
		var le *acl.LoadError
		if errors.As(err, &le) {
			fmt.Fprintln(stderr, le.Error())
		} else {
			fmt.Fprintf(stderr, "%s:1:1: %v\n", path, err)
		}
		return nil, cli.Exit(cli.ExitUsage)
	}
	return c, nil
}

func runACL(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
			fmt.Fprintln(stdout, "Usage: condfs acl check --conditions FILE --space memories|workspace|exec --path P [--context ATOM]...")
			return nil
		}
		fmt.Fprintln(stderr, "Usage: condfs acl check --conditions FILE --space memories|workspace|exec --path P [--context ATOM]...")
		return cli.Exit(cli.ExitUsage)
	}
	fs := cli.NewFlags("acl check",
		"condfs acl check --conditions FILE --space memories|workspace|exec --path P [--context ATOM]...",
		"Would a session with these atoms see this path (memories, workspace), or may a run in it\nexecute this file (exec: an absolute path, listed in [sandbox] binaries and allowed by the\nexec rules)? Prints {\"decision\",\"path\",\"rules\",\"why\"}. No --context means the empty context.", stderr)
	conditions := fs.String("conditions", "", "the conditions.toml file")
	space := fs.String("space", "", "memories, workspace or exec")
	p := fs.String("path", "", "the path, relative to the space root (exec: an absolute path)")
	atoms := fs.StringArray("context", nil, "an atom of the session's context; repeat")
	if err := cli.ParseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *conditions == "" || *space == "" || !fs.Changed("path") {
		return cli.UsageErr(stderr, fs, "--conditions, --space and --path are required")
	}
	sp, err := acl.ParseRuleSpace(*space)
	if err != nil {
		return cli.UsageErr(stderr, fs, "%v", err)
	}
	set, err := cctx.NewSet(*atoms)
	if err != nil {
		return cli.UsageErr(stderr, fs, "--context: %v", err)
	}
	c, err := loadConditions(*conditions, stderr)
	if err != nil {
		return err
	}
	var ex acl.Explanation
	if sp == acl.Exec {
		ex, err = runs.ExplainExec(c, *p, set) // as a run names programs
	} else {
		ex, err = c.ExplainView(sp, *p, set)
	}
	if err != nil {
		return cli.UsageErr(stderr, fs, "--path: %v", err)
	}
	return writeJSON(stdout, ex)
}

func runBlocks(args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlags("blocks",
		"condfs blocks --conditions FILE --blocks-dir DIR [--context ATOM]...",
		"List the prompt blocks a context selects, in table order. Prints {\"blocks\",\"errors\"}.", stderr)
	conditions := fs.String("conditions", "", "the conditions.toml file")
	dir := fs.String("blocks-dir", "", "the blocks directory (blocks/conditional)")
	atoms := fs.StringArray("context", nil, "an atom of the session's context; repeat")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	if *conditions == "" || *dir == "" {
		return cli.UsageErr(stderr, fs, "--conditions and --blocks-dir are required")
	}
	set, err := cctx.NewSet(*atoms)
	if err != nil {
		return cli.UsageErr(stderr, fs, "--context: %v", err)
	}
	c, err := loadConditions(*conditions, stderr)
	if err != nil {
		return err
	}
	if st, err := os.Stat(*dir); err != nil || !st.IsDir() {
		fmt.Fprintf(stderr, "condfs blocks: %s is not a directory; pass the blocks/conditional folder\n", *dir)
		return cli.Exit(cli.ExitFail)
	}
	blocks, errs := c.Blocks(*dir, set)
	return writeJSON(stdout, map[string]any{"blocks": blocks, "errors": errs})
}
