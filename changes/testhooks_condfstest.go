//go:build condfstest

package changes

import "os"

// Built only with -tags condfstest (the integration tests' binary).
// CONDFS_TEST_USERNS_AS_ROOT has a layer's user namespace map its root to
// the host's root, which the kernel lets no unprivileged daemon do: the
// daemon then meets a kernel that refuses it a user namespace.
func userNSHost(uid, gid int) (int, int) {
	if os.Getenv("CONDFS_TEST_USERNS_AS_ROOT") != "" {
		return 0, 0
	}
	return uid, gid
}
