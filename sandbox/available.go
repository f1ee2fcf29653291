package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/condfs/condfs/sandbox/internal/confine"
)

// Available says what sandbox this process can build: as root, namespaces;
// otherwise user namespaces. It tries: it starts an init in the namespaces a
// run would use, which exits at once. When that fails it names the sysctl
// that refuses user namespaces, if one does.
func Available() (string, error) {
	spec := Spec{UserNS: os.Geteuid() != 0, UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
	what := "namespaces (root)"
	if spec.UserNS {
		what = "user namespaces"
	}
	cmd := exec.Command(initPath, initArg, "probe")
	cmd.Args[0] = "condfs"
	cmd.Env = []string{}
	cmd.SysProcAttr = sysProcAttr(&spec)
	err := cmd.Run()
	if err == nil {
		return what, nil
	}
	if !spec.UserNS {
		return "", fmt.Errorf("sandbox: cannot create namespaces: %w", err)
	}
	if why := userNSRefused(); why != nil {
		return "", fmt.Errorf("%w (%v)", why, err)
	}
	return "", fmt.Errorf("sandbox: cannot create a user namespace: %w", err)
}

// userNSRefused names the sysctl that refuses unprivileged user
// namespaces, if one does.
func userNSRefused() error {
	for _, c := range []struct{ path, bad, say string }{
		{"/proc/sys/kernel/unprivileged_userns_clone", "0", "sysctl kernel.unprivileged_userns_clone=1"},
		{"/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1", "sysctl kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile allowing userns for condfs)"},
		{"/proc/sys/user/max_user_namespaces", "0", "sysctl user.max_user_namespaces=N (N > 0)"},
	} {
		if b, e := readSmall(c.path); e == nil && strings.TrimSpace(string(b)) == c.bad {
			return fmt.Errorf("sandbox: unprivileged user namespaces are disabled (%s is %s); enable with %s", c.path, c.bad, c.say)
		}
	}
	return nil
}

// Protections is what a run started now would have, for `status`.
type Protections struct {
	Build    string `json:"build"`           // "namespaces (root)", "user namespaces", or "" when none can be built
	Error    string `json:"error,omitempty"` // why none can be built
	Landlock int    `json:"landlock_abi"`    // the Landlock ABI in force for runs, 0 for none
	Seccomp  bool   `json:"seccomp"`
	// Programs is the index of the host's programs that runs cover with
	// noexec mounts, so the ELF interpreter cannot run them (programs.go).
	Programs ProgramsIndex `json:"programs"`
}

// ProgramsIndex is the state of the index of the host's programs.
type ProgramsIndex struct {
	Covers  int    `json:"covers"`            // noexec mounts each run gets
	Indexed string `json:"indexed,omitempty"` // when the index in use was taken (RFC 3339); "" before the first
	Error   string `json:"error,omitempty"`   // why there is none: runs are refused
}

var probed struct {
	once sync.Once
	p    Protections
}

// Probe says which protections runs get here, without starting anything
// (Available tries for real): root builds with namespaces; others with
// user namespaces unless a sysctl refuses them. It remembers the answer.
func Probe() Protections {
	probed.once.Do(func() {
		what, err := "namespaces (root)", error(nil)
		if os.Geteuid() != 0 {
			what, err = "user namespaces", userNSRefused()
		}
		r := confine.Probe()
		probed.p = Protections{Build: what, Landlock: r.Landlock, Seccomp: r.Seccomp}
		if err != nil {
			probed.p.Build, probed.p.Error = "", err.Error()
		}
	})
	p := probed.p
	p.Programs = hostPrograms.state()
	return p
}

// IndexPrograms starts indexing the host's programs in the background, so
// that a daemon's first run does not wait for it (Prepare waits when it
// must).
func IndexPrograms() {
	hostPrograms.mu.Lock()
	defer hostPrograms.mu.Unlock()
	if hostPrograms.at.IsZero() && !hostPrograms.scanning {
		hostPrograms.start()
	}
}
