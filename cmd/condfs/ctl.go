package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/pflag"

	"github.com/condfs/condfs/control"
)

const ctlUsage = `Usage: condfs ctl [--socket PATH] [--json] COMMAND ...

Commands (one per control method):
  open ID MOUNT --context ATOM... [--owner UID] [--allow-uid UID]...
                                      session.open: mount a view for a new session
  close ID                            session.close: unmount it
  list                                session.list
  context ID [ATOM... | JSON]         context.get, or context.set with atoms
  blocks (ID | --context ATOM...)     blocks.list: the prompt blocks it selects
  check (ID | --context ATOM...) SPACE PATH
                                      path.check: would it see the path, and why
  decide [--session ID] [--role R]... --tool T [--args JSON] [--ctx JSON]
                                      tool.decide
  reload                              config.reload
  status                              status
  call METHOD [PARAMS-JSON]           any method, raw

Human output by default; --json prints the raw result.
`

func runCtl(args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("ctl", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SetInterspersed(true)
	socket := fs.String("socket", envOr("CONDFS_SOCKET", defaultSocket), "control socket path (env CONDFS_SOCKET)")
	asJSON := fs.Bool("json", false, "print the raw JSON result")
	atoms := fs.StringArray("context", nil, "a context atom, or one JSON context; repeat")
	session := fs.String("session", "", "the session (decide)")
	roles := fs.StringArray("role", nil, "a caller role (decide); repeat")
	tool := fs.String("tool", "", "the tool (decide)")
	argsJSON := fs.String("args", "{}", "the call's arguments, a JSON object (decide)")
	ctxJSON := fs.String("ctx", "", "caller attributes, a JSON object (decide)")
	owner := fs.Int("owner", -1, "the uid the view serves (open; root or the daemon's uid only)")
	letIn := fs.UintSlice("allow-uid", nil, "another uid let into the view (open; root or the daemon's uid only); repeat")
	fs.Usage = func() { fmt.Fprint(stderr, ctlUsage+"\nFlags:\n"+fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return exitError{exitUsage}
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return exitError{exitUsage}
	}
	// Each subcommand takes only its own flags: a flag that would be
	// ignored (ctl list --tool x) is a usage error, never silence.
	own := map[string][]string{
		"open": {"context", "owner", "allow-uid"}, "blocks": {"context"}, "check": {"context"},
		"decide": {"session", "role", "tool", "args", "ctx"},
	}
	bad := ""
	fs.Visit(func(f *pflag.Flag) {
		if f.Name == "socket" || f.Name == "json" || bad != "" {
			return
		}
		for _, ok := range own[rest[0]] {
			if f.Name == ok {
				return
			}
		}
		bad = f.Name
	})
	if bad != "" {
		fmt.Fprintf(stderr, "condfs ctl %s does not take --%s (see condfs ctl --help)\n", rest[0], bad)
		return exitError{exitUsage}
	}
	need := func(n int, form string) error {
		if len(rest) != n {
			fmt.Fprintf(stderr, "condfs ctl: usage: condfs ctl %s\n", form)
			return exitError{exitUsage}
		}
		return nil
	}
	ctxParam := func() (json.RawMessage, error) {
		set, err := parseContextFlags(*atoms)
		if err != nil {
			return nil, err
		}
		return json.Marshal(set.Atoms())
	}
	var method string
	var params any = map[string]any{}
	switch rest[0] {
	case "open":
		if err := need(3, "open ID MOUNT --context ATOM..."); err != nil {
			return err
		}
		c, err := ctxParam()
		if err != nil {
			return fmt.Errorf("%v", err)
		}
		mnt, err := filepath.Abs(rest[2])
		if err != nil {
			return fmt.Errorf("mountpoint %s: %v", rest[2], err)
		}
		p := map[string]any{"id": rest[1], "mount": mnt, "context": c}
		if *owner >= 0 {
			p["owner"] = *owner
		}
		if len(*letIn) > 0 {
			p["allow_uids"] = *letIn
		}
		method, params = "session.open", p
	case "close":
		if err := need(2, "close ID"); err != nil {
			return err
		}
		method, params = "session.close", map[string]any{"id": rest[1]}
	case "list":
		method = "session.list"
	case "context":
		if len(rest) < 2 {
			return need(2, "context ID [ATOM... | JSON]")
		}
		if len(rest) == 2 {
			method, params = "context.get", map[string]any{"session": rest[1]}
			break
		}
		set, err := parseContextFlags(rest[2:])
		if err != nil {
			return err
		}
		method, params = "context.set", map[string]any{"session": rest[1], "context": set.Atoms()}
	case "blocks":
		p := map[string]any{}
		if len(rest) == 2 {
			p["session"] = rest[1]
		} else {
			c, err := ctxParam()
			if err != nil {
				return err
			}
			p["context"] = c
		}
		method, params = "blocks.list", p
	case "check":
		p := map[string]any{}
		switch len(rest) {
		case 4:
			p["session"], p["space"], p["path"] = rest[1], rest[2], rest[3]
		case 3:
			c, err := ctxParam()
			if err != nil {
				return err
			}
			p["context"], p["space"], p["path"] = c, rest[1], rest[2]
		default:
			return need(4, "check (ID | --context ATOM...) SPACE PATH")
		}
		method, params = "path.check", p
	case "decide":
		if *tool == "" {
			fmt.Fprintln(stderr, "condfs ctl decide: --tool is required")
			return exitError{exitUsage}
		}
		p := map[string]any{"tool": *tool, "args": json.RawMessage(*argsJSON)}
		if !json.Valid([]byte(*argsJSON)) {
			return fmt.Errorf("--args is not valid JSON")
		}
		if *ctxJSON != "" {
			if !json.Valid([]byte(*ctxJSON)) {
				return fmt.Errorf("--ctx is not valid JSON")
			}
			p["ctx"] = json.RawMessage(*ctxJSON)
		}
		if *session != "" {
			p["session"] = *session
		}
		if len(*roles) > 0 {
			p["roles"] = *roles
		}
		method, params = "tool.decide", p
	case "reload":
		method = "config.reload"
	case "status":
		method = "status"
	case "call":
		if len(rest) < 2 || len(rest) > 3 {
			return need(3, "call METHOD [PARAMS-JSON]")
		}
		method = rest[1]
		if len(rest) == 3 {
			if !json.Valid([]byte(rest[2])) {
				return fmt.Errorf("params are not valid JSON")
			}
			params = json.RawMessage(rest[2])
		}
	default:
		fmt.Fprintf(stderr, "condfs ctl: unknown command %q\n\n", rest[0])
		fs.Usage()
		return exitError{exitUsage}
	}
	c, err := control.Dial(*socket)
	if err != nil {
		return fmt.Errorf("cannot reach the daemon at %s: %v (is condfs serve running? pass --socket or set CONDFS_SOCKET)", *socket, err)
	}
	defer c.Close()
	var result json.RawMessage
	if err := c.Call(method, params, &result); err != nil {
		var rpcErr *control.Error
		if errors.As(err, &rpcErr) {
			fmt.Fprintf(stderr, "condfs ctl %s: %s\n", rest[0], rpcErr.Message)
			return exitError{exitFail}
		}
		return err
	}
	if *asJSON {
		_, err := fmt.Fprintf(stdout, "%s\n", result)
		return err
	}
	return printHuman(stdout, method, result)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// printHuman renders a result for people.
func printHuman(w io.Writer, method string, raw json.RawMessage) error {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		_, err := fmt.Fprintf(w, "%s\n", raw)
		return err
	}
	atoms := func(v any) string {
		list, _ := v.([]any)
		var s []string
		for _, a := range list {
			s = append(s, fmt.Sprint(a))
		}
		if len(s) == 0 {
			return "(empty context)"
		}
		return strings.Join(s, " ")
	}
	switch method {
	case "session.open":
		fmt.Fprintf(w, "session %v mounted at %v\ncontext: %s\n", m["id"], m["mount"], atoms(m["atoms"]))
	case "session.close":
		fmt.Fprintln(w, "closed")
	case "session.list":
		list, _ := m["sessions"].([]any)
		if len(list) == 0 {
			fmt.Fprintln(w, "no sessions")
		}
		for _, s := range list {
			sm, _ := s.(map[string]any)
			fmt.Fprintf(w, "%-16v %-32v %s\n", sm["id"], sm["mount"], atoms(sm["atoms"]))
		}
	case "context.set", "context.get":
		fmt.Fprintf(w, "context: %s\n", atoms(m["atoms"]))
	case "blocks.list":
		blocks, _ := m["blocks"].([]any)
		if len(blocks) == 0 {
			fmt.Fprintln(w, "no prompt blocks for this context")
		}
		for _, b := range blocks {
			bm, _ := b.(map[string]any)
			fmt.Fprintf(w, "== %v: %v\n%v", bm["name"], bm["description"], bm["body"])
			if body, _ := bm["body"].(string); !strings.HasSuffix(body, "\n") {
				fmt.Fprintln(w)
			}
		}
		errs, _ := m["errors"].([]any)
		for _, e := range errs {
			em, _ := e.(map[string]any)
			fmt.Fprintf(w, "error: block %v (%v): %v\n", em["name"], em["file"], em["reason"])
		}
	case "path.check":
		fmt.Fprintf(w, "%v: %v (%v)\n", m["path"], m["decision"], m["why"])
		rules, _ := m["rules"].([]any)
		for _, r := range rules {
			rm, _ := r.(map[string]any)
			fmt.Fprintf(w, "  rule %v %v when %v: holds=%v\n", rm["key"], rm["action"], rm["when"], rm["holds"])
		}
	case "tool.decide":
		role := "-"
		if m["role"] != nil {
			role = fmt.Sprint(m["role"])
		}
		fmt.Fprintf(w, "%v (role %s)\n", m["decision"], role)
		reasons, _ := m["reasons"].([]any)
		for _, r := range reasons {
			fmt.Fprintf(w, "  because %v\n", r)
		}
	default:
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			b, _ := json.Marshal(m[k])
			fmt.Fprintf(w, "%s: %s\n", k, b)
		}
	}
	return nil
}
