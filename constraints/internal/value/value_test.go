package value

import (
	"strings"
	"testing"
)

func num(t *testing.T, s string) Value {
	t.Helper()
	v, err := ParseNumber(s)
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}

func TestNumbers(t *testing.T) {
	eq := [][2]string{{"5", "5.0"}, {"1e3", "1000"}, {"100.000", "100"}, {"-0", "0"}, {"0.0e10", "0"},
		{"10e399", "1e400"}, {"12.5e-1", "1.25"}, {"9223372036854775807", "9223372036854775807.0"}}
	for _, p := range eq {
		a, b := num(t, p[0]), num(t, p[1])
		if !Equal(&a, &b) {
			t.Errorf("%s != %s", p[0], p[1])
		}
	}
	lt := [][2]string{{"9223372036854775808", "9223372036854775809"}, {"0.1", "0.1000000000000000055511151231257827"},
		{"-1e400", "-2"}, {"-2", "-1.5"}, {"1e-400", "1e-399"}, {"2e400", "3e400"}, {"-3e400", "-2e400"},
		{"9007199254740992", "9007199254740993"}, {"-9223372036854775808", "-9223372036854775807"}, {"0", "1e-400"}}
	for _, p := range lt {
		a, b := num(t, p[0]), num(t, p[1])
		if c, ok := Compare(&a, &b); !ok || c >= 0 {
			t.Errorf("%s < %s: got %d", p[0], p[1], c)
		}
		if c, _ := Compare(&b, &a); c <= 0 {
			t.Errorf("%s > %s: got %d", p[1], p[0], c)
		}
		if Equal(&a, &b) {
			t.Errorf("%s == %s", p[0], p[1])
		}
	}
	for _, bad := range []string{"+1", ".5", "01", "1.", "1e", "NaN", "Infinity", "1e999999999999"} {
		if _, err := ParseNumber(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestDecodeStrict(t *testing.T) {
	for _, bad := range []string{
		`{"a":1,"a":2}`, `{"a":{"b":1,"b":2}}`, "\"\xff\"", `"\ud800"`, `"\udc00x"`, `[1,]`, `{"a":1,}`,
		`[1] 2`, `"a` + "\x01" + `"`, `tru`, `"\x"`, strings.Repeat("[", 200) + strings.Repeat("]", 200),
	} {
		if _, err := Decode(bad, RequestLimits); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i < 40; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"k` + strings.Repeat("x", i) + `":1`)
	}
	b.WriteString(`,"k":2}`)
	if _, err := Decode(b.String(), RequestLimits); err == nil {
		t.Error("duplicate key in a large object accepted")
	}
	v, err := Decode(`{"b":[1,"é",null,true],"a":{"x":"\ud83d\ude00"}}`, RequestLimits)
	if err != nil {
		t.Fatal(err)
	}
	if got := v.String(); got != `{"a":{"x":"😀"},"b":[1,"é",null,true]}` {
		t.Fatalf("round trip %s", got)
	}
	if n, _ := v.Field("a").Field("x").Count(); n != 1 {
		t.Fatalf("count of an emoji is %d", n)
	}
}

// TestMaxValues: 1 MiB of small values decoded held 70 MB (a Value is 80
// bytes); one uid's connections sending such tool.decide requests took the
// daemon to 6.6 GB. A request's values are bounded; within the bound, the
// spec's limits stand (an array of 10,000 elements is fine).
func TestMaxValues(t *testing.T) {
	arr := func(n int) string { return "[" + strings.Repeat("0,", n-1) + "0]" }
	if _, err := Decode(`{"a":`+arr(10000)+`}`, RequestLimits); err != nil {
		t.Fatalf("an array of 10,000 elements: %v", err)
	}
	var parts []string
	for range 7 { // 7 arrays of 10,000: 70,009 values
		parts = append(parts, arr(10000))
	}
	_, err := Decode(`{"a":[`+strings.Join(parts, ",")+`]}`, RequestLimits)
	if err == nil || !strings.Contains(err.Error(), "more than 65536 values") {
		t.Fatalf("70,009 values: %v", err)
	}
}
