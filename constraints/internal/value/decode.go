package value

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Limits bound what the decoder accepts. Zero fields mean no limit.
type Limits struct {
	MaxString int // bytes of one decoded string (keys included)
	MaxArray  int // elements of one array
	MaxDepth  int // nesting of arrays and objects
	MaxValues int // values of the whole text (scalars, arrays, objects)
}

// RequestLimits are the spec's limits for tool-call arguments (the 1 MiB
// total is checked by the caller on the raw bytes), and a bound on their
// values: a Value is 80 bytes, so 1 MiB of small values ("0,") decoded
// held 70 MB, and one uid's 120 connections sending such requests took
// the daemon to 6.6 GB. 65,536 values of 80 bytes are 5 MiB.
var RequestLimits = Limits{MaxString: 64 << 10, MaxArray: 10000, MaxDepth: 128, MaxValues: 1 << 16}

// maxExp bounds decimal exponents so that exponent arithmetic cannot
// overflow; 1e400 is fine, 1e999999999 is refused.
const maxExp = 1 << 20

// SyntaxError is a decoding error at a byte offset.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("offset %d: %s", e.Offset, e.Msg) }

// Decode parses exactly one JSON value, strictly: duplicate object keys,
// invalid UTF-8, lone surrogates, trailing data and limit breaches are
// errors. Numbers are kept exact.
func Decode(data string, lim Limits) (Value, error) {
	d := decoder{s: data, lim: lim}
	d.ws()
	v, err := d.value(0)
	if err != nil {
		return Value{}, err
	}
	d.ws()
	if d.pos != len(d.s) {
		return Value{}, d.errf("unexpected %q after the value", d.s[d.pos])
	}
	return v, nil
}

// DecodePrefix parses one JSON value at the start of s and returns it with
// the number of bytes it used. Leading whitespace is not skipped.
func DecodePrefix(s string, lim Limits) (Value, int, error) {
	d := decoder{s: s, lim: lim}
	v, err := d.value(0)
	return v, d.pos, err
}

type decoder struct {
	s      string
	pos    int
	lim    Limits
	values int
}

func (d *decoder) errf(format string, args ...any) error {
	return &SyntaxError{Offset: d.pos, Msg: fmt.Sprintf(format, args...)}
}

