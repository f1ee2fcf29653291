package jsonwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"runtime"
	"strings"
	"testing"
)

func TestRefused(t *testing.T) {
	for _, c := range []struct{ name, text string }{
		{"exact duplicate", `{"a":1,"a":2}`},
		{"duplicate deep", `{"x":[{"y":{"a":1,"a":2}}]}`},
		{"folded ASCII", `{"method":"a","Method":"b"}`},
		{"folded long s", `{"params":{},"paramſ":{}}`},
		{"folded Kelvin", `{"k":1,"K":2}`},
		{"folded deep", `{"params":{"arguments":{"to":1},"argumentſ":{"to":2}}}`},
		{"invalid UTF-8", "{\"a\":\"\xff\"}"},
		{"invalid UTF-8 key", "{\"\xc3\":1}"},
		{"overlong UTF-8", "{\"a\":\"\xc0\xaf\"}"},
		{"lone high surrogate", `{"a":"\ud800"}`},
		{"lone low surrogate", `{"a":"\udc00"}`},
		{"high then not low", `{"a":"\ud800\u0041"}`},
		{"BOM", "\xef\xbb\xbf{}"},
		{"U+2028 as whitespace", "{\"a\":\u20281}"},
		{"NEL as whitespace", "{\"a\":\u00851}"},
		{"raw control in string", "{\"a\":\"x\x01\"}"},
		{"trailing data", `{} {}`},
		{"two lines", "{}\n{}"},
		{"NaN", `{"a":NaN}`},
		{"leading zero", `{"a":01}`},
		{"trailing comma", `{"a":1,}`},
		{"single quotes", `{'a':1}`},
		{"too deep", strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)},
		{"empty", ``},
	} {
		if _, err := Parse([]byte(c.text), Rules{Agreed: true}); err == nil {
			t.Errorf("%s: %q parsed", c.name, c.text)
		}
	}
}

func TestDuplicateIsErrDuplicateKey(t *testing.T) {
	_, err := Parse([]byte(`{"a":{"ſ":1,"s":2}}`), Rules{})
	if !errors.Is(err, ErrDuplicateKey) {
		t.Fatalf("err = %v", err)
	}
}

func TestNumbers(t *testing.T) {
	long := map[string]bool{ // at most 100 characters under Agreed
		"1." + strings.Repeat("0", 98): true, "1." + strings.Repeat("0", 99): false,
		"1" + strings.Repeat("0", 300): false, "1." + strings.Repeat("0", 1<<20): false,
	}
	for lit, want := range long {
		if _, err := Parse([]byte(lit), Rules{Agreed: true}); (err == nil) != want {
			t.Errorf("a literal of %d characters: err = %v, want accepted %v", len(lit), err, want)
		}
	}
	for lit, want := range map[string]bool{
		"0": true, "-0": true, "1": true, "-17": true, "0.1": true, "1.5e3": true, "1E2": true, "1.0": true,
		"9007199254740992": true, "100000000000000000000": true, "1e+21": true, "5e-324": true,
		"1e400": false, "-1e400": false, "1e-400": false, "0.1000000000000000055511151231257827": false,
		"9223372036854775808": false, "9007199254740993": false, "1.99999999999999999999": false,
		"12345678901234567890": false,
	} {
		_, err := Parse([]byte(lit), Rules{Agreed: true})
		if (err == nil) != want {
			t.Errorf("%s: err = %v, want accepted %v", lit, err, want)
		}
		// Without Agreed every valid number is kept exactly.
		v, err := Parse([]byte(lit), Rules{})
		if err != nil || v.Str != lit {
			t.Errorf("%s without Agreed: %v %v", lit, v, err)
		}
	}
}

func TestAppendIsPrintableASCIIAndRoundTrips(t *testing.T) {
	in := "{\"a\" :\r\n [1, -0.5e3, true, false, null, \"x\u2028y\u2029z\u0085\\u00e9\\ud83d\\ude00\\n\\t\\\"\\\\\\/\"],\t\"ſ\":{}}"
	v, err := Parse([]byte(in), Rules{Agreed: true})
	if err != nil {
		t.Fatal(err)
	}
	out := v.Bytes()
	for _, c := range out {
		if c < 0x20 || c >= 0x7f {
			t.Fatalf("byte %#x in %s", c, out)
		}
	}
	want := `{"a":[1,-0.5e3,true,false,null,"x\u2028y\u2029z\u0085\u00e9\ud83d\ude00\n\t\"\\/"],"\u017f":{}}`
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
	var a, b any
	if json.Unmarshal([]byte(in), &a) != nil || json.Unmarshal(out, &b) != nil {
		t.Fatal("encoding/json refuses")
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Fatalf("encoding/json reads %s and %s", ja, jb)
	}
}

