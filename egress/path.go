package egress

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// normalPath is req's path as decided and forwarded (RFC 3986 6.2.2):
// percent-encodings of unreserved characters decoded, the others in upper
// case, dot segments removed; then "?" and the query exactly as sent, when
// there is one. A character a path may not hold, a bad percent-encoding, or
// a result starting with "//" (read as an authority by some servers) is an
// error.
func normalPath(req *http.Request) (string, error) {
	raw := req.RequestURI
	if req.Method == http.MethodOptions && raw == "*" {
		return "*", nil
	}
	if i := strings.Index(raw, "://"); i >= 0 && !strings.HasPrefix(raw, "/") {
		rest := raw[i+3:]
		j := strings.IndexAny(rest, "/?")
		if j < 0 {
			raw = "/"
		} else {
			raw = rest[j:]
			if raw[0] == '?' {
				raw = "/" + raw
			}
		}
	}
	if !strings.HasPrefix(raw, "/") {
		return "", fmt.Errorf("%q is not an absolute path", raw)
	}
	p, q, hasQuery := strings.Cut(raw, "?")
	if strings.ContainsRune(q, '#') || strings.ContainsRune(p, '#') {
		return "", errors.New("a request target holds no fragment")
	}
	np, err := decodeUnreserved(p, false)
	if err != nil {
		return "", err
	}
	if err := ambiguous(np); err != nil {
		return "", err
	}
	np = removeDots(np)
	if strings.HasPrefix(np, "//") {
		return "", fmt.Errorf("%q starts with \"//\"", np)
	}
	if !hasQuery {
		return np, nil
	}
	if _, err := decodeUnreserved(q, true); err != nil {
		return "", fmt.Errorf("query: %w", err)
	}
	return np + "?" + q, nil
}

// ambiguous refuses what servers read in more than one way, so that the
// decided path is the one every server reads: an encoded "/", "\\" or NUL
// (a server that decodes before it splits sees other segments), ";"
// parameters in any segment (servers that drop them, as Tomcat does, read
// "/;x/private" or "/private;x" as "/private": TestEgressParamSegmentPathDecided),
// and an empty segment before the last (nginx merges "/a//b" into "/a/b").
func ambiguous(p string) error {
	for _, e := range []string{"%2F", "%5C", "%00", "%3B"} {
		if strings.Contains(p, e) {
			return fmt.Errorf("%q holds %s", p, e)
		}
	}
	if strings.Contains(p, ";") {
		return fmt.Errorf("%q holds \";\" (path parameters, which some servers drop)", p)
	}
	if i := strings.Index(p, "//"); i >= 0 {
		return fmt.Errorf("%q holds an empty segment (\"//\", which some servers merge)", p)
	}
	return nil
}

const hexDigits = "0123456789ABCDEF"

// decodeUnreserved decodes the percent-encoded unreserved characters of s
// and writes the other encodings in upper case, refusing what a path (or,
// query, a query) may not hold.
func decodeUnreserved(s string, query bool) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) || unhex(s[i+1]) < 0 || unhex(s[i+2]) < 0 {
				return "", fmt.Errorf("bad percent-encoding at %q", s[i:])
			}
			v := byte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			if unreserved(v) {
				b.WriteByte(v)
			} else {
				b.WriteByte('%')
				b.WriteByte(hexDigits[v>>4])
				b.WriteByte(hexDigits[v&15])
			}
			i += 2
		case unreserved(c) || strings.IndexByte("!$&'()*+,;=:@/", c) >= 0 || query && c == '?':
			b.WriteByte(c)
		default:
			return "", fmt.Errorf("%q may not appear unencoded", c)
		}
	}
	return b.String(), nil
}

func unreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

// removeDots is RFC 3986 5.2.4 on an absolute path.
func removeDots(p string) string {
	var out []string
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/")
}
