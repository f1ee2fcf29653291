// Package constraints decides AI-agent tool calls against a policy file in
// the Hexgate style: roles with tools whose mode is allow, deny or
// approval_required, guarded by constraints in a small expression language.
//
// A Policy is loaded once (Load, Parse) and then answers Decide many times
// from any number of goroutines. Loading fails with positioned errors;
// deciding never fails: it returns a decision and its reasons. Every doubt
// denies: a missing or mistyped argument makes its comparison unknown
// (Kleene logic), and a constraint passes only when it is true.
//
// Choices where the spec is silent, all failing closed:
//   - A call with no role is decided by "default" and reported as role
//     "default" when allowed.
//   - `role` in a constraint is the role as the caller named it, even when
//     an unknown name fell back to "default".
//   - Arguments nested deeper than 128 levels, numbers whose exponent
//     exceeds ±2^20, lone UTF-16 surrogates in strings and a null "roles:"
//     are rejected (request invalid, or load error).
//   - A consts path that names an existing constant but a missing field
//     below it (consts.limits.nope) is unknown, like a missing argument.
package constraints

import (
	"fmt"
	"strings"

	"github.com/condfs/condfs/constraints/internal/value"
)

// Value is a JSON value with exact numbers, as the engine sees arguments.
type Value = value.Value

// Mode is a tool entry's mode and a decision's outcome.
type Mode uint8

// Modes. The zero Mode is Deny.
const (
	Deny Mode = iota
	Allow
	ApprovalRequired
)

func (m Mode) String() string {
	switch m {
	case Allow:
		return "allow"
	case ApprovalRequired:
		return "approval_required"
	}
	return "deny"
}

// ParseMode reads "allow", "deny" or "approval_required".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "allow":
		return Allow, nil
	case "deny":
		return Deny, nil
	case "approval_required":
		return ApprovalRequired, nil
	}
	return Deny, fmt.Errorf("mode %q: want allow, deny or approval_required", s)
}

// MarshalText makes a Mode print as its name in JSON.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// Diag is a load error or warning at a position in the policy file.
type Diag struct {
	File string
	Line int
	Col  int
	Msg  string
}

func (d Diag) String() string { return fmt.Sprintf("%s:%d:%d: %s", d.File, d.Line, d.Col, d.Msg) }

// LoadError lists every error found while loading a policy.
type LoadError struct {
	Diags []Diag
}

func (e *LoadError) Error() string {
	lines := make([]string, len(e.Diags))
	for i, d := range e.Diags {
		lines[i] = d.String()
	}
	return strings.Join(lines, "\n")
}
