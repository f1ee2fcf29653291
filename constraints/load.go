package constraints

import (
	"github.com/condfs/condfs/internal/configfile"

	"fmt"
	"math/big"
	"slices"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/condfs/condfs/constraints/internal/expr"
	"github.com/condfs/condfs/constraints/internal/value"
	"github.com/condfs/condfs/internal/lazyregexp"
)

// Load reads and compiles a policy file.
func Load(path string) (*Policy, error) {
	data, err := configfile.Read(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	return Parse(path, data)
}

// Parse compiles a policy from its text; file names it in errors. The
// error, if any, is a *LoadError.
func Parse(file string, data []byte) (*Policy, error) {
	if len(data) > configfile.MaxSize {
		return nil, &LoadError{Diags: []Diag{{File: file, Line: 1, Col: 1, Msg: fmt.Sprintf("the file is over %d bytes", configfile.MaxSize)}}}
	}
	l := &loader{file: file, parsed: map[*yaml.Node]parsedExpr{}}
	p := l.load(data)
	if len(l.errs) > 0 {
		return nil, &LoadError{Diags: l.errs}
	}
	p.warnings = l.warns
	return p, nil
}

// maxExpandedNodes bounds the YAML nodes the constants expand to.
const maxExpandedNodes = 100000

type loader struct {
	expanded int
	file     string
	errs     []Diag
	warns    []Diag
	seen     map[string]bool // dedupe diags
	parsed   map[*yaml.Node]parsedExpr
}

type parsedExpr struct {
	node expr.Node
	ok   bool
}

func (l *loader) errAt(n *yaml.Node, format string, args ...any) {
	l.diag(&l.errs, n.Line, n.Column, fmt.Sprintf(format, args...))
}

func (l *loader) diag(list *[]Diag, line, col int, msg string) {
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	key := fmt.Sprintf("%d:%d:%s", line, col, msg)
	if l.seen[key] {
		return
	}
	l.seen[key] = true
	*list = append(*list, Diag{File: l.file, Line: line, Col: col, Msg: msg})
}

// rawRole is a role body as written, before inheritance.
type rawRole struct {
	name     string
	node     *yaml.Node
	null     bool
	isMixin  bool
	inherits []*yaml.Node
	consts   map[string]constDef
	constOrd []string
	def      *rawEntry // default_policy, nil if unset
	cons     []*yaml.Node
	tools    map[string]*rawEntry
	toolOrd  []string
}

type constDef struct {
	val value.Value
}

type rawEntry struct {
	node  *yaml.Node
	mode  Mode
	cons  []*yaml.Node
	isNil bool
}

var (
	topKeys   = set("version", "consts", "default_policy", "constraints", "roles")
	roleKeys  = set("inherits", "is_mixin", "consts", "default_policy", "constraints", "tools")
	entryKeys = set("mode", "constraints")
	flatKeys  = set("version", "consts", "default_policy", "constraints", "inherits", "is_mixin", "tools")
)

func set(keys ...string) map[string]bool {
	m := map[string]bool{}
	for _, k := range keys {
		m[k] = true
	}
	return m
}

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	n = resolve(n)
	return n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// mapping returns a mapping's key/value pairs after checking for duplicate
// and unknown keys (allowed nil: any key).
func (l *loader) mapping(n *yaml.Node, what string, allowed map[string]bool) [][2]*yaml.Node {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		l.errAt(n, "%s must be a mapping", what)
		return nil
	}
	var out [][2]*yaml.Node
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			l.errAt(k, "%s: keys must be plain strings", what)
			continue
		}
		if k.Value == "<<" && k.Tag == "!!merge" {
			l.errAt(k, "%s: YAML merge keys (<<) are not supported; use inherits", what)
			continue
		}
		if prev, dup := seen[k.Value]; dup {
			l.errAt(k, "duplicate key %q in %s (first at line %d)", k.Value, what, prev.Line)
			continue
		}
		seen[k.Value] = k
		if allowed != nil && !allowed[k.Value] {
			l.errAt(k, "unknown key %q in %s (allowed: %s)", k.Value, what, keyList(allowed))
			continue
		}
		out = append(out, [2]*yaml.Node{k, v})
	}
	return out
}

func keyList(m map[string]bool) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks) // a stable order for messages
	return strings.Join(ks, ", ")
}

