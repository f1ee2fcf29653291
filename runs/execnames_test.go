package runs

import (
	"os"
	"slices"
	"testing"
)

// TestSpellingsThroughUsrMerge: where /bin is a link into /usr, /bin/true
// and /usr/bin/true are spellings of one place, either way round; a path
// of the view is only itself.
func TestSpellingsThroughUsrMerge(t *testing.T) {
	if fi, err := os.Lstat("/bin"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Skip("/bin is not a link on this host")
	}
	links := mergeLinks()
	for _, c := range [][2]string{{"/bin/true", "/usr/bin/true"}, {"/usr/bin/true", "/bin/true"}} {
		if got := spellings(c[0], links); got[0] != c[0] || !slices.Contains(got, c[1]) {
			t.Errorf("spellings(%s) = %v, want it first and %s", c[0], got, c[1])
		}
	}
	if hostPlace("/bin/true") != hostPlace("/usr/bin/true") {
		t.Errorf("hostPlace: %s and %s", hostPlace("/bin/true"), hostPlace("/usr/bin/true"))
	}
	if got := spellings("/workspace/bin/x", links); !slices.Equal(got, []string{"/workspace/bin/x"}) {
		t.Errorf("spellings of a view path: %v", got)
	}
}
