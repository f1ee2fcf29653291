package testenv

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// ChangesRules is runRules with the programs that change files.
const ChangesRules = PrivateRule + `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/rm", "/usr/bin/mkdir", "/usr/bin/mv", "/usr/bin/ln", "/usr/bin/chmod", "/usr/bin/rmdir", "/usr/bin/truncate", "/usr/bin/cat"]
pids = 64
`

// BackingTree describes a backing directory: each path's type, mode,
// content or target, and a file's mtime.
func BackingTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := st.Mode().String()
		switch {
		case st.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			desc += fmt.Sprintf(" %q %d", b, st.ModTime().UnixNano())
		case st.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		}
		out[strings.TrimPrefix(p, root)] = desc
		return nil
	})
	return out
}

// TreeDiff lists, sorted, how got differs from want (two BackingTree
// descriptions); none when they are the same.
func TreeDiff(want, got map[string]string) []string {
	var diffs []string
	for p, w := range want {
		if g := got[p]; g != w {
			diffs = append(diffs, fmt.Sprintf("%s = %q, want %q", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s extra (%s)", p, g))
		}
	}
	sort.Strings(diffs)
	return diffs
}

// RollbackResult is checkpoint.rollback's answer.
type RollbackResult struct {
	Restored  int `json:"restored"`
	Conflicts []struct {
		Space, Path, Reason string
	} `json:"conflicts"`
}

// Checkpoint makes a checkpoint of session named name and returns its id.
func Checkpoint(d *Daemon, session, name string) string {
	var r struct{ ID string }
	d.Call("checkpoint.create", map[string]any{"session": session, "name": name}, &r)
	return r.ID
}

// Rollback rolls session back to checkpoint cp.
func Rollback(d *Daemon, session, cp string, force bool) RollbackResult {
	var r RollbackResult
	d.Call("checkpoint.rollback", map[string]any{"session": session, "checkpoint": cp, "force": force}, &r)
	return r
}
