package acl

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/BurntSushi/toml"

	cctx "github.com/condfs/condfs/context"

	"github.com/condfs/condfs/internal/lazyregexp"
)

// The [egress] table and the [secrets.NAME] tables (docs/conditions.md,
// "Egress"): the hosts whose HTTPS the egress gateway terminates and
// decides per request, the extra roots it verifies servers with, and the
// secrets it puts into requests to listed hosts, so that a run holds a
// placeholder, never the value.
//
// Parse checks their form; ReadValues, which the daemon calls on every
// load, reads what they name (an upstream_ca file, each secret's value)
// and fails with the position of the key that names it. Fail-closed
// choices: a secret whose host no inspect entry covers, a value that is
// empty or holds a byte a header value may not, an upstream_ca holding
// no certificate are load errors, never skipped.

// Egress is the [egress] table.
type Egress struct {
	inspect    []string // canonical names, or "*." and a canonical name
	upstreamCA string   // "": none
	caAt       pos
	roots      []*x509.Certificate // upstream_ca's certificates, after ReadValues
}

// Secret is one [secrets.NAME] table. Its value is read by ReadValues and
// is never printed: String and the errors of this file name the secret.
type Secret struct {
	name    string
	hosts   []string
	source  string // "env:NAME" or "file:/path"
	env     string
	cond    cctx.Condition
	always  bool // no when
	valueAt pos
	value   string
}

// pos is a key's position, for errors found after Parse (ReadValues).
type pos struct{ line, col int }

// maxSecretBytes bounds a secret's value: a header value, not a file.
const maxSecretBytes = 16 << 10

// Egress is the [egress] table; nil when the file has none (no host is
// inspected).
func (c *Config) Egress() *Egress { return c.egress }

// Secrets lists the [secrets.NAME] tables in file order.
func (c *Config) Secrets() []*Secret { return append([]*Secret(nil), c.secrets...) }

// Secret is the secret called name, or nil.
func (c *Config) Secret(name string) *Secret {
	for _, s := range c.secrets {
		if s.name == name {
			return s
		}
	}
	return nil
}

// Inspected reports whether the gateway terminates HTTPS to host (a
// canonical name or address, as the gateway decides it).
func (e *Egress) Inspected(host string) bool {
	if e == nil {
		return false
	}
	for _, p := range e.inspect {
		if hostMatches(p, host) {
			return true
		}
	}
	return false
}

// Inspect lists the inspect entries as written (canonical).
func (e *Egress) Inspect() []string {
	if e == nil {
		return nil
	}
	return append([]string(nil), e.inspect...)
}

// UpstreamCA is the upstream_ca file, or "".
func (e *Egress) UpstreamCA() string {
	if e == nil {
		return ""
	}
	return e.upstreamCA
}

// UpstreamRoots are upstream_ca's certificates (nil: none, or ReadValues
// was not called).
func (e *Egress) UpstreamRoots() []*x509.Certificate {
	if e == nil {
		return nil
	}
	return append([]*x509.Certificate(nil), e.roots...)
}

// Name is the secret's name.
func (s *Secret) Name() string { return s.name }

// Env is the variable of the run's environment that holds the placeholder.
func (s *Secret) Env() string { return s.env }

// Hosts lists where the secret may go (names, or "*." patterns, each
// with ":PORT" when it names a port other than 443).
func (s *Secret) Hosts() []string { return append([]string(nil), s.hosts...) }

// String names the secret, never its value.
func (s *Secret) String() string { return "secret " + s.name }

// Value is the value ReadValues read ("" before it).
func (s *Secret) Value() string { return s.value }

// Lists reports whether host:port is one of the secret's hosts: an entry
// without a port means HTTPS's, 443; "NAME:PORT" that port only (a
// request's port is decided with its host, and a secret for a host's API
// is not one for whatever else listens there).
func (s *Secret) Lists(host string, port int) bool {
	for _, e := range s.hosts {
		p, pp := secretHostPort(e)
		if pp == port && hostMatches(p, host) {
			return true
		}
	}
	return false
}

