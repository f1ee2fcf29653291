// Command condfs is the condfs daemon, its control client and its offline
// policy tools. Run "condfs help" for the commands.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"

	"github.com/condfs/condfs/sandbox"
)

// exitError carries an exit status up to main.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Exit statuses: 0 for success (any decision), 2 for a config that fails
// to load or a usage error, 1 for anything else.
const (
	exitFail  = 1
	exitUsage = 2
)

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the daemon: per-session views, the control socket, hot reload", runServe},
		{"ctl", "talk to a running daemon over its control socket", runCtl},
		{"policy", "lint a tool policy or decide calls against it, offline", runPolicy},
		{"acl", "check a path against conditions.toml, offline", runACL},
		{"blocks", "list the prompt blocks a context selects, offline", runBlocks},
		{"hook", "enforce the policy in an agent runtime's hook (claude-code)", runHook},
		{"mcp", "enforce the policy between an MCP client and server (proxy)", runMCP},
		{"run", "run a command in a sandbox under a session's authority", runRun},
		{"completion", "print a shell completion script (bash, zsh or fish)", runCompletion},
		{"help", "show this help", nil},
	}
}

const intro = `condfs gives AI agents per-session, context-aware file and tool authority.

Each agent session (a Discord DM, a guild channel, a cron heartbeat, ...) gets
its own FUSE view of memories/ and workspace/ in which paths that its context
may not see do not exist, and its tool calls are decided against a policy.
'condfs run' runs a command in a sandbox whose only files are the session's
view and which may execute only what its context allows; condfs does not
confine processes it did not start (docs/security.md).
`

func usage(w io.Writer) {
	fmt.Fprint(w, intro)
	fmt.Fprintln(w, "\nUsage: condfs COMMAND [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'condfs COMMAND --help' for a command's flags.")
}

func main() {
	// The daemon re-executes itself as a sandbox's init (package sandbox):
	// that process must do nothing else.
	if len(os.Args) > 1 && os.Args[1] == "sandbox-init" {
		sandbox.InitMain()
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" {
		if len(args) > 1 {
			return run([]string{args[1], "--help"}, stdout, stderr)
		}
		usage(stdout)
		return 0
	}
	for _, c := range commands() {
		if c.name == name && c.run != nil {
			err := c.run(args[1:], stdout, stderr)
			var ee exitError
			switch {
			case err == nil:
				return 0
			case errors.Is(err, pflag.ErrHelp):
				return 0
			case errors.As(err, &ee):
				return ee.code
			default:
				fmt.Fprintf(stderr, "condfs %s: %v\n", name, err)
				return exitFail
			}
		}
	}
	fmt.Fprintf(stderr, "condfs: unknown command %q\n\n", name)
	usage(stderr)
	return exitUsage
}

// newFlags returns a flag set that prints its usage with a description.
func newFlags(name, synopsis, desc string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n\n%s\n\nFlags:\n%s", synopsis, desc, fs.FlagUsages())
	}
	return fs
}

// parseFlags parses and turns usage errors into exit status 2.
func parseFlags(fs *pflag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return exitError{exitUsage}
	}
	return nil
}

func usageErr(stderr io.Writer, fs *pflag.FlagSet, format string, a ...any) error {
	fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), fmt.Sprintf(format, a...))
	fs.Usage()
	return exitError{exitUsage}
}
