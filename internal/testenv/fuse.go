package testenv

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// RequireUnprivilegedFUSE is what an ordinary user's daemon needs, as
// distributions ship it: fusermount3, and /dev/fuse 0666 (so does .ci/run).
func RequireUnprivilegedFUSE(t *testing.T) {
	t.Helper()
	RequireFUSE(t)
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Fatalf("fusermount3 is needed (apt-get install fuse3): %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/dev/fuse", &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o006 != 0o006 {
		if err := os.Chmod("/dev/fuse", 0o666); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod("/dev/fuse", os.FileMode(st.Mode&0o777)) })
	}
}
