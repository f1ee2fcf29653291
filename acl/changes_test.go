package acl

import (
	"strings"
	"testing"
)

// TestChangesTable: [changes] is read with its defaults, and a malformed
// table fails to load with FILE:LINE:COL.
func TestChangesTable(t *testing.T) {
	c, err := Parse("conditions.toml", []byte("[changes]\nmode = \"direct\"\nmax_bytes = \"2MiB\"\nmax_checkpoints = 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if ch := c.Changes(); ch.Mode() != "direct" || ch.MaxBytes() != 2<<20 || ch.MaxCheckpoints() != 3 {
		t.Fatalf("read %q %d %d", ch.Mode(), ch.MaxBytes(), ch.MaxCheckpoints())
	}
	c, err = Parse("conditions.toml", []byte(""))
	if err != nil {
		t.Fatal(err)
	}
	if ch := c.Changes(); ch.Mode() != "direct" || ch.MaxBytes() != 1<<30 || ch.MaxCheckpoints() != 64 {
		t.Fatalf("defaults %q %d %d", ch.Mode(), ch.MaxBytes(), ch.MaxCheckpoints())
	}
	for src, want := range map[string]string{
		"[changes]\nmode = \"overlay\"\n":      "conditions.toml:2:",
		"[changes]\nmax_bytes = \"1GB\"\n":     "conditions.toml:2:",
		"[changes]\nmax_checkpoints = 0\n":     "conditions.toml:2:",
		"[changes]\nundo = true\n":             "conditions.toml:2:",
		"changes = 1\n":                        "conditions.toml:1:",
		"[changes]\nmax_checkpoints = \"x\"\n": "conditions.toml:2:",
	} {
		_, err := Parse("conditions.toml", []byte(src))
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "changes") {
			t.Errorf("%q: %v, want an error at %s", src, err, want)
		}
	}
}
