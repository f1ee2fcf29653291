package integration

import (
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestAttackCrashKeepsRevocation: uid 65534 reads a ruled file in its DM
// session and keeps the descriptor; the daemon is killed (-9) and restarts,
// restoring the session; the session moves to a guild. The descriptor must
// not read the DM's file any more. Before, its pages stayed cached with
// attributes cached as long as the watcher allowed, so it kept reading them
// from the kernel after the restart: the new daemon, on a new connection,
// could not cut it off. The same for a directory listed before the crash.
func TestAttackCrashKeepsRevocation(t *testing.T) {
	h := openHome(t, privateRule)
	h.write("memories/private/p.md", "dm secret")
	h.write("memories/pub.md", "public")
	for _, p := range []string{"memories", "memories/private"} {
		os.Chmod(h.path(p), 0o755)
	}
	for _, p := range []string{"memories/private/p.md", "memories/pub.md"} {
		os.Chmod(h.path(p), 0o644)
	}
	os.Chown(h.path("memories/private/p.md"), nobody, nobody) // hold opens read-write
	d := startDaemon(t, h)
	mnt := d.openFor("a", nobody, dmCtx)
	first, ask := converseAsNobody(t, "hold", mnt+"/memories/private/p.md")
	if first != "open" {
		t.Fatalf("open: %s", first)
	}
	// Read twice: the second read is served from the page cache.
	for range 2 {
		if got := ask("r"); got != `read "dm secret"` {
			t.Fatalf("read before the crash: %s", got)
		}
	}

	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	os.Remove(d.socket)
	d2 := startDaemon(t, h)
	d2.setContext("a", guildCtx)
	if got := ask("r"); strings.Contains(got, "secret") {
		t.Fatalf("after the crash and a switch to the guild, a descriptor from before still reads: %s\n%s", got, d2.log())
	}
	// The restored view itself is the guild's.
	if got := asNobody(t, "cat", mnt+"/memories/private/p.md"); strings.Contains(got, "secret") {
		t.Fatalf("the restored view shows the DM's file in the guild: %s", got)
	}
	if got := asNobody(t, "cat", mnt+"/memories/pub.md"); got != `read "public"` {
		t.Fatalf("the restored view: %s", got)
	}
}
