//go:build !(linux && amd64)

package confine

import "errors"

var errUnsupported = errors.New("confine: only linux/amd64 is supported")

// Apply fails: the seccomp filter is written for linux/amd64 only.
func Apply(Config) (Report, error) { return Report{}, errUnsupported }

// Probe reports nothing available.
func Probe() Report { return Report{} }
