package control

import (
	"bufio"
	"io"
	"strings"
	"testing"
)

func TestReadLine(t *testing.T) {
	type got struct {
		line    string
		tooLong bool
		eof     bool
	}
	read := func(input string, max int, drain bool) []got {
		r := bufio.NewReaderSize(strings.NewReader(input), 16)
		var out []got
		for i := 0; i < 10; i++ {
			line, long, err := ReadLine(r, max, drain)
			if line == nil && !long && err != nil {
				break
			}
			out = append(out, got{string(line), long, err == io.EOF})
			if err != nil || (long && !drain) {
				break
			}
		}
		return out
	}
	cases := []struct {
		in    string
		max   int
		drain bool
		want  []got
	}{
		{"a\nbb\r\n", 10, true, []got{{"a", false, false}, {"bb", false, false}}},
		{"last", 10, true, []got{{"last", false, true}}},
		{"0123456789\r\nx\n", 10, true, []got{{"0123456789", false, false}, {"x", false, false}}},
		{strings.Repeat("y", 40) + "\nok\n", 10, true, []got{{"", true, false}, {"ok", false, false}}},
		{strings.Repeat("y", 40) + "\nok\n", 10, false, []got{{"", true, false}}},
		{"01234567890\n", 10, true, []got{{"", true, false}}},
		{"", 10, true, nil},
	}
	for _, c := range cases {
		g := read(c.in, c.max, c.drain)
		if len(g) != len(c.want) {
			t.Errorf("%q: %v, want %v", c.in, g, c.want)
			continue
		}
		for i := range g {
			if g[i] != c.want[i] {
				t.Errorf("%q line %d: %+v, want %+v", c.in, i, g[i], c.want[i])
			}
		}
	}
}
