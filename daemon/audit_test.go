package daemon

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestClip: what a caller names is kept in audit records to its first
// KiB and its length, cut between runes.
func TestClip(t *testing.T) {
	if got := clip("short"); got != "short" {
		t.Errorf("clip(short) = %q", got)
	}
	long := strings.Repeat("é", 3000) // 6000 bytes
	got := clip(long)
	if !utf8.ValidString(got) || len(got) > auditClip+64 || !strings.HasSuffix(got, "…(6000 bytes in all)") {
		t.Errorf("clip of 6000 bytes: %d bytes, valid %v, ends %q", len(got), utf8.ValidString(got), got[len(got)-30:])
	}
	if clipAll(nil) != nil || len(clipAll([]string{long, "a"})[0]) > auditClip+64 {
		t.Error("clipAll")
	}
}
