package sandbox

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// confineHook confines the calling OS thread just before it forks the
// command, so the command inherits it. It runs on a locked thread that is
// never reused. sandbox/internal/confine's Apply (seccomp, Landlock) replaces
// it; this default sets what holds without them.
var confineHook = baseConfine

// baseConfine sets no_new_privs, clears the ambient and inheritable
// capabilities and empties the bounding set of the calling thread. The
// effective and permitted sets stay: the forked child needs CAP_SETUID and
// CAP_SETGID to become the owner, which clears them (root path); on the
// user-namespace path the command is not uid 0 inside, so execve leaves it
// none.
func baseConfine(Spec) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	for c := 0; c <= lastCap(); c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear inheritable capabilities: %w", err)
	}
	return nil
}

// lastCap is the highest capability the kernel knows.
func lastCap() int {
	b, err := readSmall("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		var n int
		if _, err := fmt.Sscanf(string(b), "%d", &n); err == nil && n > 0 && n < 64 {
			return n
		}
	}
	return unix.CAP_LAST_CAP
}
