package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/pflag"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/cli"
)

const ctlUsage = `Usage: condfs ctl [--socket PATH] [--json] COMMAND ...

Commands (one per control method):
  open ID MOUNT --context ATOM... [--owner UID] [--allow-uid UID]... [--changes direct|staged]
                                      session.open: mount a view for a new session
  close ID [--discard]                session.close: unmount it (--discard: drop staged changes)
  list                                session.list
  context ID [ATOM... | JSON]         context.get, or context.set with atoms
  blocks (ID | --context ATOM...)     blocks.list: the prompt blocks it selects
  check (ID | --context ATOM...) SPACE PATH
                                      path.check: would it see the path, and why
  decide [--session ID] [--role R]... --tool T [--args JSON] [--ctx JSON]
                                      tool.decide
  checkpoint ID [--name N]            checkpoint.create: what the session changes from now can be undone
  checkpoints ID                      checkpoint.list
  diff ID [--since C] [--content]     changes.diff: A/M/D and the path, then unified diffs
  rollback ID C [--force]             checkpoint.rollback: undo what the session changed since C
  commit ID [PATH...] [--force]       changes.commit: apply a staged session's changes (PATH: workspace/src)
  discard ID [PATH...]                changes.discard: drop a staged session's changes
  reload                              config.reload
  status                              status
  call METHOD [PARAMS-JSON]           any method, raw

Human output by default; --json prints the raw result.
`

