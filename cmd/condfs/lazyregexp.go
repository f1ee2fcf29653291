package main

import (
	"regexp"
	"sync"
)

// lazyRegexp compiles expr on first use: package-level regexps compiled at
// init would be paid by every start of the binary (condfs run's included).
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
