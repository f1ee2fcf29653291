package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestMain makes the test binary a sandbox init when Start re-executes it,
// as cmd/condfsd does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == initArg {
		InitMain()
	}
	os.Exit(m.Run())
}

// testBinaries are the host programs the runs of the tests may execute.
var testBinaries = []string{"/bin/sh", "/usr/bin/ls", "/usr/bin/cat", "/usr/bin/id", "/usr/bin/sleep", "/usr/bin/cp", "/usr/bin/chmod", "/usr/bin/true"}

// testSpec is a run as uid 65534 over fresh workspace and memories dirs.
func testSpec(t testing.TB, script string) Spec {
	t.Helper()
	uid := uint32(65534)
	if os.Geteuid() != 0 {
		uid = uint32(os.Geteuid())
	}
	ws, mem := t.TempDir(), t.TempDir()
	for _, d := range []string{ws, mem} {
		if os.Geteuid() == 0 {
			if err := os.Chown(d, int(uid), int(uid)); err != nil {
				t.Fatal(err)
			}
			// The init reaches them as the owner, as it reaches a view:
			// the test's own directory (0700) must let it through.
			if err := os.Chmod(filepath.Dir(d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return Spec{
		Argv:      []string{"/bin/sh", "-c", script},
		Env:       []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace"},
		UID:       uid,
		GID:       uid,
		Workspace: ws,
		Memories:  mem,
		Binaries:  testBinaries,
		Allowed:   testBinaries,
		Network:   "none",
		UserNS:    os.Geteuid() != 0,
	}
}

// output collects what a run writes on one descriptor.
type output struct {
	w    *os.File
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
}

func newOutput(t testing.TB) *output {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	o := &output{w: w, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			o.mu.Unlock()
			if err != nil {
				r.Close()
				return
			}
		}
	}()
	return o
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// run starts spec with stdout and stderr collected and waits for it.
func run(t testing.TB, spec Spec) (stdout, stderr string, ex Exit) {
	t.Helper()
	r, out, errOut := start(t, spec, nil)
	ex = r.Wait()
	<-out.done
	<-errOut.done
	return out.String(), errOut.String(), ex
}

func start(t testing.TB, spec Spec, stdin *os.File) (*Run, *output, *output) {
	t.Helper()
	out, errOut := newOutput(t), newOutput(t)
	r, err := Start(spec, stdin, out.w, errOut.w)
	out.w.Close()
	errOut.w.Close()
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return r, out, errOut
}
