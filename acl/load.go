package acl

import (
	"github.com/condfs/condfs/internal/configfile"
	"github.com/condfs/condfs/internal/lazyregexp"

	"errors"
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"

	cctx "github.com/condfs/condfs/context"
)

// LoadError is a conditions.toml error with its position.
type LoadError struct {
	File string
	Line int
	Col  int
	Msg  string
}

func (e *LoadError) Error() string { return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg) }

// Load reads conditions.toml. A missing file is an error here; the daemon
// decides what a missing file means (no rules, at start).
func Load(file string) (*Config, error) {
	data, err := configfile.Read(file)
	if err != nil {
		return nil, err
	}
	return Parse(file, data)
}

var blockNameRe = lazyregexp.New(`^[A-Za-z0-9_-]+$`)

// Parse compiles conditions.toml text. Unknown tables and keys, bad values
// and malformed conditions are errors (a *LoadError) with line and column.
func Parse(file string, data []byte) (*Config, error) {
	if len(data) > configfile.MaxSize {
		return nil, &LoadError{File: file, Line: 1, Col: 1, Msg: fmt.Sprintf("the file is over %d bytes", configfile.MaxSize)}
	}
	if line, col, ok := tomlNestingOK(data); !ok {
		return nil, &LoadError{File: file, Line: line, Col: col, Msg: fmt.Sprintf("arrays or inline tables nested deeper than %d levels", maxTOMLNesting)}
	}
	l := &loader{file: file}
	c, err := l.parse(data)
	if err != nil {
		return nil, err
	}
	c.file = file
	return c, nil
}

type loader struct {
	file string
	md   toml.MetaData
}

// posErr makes a positioned error. Errors reported through a Primitive
// decode carry the position of that key; toml.ParseError gives it.
func (l *loader) posErr(err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg := pe.Message
		msg = strings.TrimPrefix(msg, "toml: ")
		// Some implicit tables carry no line (a dotted header such as [0.""]): name
		// the first line rather than line 0.
		return &LoadError{File: l.file, Line: max(pe.Position.Line, 1), Col: max(pe.Position.Col, 1), Msg: msg}
	}
	return &LoadError{File: l.file, Line: 1, Col: 1, Msg: err.Error()}
}

// failAt returns an error positioned at prim's key.
func (l *loader) failAt(prim toml.Primitive, format string, args ...any) error {
	return l.posErr(l.md.PrimitiveDecode(prim, failer{fmt.Sprintf(format, args...)}))
}

// failer makes the TOML decoder report an error at the key being decoded.
type failer struct{ msg string }

func (f failer) UnmarshalTOML(any) error { return errors.New(f.msg) }

func (l *loader) parse(data []byte) (*Config, error) {
	var top map[string]toml.Primitive
	md, err := toml.Decode(string(data), &top)
	if err != nil {
		return nil, l.posErr(err)
	}
	l.md = md
	c := Empty()
	// Tables in file order, so blocks come back in table order.
	for _, name := range childKeys(md, nil) {
		prim := top[name]
		switch name {
		case "memories", "workspace":
			sp, _ := ParseSpace(name)
			if err := l.space(c, sp, prim); err != nil {
				return nil, err
			}
		case "exec":
			if err := l.space(c, Exec, prim); err != nil {
				return nil, err
			}
		case "sandbox":
			if err := l.sandbox(c, prim); err != nil {
				return nil, err
			}
		case "changes":
			ch, err := l.changes(prim)
			if err != nil {
				return nil, err
			}
			c.changes = ch
		case "blocks":
			if err := l.blocks(c, prim); err != nil {
				return nil, err
			}
		case "egress":
			if err := l.egress(c, prim); err != nil {
				return nil, err
			}
		case "secrets":
			if err := l.secrets(c, prim); err != nil {
				return nil, err
			}
		default:
			return nil, l.failAt(prim, "unknown table [%s] (want [memories.\"/path/\"], [workspace.\"/path/\"], [exec.\"/path\"], [sandbox], [changes], [blocks.NAME], [egress] or [secrets.NAME])", name)
		}
	}
	if err := l.checkSecretHosts(c); err != nil {
		return nil, err
	}
	return c, nil
}

