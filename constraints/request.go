package constraints

import (
	"fmt"

	"github.com/condfs/condfs/constraints/internal/value"
	cctx "github.com/condfs/condfs/context"
)

// DecodeBatchRequest decodes one `policy eval --batch` line:
// {"role"|"roles","tool","args","ctx","context"}. It never fails: a bad
// line yields a Request whose Invalid says why, which Decide denies.
func DecodeBatchRequest(line []byte) Request {
	req, rest := DecodeRequest(line)
	for k := range rest {
		if req.Invalid == "" {
			req.Invalid = fmt.Sprintf("unknown field %q", k)
		}
	}
	return req
}

// DecodeRequest decodes a call object with the fields role, roles, tool,
// args, ctx and context; other fields are returned in rest for the caller
// (the daemon takes "session"). Decoding is strict: duplicate keys, invalid
// UTF-8 and oversized input set Invalid.
func DecodeRequest(raw []byte) (req Request, rest map[string]Value) {
	if len(raw) > MaxArgsBytes+64<<10 {
		req.Invalid = fmt.Sprintf("request is %d bytes, over the limit", len(raw))
		return req, nil
	}
	v, err := value.Decode(string(raw), value.RequestLimits)
	if err != nil {
		req.Invalid = "invalid JSON: " + err.Error()
		return req, nil
	}
	if v.Kind() != value.Object {
		req.Invalid = "a request must be a JSON object"
		return req, nil
	}
	invalid := func(format string, a ...any) {
		if req.Invalid == "" {
			req.Invalid = fmt.Sprintf(format, a...)
		}
	}
	hasRole := false
	members := v.Members()
	for i := range members {
		m := &members[i]
		switch m.Key {
		case "role":
			switch m.Val.Kind() {
			case value.Null:
			case value.String:
				hasRole = true
				req.Roles = append(req.Roles, m.Val.Str())
			default:
				invalid("role must be a string or null")
			}
		case "roles":
			if m.Val.Kind() == value.Null {
				continue
			}
			if m.Val.Kind() != value.Array {
				invalid("roles must be an array of strings")
				continue
			}
			if len(m.Val.Elems()) > MaxRoles {
				invalid("%d roles, more than %d", len(m.Val.Elems()), MaxRoles)
				continue
			}
			for _, r := range m.Val.Elems() {
				if r.Kind() != value.String {
					invalid("roles must be an array of strings")
					break
				}
				req.Roles = append(req.Roles, r.Str())
			}
		case "tool":
			if m.Val.Kind() != value.String || m.Val.Str() == "" {
				invalid("tool must be a non-empty string")
				continue
			}
			req.Tool = m.Val.Str()
		case "args":
			if m.Val.Kind() != value.Object {
				invalid("args must be a JSON object")
				continue
			}
			req.Args = &m.Val
		case "ctx":
			if m.Val.Kind() != value.Object {
				invalid("ctx must be a JSON object")
				continue
			}
			req.Ctx = &m.Val
		case "context":
			set, err := cctx.Parse([]byte(m.Val.String()))
			if err != nil {
				invalid("context: %v", err)
				continue
			}
			req.Atoms = &set
		default:
			if rest == nil {
				rest = map[string]Value{}
			}
			rest[m.Key] = m.Val
		}
	}
	if hasRole && len(req.Roles) > 1 {
		invalid("give role or roles, not both")
	}
	if req.Tool == "" {
		invalid("tool is required")
	}
	return req, rest
}
