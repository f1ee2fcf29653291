package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	cctx "github.com/condfs/condfs/context"
)

// RunDir is where the daemon keeps its socket and, for peers, views:
// /run/condfs for root, $XDG_RUNTIME_DIR/condfs for an ordinary user (who
// cannot write /run), else a per-uid directory under the temporary
// directory.
func RunDir() string {
	if os.Geteuid() == 0 {
		return "/run/condfs"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "condfs")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("condfs-%d", os.Geteuid()))
}

// DefaultSocket is the control socket's path when no flag names one.
func DefaultSocket() string { return filepath.Join(RunDir(), "condfs.sock") }

// ParseContext reads --context values: atoms, or one JSON value (an array
// of atoms or a description object).
func ParseContext(vals []string) (cctx.Set, error) {
	if len(vals) == 0 {
		return cctx.Set{}, errors.New(`a context is required: atoms such as --context discord:dm, or --context '{"kind":"none"}'`)
	}
	if len(vals) == 1 && (strings.HasPrefix(vals[0], "{") || strings.HasPrefix(vals[0], "[")) {
		return cctx.Parse([]byte(vals[0]))
	}
	return cctx.NewSet(vals)
}

// EnvOr is the environment variable name, or def when it is unset or empty.
func EnvOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