func (d *decoder) ws() {
	for d.pos < len(d.s) {
		switch d.s[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) value(depth int) (Value, error) {
	if d.pos >= len(d.s) {
		return Value{}, d.errf("unexpected end of input")
	}
	if d.values++; d.lim.MaxValues > 0 && d.values > d.lim.MaxValues {
		return Value{}, d.errf("more than %d values", d.lim.MaxValues)
	}
	switch c := d.s[d.pos]; {
	case c == '{':
		return d.object(depth + 1)
	case c == '[':
		return d.array(depth + 1)
	case c == '"':
		s, err := d.str()
		if err != nil {
			return Value{}, err
		}
		return MakeString(s), nil
	case c == '-' || (c >= '0' && c <= '9'):
		start := d.pos
		n := NumberLen(d.s[d.pos:])
		if n == 0 {
			return Value{}, d.errf("invalid number")
		}
		d.pos += n
		v, err := ParseNumber(d.s[start:d.pos])
		if err != nil {
			d.pos = start
			return Value{}, d.errf("%v", err)
		}
		return v, nil
	case strings.HasPrefix(d.s[d.pos:], "true"):
		d.pos += 4
		return MakeBool(true), nil
	case strings.HasPrefix(d.s[d.pos:], "false"):
		d.pos += 5
		return MakeBool(false), nil
	case strings.HasPrefix(d.s[d.pos:], "null"):
		d.pos += 4
		return MakeNull(), nil
	default:
		r, _ := utf8.DecodeRuneInString(d.s[d.pos:])
		return Value{}, d.errf("unexpected %q", r)
	}
}

func (d *decoder) checkDepth(depth int) error {
	if d.lim.MaxDepth > 0 && depth > d.lim.MaxDepth {
		return d.errf("nesting deeper than %d", d.lim.MaxDepth)
	}
	return nil
}

func (d *decoder) array(depth int) (Value, error) {
	if err := d.checkDepth(depth); err != nil {
		return Value{}, err
	}
	d.pos++ // [
	elems := []Value{}
	d.ws()
	if d.pos < len(d.s) && d.s[d.pos] == ']' {
		d.pos++
		return MakeArray(elems), nil
	}
	for {
		d.ws()
		v, err := d.value(depth)
		if err != nil {
			return Value{}, err
		}
		elems = append(elems, v)
		if d.lim.MaxArray > 0 && len(elems) > d.lim.MaxArray {
			return Value{}, d.errf("array longer than %d elements", d.lim.MaxArray)
		}
		d.ws()
		if d.pos >= len(d.s) {
			return Value{}, d.errf("unexpected end of input in array")
		}
		switch d.s[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return MakeArray(elems), nil
		default:
			return Value{}, d.errf("expected , or ] in array")
		}
	}
}

func (d *decoder) object(depth int) (Value, error) {
	if err := d.checkDepth(depth); err != nil {
		return Value{}, err
	}
	d.pos++ // {
	members := []Member{}
	d.ws()
	if d.pos < len(d.s) && d.s[d.pos] == '}' {
		d.pos++
		v, _ := MakeObject(members)
		return v, nil
	}
	for {
		d.ws()
		if d.pos >= len(d.s) || d.s[d.pos] != '"' {
			return Value{}, d.errf("expected a string key in object")
		}
		keyPos := d.pos
		k, err := d.str()
		if err != nil {
			return Value{}, err
		}
		d.ws()
		if d.pos >= len(d.s) || d.s[d.pos] != ':' {
			return Value{}, d.errf("expected : after object key")
		}
		d.pos++
		d.ws()
		v, err := d.value(depth)
		if err != nil {
			return Value{}, err
		}
		// Duplicate keys: a linear check is fine for small objects; large
		// ones are checked after sorting below.
		if len(members) < 16 {
			for i := range members {
				if members[i].Key == k {
					return Value{}, &SyntaxError{Offset: keyPos, Msg: fmt.Sprintf("duplicate key %q", k)}
				}
			}
		}
		members = append(members, Member{Key: k, Val: v})
		d.ws()
		if d.pos >= len(d.s) {
			return Value{}, d.errf("unexpected end of input in object")
		}
		switch d.s[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			obj, ok := MakeObject(members)
			if !ok {
				return Value{}, &SyntaxError{Offset: keyPos, Msg: "duplicate key in object"}
			}
			return obj, nil
		default:
			return Value{}, d.errf("expected , or } in object")
		}
	}
}

// str decodes a JSON string starting at the opening quote.
func (d *decoder) str() (string, error) {
	d.pos++ // opening quote
	start := d.pos
	// Fast path: no escapes.
	for d.pos < len(d.s) {
		c := d.s[d.pos]
		if c == '"' {
			s := d.s[start:d.pos]
			if !utf8.ValidString(s) {
				return "", &SyntaxError{Offset: start, Msg: "invalid UTF-8 in string"}
			}
			if err := d.checkLen(len(s)); err != nil {
				return "", err
			}
			d.pos++
			return s, nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", d.errf("control character in string")
		}
		d.pos++
	}
	var b strings.Builder
	b.WriteString(d.s[start:d.pos])
	for {
		if d.pos >= len(d.s) {
			return "", d.errf("unterminated string")
		}
		c := d.s[d.pos]
		switch {
		case c == '"':
			d.pos++
			out := b.String()
			if !utf8.ValidString(out) {
				return "", &SyntaxError{Offset: start, Msg: "invalid UTF-8 in string"}
			}
			if err := d.checkLen(len(out)); err != nil {
				return "", err
			}
			return out, nil
		case c < 0x20:
			return "", d.errf("control character in string")
		case c == '\\':
			if err := d.escape(&b); err != nil {
				return "", err
			}
		default:
			b.WriteByte(c)
			d.pos++
		}
		if d.lim.MaxString > 0 && b.Len() > d.lim.MaxString {
			return "", d.checkLen(b.Len())
		}
	}
}

// escape decodes the escape at d.pos (a backslash) into b.
func (d *decoder) escape(b *strings.Builder) error {
	if d.pos+1 >= len(d.s) {
		return d.errf("unterminated escape")
	}
	e := d.s[d.pos+1]
	d.pos += 2
	switch e {
	case '"', '\\', '/':
		b.WriteByte(e)
	case 'b':
		b.WriteByte('\b')
	case 'f':
		b.WriteByte('\f')
	case 'n':
		b.WriteByte('\n')
	case 'r':
		b.WriteByte('\r')
	case 't':
		b.WriteByte('\t')
	case 'u':
		r, err := d.hex4()
		if err != nil {
			return err
		}
		if utf16.IsSurrogate(r) {
			if r >= 0xDC00 || !strings.HasPrefix(d.s[d.pos:], `\u`) {
				return d.errf("lone UTF-16 surrogate in string")
			}
			d.pos += 2
			r2, err := d.hex4()
			if err != nil {
				return err
			}
			r = utf16.DecodeRune(r, r2)
			if r == utf8.RuneError {
				return d.errf("invalid UTF-16 surrogate pair in string")
			}
		}
		b.WriteRune(r)
	default:
		return d.errf("invalid escape \\%c", e)
	}
	return nil
}

func (d *decoder) checkLen(n int) error {
	if d.lim.MaxString > 0 && n > d.lim.MaxString {
		return d.errf("string longer than %d bytes", d.lim.MaxString)
	}
	return nil
}

func (d *decoder) hex4() (rune, error) {
	if d.pos+4 > len(d.s) {
		return 0, d.errf("short \\u escape")
	}
	n, err := strconv.ParseUint(d.s[d.pos:d.pos+4], 16, 32)
	if err != nil {
		return 0, d.errf("invalid \\u escape")
	}
	d.pos += 4
	return rune(n), nil
}

// NumberLen returns the length of the JSON number at the start of s, or 0
// if s does not start with one (JSON grammar: no '+', no leading '.', no
// leading zeros).
func NumberLen(s string) int {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return 0
	}
	if i < len(s) && s[i] == '.' {
		j := i + 1
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i+1 {
			return 0
		}
		i = j
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		k := j
		for k < len(s) && s[k] >= '0' && s[k] <= '9' {
			k++
		}
		if k == j {
			return 0
		}
		i = k
	}
	return i
}

var errExp = errors.New("number exponent out of range")

// ParseNumber converts a JSON number's text into an exact Value.
func ParseNumber(text string) (Value, error) {
	if NumberLen(text) != len(text) || text == "" {
		return Value{}, fmt.Errorf("invalid number %q", text)
	}
	s := text
	neg := false
	if s[0] == '-' {
		neg = true
		s = s[1:]
	}
	mant := s
	var e int64
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant = s[:i]
		es := s[i+1:]
		if len(strings.TrimLeft(strings.TrimLeft(es, "+-"), "0")) > 9 {
			return Value{}, errExp
		}
		var err error
		e, err = strconv.ParseInt(es, 10, 64)
		if err != nil {
			return Value{}, errExp
		}
	}
	intPart, frac := mant, ""
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	digits := intPart + frac
	exp := int64(len(intPart)) + e
	// Strip leading zeros (each shifts the point) and trailing zeros.
	lead := 0
	for lead < len(digits) && digits[lead] == '0' {
		lead++
	}
	digits = digits[lead:]
	exp -= int64(lead)
	digits = strings.TrimRight(digits, "0")
	if digits == "" {
		return MakeInt(0), nil
	}
	if exp > maxExp || exp < -maxExp {
		return Value{}, errExp
	}
	if exp >= int64(len(digits)) && exp <= 19 {
		full := digits + strings.Repeat("0", int(exp)-len(digits))
		if neg {
			full = "-" + full
		}
		if i, err := strconv.ParseInt(full, 10, 64); err == nil {
			return MakeInt(i), nil
		}
	}
	return Value{kind: Number, neg: neg, s: digits, exp: int32(exp)}, nil
}

// AppendQuoted writes s as a JSON string literal.
func AppendQuoted(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\r':
			b.WriteString(`\r`)
		case c == '\t':
			b.WriteString(`\t`)
		case c < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xF])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// Quote returns s as a JSON string literal.
func Quote(s string) string {
	var b strings.Builder
	AppendQuoted(&b, s)
	return b.String()
}
