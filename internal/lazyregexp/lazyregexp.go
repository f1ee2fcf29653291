// Package lazyregexp compiles regular expressions on first use: package-
// level regexps compiled at init would be paid by every start of a
// binary (condfs run's included).
package lazyregexp

import (
	"regexp"
	"sync"
)

// New returns expr compiled at the first call, and the same after.
func New(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
