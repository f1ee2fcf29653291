package main

import (
	"strings"
	"testing"
)

// TestACLCheckEgressTables: acl check loads [egress] and [secrets.NAME] as
// the daemon does (reading no value), and names a bad one by position.
func TestACLCheckEgressTables(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.toml", "[egress]\ninspect = [\"api.test\"]\n\n[secrets.gh]\nhosts = [\"api.test\"]\nvalue = \"env:CONDFS_UNSET_IN_THE_CHECKER\"\nenv = \"GH_TOKEN\"\n[memories.\"/a/\"]\nwhen = \"tui\"\naction = \"allow\"\n")
	if r := condfs(t, nil, "acl", "check", "--conditions", good, "--space", "memories", "--path", "/a/x", "--context", "tui"); r.code != 0 || !strings.Contains(r.stdout, `"allow"`) {
		t.Errorf("good: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	bad := writeFile(t, dir, "bad.toml", "[egress]\ninspect = [\"api.test\"]\n\n[secrets.gh]\nhosts = [\"other.test\"]\nvalue = \"env:X\"\nenv = \"GH_TOKEN\"\n")
	if r := condfs(t, nil, "acl", "check", "--conditions", bad, "--space", "memories", "--path", "/a"); r.code != 2 || !strings.HasPrefix(r.stderr, bad+":5:") || !strings.Contains(r.stderr, "not in [egress] inspect") {
		t.Errorf("bad: exit %d %q", r.code, r.stderr)
	}
}