// YAML 1.1 readers (Hexgate's included) read these plain scalars as
// booleans, nulls or numbers; as names they must be quoted.
var (
	ambiguousWord = lazyregexp.New(`^(?i:y|n|yes|no|on|off|true|false|null|~)$`)
	ambiguousNum  = lazyregexp.New(`^[-+]?(\.[0-9_]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?$|^[-+]?0[xX][0-9a-fA-F_]+$|^[-+]?0[oO]?[0-7_]+$|^[-+]?0[bB][01_]+$|^[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$`)
)

func (l *loader) name(k *yaml.Node, what string) (string, bool) {
	if k.Value == "" {
		l.errAt(k, "%s name must not be empty", what)
		return "", false
	}
	plain := k.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) == 0
	if plain && (k.Tag != "!!str" || ambiguousWord().MatchString(k.Value) || ambiguousNum().MatchString(k.Value)) {
		l.errAt(k, "%s name %s must be quoted (\"%s\"): YAML 1.1 readers take it for a bool, null or number", what, k.Value, k.Value)
		return "", false
	}
	if !utf8.ValidString(k.Value) {
		l.errAt(k, "%s name is not valid UTF-8", what)
		return "", false
	}
	return k.Value, true
}

func (l *loader) load(data []byte) *Policy {
	top := l.document(data)
	if top == nil {
		return nil
	}
	hasRoles, pairs := l.topLevel(top)

	var (
		fileConsts  = map[string]constDef{}
		fileConsOrd []string
		fileDef     *rawEntry
		fileCons    []*yaml.Node
		roles       = map[string]*rawRole{}
		roleOrd     []string
	)
	for _, kv := range pairs {
		k, v := kv[0], kv[1]
		switch k.Value {
		case "version":
			rv := resolve(v)
			if rv.Kind != yaml.ScalarNode || rv.Tag != "!!int" || rv.Value != "1" {
				l.errAt(v, "version must be the integer 1 (found %q)", rv.Value)
			}
		case "consts":
			if hasRoles {
				fileConsts, fileConsOrd = l.consts(v)
			}
		case "default_policy":
			if hasRoles {
				fileDef = l.entry(v, "default_policy", false)
			}
		case "constraints":
			if hasRoles {
				fileCons = l.constraintList(v)
			}
		case "roles":
			if isNull(v) {
				l.errAt(v, "roles must not be null: write roles: {} for none")
				continue
			}
			for _, rkv := range l.mapping(v, "roles", nil) {
				name, ok := l.name(rkv[0], "role")
				if !ok {
					continue
				}
				roles[name] = l.role(name, rkv[0], rkv[1])
				roleOrd = append(roleOrd, name)
			}
		}
	}
	if !hasRoles {
		// The flat form: the document is the role "default".
		r := l.role("default", top, top)
		roles["default"] = r
		roleOrd = []string{"default"}
	}
	if len(l.errs) > 0 {
		return nil
	}
	return l.build(fileConsts, fileConsOrd, fileDef, fileCons, roles, roleOrd)
}

// document parses the policy's YAML and gives its top-level mapping (an
// empty document is an empty mapping), or nil with the error recorded.
func (l *loader) document(data []byte) *yaml.Node {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line, col, msg := yamlErrPos(err)
		l.diag(&l.errs, line, col, msg)
		return nil
	}
	top := &yaml.Node{Kind: yaml.MappingNode, Line: 1, Column: 1}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		top = resolve(doc.Content[0])
	}
	if isNull(top) {
		top = &yaml.Node{Kind: yaml.MappingNode, Line: top.Line, Column: top.Column}
	}
	if top.Kind != yaml.MappingNode {
		l.errAt(top, "a policy must be a mapping (version, consts, roles, ...)")
		return nil
	}
	return top
}

// topLevel reads the top level's keys: whether the policy has roles (else
// it is one role, the flat form), and its pairs, each unknown key recorded.
func (l *loader) topLevel(top *yaml.Node) (hasRoles bool, pairs [][2]*yaml.Node) {
	for i := 0; i+1 < len(top.Content); i += 2 {
		if resolve(top.Content[i]).Value == "roles" {
			hasRoles = true
		}
	}
	allowed := topKeys
	if !hasRoles {
		allowed = flatKeys
	}
	pairs = l.mapping(top, "the policy", nil)
	for _, kv := range pairs {
		if !allowed[kv[0].Value] {
			if hasRoles && roleKeys[kv[0].Value] {
				l.errAt(kv[0], "%q belongs in a role: with roles: present, the top level holds only %s", kv[0].Value, keyList(topKeys))
			} else {
				l.errAt(kv[0], "unknown key %q at the top level (allowed: %s)", kv[0].Value, keyList(allowed))
			}
		}
	}
	return hasRoles, pairs
}

