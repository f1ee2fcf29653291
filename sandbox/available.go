package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
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
	for _, c := range []struct{ path, bad, say string }{
		{"/proc/sys/kernel/unprivileged_userns_clone", "0", "sysctl kernel.unprivileged_userns_clone=1"},
		{"/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1", "sysctl kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile allowing userns for condfs)"},
		{"/proc/sys/user/max_user_namespaces", "0", "sysctl user.max_user_namespaces=N (N > 0)"},
	} {
		if b, e := readSmall(c.path); e == nil && strings.TrimSpace(string(b)) == c.bad {
			return "", fmt.Errorf("sandbox: unprivileged user namespaces are disabled (%s is %s): %w; enable with %s",
				c.path, c.bad, err, c.say)
		}
	}
	return "", fmt.Errorf("sandbox: cannot create a user namespace: %w", err)
}