// secretHostPort splits a secret's hosts entry into its pattern and port
// (443 when it names none); the entry was checked by secretHost.
func secretHostPort(e string) (string, int) {
	if i := strings.LastIndexByte(e, ':'); i >= 0 {
		if n, err := strconv.Atoi(e[i+1:]); err == nil {
			return e[:i], n
		}
	}
	return e, 443
}

// secretHost checks a secret's hosts entry: a hostPattern, optionally
// ":PORT" (1 to 65535, in decimal without a leading zero).
func secretHost(e string) error {
	if i := strings.LastIndexByte(e, ':'); i >= 0 {
		n, err := strconv.Atoi(e[i+1:])
		if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != e[i+1:] {
			return fmt.Errorf("%q is not a port", e[i+1:])
		}
		e = e[:i]
	}
	return hostPattern(e)
}

// Holds reports whether the secret's when holds in atoms (no when: always).
func (s *Secret) Holds(atoms cctx.Set) bool { return s.always || s.cond.Holds(atoms) }

// hostMatches: p is a canonical name, or "*." and one, which matches one
// or more labels before it.
func hostMatches(p, host string) bool {
	if suffix, ok := strings.CutPrefix(p, "*"); ok {
		return len(host) > len(suffix) && strings.HasSuffix(host, suffix)
	}
	return p == host
}

// covers reports whether the inspect entry p covers every host secret
// entry q matches.
func covers(p, q string) bool {
	if p == q {
		return true
	}
	suffix, ok := strings.CutPrefix(p, "*")
	return ok && strings.HasSuffix(strings.TrimPrefix(q, "*"), suffix) && len(strings.TrimPrefix(q, "*")) > len(suffix)
}

// hostPattern checks an inspect or secret host: a DNS name (lower case,
// no trailing dot, RFC 1035 lengths) or "*." and one of two labels or
// more. Addresses are not taken: a leaf for an address is not what
// clients check against a name.
func hostPattern(s string) error {
	name := strings.TrimPrefix(s, "*.")
	if strings.HasPrefix(s, "*") && !strings.HasPrefix(s, "*.") || strings.Contains(name, "*") {
		return errors.New(`a wildcard is "*." before a name`)
	}
	if name != strings.ToLower(name) {
		return errors.New("write names in lower case")
	}
	if name == "" || len(name) > 253 || strings.HasSuffix(name, ".") {
		return errors.New("not a host name")
	}
	labels := strings.Split(name, ".")
	if strings.HasPrefix(s, "*.") && len(labels) < 2 {
		return errors.New(`"*." covers a name of two labels or more ("*.example.com")`)
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return errors.New("not a host name")
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%q may not appear in a host name", c)
			}
		}
	}
	if strings.Trim(name, "0123456789.") == "" {
		return errors.New("an address, not a name")
	}
	return nil
}

// posOf is prim's position.
func (l *loader) posOf(prim toml.Primitive) pos {
	var le *LoadError
	if errors.As(l.failAt(prim, "x"), &le) {
		return pos{le.Line, le.Col}
	}
	return pos{1, 1}
}

func (l *loader) egress(c *Config, prim toml.Primitive) error {
	keys, fields, err := l.tableOf(prim, toml.Key{"egress"}, "[egress]")
	if err != nil {
		return err
	}
	e := &Egress{inspect: []string{}}
	for _, k := range keys {
		fp := fields[k]
		switch k {
		case "inspect":
			list, err := l.strings(fp, "[egress]: inspect")
			if err != nil {
				return err
			}
			for _, h := range list {
				if err := hostPattern(h); err != nil {
					return l.failAt(fp, "[egress]: inspect: %q: %v", h, err)
				}
				e.inspect = append(e.inspect, h)
			}
		case "upstream_ca":
			var p string
			if err := l.md.PrimitiveDecode(fp, &p); err != nil || !filepath.IsAbs(p) || filepath.Clean(p) != p {
				return l.failAt(fp, "[egress]: upstream_ca must be the absolute, clean path of a PEM file")
			}
			e.upstreamCA, e.caAt = p, l.posOf(fp)
		default:
			return l.failAt(fp, "[egress]: unknown key %q (want inspect, upstream_ca)", k)
		}
	}
	c.egress = e
	return nil
}

