package constraints

import (
	"fmt"

	"github.com/condfs/condfs/constraints/internal/expr"
	"github.com/condfs/condfs/constraints/internal/value"
	cctx "github.com/condfs/condfs/context"
)

// Request limits from the spec.
const (
	MaxArgsBytes = 1 << 20
	MaxRoles     = 32
)

// Request is one tool call to decide.
type Request struct {
	Roles []string  // the caller's roles in order; none means "default"
	Tool  string    // the tool name
	Args  *Value    // an object; nil means {}
	Ctx   *Value    // caller attributes, an object; nil means {}
	Atoms *cctx.Set // the calling session's context; nil when there is none
	// Session is the session the call names; the daemon sets Atoms from
	// it. Decide never reads it.
	Session string
	// Invalid, when set, says why the request could not be decoded; the
	// call is then denied with it.
	Invalid string
}

// Decision is the outcome of a call.
type Decision struct {
	Decision Mode     `json:"decision"`
	Role     *string  `json:"role"`
	Reasons  []string `json:"reasons"`
}

var emptyObject, _ = value.MakeObject(nil)

// ParseArgs decodes a JSON object of arguments (or ctx) strictly, within
// the request limits.
func ParseArgs(raw []byte) (Value, error) {
	if len(raw) > MaxArgsBytes {
		return Value{}, fmt.Errorf("arguments are %d bytes, over the %d-byte limit", len(raw), MaxArgsBytes)
	}
	v, err := value.Decode(string(raw), value.RequestLimits)
	if err != nil {
		return Value{}, fmt.Errorf("invalid JSON: %w", err)
	}
	if v.Kind() != value.Object {
		return Value{}, fmt.Errorf("must be a JSON object, not %s", v.Kind())
	}
	return v, nil
}

func deny(reasons ...string) Decision {
	return Decision{Decision: Deny, Reasons: reasons}
}

// Decide decides one call. It never fails and is safe for concurrent use.
func (p *Policy) Decide(r *Request) Decision { return p.decide(r, nil) }

// decide is Decide, recording in cov (if set) the constraints made false.
func (p *Policy) decide(r *Request, cov *Coverage) Decision {
	if r.Invalid != "" {
		return deny("invalid request: " + r.Invalid)
	}
	if len(r.Roles) > MaxRoles {
		return deny(fmt.Sprintf("invalid request: %d roles, more than %d", len(r.Roles), MaxRoles))
	}
	if p == nil || p.roles == nil {
		return deny("no policy is loaded: every call is denied")
	}
	e, _ := p.envs.Get().(*expr.Env)
	if e == nil {
		e = new(expr.Env)
	}
	defer p.envs.Put(e)
	*e = expr.Env{Args: r.Args, Ctx: r.Ctx, Atoms: r.Atoms, Tool: value.MakeString(r.Tool), Role: value.MakeNull()}
	if e.Args == nil {
		e.Args = &emptyObject
	}
	if e.Ctx == nil {
		e.Ctx = &emptyObject
	}
	if len(r.Roles) == 0 {
		return p.decideRole(e, r.Tool, "default", nil, cov)
	}
	var approval Decision
	var reasons []string
	for i := range r.Roles {
		name := &r.Roles[i]
		e.Role = value.MakeString(*name)
		d := p.decideRole(e, r.Tool, *name, name, cov)
		switch d.Decision {
		case Allow:
			return d
		case ApprovalRequired:
			if approval.Decision != ApprovalRequired {
				approval = d
			}
		default:
			for _, why := range d.Reasons {
				reasons = append(reasons, "role "+*name+": "+why)
			}
		}
	}
	if approval.Decision == ApprovalRequired {
		return approval
	}
	return deny(reasons...)
}

// decideRole decides for one named role (or for no role when caller is
// nil); unknown roles and mixins fall back to "default".
func (p *Policy) decideRole(e *expr.Env, tool, name string, caller *string, cov *Coverage) Decision {
	ro := p.roles[name]
	if ro == nil {
		ro = p.roles["default"]
		if ro == nil {
			return deny(fmt.Sprintf("role %q is not a role and there is no default role", name))
		}
	}
	ent := ro.tools[tool]
	if ent == nil {
		ent = ro.def
	}
	if ent.mode == Deny {
		return deny(fmt.Sprintf("tool %q is denied for role %s", tool, ro.name))
	}
	if why, ok := runAll(e, ro.pre, cov); !ok {
		return deny(why)
	}
	if why, ok := runAll(e, ent.progs, cov); !ok {
		return deny(why)
	}
	if caller == nil {
		caller = &ro.name
	}
	return Decision{Decision: ent.mode, Role: caller}
}

func runAll(e *expr.Env, progs []*program, cov *Coverage) (string, bool) {
	for _, pr := range progs {
		e.Why = ""
		switch pr.Eval(e) {
		case expr.True:
			continue
		case expr.False:
			if cov != nil {
				cov.falsified[pr] = true
			}
			return pr.falseReason, false
		default:
			why := e.Why
			if why == "" {
				why = "a value is missing or has the wrong type"
			}
			return fmt.Sprintf("constraint `%s` is unknown: %s", pr.Src, why), false
		}
	}
	return "", true
}

// HasRole reports whether the policy defines a selectable role name
// (mixins are not selectable).
func (p *Policy) HasRole(name string) bool {
	if p == nil {
		return false
	}
	_, ok := p.roles[name]
	return ok
}

// MayCall reports whether some call of tool could ever be allowed or sent
// for approval for these roles: false only when every role that would
// decide (default for none, unknown ones or mixins) has mode deny for it,
// listed or by its default. Constraints are not evaluated (they depend on
// the arguments). A gateway uses it to leave tools out of a listing.
func (p *Policy) MayCall(roles []string, tool string) bool {
	if p == nil || p.roles == nil {
		return false
	}
	if len(roles) == 0 {
		roles = []string{"default"}
	}
	for _, name := range roles {
		ro := p.roles[name]
		if ro == nil {
			ro = p.roles["default"]
		}
		if ro == nil {
			continue
		}
		ent := ro.tools[tool]
		if ent == nil {
			ent = ro.def
		}
		if ent.mode != Deny {
			return true
		}
	}
	return false
}
