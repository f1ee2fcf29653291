package changes

import (
	"os"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestStagedCachedListingHidesAFileLinkedOutsideTheSpace: the kernel keeps
// a staged view's listings of a space with rules (its entries are cached as
// long as a direct view's), and a file listed there that gains a second
// name outside the space, in the backing tree, goes from the listing and
// from its entry within moments: the link watch follows the backing tree's
// filesystem beneath the layer, since link(2) raises no event in the
// directory of the file's first name and the backing watch sees no change
// beneath the space's root.
func TestStagedCachedListingHidesAFileLinkedOutsideTheSpace(t *testing.T) {
	if os.Getenv("CONDFS_TEST_NO_FANOTIFY") != "" {
		t.Skip("without the link watch a listing of a space with rules is never kept (documented)")
	}
	d, mnt, _ := stagedHome(t, testenv.ChangesRules, nil, "--cache-ttl", "1m")
	dir := mnt + "/memories/private"
	for i := 0; i < 2; i++ {
		if got := testenv.ShAsNobody(t, dir, `ls; cat p.md`); got != "p.md\ndm secret" {
			t.Fatalf("before the link: %q", got)
		}
	}
	if err := os.Link(d.Home.Path("memories/private/p.md"), d.Home.Path("outside-link")); err != nil {
		t.Fatal(err)
	}
	d.Within("a second name made outside the space hides the file", func() bool {
		got := testenv.ShAsNobody(t, dir, `ls; cat p.md 2>/dev/null || true`)
		return !strings.Contains(got, "p.md") && !strings.Contains(got, "secret")
	})
}
