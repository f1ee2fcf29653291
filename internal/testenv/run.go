package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runRules: private/ only in DMs; cat only in DMs; sh, ls, sleep, echo
// everywhere.
const RunRules = PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/ls", "/usr/bin/cat", "/usr/bin/sleep", "/usr/bin/id", "/usr/bin/tr"]
pids = 64

[exec."/usr/bin/cat"]
when = "discord:dm"
action = "allow"
`

const RunPolicy = `version: 1
roles:
  default:
    tools:
      exec:
        mode: allow
        constraints: ['every(args.argv, . != "forbidden")']
`

// runHome is an open home with a session "s" owned by 65534 in a DM, on a
// daemon that admits 65534 to its socket.
func RunHome(t *testing.T) (*Daemon, string) {
	t.Helper()
	return RunHomeWith(t, RunRules)
}

// runHomeWith is runHome with other rules.
func RunHomeWith(t *testing.T, rules string) (*Daemon, string) {
	t.Helper()
	return RunHomeFiles(t, rules, nil)
}

// runHomeFiles is runHomeWith, with files made in the backing tree by
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

// condfsRun runs `condfs run` as uid 65534 and returns its output and
// exit status.
func CondfsRun(t *testing.T, d *Daemon, stdin string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", Condfs(), "run", "--socket", d.Socket, "--session", "s"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, _ := cmd.CombinedOutput()
	return string(out), cmd.ProcessState.ExitCode()
}
