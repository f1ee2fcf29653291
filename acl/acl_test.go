package acl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	cctx "github.com/condfs/condfs/context"
)

func set(t testing.TB, atoms ...string) cctx.Set {
	t.Helper()
	s, err := cctx.NewSet(atoms)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The CireilClaw design's example: DMs see private memories, one channel
// sees admin, one guild sees deploy.
const design = `
[blocks.nsfw]
when = ["discord:nsfw", "discord:dm"]
mode = "or"
action = "load"

[blocks.intimate]
when = "discord:dm:123456789"
action = "load"

[memories."/private/"]
when = ["discord:dm"]
action = "allow"

[memories."/admin/"]
when = "discord:channel:987654321"
action = "allow"

[workspace."/deploy/"]
when = ["discord:guild:123456789"]
action = "allow"
`

func TestDesignExample(t *testing.T) {
	c := mustParse(t, design)
	dm := set(t, "discord:dm", "discord:dm:123456789", "discord:channel:123456789")
	guild := set(t, "discord:guild:123456789", "discord:channel:555")
	forum := set(t, "discord:guild:123456789", "discord:channel:9001", "discord:forum:555")
	admin := set(t, "discord:guild:1", "discord:channel:987654321")
	for _, tc := range []struct {
		ctx   cctx.Set
		space Space
		path  string
		want  bool
	}{
		{dm, Memories, "/private/diary.md", true},
		{dm, Memories, "/private", true},
		{dm, Memories, "/admin/keys", false},
		{dm, Workspace, "/deploy/run.sh", false},
		{guild, Memories, "/private/diary.md", false},
		{guild, Workspace, "/deploy/run.sh", true},
		{forum, Workspace, "/deploy/run.sh", true},
		{forum, Memories, "/privateer.md", true},
		{admin, Memories, "/admin/keys", true},
		{admin, Memories, "/notes.md", true},
		{set(t, "tui"), Memories, "/private/x", false},
		{set(t), Memories, "/", true},
	} {
		got, _ := c.Decide(tc.space, tc.path, tc.ctx)
		if got != tc.want {
			t.Errorf("%v %s %s: %v, want %v", tc.ctx, tc.space, tc.path, got, tc.want)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "nsfw.md"), []byte("+++\ndescription = \"adult\"\n+++\nbody\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "intimate.md"), []byte("+++\ndescription = \"close\"\n+++\nmore\n"), 0o644)
	blocks, errs := c.Blocks(dir, dm)
	if len(errs) != 0 || len(blocks) != 2 || blocks[0].Name != "nsfw" || blocks[1].Description != "close" || blocks[1].Body != "more\n" {
		t.Fatalf("blocks %+v errors %+v", blocks, errs)
	}
	if blocks, _ := c.Blocks(dir, guild); len(blocks) != 0 {
		t.Fatalf("guild blocks %+v", blocks)
	}
}

func TestConditionKinds(t *testing.T) {
	for _, tc := range []struct {
		when, mode string
		ctx        []string
		want       bool
	}{
		{`"tui"`, "", []string{"tui"}, true},
		{`"!tui"`, "", []string{"tui"}, false},
		{`"!tui"`, "", nil, true},
		{`["tui", "internal"]`, "or", []string{"internal"}, true},
		{`["tui", "internal"]`, "and", []string{"internal"}, false},
		{`["discord:guild:1", "!discord:nsfw"]`, "and", []string{"discord:guild:1"}, true},
		{`["discord:guild:1", "!discord:nsfw"]`, "and", []string{"discord:guild:1", "discord:nsfw"}, false},
		{`"discord:dm:7"`, "", []string{"discord:dm", "discord:dm:7"}, true},
		{`"discord:dm:7"`, "", []string{"discord:dm", "discord:dm:8"}, false},
		{`"discord:forum:5"`, "", []string{"discord:forum:5"}, true},
		{`"discord:channel:5"`, "", []string{"discord:forum:5"}, false},
	} {
		mode := ""
		if tc.mode != "" {
			mode = fmt.Sprintf("mode = %q\n", tc.mode)
		}
		c := mustParse(t, fmt.Sprintf("[memories.\"/x/\"]\nwhen = %s\n%saction = \"allow\"\n", tc.when, mode))
		if got, _ := c.Decide(Memories, "/x/y", set(t, tc.ctx...)); got != tc.want {
			t.Errorf("when %s mode %q in %v: %v, want %v", tc.when, tc.mode, tc.ctx, got, tc.want)
		}
	}
}

func TestLoadErrorPositions(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"\n\n[memories.\"/a/\"]\nwhen = \"tui\"\naction = \"allow\"\nextra = 1\n", "c.toml:6:9: [memories.\"/a/\"]: unknown key \"extra\""},
		{"[workspace.\"/a/\"]\nwhen = \"Tui\"\naction = \"allow\"\n", "c.toml:2:9: [workspace.\"/a/\"]: condition \"Tui\""},
		{"[workspace.\"/a/\"]\nwhen = \"tui\"\naction = \"load\"\n", "c.toml:3:11: [workspace.\"/a/\"]: action must be \"allow\" or \"deny\""},
		{"[blocks.x]\nwhen = \"tui\"\naction = \"allow\"\n", "c.toml:3:11: [blocks.x]: action must be \"load\""},
		{"x = [\n", "c.toml:"},
		{"[memories]\n\"//a\" = {when = \"tui\", action = \"allow\"}\n", "c.toml:2:10: [memories.\"//a\"]: a key must not hold \"//\""},
		// A scalar where a table belongs once loaded as no rules.
		{"memories = 1\n", "c.toml:1:12: [memories] must be a table"},
		{"\nblocks = \"x\"\n", "c.toml:2:11: [blocks] must be a table"},
		{"workspace = [1]\n", "c.toml:1:14: [workspace] must be a table"},
	} {
		_, err := Parse("c.toml", []byte(tc.text))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want prefix %q", tc.text, err, tc.want)
		}
	}
}

