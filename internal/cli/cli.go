// Package cli is what the condfs client and the condfsd daemon binary share
// of a command line: the command table and its dispatch, flag sets that
// print a description, and exit statuses carried up as errors.
package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

// Exit statuses: 0 for success (any decision), 2 for a config that fails
// to load or a usage error, 1 for anything else.
const (
	ExitFail  = 1
	ExitUsage = 2
)

// ExitError carries an exit status up to main.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Exit is an error that makes main exit with code, printing nothing more.
func Exit(code int) error { return ExitError{Code: code} }

// Command is one subcommand. Run nil marks help, which Main answers.
type Command struct {
	Name    string
	Summary string
	Run     func(args []string, stdout, stderr io.Writer) error
}

// Program is a binary's commands and how its help introduces them.
type Program struct {
	Name     string // as the user types it: "condfs"
	Intro    string
	Commands func() []Command
}

// Usage prints the program's help.
func (p Program) Usage(w io.Writer) {
	fmt.Fprint(w, p.Intro)
	fmt.Fprintf(w, "\nUsage: %s COMMAND [flags]\n\nCommands:\n", p.Name)
	for _, c := range p.Commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.Name, c.Summary)
	}
	fmt.Fprintf(w, "\nRun '%s COMMAND --help' for a command's flags.\n", p.Name)
}

// Main runs the command args name and returns the exit status.
func (p Program) Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		p.Usage(stderr)
		return ExitUsage
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" {
		if len(args) > 1 {
			return p.Main([]string{args[1], "--help"}, stdout, stderr)
		}
		p.Usage(stdout)
		return 0
	}
	for _, c := range p.Commands() {
		if c.Name == name && c.Run != nil {
			err := c.Run(args[1:], stdout, stderr)
			var ee ExitError
			switch {
			case err == nil:
				return 0
			case errors.Is(err, pflag.ErrHelp):
				return 0
			case errors.As(err, &ee):
				return ee.Code
			default:
				fmt.Fprintf(stderr, "%s %s: %v\n", p.Name, name, err)
				return ExitFail
			}
		}
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n\n", p.Name, name)
	p.Usage(stderr)
	return ExitUsage
}

// NewFlags returns a flag set that prints its usage with a description.
func NewFlags(name, synopsis, desc string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s\n\n%s\n\nFlags:\n%s", synopsis, desc, fs.FlagUsages())
	}
	return fs
}

// ParseFlags parses and turns usage errors into exit status 2.
func ParseFlags(fs *pflag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return Exit(ExitUsage)
	}
	return nil
}

// UsageErr prints a usage error and the flag set's usage: exit status 2.
func UsageErr(stderr io.Writer, fs *pflag.FlagSet, format string, a ...any) error {
	fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), fmt.Sprintf(format, a...))
	fs.Usage()
	return Exit(ExitUsage)
}