// strings decodes an array of strings.
func (l *loader) strings(fp toml.Primitive, what string) ([]string, error) {
	var list []any
	if err := l.md.PrimitiveDecode(fp, &list); err != nil {
		return nil, l.failAt(fp, "%s must be an array of strings", what)
	}
	out := make([]string, 0, len(list))
	for _, v := range list {
		s, ok := v.(string)
		if !ok {
			return nil, l.failAt(fp, "%s: %v is not a string", what, v)
		}
		out = append(out, s)
	}
	return out, nil
}

var envNameRe = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reservedEnv are variables the daemon sets in a run: a secret may not
// take one.
var reservedEnv = map[string]bool{"PATH": true, "HOME": true, "CONDFS_SESSION": true, "LANG": true, "TERM": true,
	"SSL_CERT_FILE": true, "REQUESTS_CA_BUNDLE": true, "CURL_CA_BUNDLE": true, "NODE_EXTRA_CA_CERTS": true, "GIT_SSL_CAINFO": true,
	"HTTP_PROXY": true, "HTTPS_PROXY": true, "ALL_PROXY": true, "NO_PROXY": true}

func (l *loader) secrets(c *Config, prim toml.Primitive) error {
	names, tables, err := l.tableOf(prim, toml.Key{"secrets"}, "[secrets]")
	if err != nil {
		return err
	}
	envs := map[string]string{}
	for _, name := range names {
		what := fmt.Sprintf("[secrets.%s]", name)
		sp := tables[name]
		if !blockNameRe().MatchString(name) {
			return l.failAt(sp, "secret name %q: use only letters, digits, '_' and '-'", name)
		}
		keys, fields, err := l.tableOf(sp, toml.Key{"secrets", name}, what)
		if err != nil {
			return err
		}
		s := &Secret{name: name}
		var when []string
		var mode string
		var whenAt toml.Primitive
		has := map[string]bool{}
		for _, k := range keys {
			fp := fields[k]
			has[k] = true
			switch k {
			case "hosts":
				if s.hosts, err = l.strings(fp, what+": hosts"); err != nil {
					return err
				}
				if len(s.hosts) == 0 {
					return l.failAt(fp, "%s: hosts must not be empty", what)
				}
				for _, h := range s.hosts {
					if err := secretHost(h); err != nil {
						return l.failAt(fp, "%s: hosts: %q: %v", what, h, err)
					}
				}
			case "value":
				if err := l.md.PrimitiveDecode(fp, &s.source); err != nil {
					return l.failAt(fp, "%s: value must be a string, \"env:NAME\" or \"file:/path\"", what)
				}
				switch kind, arg, _ := strings.Cut(s.source, ":"); {
				case kind == "env" && envNameRe().MatchString(arg):
				case kind == "file" && filepath.IsAbs(arg) && filepath.Clean(arg) == arg:
				default:
					// The text is not quoted: it may be the value itself,
					// written where its name belongs.
					return l.failAt(fp, "%s: value must be \"env:NAME\" (a variable of the daemon's environment) or \"file:/path\" (absolute and clean)", what)
				}
				s.valueAt = l.posOf(fp)
			case "env":
				if err := l.md.PrimitiveDecode(fp, &s.env); err != nil || !envNameRe().MatchString(s.env) {
					return l.failAt(fp, "%s: env must be a variable name (letters, digits, '_')", what)
				}
				if reservedEnv[strings.ToUpper(s.env)] {
					return l.failAt(fp, "%s: env: the daemon sets %s in every run", what, s.env)
				}
				if other, ok := envs[s.env]; ok {
					return l.failAt(fp, "%s: env: [secrets.%s] takes %s already", what, other, s.env)
				}
				envs[s.env] = name
			case "when":
				whenAt = fp
				var one string
				if err := l.md.PrimitiveDecode(fp, &one); err == nil {
					when = []string{one}
					break
				}
				if when, err = l.strings(fp, what+": when"); err != nil {
					return err
				}
				if len(when) == 0 {
					return l.failAt(fp, "%s: when must not be empty", what)
				}
			case "mode":
				if err := l.md.PrimitiveDecode(fp, &mode); err != nil || (mode != "or" && mode != "and") {
					return l.failAt(fp, "%s: mode must be \"or\" or \"and\"", what)
				}
			default:
				return l.failAt(fp, "%s: unknown key %q (want hosts, value, env, when, mode)", what, k)
			}
		}
		for _, k := range []string{"hosts", "value", "env"} {
			if !has[k] {
				return l.failAt(sp, "%s: %s is required", what, k)
			}
		}
		if has["mode"] && !has["when"] {
			return l.failAt(sp, "%s: mode without when", what)
		}
		if has["when"] {
			if s.cond, err = cctx.NewCondition(when, mode); err != nil {
				return l.failAt(whenAt, "%s: %v", what, err)
			}
		}
		s.always = !has["when"]
		c.secrets = append(c.secrets, s)
		c.secretAt = append(c.secretAt, fields["hosts"])
	}
	return nil
}

