package bench

import (
	"os"
	"sync"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

var (
	plainOnce sync.Once
	plainDir  string // removed by TestMain
	plainErr  error
)

// usePlainBinaries makes testenv's daemon condfs built without the race
// detector (the benchmarks time it), once per run of the benchmarks.
func usePlainBinaries(b *testing.B) {
	b.Helper()
	plainOnce.Do(func() {
		if plainDir, plainErr = os.MkdirTemp("", "condfs-bench-bin"); plainErr != nil {
			return
		}
		if plainErr = buildCondfs(plainDir); plainErr == nil {
			testenv.UseBinaries(plainDir)
		}
	})
	if plainErr != nil {
		b.Fatal(plainErr)
	}
}

// runHome is a daemon of the benchmark's own, for condfs run: a home whose
// config holds conditions and policy, and session "s" (context internal)
// open. It is stopped with b.
type runHome struct {
	bin, root, sock string
	daemon          int // the daemon's pid
}

func newRunHome(b *testing.B, conditions, policy string, serve ...string) *runHome {
	b.Helper()
	usePlainBinaries(b)
	h := testenv.NewHome(b, conditions, policy)
	d := testenv.Start(b, h, append([]string{"--log-level", "error", "--audit", h.Path("audit.log")}, serve...)...)
	d.Open("s", []string{"internal"})
	return &runHome{bin: testenv.Condfs(), root: h.Root, sock: d.Socket, daemon: d.Cmd.Process.Pid}
}

// run is the argv of condfs run in session s.
func (h *runHome) run(argv ...string) []string {
	return append([]string{h.bin, "run", "--socket", h.sock, "--session", "s", "--"}, argv...)
}
