package lazyregexp

import "testing"

func TestNewCompilesOnce(t *testing.T) {
	re := New(`^a+$`)
	first := re()
	if !first.MatchString("aaa") || first.MatchString("b") || re() != first {
		t.Fatal("New does not compile expr once")
	}
}
