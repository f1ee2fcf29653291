package acl

import (
	"fmt"
	"strings"
	"testing"
)

// rules1000 builds 1,000 rules over nested directories in both spaces.
func rules1000() string {
	var b strings.Builder
	conds := []string{`"discord:dm"`, `"discord:guild:1"`, `["!discord:nsfw", "discord:guild:2"]`, `"internal"`}
	for i := 0; i < 1000; i++ {
		space := []string{"memories", "workspace"}[i%2]
		key := fmt.Sprintf("/team%d/project%d/", i%50, i)
		if i%3 == 0 {
			key = fmt.Sprintf("/team%d/project%d/notes/file%d.md", i%50, i, i)
		}
		action := []string{"allow", "deny"}[i%5/4]
		fmt.Fprintf(&b, "[%s.%q]\nwhen = %s\nmode = \"and\"\naction = %q\n\n", space, key, conds[i%4], action)
	}
	return b.String()
}

// BenchmarkDecide: 1,000 rules and deep paths. Goal: ≤ 200 ns for a miss,
// 0 allocs.
func BenchmarkDecide(b *testing.B) {
	c := mustParse(b, rules1000())
	ctx := set(b, "discord:guild:1", "discord:channel:5")
	deep := "/" + strings.Repeat("dir/", 30) + "file.md"
	for _, bc := range []struct{ name, path string }{
		{"miss-deep", deep},
		{"miss-shared-prefix", "/team7/" + strings.Repeat("x/", 30) + "f"},
		{"hit-prefix", "/team8/project8/" + strings.Repeat("x/", 28) + "f"},
		{"hit-exact", "/team6/project6/notes/file6.md"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.Decide(Memories, bc.path, ctx)
			}
		})
	}
}

// BenchmarkBaselineMapLookup is the same-run baseline for BenchmarkDecide:
// one Go map lookup of the whole path (what any per-path check costs at
// least).
func BenchmarkBaselineMapLookup(b *testing.B) {
	m := map[string]bool{}
	for i := 0; i < 1000; i++ {
		m[fmt.Sprintf("/team%d/project%d/", i%50, i)] = true
	}
	deep := "/" + strings.Repeat("dir/", 30) + "file.md"
	b.ReportAllocs()
	for b.Loop() {
		_ = m[deep]
	}
}

// BenchmarkVisible is what a view asks on every lookup: the path and every
// directory above it, in one walk.
func BenchmarkVisible(b *testing.B) {
	c := mustParse(b, rules1000())
	ctx := set(b, "discord:guild:1", "discord:channel:5")
	for _, bc := range []struct{ name, path string }{
		{"miss-deep", "/" + strings.Repeat("dir/", 30) + "file.md"},
		{"hit-prefix-deep", "/team8/project8/" + strings.Repeat("x/", 28) + "f"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.Visible(Memories, bc.path, ctx)
			}
		})
	}
}
