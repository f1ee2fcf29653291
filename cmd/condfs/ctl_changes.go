package main

import (
	"fmt"
	"io"
)

// The ctl commands of checkpoints and rollback (docs/changes.md).

func ctlCheckpoint(a *ctlArgs) (string, any, error) {
	if err := a.need(2, "checkpoint SESSION [--name N]"); err != nil {
		return "", nil, err
	}
	p := map[string]any{"session": a.rest[1]}
	if a.name != "" {
		p["name"] = a.name
	}
	return "checkpoint.create", p, nil
}

func ctlCheckpoints(a *ctlArgs) (string, any, error) {
	if err := a.need(2, "checkpoints SESSION"); err != nil {
		return "", nil, err
	}
	return "checkpoint.list", map[string]any{"session": a.rest[1]}, nil
}

func ctlDiff(a *ctlArgs) (string, any, error) {
	if err := a.need(2, "diff SESSION [--since C] [--content]"); err != nil {
		return "", nil, err
	}
	p := map[string]any{"session": a.rest[1], "content": a.content}
	if a.since != "" {
		p["since"] = a.since
	}
	return "changes.diff", p, nil
}

func ctlRollback(a *ctlArgs) (string, any, error) {
	if err := a.need(3, "rollback SESSION CHECKPOINT [--force]"); err != nil {
		return "", nil, err
	}
	return "checkpoint.rollback", map[string]any{"session": a.rest[1], "checkpoint": a.rest[2], "force": a.force}, nil
}

func ctlCommit(a *ctlArgs) (string, any, error) {
	if len(a.rest) < 2 {
		return "", nil, a.need(2, "commit SESSION [PATH...] [--force]")
	}
	p := map[string]any{"session": a.rest[1], "force": a.force}
	if len(a.rest) > 2 {
		p["paths"] = a.rest[2:]
	}
	return "changes.commit", p, nil
}

func ctlDiscard(a *ctlArgs) (string, any, error) {
	if len(a.rest) < 2 {
		return "", nil, a.need(2, "discard SESSION [PATH...]")
	}
	p := map[string]any{"session": a.rest[1]}
	if len(a.rest) > 2 {
		p["paths"] = a.rest[2:]
	}
	return "changes.discard", p, nil
}

// printChanges renders the results of the changes methods; false for any
// other method.
func printChanges(w io.Writer, method string, m map[string]any) bool {
	switch method {
	case "checkpoint.create":
		fmt.Fprintf(w, "checkpoint %v %v at %v\n", m["id"], m["name"], m["created"])
	case "checkpoint.list":
		list, _ := m["checkpoints"].([]any)
		if len(list) == 0 {
			fmt.Fprintln(w, "no checkpoints")
		}
		for _, c := range list {
			cm, _ := c.(map[string]any)
			fmt.Fprintf(w, "%-6v %-24v %v  %v changed\n", cm["id"], cm["name"], cm["created"], cm["changes"])
		}
	case "checkpoint.rollback":
		fmt.Fprintf(w, "restored %v\n", m["restored"])
		conflicts, _ := m["conflicts"].([]any)
		for _, c := range conflicts {
			cm, _ := c.(map[string]any)
			fmt.Fprintf(w, "conflict %v%v: %v\n", cm["space"], cm["path"], cm["reason"])
		}
		if len(conflicts) > 0 {
			fmt.Fprintln(w, "(left as they are; --force restores them)")
		}
	case "changes.commit":
		fmt.Fprintf(w, "committed %v\n", m["committed"])
		conflicts, _ := m["conflicts"].([]any)
		for _, c := range conflicts {
			cm, _ := c.(map[string]any)
			fmt.Fprintf(w, "conflict %v%v: %v\n", cm["space"], cm["path"], cm["reason"])
		}
		if len(conflicts) > 0 {
			fmt.Fprintln(w, "(left staged; --force commits them over the backing tree)")
		}
	case "changes.discard":
		fmt.Fprintf(w, "discarded %v\n", m["discarded"])
	case "changes.diff":
		list, _ := m["changes"].([]any)
		var diffs []string
		for _, c := range list {
			cm, _ := c.(map[string]any)
			letter := map[any]string{"added": "A", "modified": "M", "deleted": "D"}[cm["change"]]
			fmt.Fprintf(w, "%s %v%v\n", letter, cm["space"], cm["path"])
			if d, _ := cm["diff"].(string); d != "" {
				diffs = append(diffs, d)
			} else if b, _ := cm["binary"].(bool); b {
				diffs = append(diffs, fmt.Sprintf("Binary files differ: %v%v\n", cm["space"], cm["path"]))
			}
		}
		if h, _ := m["hidden"].(float64); h > 0 {
			fmt.Fprintf(w, "(%v more the session's context does not show)\n", h)
		}
		for _, d := range diffs {
			fmt.Fprint(w, "\n"+d)
		}
	default:
		return false
	}
	return true
}
