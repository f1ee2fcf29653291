package acl

import (
	"strings"
	"testing"
)

// FuzzDecide: no input panics; the decision for a path equals the decision
// for its canonical form; no canonical path escapes the space root.
func FuzzDecide(f *testing.F) {
	for _, s := range []string{"/private/x.md", "//private/./x", "/a/../../private", "private/", "/.", "x/../..//private/./y/"} {
		f.Add(s)
	}
	c := mustParse(f, design+"\n[memories.\"/private/secret\"]\nwhen = \"discord:dm\"\naction = \"deny\"\n")
	ctxs := []string{"discord:guild:1", "discord:dm"}
	f.Fuzz(func(t *testing.T, p string) {
		canon, err := Canon(p)
		if err != nil {
			if !strings.Contains(p, "\x00") {
				t.Fatalf("%q refused: %v", p, err)
			}
			return
		}
		if !strings.HasPrefix(canon, "/") || strings.Contains(canon, "/../") || strings.HasSuffix(canon, "/..") ||
			strings.Contains(canon, "//") || (canon != "/" && strings.HasSuffix(canon, "/")) {
			t.Fatalf("%q canonicalised to %q", p, canon)
		}
		if want := strings.HasPrefix(p, "/") && canon == p && p != "/"; execPathOK(p) != want {
			t.Fatalf("execPathOK(%q) = %v, want %v", p, !want, want)
		}
		again, _ := Canon(canon)
		if again != canon {
			t.Fatalf("Canon not idempotent: %q -> %q -> %q", p, canon, again)
		}
		for _, a := range ctxs {
			ctx := set(t, a)
			d1, _ := c.Decide(Memories, canon, ctx)
			alt, _ := Canon("/x/../" + p)
			d2, _ := c.Decide(Memories, alt, ctx)
			if d1 != d2 {
				t.Fatalf("%q and %q decide differently", canon, alt)
			}
			if ex := c.Explain(Memories, canon, ctx); (ex.Decision == "allow") != d1 {
				t.Fatalf("Explain and Decide disagree on %q", canon)
			}
		}
	})
}

// FuzzParseConditions: no conditions.toml crashes the loader or takes it
// unbounded memory; the seeds include the bracket bomb that once
// overflowed the stack on reload (issue 8). A file either loads or fails
// with a positioned error.
func FuzzParseConditions(f *testing.F) {
	f.Add([]byte(design))
	f.Add([]byte(strings.Repeat("[", 100000)))
	f.Add([]byte("a = " + strings.Repeat("[", 5000) + strings.Repeat("]", 5000)))
	f.Add([]byte("a = " + strings.Repeat("{b=", 200) + "1" + strings.Repeat("}", 200)))
	f.Add([]byte("x = \"[[[[\"\n[memories.\"/p/\"]\nwhen = \"tui\"\naction = \"allow\"\n"))
	f.Add([]byte(sandboxDesign))
	f.Add([]byte("[sandbox]\nbinaries = [\"/\"]\nnetwork = \"policy\"\nmemory = 1\ntmp_size = \"9223372036854775807B\"\nreach_private = [\"::/0\", \"0.0.0.0/0\"]\n"))
	f.Add([]byte("sandbox = {binaries = [\"/bin/\"], pids = 1}\n[exec]\n\"/bin/sh\" = {when = \"!tui\", action = \"deny\"}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("f.toml", data)
		if err != nil {
			if le, ok := err.(*LoadError); ok && le.Line < 1 {
				t.Fatalf("error without a position: %v", err)
			}
			return
		}
		tui := set(t, "tui")
		c.Visible(Memories, "/p/x", tui)
		// Nothing is executable without a [sandbox] that lists it.
		for _, p := range []string{"/bin/sh", "/usr/bin/x", "/workspace/x", "/"} {
			allowed := c.ExecAllowed(tui, p)
			if allowed && (c.Sandbox() == nil || !c.Sandbox().Listed(p)) {
				t.Fatalf("%s allowed but not listed", p)
			}
			if ex, err := c.ExplainExec(p, tui); err != nil || (ex.Decision == "allow") != allowed {
				t.Fatalf("ExplainExec(%s) = %+v, %v; ExecAllowed %v", p, ex, err, allowed)
			}
		}
	})
}
