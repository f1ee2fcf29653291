package acl

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/condfs/condfs/internal/lazyregexp"
)

// sandbox loads the [sandbox] table. Every key is checked; anything the
// sandbox could read two ways (a relative path, an unknown unit, a prefix
// with host bits set) is an error rather than a guess.
func (l *loader) sandbox(c *Config, prim toml.Primitive) error {
	keys, fields, err := l.tableOf(prim, toml.Key{"sandbox"}, "[sandbox]")
	if err != nil {
		return err
	}
	sb := &Sandbox{files: map[string]bool{}, dirs: map[string]bool{}, network: NetworkNone, connections: DefaultConnections}
	hasBinaries := false
	for _, k := range keys {
		fp := fields[k]
		switch k {
		case "binaries":
			hasBinaries = true
			if err := l.sandboxBinaries(sb, fp); err != nil {
				return err
			}
		case "network":
			var s string
			if err := l.md.PrimitiveDecode(fp, &s); err != nil || (s != string(NetworkNone) && s != string(NetworkHost) && s != string(NetworkPolicy)) {
				return l.failAt(fp, "[sandbox]: network must be \"none\", \"host\" or \"policy\"")
			}
			sb.network = Network(s)
		case "memory", "tmp_size":
			var v any
			l.md.PrimitiveDecode(fp, &v)
			n, err := parseSize(v)
			if err != nil {
				return l.failAt(fp, "[sandbox]: %s: %v", k, err)
			}
			if k == "memory" {
				sb.memory = n
			} else {
				sb.tmpSize = n
			}
		case "pids", "connections":
			var n int64
			if err := l.md.PrimitiveDecode(fp, &n); err != nil || n <= 0 || n > math.MaxInt32 {
				return l.failAt(fp, "[sandbox]: %s must be an integer from 1 to %d", k, math.MaxInt32)
			}
			if k == "pids" {
				sb.pids = int(n)
			} else {
				sb.connections = int(n)
			}
		case "hosts":
			var h string
			if err := l.md.PrimitiveDecode(fp, &h); err != nil || !filepath.IsAbs(h) || filepath.Clean(h) != h {
				return l.failAt(fp, "[sandbox]: hosts must be the absolute, clean path of a hosts(5) file")
			}
			sb.hosts = h
		case "reach_private":
			if err := l.sandboxReach(sb, fp); err != nil {
				return err
			}
		default:
			return l.failAt(fp, "[sandbox]: unknown key %q (want binaries, network, memory, pids, tmp_size, connections, reach_private, hosts)", k)
		}
	}
	if !hasBinaries {
		return l.failAt(prim, "[sandbox]: binaries is required (an empty array allows nothing)")
	}
	c.sandbox = sb
	return nil
}

// sandboxBinaries reads [sandbox] binaries: absolute paths of files, or of
// directories ending in "/".
func (l *loader) sandboxBinaries(sb *Sandbox, fp toml.Primitive) error {
	var list []any
	if err := l.md.PrimitiveDecode(fp, &list); err != nil {
		return l.failAt(fp, "[sandbox]: binaries must be an array of absolute paths")
	}
	for _, v := range list {
		s, ok := v.(string)
		if !ok {
			return l.failAt(fp, "[sandbox]: binaries: %v is not a string", v)
		}
		if err := checkBinary(s); err != nil {
			return l.failAt(fp, "[sandbox]: binaries: %q: %v", s, err)
		}
		if strings.HasSuffix(s, "/") {
			sb.dirs[strings.TrimSuffix(s, "/")] = true
		} else {
			sb.files[s] = true
		}
		if sp, rest, ok := viewPath(strings.TrimSuffix(s, "/")); ok {
			sb.view = append(sb.view, viewEntry{sp, rest, strings.HasSuffix(s, "/")})
		}
		sb.binaries = append(sb.binaries, s)
	}
	return nil
}

// sandboxReach reads [sandbox] reach_private: addresses or CIDR prefixes.
func (l *loader) sandboxReach(sb *Sandbox, fp toml.Primitive) error {
	var list []any
	if err := l.md.PrimitiveDecode(fp, &list); err != nil {
		return l.failAt(fp, "[sandbox]: reach_private must be an array of addresses or CIDR prefixes")
	}
	sb.reachPrivate = []netip.Prefix{}
	for _, v := range list {
		s, ok := v.(string)
		if !ok {
			return l.failAt(fp, "[sandbox]: reach_private: %v is not a string", v)
		}
		p, err := parseReach(s)
		if err != nil {
			return l.failAt(fp, "[sandbox]: reach_private: %q: %v", s, err)
		}
		sb.reachPrivate = append(sb.reachPrivate, p)
	}
	return nil
}

// checkBinary accepts an absolute, canonical path: a file, or a directory
// ending in "/" (everything beneath it).
func checkBinary(s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return errors.New("a path must not hold NUL")
	}
	if !strings.HasPrefix(s, "/") {
		return errors.New("not an absolute path")
	}
	if s == "/" {
		return nil
	}
	for _, seg := range strings.Split(strings.TrimSuffix(s[1:], "/"), "/") {
		switch seg {
		case "":
			return errors.New("a path must not hold \"//\"")
		case ".", "..":
			return fmt.Errorf("a path must not hold a %q segment", seg)
		}
	}
	if sp, rest, ok := viewPath(s); ok && rest == "/" {
		return fmt.Errorf("names the %s space itself, not a file: write \"/%s/\" for everything in it", sp, sp)
	}
	return nil
}

var sizeRe = lazyregexp.New(`^([0-9]+)(B|KiB|MiB|GiB|TiB)?$`)

var sizeUnits = map[string]int64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

// parseSize reads a size: an integer of bytes, or a string of digits with
// an optional binary unit ("256MiB", "1GiB"). Decimal units (MB, GB) are
// refused rather than guessed at.
func parseSize(v any) (int64, error) {
	const want = "want a positive integer of bytes or a string such as \"256MiB\" (units B, KiB, MiB, GiB, TiB)"
	switch v := v.(type) {
	case int64:
		if v <= 0 {
			return 0, errors.New(want)
		}
		return v, nil
	case string:
		m := sizeRe().FindStringSubmatch(v)
		if m == nil {
			return 0, errors.New(want)
		}
		n, err := strconv.ParseInt(m[1], 10, 64)
		unit := sizeUnits[m[2]]
		if err != nil || n > math.MaxInt64/unit {
			return 0, errors.New("too large")
		}
		if n == 0 {
			return 0, errors.New(want)
		}
		return n * unit, nil
	}
	return 0, errors.New(want)
}

// parseReach reads an address or a CIDR prefix. A zone, an IPv4-mapped
// IPv6 form or a prefix with host bits set is refused: each could be read
// as something other than what the run is then allowed to reach.
func parseReach(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return p, errors.New("not a CIDR prefix")
		}
		if p.Masked() != p {
			return p, fmt.Errorf("host bits are set: write %s", p.Masked())
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return p, errors.New("not an address or a CIDR prefix")
		}
		if a.Zone() != "" {
			return p, errors.New("an address with a zone")
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return p, fmt.Errorf("an IPv4-mapped address: write the IPv4 form")
	}
	return p, nil
}
