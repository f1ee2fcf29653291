package changes

import (
	"os"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestStagedDiffShowsOnlyWhatTheOwnerMayRead: changes.diff with content
// reads both trees with the session owner's authority. uid 65534 may
// remove or rename root's unreadable file in a directory it may write; the
// diff lists the change but shows none of the file's content.
func TestStagedDiffShowsOnlyWhatTheOwnerMayRead(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, func(h *testenv.Home) {
		h.Write("workspace/secret.txt", "root secret one\n")
		h.Write("workspace/secret2.txt", "root secret two\n")
		for _, p := range []string{"workspace/secret.txt", "workspace/secret2.txt"} {
			os.Chmod(h.Path(p), 0o600)
		}
	})
	testenv.ShAsNobody(t, mnt+"/workspace", `rm -f secret.txt && mv secret2.txt moved.txt`)
	out := testenv.AsNobody(t, "condfs", "ctl", "--socket", d.Socket, "--json", "call", "changes.diff", `{"session":"s","content":true}`)
	if !strings.Contains(out, "secret.txt") || !strings.Contains(out, "moved.txt") {
		t.Fatalf("the diff does not list the changes: %s", out)
	}
	if strings.Contains(out, "root secret") {
		t.Fatalf("the diff shows root's unreadable content to uid 65534: %s", out)
	}
}
