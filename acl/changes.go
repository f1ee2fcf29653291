package acl

import (
	"math"

	"github.com/BurntSushi/toml"
)

// Changes is the [changes] table: how sessions keep what they change
// (docs/changes.md).
type Changes struct {
	mode           string
	maxBytes       int64
	maxCheckpoints int
}

// Defaults of [changes].
const (
	DefaultChangesMode        = "direct"
	DefaultChangesMaxBytes    = 1 << 30
	DefaultChangesCheckpoints = 64
)

// Mode is "direct" or "staged".
func (c *Changes) Mode() string {
	if c == nil {
		return DefaultChangesMode
	}
	return c.mode
}

// MaxBytes bounds what one session's checkpoints may hold.
func (c *Changes) MaxBytes() int64 {
	if c == nil {
		return DefaultChangesMaxBytes
	}
	return c.maxBytes
}

// MaxCheckpoints is how many checkpoints a session keeps.
func (c *Changes) MaxCheckpoints() int {
	if c == nil {
		return DefaultChangesCheckpoints
	}
	return c.maxCheckpoints
}

// changes loads the [changes] table; every key is checked.
func (l *loader) changes(prim toml.Primitive) (*Changes, error) {
	keys, fields, err := l.tableOf(prim, toml.Key{"changes"}, "[changes]")
	if err != nil {
		return nil, err
	}
	ch := &Changes{mode: DefaultChangesMode, maxBytes: DefaultChangesMaxBytes, maxCheckpoints: DefaultChangesCheckpoints}
	for _, k := range keys {
		fp := fields[k]
		switch k {
		case "mode":
			var s string
			if err := l.md.PrimitiveDecode(fp, &s); err != nil || (s != "direct" && s != "staged") {
				return nil, l.failAt(fp, "[changes]: mode must be \"direct\" or \"staged\"")
			}
			ch.mode = s
		case "max_bytes":
			var v any
			l.md.PrimitiveDecode(fp, &v)
			n, err := parseSize(v)
			if err != nil {
				return nil, l.failAt(fp, "[changes]: max_bytes: %v", err)
			}
			ch.maxBytes = n
		case "max_checkpoints":
			var n int64
			if err := l.md.PrimitiveDecode(fp, &n); err != nil || n <= 0 || n > math.MaxInt32 {
				return nil, l.failAt(fp, "[changes]: max_checkpoints must be an integer from 1 to %d", math.MaxInt32)
			}
			ch.maxCheckpoints = int(n)
		default:
			return nil, l.failAt(fp, "[changes]: unknown key %q (want mode, max_bytes, max_checkpoints)", k)
		}
	}
	return ch, nil
}

// Changes gives the [changes] table (nil without one: the defaults).
func (c *Config) Changes() *Changes { return c.changes }
