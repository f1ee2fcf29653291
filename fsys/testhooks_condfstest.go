//go:build condfstest

package fsys

import (
	"os"
	"time"
)

// Built only with -tags condfstest (the integration tests' binary): test
// hooks that widen race windows so that a test can show a fix is needed.
// CONDFS_TEST_PLUS_DELAY holds a READDIRPLUS entry between its decision
// and the answer that carries it to the kernel. CONDFS_TEST_CHANGE_DELAY
// holds a write or fallocate through a handle between choosing the
// credentials it acts with and acting. CONDFS_TEST_NO_FANOTIFY
// runs the daemon as one that cannot mark filesystems (not root).
func testHooks() hooks {
	var h hooks
	h.noLinkWatch = os.Getenv("CONDFS_TEST_NO_FANOTIFY") != ""
	if d, err := time.ParseDuration(os.Getenv("CONDFS_TEST_PLUS_DELAY")); err == nil {
		h.plusDelay = d
	}
	if d, err := time.ParseDuration(os.Getenv("CONDFS_TEST_CHANGE_DELAY")); err == nil {
		h.changeDelay = d
	}
	return h
}
