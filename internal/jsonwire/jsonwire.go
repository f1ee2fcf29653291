// Package jsonwire parses the JSON messages condfs reads off a wire and
// writes back the very message it parsed.
//
// Parsers disagree on the edges of JSON: which of two duplicate keys wins,
// whether "paramſ" is "params" (encoding/json folds case, and U+017F folds
// to 's'), what an unpaired surrogate or invalid UTF-8 becomes, whether a
// bare CR or U+2028 ends a line, what 1e400 or a 20-digit integer is. A
// gateway that decides on its own reading and passes the raw bytes on lets
// a server run what was never decided. So Parse refuses every text on whose
// meaning common readers could differ, and Append writes a Value as compact
// printable ASCII: the one text every reader reads as the message decided.
//
// Refused, at any depth: invalid syntax or trailing data, invalid UTF-8,
// unpaired surrogate escapes, two keys of one object that are equal or
// equal under Unicode case folding, nesting deeper than MaxDepth, and (with
// Agreed) numbers whose value a float64 reader would read differently.
package jsonwire

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Kind is the type of a Value.
type Kind uint8

// The kinds of JSON values.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

// Value is one parsed JSON value. Object members keep their order and
// their keys exactly as written (after unescaping); a number keeps its
// literal.
type Value struct {
	Kind    Kind
	Bool    bool
	Str     string // a String's text, a Number's literal
	Elems   []*Value
	Members []Member
}

// Member is one key of an object and its value.
type Member struct {
	Key   string
	Value *Value
}

// MaxDepth bounds nesting: deeper texts are refused (Python's json and
// others give up long before encoding/json does).
const MaxDepth = 128

// Rules choose the checks beyond the ones Parse always makes.
type Rules struct {
	// Agreed refuses a number unless every reader, exact or float64, reads
	// the same value: its literal must be, in value, the shortest decimal
	// of the float64 nearest to it (so 0.1, 1.5e3 and 2^53 pass; 1e400,
	// 0.1000000000000000055511151231257827 and 2^63 do not).
	Agreed bool
	// MaxValues, when positive, bounds the values of one text (every
	// scalar, array and object counts one). A parsed value is held in
	// about 40 times the bytes of a text of small values, so a reader of
	// long lines bounds what one line can make it hold.
	MaxValues int
}

// SyntaxError says what is wrong and at which byte.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("byte %d: %s", e.Offset, e.Msg) }

// ErrDuplicateKey is wrapped by the error for two keys parsers may confuse.
var ErrDuplicateKey = errors.New("duplicate key")

// Parse parses exactly one JSON value (JSON whitespace around it allowed).
func Parse(data []byte, r Rules) (*Value, error) {
	return parse(data, r, true)
}

func parse(data []byte, r Rules, keep bool) (*Value, error) {
	p := parser{data: data, rules: r, keep: keep}
	p.space()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.i != len(p.data) {
		return nil, p.fail("data after the value")
	}
	return v, nil
}

// Check reports whether data would parse. It keeps no tree: what it
// holds is bounded by the keys of the objects it is inside.
func Check(data []byte, r Rules) error {
	_, err := parse(data, r, false)
	return err
}

type parser struct {
	data   []byte
	i      int
	rules  Rules
	keep   bool // build the tree (Parse), or only check (Check)
	values int
}

// checked stands for every value Check reads: nothing is kept.
var checked = &Value{}