func runCtl(args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("ctl", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SetInterspersed(true)
	socket := fs.String("socket", cli.EnvOr("CONDFS_SOCKET", cli.DefaultSocket()), "control socket path (env CONDFS_SOCKET)")
	asJSON := fs.Bool("json", false, "print the raw JSON result")
	a := &ctlArgs{stderr: stderr}
	fs.StringArrayVar(&a.atoms, "context", nil, "a context atom, or one JSON context; repeat")
	fs.StringVar(&a.session, "session", "", "the session (decide)")
	fs.StringArrayVar(&a.roles, "role", nil, "a caller role (decide); repeat")
	fs.StringVar(&a.tool, "tool", "", "the tool (decide)")
	fs.StringVar(&a.argsJSON, "args", "{}", "the call's arguments, a JSON object (decide)")
	fs.StringVar(&a.ctxJSON, "ctx", "", "caller attributes, a JSON object (decide)")
	fs.IntVar(&a.owner, "owner", -1, "the uid the view serves (open; root or the daemon's uid only)")
	fs.UintSliceVar(&a.letIn, "allow-uid", nil, "another uid let into the view (open; root or the daemon's uid only); repeat")
	fs.StringVar(&a.changes, "changes", "", "direct or staged (open; default: [changes] mode)")
	fs.StringVar(&a.name, "name", "", "the checkpoint's name (checkpoint)")
	fs.StringVar(&a.since, "since", "", "a checkpoint: changes since it (diff; default the oldest)")
	fs.BoolVar(&a.content, "content", false, "unified diffs of text files (diff)")
	fs.BoolVar(&a.force, "force", false, "restore (rollback) or commit paths changed outside the view too")
	fs.BoolVar(&a.discard, "discard", false, "drop a staged session's uncommitted changes (close)")
	fs.Usage = func() { fmt.Fprint(stderr, ctlUsage+"\nFlags:\n"+fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return cli.Exit(cli.ExitUsage)
	}
	a.rest = fs.Args()
	if len(a.rest) == 0 {
		fs.Usage()
		return cli.Exit(cli.ExitUsage)
	}
	build, ok := ctlCommands[a.rest[0]]
	if !ok {
		fmt.Fprintf(stderr, "condfs ctl: unknown command %q\n\n", a.rest[0])
		fs.Usage()
		return cli.Exit(cli.ExitUsage)
	}
	if bad := foreignFlag(fs, a.rest[0]); bad != "" {
		fmt.Fprintf(stderr, "condfs ctl %s does not take --%s (see condfs ctl --help)\n", a.rest[0], bad)
		return cli.Exit(cli.ExitUsage)
	}
	method, params, err := build(a)
	if err != nil {
		return err
	}
	return ctlCall(*socket, a.rest[0], method, params, *asJSON, stdout, stderr)
}

// ctlOwnFlags: each subcommand takes only its own flags (and --socket,
// --json): a flag that would be ignored (ctl list --tool x) is a usage
// error, never silence.
var ctlOwnFlags = map[string][]string{
	"open": {"context", "owner", "allow-uid", "changes"}, "blocks": {"context"}, "check": {"context"},
	"checkpoint": {"name"}, "diff": {"since", "content"}, "rollback": {"force"}, "commit": {"force"},
	"close":  {"discard"},
	"decide": {"session", "role", "tool", "args", "ctx"},
}

// foreignFlag names a flag given that cmd does not take, or "".
func foreignFlag(fs *pflag.FlagSet, cmd string) string {
	bad := ""
	fs.Visit(func(f *pflag.Flag) {
		if f.Name == "socket" || f.Name == "json" || bad != "" || slices.Contains(ctlOwnFlags[cmd], f.Name) {
			return
		}
		bad = f.Name
	})
	return bad
}

// ctlArgs is a ctl command line: its words and flags.
type ctlArgs struct {
	rest                             []string
	atoms, roles                     []string
	session, tool, argsJSON, ctxJSON string
	owner                            int
	letIn                            []uint
	changes, name, since             string
	content, force, discard          bool
	stderr                           io.Writer
}

func (a *ctlArgs) need(n int, form string) error {
	if len(a.rest) != n {
		fmt.Fprintf(a.stderr, "condfs ctl: usage: condfs ctl %s\n", form)
		return cli.Exit(cli.ExitUsage)
	}
	return nil
}

func (a *ctlArgs) ctxParam() (json.RawMessage, error) {
	set, err := cli.ParseContext(a.atoms)
	if err != nil {
		return nil, err
	}
	return json.Marshal(set.Atoms())
}

// ctlCommands turn each ctl command into its method and params.
var ctlCommands = map[string]func(a *ctlArgs) (method string, params any, err error){
	"open":    ctlOpen,
	"close":   ctlClose,
	"list":    func(*ctlArgs) (string, any, error) { return "session.list", map[string]any{}, nil },
	"context": ctlContext,
	"blocks":  ctlBlocks,
	"check":   ctlCheck,
	"decide":  ctlDecide,
	"reload":  func(*ctlArgs) (string, any, error) { return "config.reload", map[string]any{}, nil },
	"status":  func(*ctlArgs) (string, any, error) { return "status", map[string]any{}, nil },
	"call":    ctlRawCall,

	"checkpoint":  ctlCheckpoint,
	"checkpoints": ctlCheckpoints,
	"diff":        ctlDiff,
	"rollback":    ctlRollback,
	"commit":      ctlCommit,
	"discard":     ctlDiscard,
}

func ctlOpen(a *ctlArgs) (string, any, error) {
	if err := a.need(3, "open ID MOUNT --context ATOM..."); err != nil {
		return "", nil, err
	}
	c, err := a.ctxParam()
	if err != nil {
		return "", nil, fmt.Errorf("%v", err)
	}
	mnt, err := filepath.Abs(a.rest[2])
	if err != nil {
		return "", nil, fmt.Errorf("mountpoint %s: %v", a.rest[2], err)
	}
	p := map[string]any{"id": a.rest[1], "mount": mnt, "context": c}
	if a.owner >= 0 {
		p["owner"] = a.owner
	}
	if len(a.letIn) > 0 {
		p["allow_uids"] = a.letIn
	}
	if a.changes != "" {
		p["changes"] = a.changes
	}
	return "session.open", p, nil
}

func ctlClose(a *ctlArgs) (string, any, error) {
	if err := a.need(2, "close ID [--discard]"); err != nil {
		return "", nil, err
	}
	p := map[string]any{"id": a.rest[1]}
	if a.discard {
		p["discard"] = true
	}
	return "session.close", p, nil
}

func ctlContext(a *ctlArgs) (string, any, error) {
	if len(a.rest) < 2 {
		return "", nil, a.need(2, "context ID [ATOM... | JSON]")
	}
	if len(a.rest) == 2 {
		return "context.get", map[string]any{"session": a.rest[1]}, nil
	}
	set, err := cli.ParseContext(a.rest[2:])
	if err != nil {
		return "", nil, err
	}
	return "context.set", map[string]any{"session": a.rest[1], "context": set.Atoms()}, nil
}

func ctlBlocks(a *ctlArgs) (string, any, error) {
	p := map[string]any{}
	if len(a.rest) == 2 {
		p["session"] = a.rest[1]
	} else {
		c, err := a.ctxParam()
		if err != nil {
			return "", nil, err
		}
		p["context"] = c
	}
	return "blocks.list", p, nil
}

func ctlCheck(a *ctlArgs) (string, any, error) {
	p := map[string]any{}
	switch len(a.rest) {
	case 4:
		p["session"], p["space"], p["path"] = a.rest[1], a.rest[2], a.rest[3]
	case 3:
		c, err := a.ctxParam()
		if err != nil {
			return "", nil, err
		}
		p["context"], p["space"], p["path"] = c, a.rest[1], a.rest[2]
	default:
		return "", nil, a.need(4, "check (ID | --context ATOM...) SPACE PATH")
	}
	return "path.check", p, nil
}

func ctlDecide(a *ctlArgs) (string, any, error) {
	if a.tool == "" {
		fmt.Fprintln(a.stderr, "condfs ctl decide: --tool is required")
		return "", nil, cli.Exit(cli.ExitUsage)
	}
	if !json.Valid([]byte(a.argsJSON)) {
		return "", nil, fmt.Errorf("--args is not valid JSON")
	}
	p := map[string]any{"tool": a.tool, "args": json.RawMessage(a.argsJSON)}
	if a.ctxJSON != "" {
		if !json.Valid([]byte(a.ctxJSON)) {
			return "", nil, fmt.Errorf("--ctx is not valid JSON")
		}
		p["ctx"] = json.RawMessage(a.ctxJSON)
	}
	if a.session != "" {
		p["session"] = a.session
	}
	if len(a.roles) > 0 {
		p["roles"] = a.roles
	}
	return "tool.decide", p, nil
}

func ctlRawCall(a *ctlArgs) (string, any, error) {
	if len(a.rest) < 2 || len(a.rest) > 3 {
		return "", nil, a.need(3, "call METHOD [PARAMS-JSON]")
	}
	var params any = map[string]any{}
	if len(a.rest) == 3 {
		if !json.Valid([]byte(a.rest[2])) {
			return "", nil, fmt.Errorf("params are not valid JSON")
		}
		params = json.RawMessage(a.rest[2])
	}
	return a.rest[1], params, nil
}

// ctlCall sends one request and prints its result.
func ctlCall(socket, cmd, method string, params any, asJSON bool, stdout, stderr io.Writer) error {
	c, err := control.Dial(socket)
	if err != nil {
		return fmt.Errorf("cannot reach the daemon at %s: %v (is condfs serve running? pass --socket or set CONDFS_SOCKET)", socket, err)
	}
	defer c.Close()
	var result json.RawMessage
	if err := c.Call(method, params, &result); err != nil {
		var rpcErr *control.Error
		if errors.As(err, &rpcErr) {
			fmt.Fprintf(stderr, "condfs ctl %s: %s\n", cmd, rpcErr.Message)
			return cli.Exit(cli.ExitFail)
		}
		return err
	}
	if asJSON {
		_, err := fmt.Fprintf(stdout, "%s\n", result)
		return err
	}
	return printHuman(stdout, method, result)
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
	if printChanges(w, method, m) {
		return nil
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
