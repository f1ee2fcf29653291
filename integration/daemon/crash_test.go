package daemon

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestCrashKeepsRevocation: uid 65534 reads a ruled file in its DM
// session and keeps the descriptor; the daemon is killed (-9) and restarts,
// restoring the session; the session moves to a guild. The descriptor must
// not read the DM's file any more: pages and attributes the kernel keeps
// as long as the watcher allows would let it read on after the restart,
// where the new daemon, on a new connection, cannot cut it off. The same
// for a directory listed before the crash.
func TestCrashKeepsRevocation(t *testing.T) {
	h := testenv.OpenHome(t, testenv.PrivateRule)
	h.Write("memories/private/p.md", "dm secret")
	h.Write("memories/pub.md", "public")
	for _, p := range []string{"memories", "memories/private"} {
		os.Chmod(h.Path(p), 0o755)
	}
	for _, p := range []string{"memories/private/p.md", "memories/pub.md"} {
		os.Chmod(h.Path(p), 0o644)
	}
	os.Chown(h.Path("memories/private/p.md"), testenv.Nobody, testenv.Nobody) // hold opens read-write
	d := testenv.Start(t, h)
	mnt := d.OpenFor("a", testenv.Nobody, testenv.DM)
	first, ask := testenv.ConverseAsNobody(t, "hold", mnt+"/memories/private/p.md")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	// Read twice: the second read is served from the page cache.
	for range 2 {
		if got := ask("r"); got != `read "dm secret"` {
			t.Fatalf("read before the crash: %s", got)
		}
	}

	d.Cmd.Process.Signal(syscall.SIGKILL)
	<-d.Exited()
	os.Remove(d.Socket)
	d2 := testenv.Start(t, h)
	d2.SetContext("a", testenv.Guild)
	if got := ask("r"); strings.Contains(got, "secret") {
		t.Fatalf("after the crash and a switch to the guild, a descriptor from before still reads: %s\n%s", got, d2.Log())
	}
	// The restored view itself is the guild's.
	if got := testenv.AsNobody(t, "cat", mnt+"/memories/private/p.md"); strings.Contains(got, "secret") {
		t.Fatalf("the restored view shows the DM's file in the guild: %s", got)
	}
	if got := testenv.AsNobody(t, "cat", mnt+"/memories/pub.md"); got != `read "public"` {
		t.Fatalf("the restored view: %s", got)
	}
}
