package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// OpenHome is a home whose directories other users may search, as a real
// agent home is (t.TempDir is 0700, which would refuse them natively).
func OpenHome(t *testing.T, conditions string) *Home {
	t.Helper()
	h := NewHome(t, conditions, "version: 1\n")
	for _, dir := range []string{h.Root, filepath.Dir(h.Root)} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return h
}
