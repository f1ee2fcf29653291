package acl

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/internal/conformance"
)

var posRe = regexp.MustCompile(`^conditions\.toml:\d+:\d+: .+`)

// TestConformance runs every shared conditions case that needs no mount:
// path decisions (fixtures and mount-only views aside), blocks, loads, and
// context derivation.
func TestConformance(t *testing.T) {
	cases, err := conformance.Load("conditions.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	disputed, err := conformance.Disputed()
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, c := range cases {
		if why, ok := disputed[c.ID]; ok {
			t.Logf("disputed case %s: %s", c.ID, why)
			continue
		}
		kind := c.Str("kind")
		if kind == "reload" || (kind == "path" && c.Has("fixtures")) {
			continue // need a daemon and a mount: see integration/
		}
		ran++
		t.Run(c.ID, func(t *testing.T) {
			switch kind {
			case "load":
				_, err := Parse("conditions.toml", []byte(c.Str("conditions_toml")))
				if got := map[bool]string{true: "ok", false: "error"}[err == nil]; got != c.Str("expect_load") {
					t.Fatalf("load %s (%v), want %s", got, err, c.Str("expect_load"))
				}
				if err != nil && !posRe.MatchString(err.Error()) {
					t.Fatalf("error without FILE:LINE:COL: %v", err)
				}
				t.Logf("%v", err)
			case "context":
				set, err := cctx.Parse(c.Fields["context"])
				if c.Has("expect_error") {
					if err == nil {
						t.Fatalf("context accepted as %v, want an error", set)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				checkAtoms(t, c, set)
			case "path":
				cfg := mustParse(t, c.Str("conditions_toml"))
				set, err := cctx.Parse(c.Fields["context"])
				if err != nil {
					t.Fatal(err)
				}
				if c.Has("expect_atoms") {
					checkAtoms(t, c, set)
				}
				sp, err := ParseSpace(c.Str("space"))
				if err != nil {
					t.Fatal(err)
				}
				p, err := Canon(c.Str("path"))
				if c.Str("expect") == "refused" {
					if err == nil {
						t.Fatalf("path with NUL accepted as %q", p)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				allow, _ := cfg.Decide(sp, p, set)
				if got := map[bool]string{true: "allow", false: "deny"}[allow]; got != c.Str("expect") {
					t.Fatalf("%s %s in %v: %s, want %s\n%+v", sp, p, set, got, c.Str("expect"), cfg.Explain(sp, p, set))
				}
			case "blocks":
				cfg := mustParse(t, c.Str("conditions_toml"))
				dir := t.TempDir()
				var files map[string]string
				c.Decode("block_files", &files)
				for name, text := range files {
					os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644)
				}
				var atoms []string
				c.Decode("context", &atoms)
				set, err := cctx.NewSet(atoms)
				if err != nil {
					t.Fatal(err)
				}
				blocks, errs := cfg.Blocks(dir, set)
				var want []string
				c.Decode("expect_blocks", &want)
				var got []string
				for _, b := range blocks {
					got = append(got, b.Name)
				}
				if len(got) != len(want) || (len(got) > 0 && string(mustJSON(got)) != string(mustJSON(want))) {
					t.Fatalf("blocks %v, want %v (errors %v)", got, want, errs)
				}
				if (len(errs) > 0) != c.Has("expect_error") {
					t.Fatalf("errors %v, want errors: %v", errs, c.Has("expect_error"))
				}
			default:
				t.Fatalf("unknown kind %q", kind)
			}
		})
	}
	if ran < 100 {
		t.Fatalf("only %d cases ran", ran)
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func checkAtoms(t *testing.T, c conformance.Case, set cctx.Set) {
	t.Helper()
	var want []string
	c.Decode("expect_atoms", &want)
	if string(mustJSON(set.Atoms())) != string(mustJSON(want)) && !(len(want) == 0 && set.Len() == 0) {
		t.Fatalf("atoms %v, want %v", set.Atoms(), want)
	}
}

func mustParse(t testing.TB, text string) *Config {
	t.Helper()
	c, err := Parse("conditions.toml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
