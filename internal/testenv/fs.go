package testenv

import (
	"os"
)

func Exists(p string) bool { _, err := os.Stat(p); return err == nil }