// checkSecretHosts: every host of every secret is covered by an inspect
// entry (the value goes only into requests the gateway decides one by one).
func (l *loader) checkSecretHosts(c *Config) error {
	for i, s := range c.secrets {
		for _, h := range s.hosts {
			ok := false
			name, _ := secretHostPort(h)
			for _, p := range c.egress.Inspect() {
				if covers(p, name) {
					ok = true
					break
				}
			}
			if !ok {
				return l.failAt(c.secretAt[i], "[secrets.%s]: hosts: %q is not in [egress] inspect (a secret goes only to hosts whose requests the gateway decides)", s.name, h)
			}
		}
	}
	c.secretAt = nil
	return nil
}

// ReadValues reads what the egress tables name: upstream_ca's
// certificates and each secret's value, as the process calling it sees
// them (the daemon, at every load). An error names the file and position
// of the key, never a value.
func (c *Config) ReadValues() error {
	fail := func(p pos, format string, a ...any) error {
		return &LoadError{File: c.file, Line: p.line, Col: p.col, Msg: fmt.Sprintf(format, a...)}
	}
	if e := c.egress; e != nil && e.upstreamCA != "" {
		b, err := readLimited(e.upstreamCA, 1<<20)
		if err != nil {
			return fail(e.caAt, "[egress]: upstream_ca: %v", err)
		}
		var certs []*x509.Certificate
		for {
			var blk *pem.Block
			if blk, b = pem.Decode(b); blk == nil {
				break
			}
			if blk.Type != "CERTIFICATE" {
				continue
			}
			cert, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return fail(e.caAt, "[egress]: upstream_ca: %s: %v", e.upstreamCA, err)
			}
			certs = append(certs, cert)
		}
		if len(certs) == 0 {
			return fail(e.caAt, "[egress]: upstream_ca: %s holds no PEM certificate", e.upstreamCA)
		}
		e.roots = certs
	}
	for _, s := range c.secrets {
		kind, arg, _ := strings.Cut(s.source, ":")
		var v string
		switch kind {
		case "env":
			val, ok := os.LookupEnv(arg)
			if !ok {
				return fail(s.valueAt, "[secrets.%s]: value: %s is not set in the daemon's environment", s.name, arg)
			}
			v = val
		case "file":
			b, err := readLimited(arg, maxSecretBytes)
			if err != nil {
				return fail(s.valueAt, "[secrets.%s]: value: %v", s.name, err)
			}
			// A file written by an editor or echo ends in a newline that
			// is not part of the value.
			v = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		}
		if err := headerValueOK(v); err != nil {
			return fail(s.valueAt, "[secrets.%s]: value: %v", s.name, err)
		}
		s.value = v
	}
	return nil
}

// headerValueOK: what a header value may hold (RFC 9110 5.5), so that the
// value can never end a header line or the head.
func headerValueOK(v string) error {
	switch {
	case v == "":
		return errors.New("the value is empty")
	case len(v) > maxSecretBytes:
		return fmt.Errorf("the value is over %d bytes", maxSecretBytes)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Errorf("the value holds a control byte at offset %d, which a header value may not", i)
		}
	}
	return nil
}

// readLimited reads a regular file of at most max bytes (a FIFO must not
// hang a load).
func readLimited(p string, max int64) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot open %s: %w", p, errors.Unwrap(err))
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", p, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is over %d bytes", p, max)
	}
	return b, nil
}