// tableOf decodes a table into its keys in file order.
func (l *loader) tableOf(prim toml.Primitive, prefix toml.Key, what string) ([]string, map[string]toml.Primitive, error) {
	var m map[string]toml.Primitive
	// The decoder turns a scalar into an empty map without complaint
	// ("memories = 1" would load as no rules); implicit parent tables of
	// dotted headers have no type.
	if t := l.md.Type(prefix...); t != "" && t != "Hash" {
		return nil, nil, l.failAt(prim, "%s must be a table", what)
	}
	if err := l.md.PrimitiveDecode(prim, &m); err != nil {
		return nil, nil, l.failAt(prim, "%s must be a table", what)
	}
	return childKeys(l.md, prefix), m, nil
}

// childKeys lists the keys directly under prefix in file order. Parent
// tables of dotted headers are implicit and absent from md.Keys(), so
// children are collected from every longer key.
func childKeys(md toml.MetaData, prefix toml.Key) []string {
	var order []string
	seen := map[string]bool{}
	for _, k := range md.Keys() {
		if len(k) > len(prefix) && k[:len(prefix)].String() == prefix.String() && !seen[k[len(prefix)]] {
			seen[k[len(prefix)]] = true
			order = append(order, k[len(prefix)])
		}
	}
	return order
}

type rawRule struct {
	when   []string
	mode   string
	action string
	prim   toml.Primitive
	whenAt toml.Primitive
}

func (l *loader) rule(prim toml.Primitive, key toml.Key, what string, actions ...string) (rawRule, error) {
	r := rawRule{prim: prim}
	order, fields, err := l.tableOf(prim, key, what)
	if err != nil {
		return r, err
	}
	hasWhen, hasAction := false, false
	for _, f := range order {
		fp := fields[f]
		switch f {
		case "when":
			hasWhen = true
			r.whenAt = fp
			var one string
			if err := l.md.PrimitiveDecode(fp, &one); err == nil {
				r.when = []string{one}
				break
			}
			var many []any
			if err := l.md.PrimitiveDecode(fp, &many); err != nil {
				return r, l.failAt(fp, "%s: when must be a condition string or an array of them", what)
			}
			if len(many) == 0 {
				return r, l.failAt(fp, "%s: when must not be empty", what)
			}
			for _, m := range many {
				s, ok := m.(string)
				if !ok {
					return r, l.failAt(fp, "%s: when: %v is not a string", what, m)
				}
				r.when = append(r.when, s)
			}
		case "mode":
			if err := l.md.PrimitiveDecode(fp, &r.mode); err != nil || (r.mode != "or" && r.mode != "and") {
				return r, l.failAt(fp, "%s: mode must be \"or\" or \"and\"", what)
			}
		case "action":
			hasAction = true
			if err := l.md.PrimitiveDecode(fp, &r.action); err != nil || !contains(actions, r.action) {
				return r, l.failAt(fp, "%s: action must be %s", what, quoteList(actions))
			}
		default:
			return r, l.failAt(fp, "%s: unknown key %q (want when, mode, action)", what, f)
		}
	}
	if !hasWhen {
		return r, l.failAt(prim, "%s: when is required", what)
	}
	if !hasAction {
		return r, l.failAt(prim, "%s: action is required (%s)", what, quoteList(actions))
	}
	return r, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func quoteList(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, " or ")
}

func (l *loader) condition(r rawRule, what string) (cctx.Condition, error) {
	cond, err := cctx.NewCondition(r.when, r.mode)
	if err != nil {
		return cctx.Condition{}, l.failAt(r.whenAt, "%s: %v", what, err)
	}
	return cond, nil
}

func (l *loader) space(c *Config, sp Space, prim toml.Primitive) error {
	keys, rules, err := l.tableOf(prim, toml.Key{sp.String()}, "["+sp.String()+"]")
	if err != nil {
		return err
	}
	for _, key := range keys {
		what := fmt.Sprintf("[%s.%q]", sp, key)
		rp := rules[key]
		if sp == Exec && !strings.HasPrefix(key, "/") {
			// A host path: a relative key would name nothing in particular.
			return l.failAt(rp, "%s: an exec key is an absolute path", what)
		}
		norm, err := normaliseKey(key)
		if err != nil {
			return l.failAt(rp, "%s: %v", what, err)
		}
		raw, err := l.rule(rp, toml.Key{sp.String(), key}, what, "allow", "deny")
		if err != nil {
			return err
		}
		cond, err := l.condition(raw, what)
		if err != nil {
			return err
		}
		c.add(sp, norm, rule{key: norm, deny: raw.action == "deny", cond: cond})
	}
	return nil
}

