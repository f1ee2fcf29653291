package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/condfs/condfs/internal/cli"
)

// daemonBinary is the name of the binary that holds the daemon.
const daemonBinary = "condfsd"

func isDaemonCommand(name string) bool {
	switch name {
	case "serve", "mcp", "policy", "acl", "blocks":
		return true
	}
	return false
}

// daemonPath finds condfsd: beside this binary (as make build and an
// install put them), else on PATH.
func daemonPath() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), daemonBinary)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath(daemonBinary)
	if err != nil {
		return "", fmt.Errorf("%s (the daemon and the offline tools) is neither beside this binary nor on PATH: install both (make build puts them in bin/)", daemonBinary)
	}
	return p, nil
}

// execDaemon replaces this process with condfsd running args; it returns
// only by exiting.
func execDaemon(args []string) {
	p, err := daemonPath()
	if err == nil {
		err = syscall.Exec(p, append([]string{daemonBinary}, args...), os.Environ())
		err = fmt.Errorf("exec %s: %w", p, err)
	}
	fmt.Fprintf(os.Stderr, "condfs %s: %v\n", args[0], err)
	os.Exit(cli.ExitFail)
}

// daemonCommand runs condfsd's command name as a child writing to stdout
// and stderr: for what reads a command's output in this process
// (completion reads --help). Commands typed by a user become condfsd
// instead (execDaemon).
func daemonCommand(name string) func(args []string, stdout, stderr io.Writer) error {
	return func(args []string, stdout, stderr io.Writer) error {
		p, err := daemonPath()
		if err != nil {
			return err
		}
		cmd := exec.Command(p, append([]string{name}, args...)...)
		cmd.Args[0] = daemonBinary
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
		err = cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return cli.Exit(ee.ExitCode())
		}
		return err
	}
}