var yamlLineRe = lazyregexp.New(`line (\d+)(?:, column (\d+))?: (.*)`)

func yamlErrPos(err error) (int, int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := yamlLineRe().FindStringSubmatch(msg); m != nil {
		line, col := 0, 1
		fmt.Sscan(m[1], &line)
		if m[2] != "" {
			fmt.Sscan(m[2], &col)
		}
		return line, col, "invalid YAML: " + m[3]
	}
	return 1, 1, "invalid YAML: " + msg
}

func (l *loader) role(name string, key, body *yaml.Node) *rawRole {
	r := &rawRole{name: name, node: key, tools: map[string]*rawEntry{}, consts: map[string]constDef{}}
	if isNull(body) {
		// A null role body is a role with no tools that denies by default;
		// it does not fall back to the file's default_policy.
		r.null = true
		r.def = &rawEntry{node: key, mode: Deny}
		return r
	}
	flat := body == key
	allowed := roleKeys
	if flat {
		allowed = nil // checked by the caller
	}
	for _, kv := range l.mapping(body, "role "+name, allowed) {
		k, v := kv[0], kv[1]
		switch k.Value {
		case "inherits":
			rv := resolve(v)
			if rv.Kind != yaml.SequenceNode {
				l.errAt(v, "inherits must be a list of role names")
				continue
			}
			for _, p := range rv.Content {
				p = resolve(p)
				if p.Kind != yaml.ScalarNode || isNull(p) {
					l.errAt(p, "inherits: each entry must be a role name")
					continue
				}
				r.inherits = append(r.inherits, p)
			}
		case "is_mixin":
			rv := resolve(v)
			if rv.Kind != yaml.ScalarNode || rv.Tag != "!!bool" {
				l.errAt(v, "is_mixin must be true or false")
				continue
			}
			r.isMixin = rv.Value == "true" || rv.Value == "True" || rv.Value == "TRUE"
		case "consts":
			r.consts, r.constOrd = l.consts(v)
		case "default_policy":
			r.def = l.entry(v, "default_policy", false)
		case "constraints":
			r.cons = l.constraintList(v)
		case "tools":
			if isNull(v) {
				l.errAt(v, "tools must not be null: write tools: {} for none")
				continue
			}
			for _, tkv := range l.mapping(v, "tools of role "+name, nil) {
				tname, ok := l.name(tkv[0], "tool")
				if !ok {
					continue
				}
				r.tools[tname] = l.entry(tkv[1], "tool "+tname, true)
				r.toolOrd = append(r.toolOrd, tname)
			}
		}
	}
	return r
}

// entry reads a tool entry or default_policy. A null tool entry is a deny
// entry; a null default_policy is an error.
func (l *loader) entry(n *yaml.Node, what string, nullOK bool) *rawEntry {
	e := &rawEntry{node: n, mode: Deny}
	if isNull(n) {
		if !nullOK {
			l.errAt(n, "%s must not be null: write {mode: deny}", what)
		}
		e.isNil = true
		return e
	}
	for _, kv := range l.mapping(n, what, entryKeys) {
		k, v := kv[0], kv[1]
		switch k.Value {
		case "mode":
			rv := resolve(v)
			if rv.Kind != yaml.ScalarNode || rv.Tag != "!!str" {
				l.errAt(v, "%s: mode must be allow, deny or approval_required", what)
				continue
			}
			m, err := ParseMode(rv.Value)
			if err != nil {
				l.errAt(v, "%s: %v", what, err)
				continue
			}
			e.mode = m
		case "constraints":
			e.cons = l.constraintList(v)
		}
	}
	return e
}

func (l *loader) constraintList(n *yaml.Node) []*yaml.Node {
	rn := resolve(n)
	if isNull(rn) {
		l.errAt(n, "constraints must not be null: write constraints: [] for none")
		return nil
	}
	if rn.Kind != yaml.SequenceNode {
		l.errAt(n, "constraints must be a list of strings (one constraint each)")
		return nil
	}
	var out []*yaml.Node
	for _, c := range rn.Content {
		c = resolve(c)
		if c.Kind != yaml.ScalarNode || c.Tag != "!!str" {
			l.errAt(c, "a constraint must be a string (quote it)")
			continue
		}
		if _, ok := l.parse(c); ok {
			out = append(out, c)
		}
	}
	return out
}

