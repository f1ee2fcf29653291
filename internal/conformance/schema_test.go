package conformance_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"

	"github.com/condfs/condfs/acl"
	"github.com/condfs/condfs/constraints"
	"github.com/condfs/condfs/internal/conformance"
)

// The editor schemas (docs/*.schema.json) agree with the loaders: every
// example and every conformance file that loads is valid, and every one
// that fails to load for an unknown key or table is invalid. (Errors a
// schema cannot see, such as a bad expression, are the loader's alone.)
func TestSchemas(t *testing.T) {
	root, err := conformance.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	policy := compileSchema(t, filepath.Join(root, "docs/policy.schema.json"))
	conditions := compileSchema(t, filepath.Join(root, "docs/conditions.schema.json"))

	type file struct{ name, text string }
	var policies, conds []file
	for _, p := range []string{"examples/agent/config/policy.yaml", "examples/claude-code/policy.yaml", "examples/egress/policy.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		policies = append(policies, file{p, string(b)})
	}
	for _, p := range []string{"examples/agent/config/conditions.toml", "examples/egress/conditions.toml"} {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		conds = append(conds, file{p, string(b)})
	}
	conds = append(conds,
		file{"sandbox", "[sandbox]\nbinaries = [\"/bin/sh\", \"/usr/lib/git-core/\"]\nnetwork = \"policy\"\nmemory = 1048576\ntmp_size = \"64MiB\"\npids = 8\nconnections = 4\nreach_private = [\"10.0.0.0/8\", \"fd00::1\"]\nhosts = \"/etc/condfs/hosts\"\n[exec.\"/usr/lib/git-core/\"]\nwhen = \"tui\"\naction = \"deny\"\n"},
		file{"egress", "[egress]\ninspect = [\"api.test\", \"*.example.com\"]\nupstream_ca = \"/etc/condfs/ca.pem\"\n[secrets.gh]\nhosts = [\"api.test\"]\nvalue = \"env:GH\"\nenv = \"GH_TOKEN\"\nwhen = \"tui\"\n"},
		file{"egress unknown key", "[egress]\ninspect = []\nhosts = []\n"},
		file{"secrets unknown key", "[egress]\ninspect = [\"api.test\"]\n[secrets.gh]\nhosts = [\"api.test\"]\nvalue = \"env:GH\"\nenv = \"GH\"\nheader = \"Authorization\"\n"},
		file{"sandbox unknown key", "[sandbox]\nbinaries = []\nshell = \"/bin/sh\"\n"},
		file{"sandbox in exec", "[exec.\"/bin/sh\"]\nwhen = \"tui\"\naction = \"allow\"\nbinaries = []\n"},
		file{"changes", "[changes]\nmode = \"staged\"\nmax_bytes = \"512MiB\"\nmax_checkpoints = 8\n"},
		file{"changes bad mode", "[changes]\nmode = \"overlay\"\n"},
		file{"changes bad size", "[changes]\nmax_bytes = \"1GB\"\n"},
		file{"changes unknown key", "[changes]\nundo = true\n"})
	cases, err := conformance.Load("constraints.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if c.Has("policy_yaml") {
			policies = append(policies, file{c.Str("id"), c.Str("policy_yaml")})
		}
	}
	cases, err = conformance.Load("conditions.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		for _, k := range []string{"conditions_toml", "reload_toml"} {
			if c.Has(k) {
				conds = append(conds, file{c.Str("id") + " " + k, c.Str(k)})
			}
		}
	}

	valid, invalid := 0, 0
	check := func(sch *jsonschema.Schema, name string, doc any, loadErr error) {
		t.Helper()
		verr := sch.Validate(doc)
		switch {
		case loadErr == nil && verr != nil:
			t.Errorf("%s loads but the schema rejects it: %v", name, verr)
		case loadErr == nil:
			valid++
		case strings.Contains(loadErr.Error(), "unknown key") || strings.Contains(loadErr.Error(), "unknown table"):
			if verr == nil {
				t.Errorf("%s fails to load (%v) but the schema accepts it", name, loadErr)
			}
			invalid++
		}
	}
	for _, f := range policies {
		var doc any
		if err := yaml.Unmarshal([]byte(f.text), &doc); err != nil {
			continue // not YAML: nothing for a schema to say
		}
		_, lerr := constraints.Parse("policy.yaml", []byte(f.text))
		check(policy, f.name, jsonValue(doc), lerr)
	}
	for _, f := range conds {
		var doc map[string]any
		if _, err := toml.Decode(f.text, &doc); err != nil {
			continue
		}
		_, lerr := acl.Parse("conditions.toml", []byte(f.text))
		check(conditions, f.name, jsonValue(doc), lerr)
	}
	t.Logf("%d files valid, %d rejected for unknown keys, of %d policies and %d conditions files", valid, invalid, len(policies), len(conds))
	if valid < 10 || invalid < 2 {
		t.Fatalf("too few files checked: %d valid, %d invalid", valid, invalid)
	}
}

func compileSchema(t *testing.T, path string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	s, err := c.Compile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return s
}

// jsonValue turns a YAML or TOML document into what a JSON decoder would
// give (string keys, float64 numbers), for the validator.
func jsonValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = jsonValue(e)
		}
		return out
	case map[any]any:
		out := map[string]any{}
		for k, e := range x {
			out[fmt.Sprint(k)] = jsonValue(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	case []map[string]any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonValue(e)
		}
		return out
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	var out any
	json.Unmarshal(b, &out)
	return out
}
