package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RunRules shows private/ only in DMs and lets cat run only in DMs; sh,
// ls, sleep, id and tr run everywhere.
const RunRules = PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/ls", "/usr/bin/cat", "/usr/bin/sleep", "/usr/bin/id", "/usr/bin/tr"]
pids = 64

[exec."/usr/bin/cat"]
when = "discord:dm"
action = "allow"
`

// RunPolicy allows every command whose arguments do not include "forbidden".
const RunPolicy = `version: 1
roles:
  default:
    tools:
      exec:
        mode: allow
        constraints: ['every(args.argv, . != "forbidden")']
`

// RunHome is an open home with a session "s" owned by 65534 in a DM, on a
// daemon that admits 65534 to its socket.
func RunHome(t *testing.T) (*Daemon, string) {
	t.Helper()
	return RunHomeWith(t, RunRules)
}

// RunHomeWith is runHome with other rules.
func RunHomeWith(t *testing.T, rules string) (*Daemon, string) {
	t.Helper()
	return RunHomeFiles(t, rules, nil)
}

// RunHomeFiles is runHomeWith, with files made in the backing tree by
// files (if set) before the daemon starts.
func RunHomeFiles(t *testing.T, rules string, files func(h *Home)) (*Daemon, string) {
	t.Helper()
	h := OpenHome(t, rules)
	h.Write("config/policy.yaml", RunPolicy)
	h.Write("memories/private/p.md", "dm secret\n")
	h.Write("memories/pub.md", "public\n")
	h.Write("workspace/w.txt", "work\n")
	for _, p := range []string{"memories", "memories/private", "workspace"} {
		os.Chmod(h.Path(p), 0o777)
	}
	if files != nil {
		files(h)
	}
	d := Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	mnt := d.OpenFor("s", Nobody, DM)
	return d, mnt
}

// CondfsRun runs `condfs run` as uid 65534 and returns its output and
// exit status.
func CondfsRun(t *testing.T, d *Daemon, stdin string, args ...string) (string, int) {
	t.Helper()
	cmd := CommandAs(Nobody, Condfs(), append([]string{"run", "--socket", d.Socket, "--session", "s"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, _ := cmd.CombinedOutput()
	return string(out), cmd.ProcessState.ExitCode()
}