func (p *parser) fail(format string, args ...any) error {
	return &SyntaxError{Offset: p.i, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) space() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (*Value, error) {
	if p.i >= len(p.data) {
		return nil, p.fail("unexpected end of input")
	}
	if p.values++; p.rules.MaxValues > 0 && p.values > p.rules.MaxValues {
		return nil, p.fail("more than %d values", p.rules.MaxValues)
	}
	return p.scan(depth)
}

// mk returns a scalar read: a new Value, or nothing kept when checking.
func (p *parser) mk(v Value) *Value {
	if !p.keep {
		return checked
	}
	return &v
}

// scan reads the value at p.i.
func (p *parser) scan(depth int) (*Value, error) {
	switch c := p.data[p.i]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return nil, err
		}
		return p.mk(Value{Kind: String, Str: s}), nil
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	case p.word("true"):
		return p.mk(Value{Kind: Bool, Bool: true}), nil
	case p.word("false"):
		return p.mk(Value{Kind: Bool}), nil
	case p.word("null"):
		return p.mk(Value{Kind: Null}), nil
	default:
		return nil, p.fail("unexpected character %q", rune(c))
	}
}

func (p *parser) word(w string) bool {
	if len(p.data)-p.i >= len(w) && string(p.data[p.i:p.i+len(w)]) == w {
		p.i += len(w)
		return true
	}
	return false
}

func (p *parser) object(depth int) (*Value, error) {
	if depth > MaxDepth {
		return nil, p.fail("nested deeper than %d", MaxDepth)
	}
	p.i++ // {
	v := p.mk(Value{Kind: Object, Members: []Member{}})
	var seen map[string]string // folded key -> key as written
	p.space()
	if p.i < len(p.data) && p.data[p.i] == '}' {
		p.i++
		return v, nil
	}
	for {
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != '"' {
			return nil, p.fail("expected a key")
		}
		at := p.i
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		f := fold(k)
		if prev, dup := seen[f]; dup {
			if prev == k {
				return nil, fmt.Errorf("byte %d: %w %q", at, ErrDuplicateKey, k)
			}
			return nil, fmt.Errorf("byte %d: %w %q (readers that fold case read it as %q)", at, ErrDuplicateKey, k, prev)
		}
		if seen == nil {
			seen = map[string]string{}
		}
		seen[f] = k
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != ':' {
			return nil, p.fail("expected ':' after a key")
		}
		p.i++
		p.space()
		e, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		if p.keep {
			v.Members = append(v.Members, Member{Key: k, Value: e})
		}
		p.space()
		if p.i >= len(p.data) {
			return nil, p.fail("unexpected end of input in an object")
		}
		switch p.data[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return v, nil
		default:
			return nil, p.fail("expected ',' or '}'")
		}
	}
}

func (p *parser) array(depth int) (*Value, error) {
	if depth > MaxDepth {
		return nil, p.fail("nested deeper than %d", MaxDepth)
	}
	p.i++ // [
	v := p.mk(Value{Kind: Array, Elems: []*Value{}})
	p.space()
	if p.i < len(p.data) && p.data[p.i] == ']' {
		p.i++
		return v, nil
	}
	for {
		p.space()
		e, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		if p.keep {
			v.Elems = append(v.Elems, e)
		}
		p.space()
		if p.i >= len(p.data) {
			return nil, p.fail("unexpected end of input in an array")
		}
		switch p.data[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return v, nil
		default:
			return nil, p.fail("expected ',' or ']'")
		}
	}
}

// str reads a string literal; p.data[p.i] is its opening quote.
func (p *parser) str() (string, error) {
	p.i++
	start := p.i
	// The common case: no escapes, printable ASCII.
	for p.i < len(p.data) {
		c := p.data[p.i]
		if c == '"' {
			s := string(p.data[start:p.i])
			p.i++
			return s, nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		p.i++
	}
	buf := append([]byte(nil), p.data[start:p.i]...)
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			p.i++
			return string(buf), nil
		case c < 0x20:
			return "", p.fail("control character %#x in a string", c)
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			buf = utf8.AppendRune(buf, r)
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			p.i++
		default:
			r, n := utf8.DecodeRune(p.data[p.i:])
			if r == utf8.RuneError && n <= 1 {
				return "", p.fail("invalid UTF-8")
			}
			buf = append(buf, p.data[p.i:p.i+n]...)
			p.i += n
		}
	}
	return "", p.fail("unterminated string")
}