func TestGetExact(t *testing.T) {
	v, err := Parse([]byte(`{"Method":"x","params":{"name":"n"}}`), Rules{})
	if err != nil {
		t.Fatal(err)
	}
	if v.Get("method") != nil {
		t.Fatal("Get folded a key")
	}
	if k, ok := v.HasFolded("method", "params"); !ok || k != "Method" {
		t.Fatalf("HasFolded = %q %v", k, ok)
	}
	if s, ok := v.Get("params").Get("name").Text(); !ok || s != "n" {
		t.Fatalf("name = %q", s)
	}
}

// FuzzParse: whatever Parse accepts, encoding/json reads as the same value
// (numbers compared exactly), and Append's text parses back to itself.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,"x",{"b":null}]`, `{"paramſ":1,"params":2}`, "{\"a\":\r1}", `"\ud83d\ude00"`, `1e400`, `0.1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Parse(data, Rules{Agreed: true})
		if err != nil {
			return
		}
		out := v.Bytes()
		w, err := Parse(out, Rules{Agreed: true})
		if err != nil {
			t.Fatalf("Append's text %q refused: %v", out, err)
		}
		if !bytes.Equal(w.Bytes(), out) {
			t.Fatalf("not a fixed point: %q", out)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var x any
		if err := dec.Decode(&x); err != nil {
			t.Fatalf("encoding/json refuses %q: %v", data, err)
		}
		if !same(v, x) {
			t.Fatalf("encoding/json reads %q as %v", data, x)
		}
	})
}

// same compares a Value with what encoding/json decoded (UseNumber).
func same(v *Value, x any) bool {
	switch v.Kind {
	case Null:
		return x == nil
	case Bool:
		b, ok := x.(bool)
		return ok && b == v.Bool
	case Number:
		n, ok := x.(json.Number)
		a, ok1 := new(big.Rat).SetString(v.Str)
		b, ok2 := new(big.Rat).SetString(string(n))
		return ok && ok1 && ok2 && a.Cmp(b) == 0
	case String:
		s, ok := x.(string)
		return ok && s == v.Str
	case Array:
		a, ok := x.([]any)
		if !ok || len(a) != len(v.Elems) {
			return false
		}
		for i, e := range v.Elems {
			if !same(e, a[i]) {
				return false
			}
		}
		return true
	default:
		m, ok := x.(map[string]any)
		if !ok || len(m) != len(v.Members) {
			return false
		}
		for _, mem := range v.Members {
			if !same(mem.Value, m[mem.Key]) {
				return false
			}
		}
		return true
	}
}

// TestMaxValues: a parsed value is held in about 40 times the bytes of a
// text of small values (a 64 MiB line of the MCP gateway would hold
// 2.7 GiB). MaxValues bounds it, counting scalars and containers.
func TestMaxValues(t *testing.T) {
	line := zeros(1000) // 1001 values
	if _, err := Parse(line, Rules{MaxValues: 1001}); err != nil {
		t.Fatalf("1001 values under a bound of 1001: %v", err)
	}
	_, err := Parse(line, Rules{MaxValues: 1000})
	if err == nil || !strings.Contains(err.Error(), "more than 1000 values") {
		t.Fatalf("1001 values under a bound of 1000: %v", err)
	}
	if err := Check(line, Rules{MaxValues: 1000}); err == nil {
		t.Fatal("Check took 1001 values under a bound of 1000")
	}
	if _, err := Parse([]byte(`{"a":{"b":[1,2]}}`), Rules{MaxValues: 4}); err == nil {
		t.Error("5 values (two objects, an array, two numbers) under a bound of 4")
	}
}

// TestCheckKeepsNothing: Check (the control socket's strict reading of
// each request line) built the whole tree of a line it then dropped, so
// each connection could make the daemon hold 40 times its line.
func TestCheckKeepsNothing(t *testing.T) {
	line := zeros(1 << 19) // 1 MiB
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := Check(line, Rules{}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(len(line)) {
		t.Errorf("Check of a %d-byte line of small values allocated %d bytes", len(line), got)
	}
}

// zeros is a JSON array of n zeros: the most values per byte.
func zeros(n int) []byte { return []byte("[" + strings.Repeat("0,", n-1) + "0]") }
