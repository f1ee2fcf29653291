package sandbox

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestUserNS runs this package's tests again as uid 65534 through setpriv: an
// ordinary user whose runs are built with user namespaces.
func TestUserNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the nested run as an ordinary user: TestUserNS is its parent")
	}
	if what, err := Available(); err != nil || what != "namespaces (root)" {
		t.Fatalf("Available as root: %q, %v", what, err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// t.TempDir's parent is private to root: the user needs a path it can walk.
	dir, err := os.MkdirTemp("", "condfs-sandbox-userns-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "sandbox.test")
	copyFile(t, exe, bin)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tmp, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cmd := testenv.CommandAs(testenv.Nobody, bin,
		"-test.run=^Test", "-test.count=1", "-test.v")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "HOME=" + tmp}
	cmd.Dir = tmp
	out, err := cmd.CombinedOutput()
	t.Logf("as uid 65534:\n%s", out)
	if err != nil {
		t.Fatalf("the tests as uid 65534 failed: %v", err)
	}
	for _, want := range []string{"--- PASS: TestAvailable", "--- PASS: TestAllowLive", "--- PASS: TestIdentity", "--- PASS: TestMountsNosuidNodev", "--- PASS: TestAgain"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q", want)
		}
	}
}

func TestAvailable(t *testing.T) {
	what, err := Available()
	if err != nil {
		t.Fatal(err)
	}
	want := "namespaces (root)"
	if os.Geteuid() != 0 {
		want = "user namespaces"
	}
	if what != want {
		t.Errorf("Available: %q, want %q", what, want)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