// escape reads one escape sequence (a surrogate pair as one).
func (p *parser) escape() (rune, error) {
	if p.i+1 >= len(p.data) {
		return 0, p.fail("unterminated escape")
	}
	c := p.data[p.i+1]
	p.i += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
	default:
		p.i -= 2
		return 0, p.fail("invalid escape \\%c", c)
	}
	r, err := p.hex4()
	if err != nil {
		return 0, err
	}
	if !utf16.IsSurrogate(r) {
		return r, nil
	}
	// Readers differ on an unpaired surrogate (U+FFFD, an error, or kept
	// as is): only a high surrogate followed by a low one is accepted.
	if r < 0xDC00 && p.i+1 < len(p.data) && p.data[p.i] == '\\' && p.data[p.i+1] == 'u' {
		p.i += 2
		r2, err := p.hex4()
		if err != nil {
			return 0, err
		}
		if d := utf16.DecodeRune(r, r2); d != unicode.ReplacementChar {
			return d, nil
		}
	}
	return 0, p.fail("unpaired surrogate in a \\u escape")
}

func (p *parser) hex4() (rune, error) {
	if p.i+4 > len(p.data) {
		return 0, p.fail("short \\u escape")
	}
	n, err := strconv.ParseUint(string(p.data[p.i:p.i+4]), 16, 16)
	if err != nil {
		return 0, p.fail("invalid \\u escape")
	}
	p.i += 4
	return rune(n), nil
}

func (p *parser) number() (*Value, error) {
	start := p.i
	if p.data[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.data) && p.data[p.i] == '0':
		p.i++
	case p.i < len(p.data) && '1' <= p.data[p.i] && p.data[p.i] <= '9':
		p.digits()
	default:
		return nil, p.fail("invalid number")
	}
	if p.i < len(p.data) && p.data[p.i] == '.' {
		p.i++
		if p.digits() == 0 {
			return nil, p.fail("invalid number: no digit after '.'")
		}
	}
	if p.i < len(p.data) && (p.data[p.i] == 'e' || p.data[p.i] == 'E') {
		p.i++
		if p.i < len(p.data) && (p.data[p.i] == '+' || p.data[p.i] == '-') {
			p.i++
		}
		if p.digits() == 0 {
			return nil, p.fail("invalid number: no digit in the exponent")
		}
	}
	if !p.keep && !p.rules.Agreed {
		return checked, nil
	}
	lit := string(p.data[start:p.i])
	if p.rules.Agreed && len(lit) > maxAgreedLiteral {
		// Comparing a long literal exactly costs time quadratic in its
		// length (a million digits took a second); the shortest decimal
		// of a float64 has at most 24 characters, and a longer literal
		// can only agree with it by padding (1.5000..., 1000...).
		p.i = start
		return nil, p.fail("number literal of %d characters: at most %d where float64 readers must agree", len(lit), maxAgreedLiteral)
	}
	if p.rules.Agreed && !agreed(lit) {
		p.i = start
		return nil, p.fail("number %s is read differently by float64 readers", lit)
	}
	return p.mk(Value{Kind: Number, Str: lit}), nil
}

func (p *parser) digits() int {
	n := 0
	for p.i < len(p.data) && '0' <= p.data[p.i] && p.data[p.i] <= '9' {
		p.i++
		n++
	}
	return n
}

// maxAgreedLiteral bounds a number's literal under Agreed.
const maxAgreedLiteral = 100

// agreed reports whether the literal's exact value is the shortest decimal
// of its float64: then exact readers and float64 readers read one value.
func agreed(lit string) bool {
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil { // out of range
		return false
	}
	short := strconv.FormatFloat(f, 'g', -1, 64)
	if short == lit {
		return true
	}
	// Small integers, the common case, without big arithmetic.
	if n, err := strconv.ParseInt(lit, 10, 64); err == nil && n >= -1<<53 && n <= 1<<53 {
		return true
	}
	a, ok1 := new(big.Rat).SetString(lit)
	b, ok2 := new(big.Rat).SetString(short)
	return ok1 && ok2 && a.Cmp(b) == 0
}