// parse parses a constraint once, reporting syntax errors and warnings.
func (l *loader) parse(c *yaml.Node) (expr.Node, bool) {
	if pe, ok := l.parsed[c]; ok {
		return pe.node, pe.ok
	}
	n, warns, err := expr.Parse(c.Value)
	for _, w := range warns {
		line, col := exprPos(c, w.Off)
		l.diag(&l.warns, line, col, "warning: "+w.Msg)
	}
	if err != nil {
		e := err.(*expr.Error)
		line, col := exprPos(c, e.Off)
		l.diag(&l.errs, line, col, fmt.Sprintf("constraint %s: %s", value.Quote(c.Value), e.Msg))
	}
	l.parsed[c] = parsedExpr{node: n, ok: err == nil}
	return n, err == nil
}

// exprPos maps a byte offset in a constraint to a file position. Exact for
// plain and quoted one-line scalars without escapes; otherwise the
// scalar's own position.
func exprPos(c *yaml.Node, off int) (int, int) {
	if strings.ContainsAny(c.Value, "\n\\") || c.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return c.Line, c.Column
	}
	col := c.Column + utf8.RuneCountInString(c.Value[:min(off, len(c.Value))])
	if c.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
		col++
	}
	return c.Line, col
}

func (l *loader) consts(n *yaml.Node) (map[string]constDef, []string) {
	out := map[string]constDef{}
	var ord []string
	if isNull(n) {
		l.errAt(n, "consts must not be null: write consts: {} for none")
		return out, nil
	}
	for _, kv := range l.mapping(n, "consts", nil) {
		v, ok := l.yamlValue(kv[1], 0)
		if !ok {
			continue
		}
		out[kv[0].Value] = constDef{val: v}
		ord = append(ord, kv[0].Value)
	}
	return out, ord
}

var jsonNumRe = lazyregexp.New(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)

// yamlValue converts a YAML node to an exact Value.
func (l *loader) yamlValue(n *yaml.Node, depth int) (value.Value, bool) {
	n = resolve(n)
	// Aliases share nodes, so a small file can name an exponential number
	// of them (an alias bomb): count what is expanded, not the depth.
	l.expanded++
	if l.expanded > maxExpandedNodes {
		if l.expanded == maxExpandedNodes+1 {
			l.errAt(n, "constants expand to more than %d YAML nodes (aliases included)", maxExpandedNodes)
		}
		return value.Value{}, false
	}
	if depth > 64 {
		l.errAt(n, "consts nested deeper than 64 levels")
		return value.Value{}, false
	}
	switch n.Kind {
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return value.MakeNull(), true
		case "!!bool":
			return value.MakeBool(strings.EqualFold(n.Value, "true")), true
		case "!!int", "!!float":
			text := strings.TrimPrefix(strings.ReplaceAll(n.Value, "_", ""), "+")
			if !jsonNumRe().MatchString(text) && n.Tag == "!!int" {
				var b big.Int
				if _, ok := b.SetString(text, 0); ok {
					text = b.String()
				}
			}
			v, err := value.ParseNumber(text)
			if err != nil {
				l.errAt(n, "constant %s: write numbers in JSON form (finite, no leading +)", n.Value)
				return value.Value{}, false
			}
			return v, true
		default:
			if !utf8.ValidString(n.Value) {
				l.errAt(n, "constant is not valid UTF-8")
				return value.Value{}, false
			}
			return value.MakeString(n.Value), true
		}
	case yaml.SequenceNode:
		elems := make([]value.Value, 0, len(n.Content))
		for _, c := range n.Content {
			v, ok := l.yamlValue(c, depth+1)
			if !ok {
				return value.Value{}, false
			}
			elems = append(elems, v)
		}
		return value.MakeArray(elems), true
	case yaml.MappingNode:
		var members []value.Member
		for _, kv := range l.mapping(n, "a constant", nil) {
			v, ok := l.yamlValue(kv[1], depth+1)
			if !ok {
				return value.Value{}, false
			}
			members = append(members, value.Member{Key: kv[0].Value, Val: v})
		}
		if len(members) != len(n.Content)/2 {
			return value.Value{}, false
		}
		obj, ok := value.MakeObject(members)
		return obj, ok
	}
	l.errAt(n, "unsupported YAML value")
	return value.Value{}, false
}
