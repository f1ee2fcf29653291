// Package value is the JSON value model of the constraint engine: exact
// decimal numbers, code-point strings, deep equality, and a strict decoder.
//
// Values are immutable once built. Objects keep their members sorted by key
// so that lookup is a binary search and deep equality is a linear walk.
package value

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Kind is the JSON type of a Value.
type Kind uint8

// The JSON kinds. Missing is not a JSON kind: it marks "no value here"
// (a missing path), and every operator treats it as unknown.
const (
	Missing Kind = iota
	Null
	Bool
	Number
	String
	Array
	Object
)

func (k Kind) String() string {
	switch k {
	case Null:
		return "null"
	case Bool:
		return "bool"
	case Number:
		return "number"
	case String:
		return "string"
	case Array:
		return "array"
	case Object:
		return "object"
	}
	return "missing"
}

// Value is one JSON value.
//
// Numbers are exact: an integer that fits in int64 is held in i (isInt);
// every other number is a normalised decimal 0.DIGITS × 10^exp with sign
// neg, DIGITS in s without leading or trailing zeros. So two numbers are
// equal exactly when their fields are equal.
type Value struct {
	kind  Kind
	b     bool // Bool's value
	isInt bool
	neg   bool
	exp   int32
	i     int64
	s     string // String's value, or a decimal's digits
	arr   []Value
	obj   []Member
}

// Member is one key of an object.
type Member struct {
	Key string
	Val Value
}

// Constructors.

// MakeNull returns JSON null.
func MakeNull() Value { return Value{kind: Null} }

// MakeBool returns a JSON boolean.
func MakeBool(b bool) Value { return Value{kind: Bool, b: b} }

// MakeString returns a JSON string.
func MakeString(s string) Value { return Value{kind: String, s: s} }

// MakeInt returns an integer number.
func MakeInt(i int64) Value { return Value{kind: Number, isInt: true, i: i} }

// MakeArray returns an array holding elems (not copied).
func MakeArray(elems []Value) Value {
	if elems == nil {
		elems = []Value{}
	}
	return Value{kind: Array, arr: elems}
}

// MakeObject returns an object. It sorts members by key; duplicate keys
// must have been rejected by the caller (ok is false if any remain).
func MakeObject(members []Member) (v Value, ok bool) {
	if members == nil {
		members = []Member{}
	}
	sortMembers(members)
	for i := 1; i < len(members); i++ {
		if members[i-1].Key == members[i].Key {
			return Value{}, false
		}
	}
	return Value{kind: Object, obj: members}, true
}

func sortMembers(m []Member) {
	// Insertion sort for small objects, which are the norm; otherwise a
	// simple merge via the standard library would need an allocation-free
	// comparator, so use a heap-free shell sort.
	for gap := len(m) / 2; gap > 0; gap /= 2 {
		for i := gap; i < len(m); i++ {
			for j := i; j >= gap && m[j-gap].Key > m[j].Key; j -= gap {
				m[j-gap], m[j] = m[j], m[j-gap]
			}
		}
	}
}

// Accessors.

// Kind returns the value's kind.
func (v *Value) Kind() Kind { return v.kind }

// Bool returns a Bool's value.
func (v *Value) Bool() bool { return v.b }

// Str returns a String's value.
func (v *Value) Str() string { return v.s }

// Elems returns an Array's elements. Do not modify them.
func (v *Value) Elems() []Value { return v.arr }

// Members returns an Object's members sorted by key. Do not modify them.
func (v *Value) Members() []Member { return v.obj }

// Int returns the number as an int64 when it is an integer that fits.
func (v *Value) Int() (int64, bool) { return v.i, v.kind == Number && v.isInt }

