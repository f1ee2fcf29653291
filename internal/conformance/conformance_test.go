package conformance

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCopyMatchesShared: when the team's corpus is beside the repository,
// the copy in testdata/conformance must be identical to it, file by file.
func TestCopyMatchesShared(t *testing.T) {
	shared, ok := SharedDir()
	if !ok {
		t.Log("no ../shared/conformance beside the repository: nothing to compare (the copy is used alone)")
		return
	}
	local, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, dir := range []string{shared, local} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if !e.IsDir() {
				names[e.Name()] = true
			}
		}
	}
	for name := range names {
		a, errA := os.ReadFile(filepath.Join(shared, name))
		b, errB := os.ReadFile(filepath.Join(local, name))
		switch {
		case errA != nil:
			t.Errorf("testdata/conformance/%s is not in ../shared/conformance: remove it, or ask why it went", name)
		case errB != nil:
			t.Errorf("../shared/conformance/%s has no copy: cp ../shared/conformance/%s testdata/conformance/", name, name)
		case !bytes.Equal(a, b):
			t.Errorf("testdata/conformance/%s differs from ../shared/conformance/%s: refresh it with cp ../shared/conformance/%s testdata/conformance/ (and check the cases that changed)", name, name, name)
		}
	}
}

func TestCasesLoad(t *testing.T) {
	for _, name := range []string{"conditions.jsonl", "constraints.jsonl"} {
		cases, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(cases) < 100 {
			t.Fatalf("%s: %d cases", name, len(cases))
		}
		for _, c := range cases {
			if c.ID == "" {
				t.Fatalf("%s:%d: a case without an id", name, c.Line)
			}
		}
	}
}
