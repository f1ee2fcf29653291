package main

import (
	"encoding/json"
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
