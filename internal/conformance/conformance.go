// Package conformance reads the conformance cases the repository keeps in
// testdata/conformance (a copy of the team's shared corpus, so that a clone
// stands alone) and the list of cases this repository disputes
// (testdata/conformance-disputed.txt). Tests use it; missing cases are a
// test failure, never a skip. SharedDir finds the team's corpus beside the
// repository, when it is there, so that a test can fail on drift.
package conformance

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// RepoRoot finds the repository root (the directory holding go.mod) from
// the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Dir returns the repository's copy of the conformance cases.
func Dir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "testdata", "conformance")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("conformance cases not found at %s: %w", dir, err)
	}
	return dir, nil
}

// SharedDir returns the team's shared corpus beside the repository
// (../shared/conformance), and false when there is none.
func SharedDir() (string, bool) {
	root, err := RepoRoot()
	if err != nil {
		return "", false
	}
	dir := filepath.Join(root, "..", "shared", "conformance")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", false
	}
	return dir, true
}

// Case is one line of a JSON Lines file: its id and its raw fields.
type Case struct {
	ID     string
	Fields map[string]json.RawMessage
	Line   int
}

// Str returns a string field ("" when absent or not a string).
func (c Case) Str(name string) string {
	var s string
	_ = json.Unmarshal(c.Fields[name], &s)
	return s
}

// Has reports whether a field is present and not null.
func (c Case) Has(name string) bool {
	raw, ok := c.Fields[name]
	return ok && string(raw) != "null"
}

// Decode decodes a field into v.
func (c Case) Decode(name string, v any) error {
	raw, ok := c.Fields[name]
	if !ok {
		return fmt.Errorf("case %s: no field %s", c.ID, name)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return dec.Decode(v)
}

// Load reads one JSON Lines file of the shared corpus by name.
func Load(name string) ([]Case, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Case
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(line, &fields); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		c := Case{Fields: fields, Line: n}
		c.ID = c.Str("id")
		out = append(out, c)
	}
	return out, sc.Err()
}

// Disputed returns the ids this repository disputes, with their reasons,
// from testdata/conformance-disputed.txt ("ID reason" per line, # comments).
func Disputed() (map[string]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "testdata", "conformance-disputed.txt"))
	if os.IsNotExist(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, reason, _ := strings.Cut(line, " ")
		out[id] = strings.TrimSpace(reason)
	}
	return out, nil
}
