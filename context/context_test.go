package context

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{`["tui"]`, "[tui]", ""},
		{`[]`, "[]", ""},
		{`["discord:dm","discord:dm"]`, "[discord:dm]", ""},
		{`{"kind":"discord","channel_id":"7"}`, "[discord:channel:7 discord:dm discord:dm:7]", ""},
		{`{"kind":"discord","channel_id":"9","guild_id":"1","parent_id":"5","nsfw":true}`, "[discord:channel:9 discord:forum:5 discord:guild:1 discord:nsfw]", ""},
		{`{"kind":"internal"}`, "[internal]", ""},
		{`{"kind":"none"}`, "[]", ""},
		{`null`, "", "required"},
		{``, "", "required"},
		{`["TUI"]`, "", "unknown atom"},
		{`["!tui"]`, "", "negation"},
		{`["discord:dm:"]`, "", "missing id"},
		{`["discord:guild:1a"]`, "", "ASCII digits"},
		{`{"kind":"discord"}`, "", "channel_id"},
		{`{"kind":"discord","channel_id":7}`, "", "context description"},
		{`{"kind":"matrix"}`, "", "unknown kind"},
		{`{"kind":"tui","guild_id":"1"}`, "", "only"},
		{`{"kind":"none","extra":1}`, "", "unknown field"},
		{`["tui"] x`, "", "after"},
		{`"tui"`, "", "array"},
	} {
		s, err := Parse([]byte(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || s.String() != tc.want {
			t.Errorf("%s: %v %v, want %s", tc.in, s, err, tc.want)
		}
	}
}

func TestConditions(t *testing.T) {
	ctx, _ := NewSet([]string{"discord:guild:1", "discord:channel:2"})
	for _, tc := range []struct {
		when []string
		mode string
		want bool
	}{
		{[]string{"discord:guild:1"}, "", true},
		{[]string{"!discord:guild:1"}, "", false},
		{[]string{"discord:dm", "discord:guild:1"}, "or", true},
		{[]string{"discord:dm", "discord:guild:1"}, "and", false},
		{[]string{"!discord:nsfw", "discord:channel:2"}, "and", true},
	} {
		c, err := NewCondition(tc.when, tc.mode)
		if err != nil {
			t.Fatal(err)
		}
		if c.Holds(ctx) != tc.want {
			t.Errorf("%v %s: %v", tc.when, tc.mode, !tc.want)
		}
	}
	for _, bad := range []string{"!!tui", "Tui", " tui", "discord:role:1", "discord:forum", "", "!"} {
		if _, err := ParseCond(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := NewCondition(nil, ""); err == nil {
		t.Error("empty when accepted")
	}
	if _, err := NewCondition([]string{"tui"}, "xor"); err == nil {
		t.Error("mode xor accepted")
	}
}

// TestMaxAtoms: a context of 1 MiB of atoms was kept whole by the session
// it was set on; a context has at most MaxAtoms.
func TestMaxAtoms(t *testing.T) {
	atoms := func(n int) []byte {
		var b strings.Builder
		b.WriteString("[")
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(`"discord:channel:` + strings.Repeat("1", 1+i%18) + strings.Repeat("2", i/18) + `"`)
		}
		return []byte(b.String() + "]")
	}
	if s, err := Parse(atoms(MaxAtoms)); err != nil || s.Len() != MaxAtoms {
		t.Fatalf("%d atoms: %v, %d kept", MaxAtoms, err, s.Len())
	}
	if _, err := Parse(atoms(MaxAtoms + 1)); err == nil || !strings.Contains(err.Error(), "at most 64 atoms") {
		t.Fatalf("%d atoms: %v", MaxAtoms+1, err)
	}
}
