package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/conformance"
)

// TestACLConformance runs the offline conditions cases through the CLI,
// as the corpus README describes: acl check for path cases with atom
// contexts, blocks for blocks cases, acl check on / for load cases.
func TestACLConformance(t *testing.T) {
	cases, err := conformance.Load("conditions.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	disputed, err := conformance.Disputed()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ran := 0
	for _, c := range cases {
		if why, ok := disputed[c.ID]; ok {
			t.Logf("disputed case %s: %s", c.ID, why)
			continue
		}
		kind := c.Str("kind")
		var atoms []string
		if kind == "path" || kind == "blocks" {
			if err := c.Decode("context", &atoms); err != nil {
				continue // a description context: checked through the daemon
			}
		}
		if kind == "path" && (c.Has("fixtures") || string(c.Fields["cli"]) == "false") {
			continue
		}
		if kind != "path" && kind != "blocks" && kind != "load" {
			continue
		}
		ran++
		t.Run(c.ID, func(t *testing.T) {
			t.Parallel()
			cdir := filepath.Join(dir, c.ID)
			f := writeFile(t, cdir, "conditions.toml", c.Str("conditions_toml"))
			var ctxFlags []string
			for _, a := range atoms {
				ctxFlags = append(ctxFlags, "--context", a)
			}
			switch kind {
			case "load":
				r := condfs(t, nil, "acl", "check", "--conditions", f, "--space", "memories", "--path", "/")
				if c.Str("expect_load") == "ok" {
					if r.code != 0 {
						t.Fatalf("exit %d: %s", r.code, r.stderr)
					}
				} else if r.code != 2 || !strings.HasPrefix(r.stderr, f+":") || !diagRe.MatchString(r.stderr) {
					t.Fatalf("want exit 2 with %s:LINE:COL, got %d %q", f, r.code, r.stderr)
				}
			case "path":
				args := append([]string{"acl", "check", "--conditions", f, "--space", c.Str("space"), "--path", c.Str("path")}, ctxFlags...)
				r := condfs(t, nil, args...)
				var out struct {
					Decision string `json:"decision"`
					Rules    []any  `json:"rules"`
				}
				if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
					t.Fatalf("exit %d: %s %s", r.code, r.stdout, r.stderr)
				}
				// acl check answers what the view does (the path and every
				// directory the walk crosses): expect_view where the case
				// has one.
				want := c.Str("expect")
				if v := c.Str("expect_view"); v != "" {
					want = v
				}
				if out.Decision != want || out.Rules == nil {
					t.Fatalf("%s, want %s: %s", out.Decision, want, r.stdout)
				}
			case "blocks":
				bdir := filepath.Join(cdir, "blocks")
				var files map[string]string
				c.Decode("block_files", &files)
				writeFile(t, bdir, ".keep", "")
				for name, text := range files {
					writeFile(t, bdir, name, text)
				}
				r := condfs(t, nil, append([]string{"blocks", "--conditions", f, "--blocks-dir", bdir}, ctxFlags...)...)
				var out struct {
					Blocks []struct{ Name string } `json:"blocks"`
					Errors []any                   `json:"errors"`
				}
				if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
					t.Fatalf("exit %d: %s %s", r.code, r.stdout, r.stderr)
				}
				var want, got []string
				c.Decode("expect_blocks", &want)
				for _, b := range out.Blocks {
					got = append(got, b.Name)
				}
				if strings.Join(got, ",") != strings.Join(want, ",") || out.Errors == nil || (len(out.Errors) > 0) != c.Has("expect_error") {
					t.Fatalf("blocks %v errors %v; want %v error=%v", got, out.Errors, want, c.Has("expect_error"))
				}
			}
		})
	}
	if ran < 100 {
		t.Fatalf("only %d cases ran", ran)
	}
}

