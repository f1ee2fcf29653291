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
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

var (
	buildDir                  string // where build puts the binaries
	binDir                    string // where condfs and condfsd are
	dirOnce, binOnce, atkOnce sync.Once
	dirErr, binErr, atkErr    error
)

// Main runs a test package's tests (call it from TestMain).
func Main(m *testing.M) {
	os.Exit(m.Run())
}

// UseBinaries makes Condfs the condfs (and condfsd beside it) a package
// built itself into dir: cmd/condfs's tests build the client they test,
// bench/ builds them without the race detector. Call it before the first
// Condfs.
func UseBinaries(dir string) {
	binOnce.Do(func() { binDir = dir })
}

// build runs go build args into the build directory, on first use: a
// package whose selected tests need no binary builds none. The directory
// is one per checkout and user, kept between test processes: go build
// links again only what changed (it leaves an up-to-date output alone),
// so the integration packages and make test's passes link condfs once.
func build(args ...string) error {
	dirOnce.Do(func() { buildDir, dirErr = binCache() })
	if dirErr != nil {
		return dirErr
	}
	args = append([]string{"build", "-o", buildDir + "/"}, args...)
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go %v: %v\n%s", args, err, out)
	}
	return nil
}

// binCache is the build directory: in the temporary directory, named for
// the module's root and the user, and the user's own (a directory of that
// name someone else made is not used).
func binCache() (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s %d", bytes.TrimSpace(gomod), os.Geteuid())))
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("condfs-testbin-%x", sum[:8]))
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return "", err
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(dir, &st); err != nil {
		return "", err
	}
	if st.Uid != uint32(os.Geteuid()) || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		if dir, err = os.MkdirTemp("", "condfs-testbin"); err != nil {
			return "", err
		}
	}
	// Unprivileged callers run the binaries.
	return dir, os.Chmod(dir, 0o755)
}

// must ends the test process when a binary cannot be built: every test
// after would fail the same way.
func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// Condfs is the path of the condfs client, with the daemon, condfsd,
// beside it: built once per test process, race-enabled and with the
// condfstest hooks, unless UseBinaries named others.
func Condfs() string {
	binOnce.Do(func() {
		binErr = build("-race", "-tags", "condfstest", "github.com/condfs/condfs/cmd/condfs", "github.com/condfs/condfs/cmd/condfsd")
		binDir = buildDir
	})
	must(binErr)
	return filepath.Join(binDir, "condfs")
}

// Attacker is the path of the attacker program (internal/testenv/attacker):
// the syscalls a hostile caller makes, as subcommands.
func Attacker() string {
	atkOnce.Do(func() { atkErr = build("github.com/condfs/condfs/internal/testenv/attacker") })
	must(atkErr)
	return filepath.Join(buildDir, "attacker")
}

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