// normaliseKey gives a key its leading "/" and refuses keys that could
// never match a canonical path.
func normaliseKey(key string) (string, error) {
	if key == "" {
		return "", errors.New("an empty key matches nothing: use \"/\" for the whole space")
	}
	if strings.IndexByte(key, 0) >= 0 {
		return "", errors.New("a key must not hold NUL")
	}
	if !strings.HasPrefix(key, "/") {
		key = "/" + key
	}
	if key == "/" {
		return key, nil
	}
	body := strings.TrimSuffix(key[1:], "/")
	for _, seg := range strings.Split(body, "/") {
		switch seg {
		case "":
			return "", errors.New("a key must not hold \"//\"")
		case ".", "..":
			return "", fmt.Errorf("a key must not hold a %q segment: it could never match a canonical path", seg)
		}
	}
	return key, nil
}

// add inserts a rule under its key's trie node.
func (c *Config) add(sp Space, key string, r rule) {
	c.ruled[sp] = true
	n := c.spaces[sp]
	prefix := strings.HasSuffix(key, "/")
	body := strings.Trim(key, "/")
	if body != "" {
		for _, seg := range strings.Split(body, "/") {
			if n.children == nil {
				n.children = map[string]*node{}
			}
			child := n.children[seg]
			if child == nil {
				child = &node{}
				n.children[seg] = child
			}
			n = child
		}
	}
	if prefix {
		n.prefix = append(n.prefix, r)
	} else {
		n.exact = append(n.exact, r)
	}
}

func (l *loader) blocks(c *Config, prim toml.Primitive) error {
	names, rules, err := l.tableOf(prim, toml.Key{"blocks"}, "[blocks]")
	if err != nil {
		return err
	}
	for _, name := range names {
		what := fmt.Sprintf("[blocks.%s]", name)
		rp := rules[name]
		if !blockNameRe().MatchString(name) {
			return l.failAt(rp, "block name %q: use only letters, digits, '_' and '-'", name)
		}
		raw, err := l.rule(rp, toml.Key{"blocks", name}, what, "load")
		if err != nil {
			return err
		}
		cond, err := l.condition(raw, what)
		if err != nil {
			return err
		}
		c.blocks = append(c.blocks, blockRule{name: name, cond: cond})
	}
	return nil
}

// maxTOMLNesting bounds [ and { nesting: the TOML parser recurses on them,
// and a few MB of "[" would overflow the stack and kill the daemon.
const maxTOMLNesting = 64

// tomlNestingOK scans TOML text for bracket nesting, skipping strings and
// comments. It reports the position of the first bracket too deep.
func tomlNestingOK(data []byte) (line, col int, ok bool) {
	depth := 0
	line, lineStart := 1, 0
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case c == '\n':
			line, lineStart = line+1, i+1
		case c == '#':
			for i+1 < len(data) && data[i+1] != '\n' {
				i++
			}
		case c == '"' || c == '\'':
			quote := c
			multi := i+2 < len(data) && data[i+1] == quote && data[i+2] == quote
			if multi {
				i += 2
			}
			for i+1 < len(data) {
				i++
				switch {
				case data[i] == '\\' && quote == '"':
					i++
				case data[i] == '\n':
					if !multi {
						goto next // unterminated: the parser reports it
					}
					line, lineStart = line+1, i+1
				case data[i] == quote:
					if !multi {
						goto next
					}
					if i+2 < len(data) && data[i+1] == quote && data[i+2] == quote {
						i += 2
						goto next
					}
				}
			}
		case c == '[' || c == '{':
			depth++
			if depth > maxTOMLNesting {
				return line, i - lineStart + 1, false
			}
		case c == ']' || c == '}':
			if depth > 0 {
				depth--
			}
		}
	next:
	}
	return 0, 0, true
}