// TestACLCheckExec: acl check --space exec answers what a run in the
// context may execute: listed in [sandbox] binaries and allowed by the
// exec rules.
func TestACLCheckExec(t *testing.T) {
	dir := t.TempDir()
	f := writeFile(t, dir, "conditions.toml", `
[sandbox]
binaries = ["/bin/sh", "/usr/bin/cat", "/usr/lib/git-core/"]

[exec."/usr/bin/cat"]
when = "discord:dm"
action = "allow"
`)
	dm := []string{"--context", "discord:dm", "--context", "discord:dm:5", "--context", "discord:channel:5"}
	guild := []string{"--context", "discord:guild:1", "--context", "discord:channel:7"}
	for _, tc := range []struct {
		path string
		ctx  []string
		want string
		why  string
	}{
		{"/usr/bin/cat", dm, "allow", "allow rule /usr/bin/cat holds"},
		{"/usr/bin/cat", guild, "deny", "no matching rule's condition holds"},
		{"/usr/bin/cat", nil, "deny", "no matching rule's condition holds"},
		{"/bin/sh", guild, "allow", "no rule matches the path"},
		{"/usr/lib/git-core/git-remote-http", guild, "allow", "no rule matches the path"},
		{"/usr/bin/nc", dm, "deny", "/usr/bin/nc is not listed in [sandbox] binaries"},
	} {
		args := append([]string{"acl", "check", "--conditions", f, "--space", "exec", "--path", tc.path}, tc.ctx...)
		r := condfs(t, nil, args...)
		var out struct {
			Decision string `json:"decision"`
			Why      string `json:"why"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || out.Decision != tc.want || out.Why != tc.why {
			t.Errorf("%s %v: exit %d %s %s; want %s, %q", tc.path, tc.ctx, r.code, r.stdout, r.stderr, tc.want, tc.why)
		}
	}
	if r := condfs(t, nil, "acl", "check", "--conditions", f, "--space", "exec", "--path", "usr/bin/cat"); r.code != 2 || !strings.Contains(r.stderr, "an exec path is absolute") {
		t.Errorf("relative path: exit %d %s", r.code, r.stderr)
	}
	none := writeFile(t, dir, "none.toml", "[exec.\"/bin/\"]\nwhen = \"tui\"\naction = \"allow\"\n")
	if r := condfs(t, nil, "acl", "check", "--conditions", none, "--space", "exec", "--path", "/bin/sh", "--context", "tui"); r.code != 0 || !strings.Contains(r.stdout, "no binaries are allowed") {
		t.Errorf("no [sandbox]: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	bad := writeFile(t, dir, "bad.toml", "[sandbox]\nbinaries = [\"/bin/sh\"]\nnetwork = \"bridge\"\n")
	if r := condfs(t, nil, "acl", "check", "--conditions", bad, "--space", "exec", "--path", "/bin/sh"); r.code != 2 || !strings.HasPrefix(r.stderr, bad+":3:12: [sandbox]: network must be") {
		t.Errorf("bad [sandbox]: exit %d %q", r.code, r.stderr)
	}
	if r := condfs(t, nil, "acl", "check", "--conditions", f, "--space", "sandbox", "--path", "/bin/sh"); r.code != 2 || !strings.Contains(r.stderr, "want memories, workspace or exec") {
		t.Errorf("unknown space: exit %d %q", r.code, r.stderr)
	}
}

// TestACLCheckExecNamesAsARunDoes: where /bin is a link to usr/bin, acl
// check answers for a name what a run does: /bin/cat is the program
// listed as /usr/bin/cat, decided by the exec rules of every spelling
// (keys written either way apply; where they disagree, it is refused).
func TestACLCheckExecNamesAsARunDoes(t *testing.T) {
	if fi, err := os.Lstat("/bin"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("/bin is not a link on this host (%v): the test needs a usr-merged host", err)
		}
		t.Skip("/bin is not a link on this host")
	}
	f := writeFile(t, t.TempDir(), "conditions.toml", `
[sandbox]
binaries = ["/usr/bin/cat", "/bin/ls", "/usr/bin/true"]

[exec."/bin/cat"]
when = "discord:dm"
action = "allow"

[exec."/usr/bin/true"]
when = "discord:dm"
action = "allow"

[exec."/bin/true"]
when = "discord:dm:6"
action = "allow"
`)
	dm := []string{"--context", "discord:dm", "--context", "discord:dm:6"}
	dm5 := []string{"--context", "discord:dm", "--context", "discord:dm:5"}
	guild := []string{"--context", "discord:guild:1"}
	for _, tc := range []struct {
		path string
		ctx  []string
		want string
	}{
		{"/bin/cat", dm, "allow"}, {"/usr/bin/cat", dm, "allow"},
		{"/bin/cat", guild, "deny"}, {"/usr/bin/cat", guild, "deny"},
		{"/bin/ls", guild, "allow"}, {"/usr/bin/ls", guild, "allow"},
		{"/bin/true", dm, "allow"}, {"/usr/bin/true", dm, "allow"},
		{"/bin/true", dm5, "deny"}, {"/usr/bin/true", dm5, "deny"},
		{"/bin/wc", dm, "deny"}, {"/usr/bin/wc", dm, "deny"},
	} {
		r := condfs(t, nil, append([]string{"acl", "check", "--conditions", f, "--space", "exec", "--path", tc.path}, tc.ctx...)...)
		var out struct {
			Decision string `json:"decision"`
			Path     string `json:"path"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || out.Decision != tc.want || out.Path != tc.path {
			t.Errorf("%s %v: exit %d %s %s; want %s", tc.path, tc.ctx, r.code, r.stdout, r.stderr, tc.want)
		}
	}
}

// TestACLCheckExecBeneathADirectoryDeniedWhole: a file beneath a listed
// directory that a rule beneath it keeps from running in the context is
// refused by acl check, as a run refuses it.
func TestACLCheckExecBeneathADirectoryDeniedWhole(t *testing.T) {
	f := writeFile(t, t.TempDir(), "conditions.toml", `
[sandbox]
binaries = ["/usr/lib/git-core/"]

[exec."/usr/lib/git-core/git-daemon"]
when = "discord:dm"
action = "allow"
`)
	for _, tc := range []struct {
		ctx  []string
		want string
	}{{[]string{"--context", "discord:dm"}, "allow"}, {[]string{"--context", "discord:guild:1"}, "deny"}} {
		r := condfs(t, nil, append([]string{"acl", "check", "--conditions", f, "--space", "exec", "--path", "/usr/lib/git-core/git-remote-http"}, tc.ctx...)...)
		var out struct{ Decision string }
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || out.Decision != tc.want {
			t.Errorf("%v: exit %d %s %s; want %s", tc.ctx, r.code, r.stdout, r.stderr, tc.want)
		}
	}
}
