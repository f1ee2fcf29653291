package testenv

import (
	"os"
)

// Exists reports whether p can be stat'ed.
func Exists(p string) bool { _, err := os.Stat(p); return err == nil }
