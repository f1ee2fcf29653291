package constraints

import (
	"fmt"
	"strings"
	"testing"
)

// aliasBomb is the 600-byte policy that once exhausted the daemon's
// memory on reload (issue 8): nine levels of nine aliases.
func aliasBomb() string {
	b := "version: 1\nconsts:\n  a: &a [x,x,x,x,x,x,x,x,x]\n"
	for i, c := range "bcdefghi" {
		p := string("abcdefghi"[i])
		b += fmt.Sprintf("  %c: &%c [%s]\n", c, c, strings.TrimSuffix(strings.Repeat("*"+p+",", 9), ","))
	}
	return b + "roles:\n  default:\n    tools: {}\n"
}

// FuzzParsePolicy: no policy file crashes the loader or expands without
// bound; errors carry positions.
func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(aliasBomb()))
	f.Add([]byte("version: 1\nroles:\n  default:\n    tools:\n      t: {mode: allow, constraints: [\"args.a <= 3\"]}\n"))
	f.Add([]byte(strings.Repeat("[", 10000)))
	f.Add([]byte("version: 1\nconsts: &c {a: *c}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := Parse("p.yaml", data)
		if err != nil && !strings.HasPrefix(err.Error(), "p.yaml:") {
			t.Fatalf("error without the file's position: %v", err)
		}
	})
}

func TestAliasBombIsALoadError(t *testing.T) {
	_, err := Parse("p.yaml", []byte(aliasBomb()))
	if err == nil || !strings.Contains(err.Error(), "expand") {
		t.Fatalf("alias bomb: %v", err)
	}
}