// fold maps a key to a form shared by every key equal to it under Unicode
// simple case folding (what encoding/json's matching and strings.EqualFold
// treat as equal): each rune becomes the least rune of its folding orbit.
func fold(s string) string {
	// Keys without a lower-case ASCII letter or a non-ASCII rune are their
	// own form (an upper-case ASCII letter is the least of its orbit).
	ascii := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= utf8.RuneSelf || ('a' <= c && c <= 'z') {
			ascii = false
			break
		}
	}
	if ascii {
		return s
	}
	out := make([]rune, 0, len(s))
	for _, r := range s {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		out = append(out, least)
	}
	return string(out)
}

// Get returns the value of an object's key, matched exactly, or nil.
func (v *Value) Get(key string) *Value {
	if v == nil || v.Kind != Object {
		return nil
	}
	for _, m := range v.Members {
		if m.Key == key {
			return m.Value
		}
	}
	return nil
}

// Set replaces key's value, or appends the member.
func (v *Value) Set(key string, val *Value) {
	for i, m := range v.Members {
		if m.Key == key {
			v.Members[i].Value = val
			return
		}
	}
	v.Members = append(v.Members, Member{Key: key, Value: val})
}

// Delete removes key from an object.
func (v *Value) Delete(key string) {
	for i, m := range v.Members {
		if m.Key == key {
			v.Members = append(v.Members[:i:i], v.Members[i+1:]...)
			return
		}
	}
}

// HasFolded returns a key of v that equals one of keys under case folding
// without being it ("Method" beside no "method"): a reader that folds
// reads it as that key, one that does not reads it as another.
func (v *Value) HasFolded(keys ...string) (string, bool) {
	if v == nil || v.Kind != Object {
		return "", false
	}
	for _, m := range v.Members {
		f := fold(m.Key)
		for _, k := range keys {
			if m.Key != k && f == fold(k) {
				return m.Key, true
			}
		}
	}
	return "", false
}

// Text returns a String's text; ok is false for any other kind.
func (v *Value) Text() (string, bool) {
	if v == nil || v.Kind != String {
		return "", false
	}
	return v.Str, true
}

// Bytes is Append to a new slice.
func (v *Value) Bytes() []byte { return v.Append(nil) }

// Append appends v as compact JSON of printable ASCII only: every other
// character is escaped, so no reader can split the text into lines.
func (v *Value) Append(dst []byte) []byte {
	switch v.Kind {
	case Null:
		return append(dst, "null"...)
	case Bool:
		return strconv.AppendBool(dst, v.Bool)
	case Number:
		return append(dst, v.Str...)
	case String:
		return AppendString(dst, v.Str)
	case Array:
		dst = append(dst, '[')
		for i, e := range v.Elems {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = e.Append(dst)
		}
		return append(dst, ']')
	default:
		dst = append(dst, '{')
		for i, m := range v.Members {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, m.Key)
			dst = append(dst, ':')
			dst = m.Value.Append(dst)
		}
		return append(dst, '}')
	}
}

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string of printable ASCII.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\n':
			dst = append(dst, '\\', 'n')
		case r == '\t':
			dst = append(dst, '\\', 't')
		case r >= 0x20 && r < 0x7f:
			dst = append(dst, byte(r))
		case r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			dst = appendU(appendU(dst, r1), r2)
		default:
			dst = appendU(dst, r)
		}
	}
	return append(dst, '"')
}

func appendU(dst []byte, r rune) []byte {
	return append(dst, '\\', 'u', hexDigits[r>>12&15], hexDigits[r>>8&15], hexDigits[r>>4&15], hexDigits[r&15])
}

// New helpers build values for messages condfs writes itself.

// NewString returns a String value.
func NewString(s string) *Value { return &Value{Kind: String, Str: s} }

// NewObject returns an empty Object value.
func NewObject() *Value { return &Value{Kind: Object, Members: []Member{}} }
