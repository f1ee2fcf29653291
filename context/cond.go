package context

import (
	"errors"
	"fmt"
	"strings"
)

// Cond is one condition: an atom, possibly negated with a leading "!".
type Cond struct {
	Atom string
	Neg  bool
}

// ParseCond parses "atom" or "!atom". "!!x", upper case, empty ids and
// unknown kinds are errors.
func ParseCond(s string) (Cond, error) {
	c := Cond{Atom: s}
	if rest, ok := strings.CutPrefix(s, "!"); ok {
		c = Cond{Atom: rest, Neg: true}
		if strings.HasPrefix(rest, "!") {
			return Cond{}, fmt.Errorf("condition %q: double negation is not allowed", s)
		}
	}
	if err := ValidateAtom(c.Atom); err != nil {
		return Cond{}, fmt.Errorf("condition %q: %w", s, err)
	}
	return c, nil
}

// Holds reports whether the condition is true in atoms.
func (c Cond) Holds(atoms Set) bool { return atoms.Has(c.Atom) != c.Neg }

func (c Cond) String() string {
	if c.Neg {
		return "!" + c.Atom
	}
	return c.Atom
}

// Condition is a rule's "when" with its "mode": one or more conditions,
// combined with or (the default) or and.
type Condition struct {
	Conds []Cond
	And   bool
}

// NewCondition parses the conditions of a "when" and the mode ("", "or"
// or "and").
func NewCondition(when []string, mode string) (Condition, error) {
	var c Condition
	switch mode {
	case "", "or":
	case "and":
		c.And = true
	default:
		return Condition{}, fmt.Errorf("mode %q: want \"or\" or \"and\"", mode)
	}
	if len(when) == 0 {
		return Condition{}, errors.New("when: at least one condition is required")
	}
	for _, w := range when {
		cd, err := ParseCond(w)
		if err != nil {
			return Condition{}, err
		}
		c.Conds = append(c.Conds, cd)
	}
	return c, nil
}

// Holds evaluates the condition against atoms. It does not allocate.
func (c Condition) Holds(atoms Set) bool {
	if c.And {
		for _, cd := range c.Conds {
			if !cd.Holds(atoms) {
				return false
			}
		}
		return len(c.Conds) > 0
	}
	for _, cd := range c.Conds {
		if cd.Holds(atoms) {
			return true
		}
	}
	return false
}

func (c Condition) String() string {
	parts := make([]string, len(c.Conds))
	for i, cd := range c.Conds {
		parts[i] = cd.String()
	}
	sep := " or "
	if c.And {
		sep = " and "
	}
	return strings.Join(parts, sep)
}