func TestCanon(t *testing.T) {
	for in, want := range map[string]string{
		"": "/", "/": "/", "a": "/a", "/a/": "/a", "//a//b/": "/a/b", "/a/./b": "/a/b",
		"/a/../b": "/b", "/../../x": "/x", "a/..": "/", "/.hidden": "/.hidden", "/...": "/...",
	} {
		if got, err := Canon(in); err != nil || got != want {
			t.Errorf("Canon(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := Canon("/a\x00b"); err == nil {
		t.Error("NUL accepted")
	}
}

func TestExplain(t *testing.T) {
	c := mustParse(t, design+"\n[memories.\"/private/secret\"]\nwhen = \"discord:dm\"\naction = \"deny\"\n")
	ex := c.Explain(Memories, "/private/secret", set(t, "discord:dm", "discord:dm:1", "discord:channel:1"))
	if ex.Decision != "deny" || len(ex.Rules) != 2 || ex.Why != "deny rule /private/secret holds" {
		t.Fatalf("%+v", ex)
	}
	ex = c.Explain(Memories, "/notes", set(t))
	if ex.Decision != "allow" || len(ex.Rules) != 0 {
		t.Fatalf("%+v", ex)
	}
}

func TestBlockErrorsKeepOthers(t *testing.T) {
	c := mustParse(t, "[blocks.a]\nwhen = \"tui\"\naction = \"load\"\n[blocks.b]\nwhen = \"tui\"\naction = \"load\"\n[blocks.c]\nwhen = \"tui\"\naction = \"load\"\n")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "b.md"), []byte("+++\r\ndescription = \"d\"\r\n+++\r\nbody"), 0o644)
	os.Symlink("/etc/hostname", filepath.Join(dir, "c.md"))
	blocks, errs := c.Blocks(dir, set(t, "tui"))
	if len(blocks) != 1 || blocks[0].Name != "b" || blocks[0].Body != "body" || len(errs) != 2 {
		t.Fatalf("blocks %+v errs %+v", blocks, errs)
	}
	if errs[0].Name != "a" || !strings.Contains(errs[0].Reason, "missing") || errs[1].Name != "c" {
		t.Fatalf("errs %+v", errs)
	}
}

func TestVisible(t *testing.T) {
	c := mustParse(t, `
[memories."/p"]
when = "discord:dm"
action = "allow"

[memories."/a/"]
when = "discord:guild:1"
action = "allow"

[memories."/a/secret"]
when = "discord:guild:1"
action = "deny"

[memories."/x/y"]
when = "tui"
action = "allow"
`)
	guild := set(t, "discord:guild:1")
	for _, tc := range []struct {
		path       string
		ctx        cctx.Set
		vis, ruled bool
	}{
		{"/", guild, true, false},
		{"/p", guild, false, true},
		{"/p/new.md", guild, false, true}, // its own decision is allow, but /p is hidden
		{"/p/new.md", set(t, "discord:dm"), true, true},
		{"/a/b/c", guild, true, true},
		{"/a/secret/c", guild, false, true}, // under the hidden /a/secret
		{"/a/secret", guild, false, true},
		{"/a", set(t, "tui"), false, true},
		{"/x/y/z", guild, false, true}, // under the hidden /x/y
		{"/x/y/z", set(t, "tui"), true, true},
		{"/x/y", guild, false, true},
		{"/free/file", guild, true, false},
	} {
		vis, ruled := c.Visible(Memories, tc.path, tc.ctx)
		if vis != tc.vis || ruled != tc.ruled {
			t.Errorf("Visible(%s, %v) = %v, %v; want %v, %v", tc.path, tc.ctx, vis, ruled, tc.vis, tc.ruled)
		}
		if own, _ := c.Decide(Memories, tc.path, tc.ctx); tc.vis && !own {
			t.Errorf("%s visible but its own decision is deny", tc.path)
		}
	}
	if !c.HasRulesUnder(Memories, "/a") || !c.HasRulesUnder(Memories, "/x") || c.HasRulesUnder(Memories, "/free") || !c.HasRulesUnder(Memories, "/") {
		t.Error("HasRulesUnder")
	}
}
