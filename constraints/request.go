package constraints

import (
	"fmt"

	"github.com/condfs/condfs/constraints/internal/value"
	cctx "github.com/condfs/condfs/context"
)

// DecodeBatchRequest decodes one `policy eval --batch` line:
// {"role"|"roles","tool","args","ctx","context"}. It never fails: a bad
// line yields a Request whose Invalid says why, which Decide denies. A
// batch has no daemon, so no session.
func DecodeBatchRequest(line []byte) Request {
	req := DecodeRequest(line)
	if req.Session != "" && req.Invalid == "" {
		req.Invalid = `unknown field "session" (a batch line names no session; give "context")`
	}
	return req
}

// DecodeRequest decodes a call once, whole: the fields role, roles, tool,
// args, ctx, and either context or session (whose context the daemon adds
// to Atoms). It never fails: an unknown or wrong-typed field, a duplicate
// key, invalid UTF-8 or oversized input sets Invalid, which Decide denies.
func DecodeRequest(raw []byte) (req Request) {
	if len(raw) > MaxArgsBytes+64<<10 {
		req.Invalid = fmt.Sprintf("request is %d bytes, over the limit", len(raw))
		return req
	}
	v, err := value.Decode(string(raw), value.RequestLimits)
	if err != nil {
		req.Invalid = "invalid JSON: " + err.Error()
		return req
	}
	if v.Kind() != value.Object {
		req.Invalid = "a request must be a JSON object"
		return req
	}
	invalid := func(format string, a ...any) {
		if req.Invalid == "" {
			req.Invalid = fmt.Sprintf(format, a...)
		}
	}
	hasRole := false
	members := v.Members()
	for i := range members {
		named, why := req.member(&members[i])
		hasRole = hasRole || named
		if why != "" {
			invalid("%s", why)
		}
	}
	if hasRole && len(req.Roles) > 1 {
		invalid("give role or roles, not both")
	}
	if req.Session != "" && req.Atoms != nil {
		invalid("give session or context, not both")
	}
	if req.Tool == "" {
		invalid("tool is required")
	}
	return req
}

// member reads one member of a request into req: whether it named a role
// (role: "r"), and what is wrong with it, if anything.
func (req *Request) member(m *value.Member) (role bool, why string) {
	switch m.Key {
	case "role":
		switch m.Val.Kind() {
		case value.Null:
		case value.String:
			req.Roles = append(req.Roles, m.Val.Str())
			return true, ""
		default:
			return false, "role must be a string or null"
		}
	case "roles":
		switch {
		case m.Val.Kind() == value.Null:
		case m.Val.Kind() != value.Array:
			return false, "roles must be an array of strings"
		case len(m.Val.Elems()) > MaxRoles:
			return false, fmt.Sprintf("%d roles, more than %d", len(m.Val.Elems()), MaxRoles)
		default:
			for _, r := range m.Val.Elems() {
				if r.Kind() != value.String {
					return false, "roles must be an array of strings"
				}
				req.Roles = append(req.Roles, r.Str())
			}
		}
	case "tool":
		if m.Val.Kind() != value.String || m.Val.Str() == "" {
			return false, "tool must be a non-empty string"
		}
		req.Tool = m.Val.Str()
	case "args":
		if m.Val.Kind() != value.Object {
			return false, "args must be a JSON object"
		}
		req.Args = &m.Val
	case "ctx":
		if m.Val.Kind() != value.Object {
			return false, "ctx must be a JSON object"
		}
		req.Ctx = &m.Val
	case "context":
		set, err := contextOf(m.Val)
		if err != nil {
			return false, fmt.Sprintf("context: %v", err)
		}
		req.Atoms = &set
	case "session":
		if m.Val.Kind() != value.String || m.Val.Str() == "" {
			return false, "session must be a non-empty string"
		}
		req.Session = m.Val.Str()
	default:
		return false, fmt.Sprintf("unknown field %q (a call has role or roles, tool, args, ctx, and context or session)", m.Key)
	}
	return false, ""
}

// contextOf reads a context from the decoded request, without encoding it
// again: an array of atoms, or a description object.
func contextOf(v value.Value) (cctx.Set, error) {
	switch v.Kind() {
	case value.Array:
		atoms := make([]string, 0, len(v.Elems()))
		for _, e := range v.Elems() {
			if e.Kind() != value.String {
				return cctx.Set{}, fmt.Errorf("atoms must be strings")
			}
			atoms = append(atoms, e.Str())
		}
		return cctx.NewSet(atoms)
	case value.Object:
		var d cctx.Description
		for _, m := range v.Members() {
			field := map[string]*string{"kind": &d.Kind, "channel_id": &d.ChannelID, "guild_id": &d.GuildID, "parent_id": &d.ParentID}[m.Key]
			switch {
			case field != nil && m.Val.Kind() == value.String:
				*field = m.Val.Str()
			case m.Key == "nsfw" && m.Val.Kind() == value.Bool:
				d.NSFW = m.Val.Bool()
			case field != nil || m.Key == "nsfw":
				return cctx.Set{}, fmt.Errorf("description field %q has the wrong type", m.Key)
			default:
				return cctx.Set{}, fmt.Errorf("description: unknown field %q", m.Key)
			}
		}
		return d.Derive()
	}
	return cctx.Set{}, fmt.Errorf("must be an array of atoms or a description object")
}