// Field returns the member named key of an object, or nil.
func (v *Value) Field(key string) *Value {
	if v.kind != Object {
		return nil
	}
	lo, hi := 0, len(v.obj)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if v.obj[m].Key < key {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(v.obj) && v.obj[lo].Key == key {
		return &v.obj[lo].Val
	}
	return nil
}

// Count is count(): code points of a string, elements of an array, keys of
// an object. ok is false for any other kind.
func (v *Value) Count() (int, bool) {
	switch v.kind {
	case String:
		return utf8.RuneCountInString(v.s), true
	case Array:
		return len(v.arr), true
	case Object:
		return len(v.obj), true
	}
	return 0, false
}

// Equal is deep JSON equality: numbers by exact value, a bool never equals
// a number, objects by key set and values.
func Equal(a, b *Value) bool {
	if a.kind != b.kind {
		return false
	}
	switch a.kind {
	case Missing, Null:
		return true
	case Bool:
		return a.b == b.b
	case Number:
		return a.isInt == b.isInt && a.i == b.i && a.neg == b.neg && a.exp == b.exp && a.s == b.s
	case String:
		return a.s == b.s
	case Array:
		if len(a.arr) != len(b.arr) {
			return false
		}
		for i := range a.arr {
			if !Equal(&a.arr[i], &b.arr[i]) {
				return false
			}
		}
		return true
	case Object:
		if len(a.obj) != len(b.obj) {
			return false
		}
		for i := range a.obj {
			if a.obj[i].Key != b.obj[i].Key || !Equal(&a.obj[i].Val, &b.obj[i].Val) {
				return false
			}
		}
		return true
	}
	return false
}

// Compare orders two numbers or two strings. ok is false for any other
// pair, which the language treats as unknown.
func Compare(a, b *Value) (c int, ok bool) {
	switch {
	case a.kind == Number && b.kind == Number:
		return compareNum(a, b), true
	case a.kind == String && b.kind == String:
		// Byte order of UTF-8 is code point order.
		return strings.Compare(a.s, b.s), true
	}
	return 0, false
}

func compareNum(a, b *Value) int {
	if a.isInt && b.isInt {
		switch {
		case a.i < b.i:
			return -1
		case a.i > b.i:
			return 1
		}
		return 0
	}
	an, ad, ae := a.decimal()
	bn, bd, be := b.decimal()
	return compareDec(an, ad, ae, bn, bd, be)
}

// decimal returns the normalised decimal form (sign, digits, exponent).
func (v *Value) decimal() (neg bool, digits string, exp int32) {
	if !v.isInt {
		return v.neg, v.s, v.exp
	}
	if v.i == 0 {
		return false, "", 0
	}
	var u uint64
	if v.i < 0 {
		neg = true
		u = uint64(-(v.i + 1)) + 1
	} else {
		u = uint64(v.i)
	}
	d := strconv.FormatUint(u, 10)
	exp = int32(len(d))
	return neg, strings.TrimRight(d, "0"), exp
}

func compareDec(an bool, ad string, ae int32, bn bool, bd string, be int32) int {
	az, bz := ad == "", bd == ""
	switch {
	case az && bz:
		return 0
	case az:
		if bn {
			return 1
		}
		return -1
	case bz:
		if an {
			return -1
		}
		return 1
	}
	if an != bn {
		if an {
			return -1
		}
		return 1
	}
	mag := 0
	switch {
	case ae < be:
		mag = -1
	case ae > be:
		mag = 1
	default:
		mag = strings.Compare(ad, bd)
	}
	if an {
		return -mag
	}
	return mag
}

// String renders the value as compact JSON (numbers in a canonical form).
func (v Value) String() string {
	var b strings.Builder
	v.appendJSON(&b)
	return b.String()
}

func (v *Value) appendJSON(b *strings.Builder) {
	switch v.kind {
	case Missing:
		b.WriteString("<missing>")
	case Null:
		b.WriteString("null")
	case Bool:
		b.WriteString(strconv.FormatBool(v.b))
	case Number:
		if v.isInt {
			b.WriteString(strconv.FormatInt(v.i, 10))
			return
		}
		if v.neg {
			b.WriteByte('-')
		}
		b.WriteString("0.")
		b.WriteString(v.s)
		if v.exp != 0 {
			b.WriteString("e")
			b.WriteString(strconv.FormatInt(int64(v.exp), 10))
		}
	case String:
		AppendQuoted(b, v.s)
	case Array:
		b.WriteByte('[')
		for i := range v.arr {
			if i > 0 {
				b.WriteByte(',')
			}
			v.arr[i].appendJSON(b)
		}
		b.WriteByte(']')
	case Object:
		b.WriteByte('{')
		for i := range v.obj {
			if i > 0 {
				b.WriteByte(',')
			}
			AppendQuoted(b, v.obj[i].Key)
			b.WriteByte(':')
			v.obj[i].Val.appendJSON(b)
		}
		b.WriteByte('}')
	}
}
