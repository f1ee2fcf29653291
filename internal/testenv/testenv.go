// Package testenv is the one test environment of condfs's integration
// tests, benchmarks and the package tests that need a daemon: an agent
// home, a condfs serve process (as root, as another uid, with flags), a
// caller acting as another uid (uid 65534 through setpriv), the fixtures
// (the attacker program, shared rules and contexts) and waits for sockets
// and mounts. Only tests import it: it is no part of a condfs binary.
//
// The test process only uses the views, never serves them: a Go process
// that both serves and uses a FUSE mount can deadlock in its own runtime.
// In CI (CI=true) a test that cannot mount fails; elsewhere it skips with
// a loud reason.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// Main runs a test package's tests (call it from TestMain) and removes
// the binaries they built.
func Main(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// build builds the condfs client, the daemon beside it (race-enabled, with
// the condfstest hooks) and the attacker program once per test process, on
// first use: a package whose selected tests need none builds nothing.
func build() {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "condfs-it")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		// Unprivileged callers run both binaries.
		os.Chmod(dir, 0o755)
		for _, b := range [][]string{
			{"build", "-race", "-tags", "condfstest", "-o", dir + "/", "github.com/condfs/condfs/cmd/condfs", "github.com/condfs/condfs/cmd/condfsd"},
			{"build", "-o", dir + "/", "github.com/condfs/condfs/internal/testenv/attacker"},
		} {
			if out, err := exec.Command("go", b...).CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go %v: %v\n%s", b, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		fmt.Fprintln(os.Stderr, buildErr)
		os.Exit(1)
	}
}

// Condfs is the path of the condfs client; the daemon, condfsd, is beside it.
func Condfs() string { build(); return filepath.Join(buildDir, "condfs") }

// Attacker is the path of the attacker program (internal/testenv/attacker):
// the syscalls a hostile caller makes, as subcommands.
func Attacker() string { build(); return filepath.Join(buildDir, "attacker") }

// RequireFUSE fails in CI and skips elsewhere when views cannot be mounted.
func RequireFUSE(t testing.TB) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "integration tests need root to mount FUSE views"
	} else if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse: " + err.Error()
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s", why)
	}
	t.Skipf("SKIPPING FUSE TEST: %s (in CI this fails)", why)
}
