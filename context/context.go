// Package context holds a session's context (its set of condition atoms)
// and the conditions that test it. The path rules (acl) and the constraint
// engine's when() share this code, so that "discord:dm" means the same in
// conditions.toml and in a policy.
//
// Atoms: discord:channel:ID, discord:dm, discord:dm:ID, discord:guild:ID,
// discord:forum:ID, discord:nsfw, internal, tui. IDs are 1 to 64 ASCII
// digits. Anything else is an error: an unknown atom is never silently
// ignored, because an ignored atom could flip a negated condition.
package context

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// maxID bounds an ID's length. Discord snowflakes have at most 20 digits;
// the bound only keeps hostile input small.
const maxID = 64

// ValidateAtom reports whether s is a well-formed atom.
func ValidateAtom(s string) error {
	switch s {
	case "discord:dm", "discord:nsfw", "internal", "tui":
		return nil
	}
	for _, p := range []string{"discord:channel:", "discord:dm:", "discord:guild:", "discord:forum:"} {
		if id, ok := strings.CutPrefix(s, p); ok {
			if err := validateID(id); err != nil {
				return fmt.Errorf("atom %q: %w", s, err)
			}
			return nil
		}
	}
	if strings.HasPrefix(s, "!") {
		return fmt.Errorf("atom %q: a negation is a condition, not an atom", s)
	}
	return fmt.Errorf("unknown atom %q (known: discord:channel:ID, discord:dm, discord:dm:ID, discord:guild:ID, discord:forum:ID, discord:nsfw, internal, tui)", s)
}

func validateID(id string) error {
	if id == "" {
		return errors.New("missing id")
	}
	if len(id) > maxID {
		return fmt.Errorf("id longer than %d digits", maxID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] < '0' || id[i] > '9' {
			return fmt.Errorf("id %q is not ASCII digits", id)
		}
	}
	return nil
}

// Set is an immutable set of atoms. The zero Set is the empty context.
type Set struct {
	atoms []string // sorted, unique
}

// MaxAtoms bounds the atoms of one context. A context names where a
// session works (a DM, a channel of a guild, a forum thread): a handful of
// atoms. Unbounded, a 1 MiB context.set kept about 40,000 atoms in the
// session for as long as it lived.
const MaxAtoms = 64

// NewSet validates atoms and returns their set.
func NewSet(atoms []string) (Set, error) {
	if len(atoms) > MaxAtoms {
		return Set{}, fmt.Errorf("a context has at most %d atoms; this one has %d", MaxAtoms, len(atoms))
	}
	out := make([]string, 0, len(atoms))
	for _, a := range atoms {
		if err := ValidateAtom(a); err != nil {
			return Set{}, err
		}
		out = append(out, a)
	}
	slices.Sort(out)
	return Set{atoms: slices.Compact(out)}, nil
}

// Has reports whether atom a is in the set. It does not allocate.
func (s Set) Has(a string) bool {
	_, ok := slices.BinarySearch(s.atoms, a)
	return ok
}

// Atoms returns the sorted atoms (a copy).
func (s Set) Atoms() []string { return slices.Clone(s.atoms) }

// Len is the number of atoms.
func (s Set) Len() int { return len(s.atoms) }

// String renders the set for logs.
func (s Set) String() string { return "[" + strings.Join(s.atoms, " ") + "]" }

// Description is a session description from which atoms are derived.
type Description struct {
	Kind      string `json:"kind"`
	ChannelID string `json:"channel_id,omitempty"`
	GuildID   string `json:"guild_id,omitempty"`
	ParentID  string `json:"parent_id,omitempty"`
	NSFW      bool   `json:"nsfw,omitempty"`
}

// Derive returns the atoms of a description.
func (d Description) Derive() (Set, error) {
	var atoms []string
	switch d.Kind {
	case "discord":
		if d.ChannelID == "" {
			return Set{}, errors.New("discord context: channel_id is required")
		}
		atoms = append(atoms, "discord:channel:"+d.ChannelID)
		if d.GuildID == "" {
			atoms = append(atoms, "discord:dm", "discord:dm:"+d.ChannelID)
		} else {
			atoms = append(atoms, "discord:guild:"+d.GuildID)
		}
		if d.ParentID != "" {
			atoms = append(atoms, "discord:forum:"+d.ParentID)
		}
		if d.NSFW {
			atoms = append(atoms, "discord:nsfw")
		}
	case "internal", "tui":
		if d.ChannelID != "" || d.GuildID != "" || d.ParentID != "" || d.NSFW {
			return Set{}, fmt.Errorf("%s context: only \"kind\" is allowed", d.Kind)
		}
		atoms = []string{d.Kind}
	case "none":
		if d.ChannelID != "" || d.GuildID != "" || d.ParentID != "" || d.NSFW {
			return Set{}, errors.New("none context: only \"kind\" is allowed")
		}
	case "":
		return Set{}, errors.New("context description: \"kind\" is required (discord, internal, tui or none)")
	default:
		return Set{}, fmt.Errorf("context description: unknown kind %q (want discord, internal, tui or none)", d.Kind)
	}
	return NewSet(atoms)
}

// Parse reads a context sent by a client: a JSON array of atoms, or a
// description object. null or absence is an error: a session never has an
// implicit context, since an unset one would satisfy every "!x".
func Parse(raw []byte) (Set, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return Set{}, errors.New("context is required: an array of atoms or a description such as {\"kind\":\"none\"}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	switch raw[0] {
	case '[':
		var atoms []string
		if err := dec.Decode(&atoms); err != nil {
			return Set{}, fmt.Errorf("context: %w", err)
		}
		if dec.InputOffset() != int64(len(raw)) {
			return Set{}, errors.New("context: unexpected data after the array")
		}
		return NewSet(atoms)
	case '{':
		var d Description
		if err := dec.Decode(&d); err != nil {
			return Set{}, fmt.Errorf("context description: %w", err)
		}
		if dec.InputOffset() != int64(len(raw)) {
			return Set{}, errors.New("context description: unexpected data after the object")
		}
		return d.Derive()
	}
	return Set{}, errors.New("context must be an array of atoms or a description object")
}
