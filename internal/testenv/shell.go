package testenv

import (
	"bufio"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Shell is the attacker's shell: one command a line, as another uid.
type Shell struct {
	t   *testing.T
	in  *bufio.Writer
	out *bufio.Scanner
	cmd *exec.Cmd
}

// StartShell starts the attacker's shell as uid 65534.
func StartShell(t *testing.T) *Shell { return StartShellAs(t, Nobody) }

// StartShellAs starts the attacker's shell as uid and gid uid, no groups.
func StartShellAs(t *testing.T, uid int) *Shell {
	cmd := CommandAs(uid, Attacker(), "shell", "-")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &Shell{t: t, in: bufio.NewWriter(stdin), out: bufio.NewScanner(stdout), cmd: cmd}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	return s
}

// Do runs one command; ok reports success and res its quoted result.
func (s *Shell) Do(args ...string) (ok bool, res string) {
	fmt.Fprintln(s.in, strings.Join(args, " "))
	s.in.Flush()
	if !s.out.Scan() {
		s.t.Fatalf("attacker shell died at %v", args)
	}
	line := s.out.Text()
	if strings.HasPrefix(line, "ok ") {
		v, err := strconv.Unquote(line[3:])
		if err != nil {
			s.t.Fatalf("bad answer %q", line)
		}
		return true, v
	}
	return false, line
}
