package integration

import (
	"sort"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
)

// TestPosix runs go-fuse's posixtest suite on a view whose paths are all
// allowed: the view must be a real filesystem.
func TestPosix(t *testing.T) {
	var names []string
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, "", atoms(t, "tui"))
			posixtest.All[name](t, r.view_("workspace", ""))
		})
	}
}
