package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/condfs/condfs/changes"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/cli"
	"github.com/condfs/condfs/internal/jsonwire"
)

// maxHookInput bounds the hook's stdin: a tool call's input (a file
// written whole by Write) is the largest part.
const maxHookInput = 8 << 20

// runHook is `condfs hook claude-code`: a Claude Code PreToolUse hook that
// decides each tool call through the daemon. Claude Code lets a call
// through when a hook crashes or exits unexpectedly, so this command never
// does either: every failure prints a deny with its reason and exits 0.
func runHook(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "claude-code" {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			fmt.Fprintln(stdout, "Usage: condfs hook claude-code [--socket S] (--session ID | --context ATOM...) [--role R]... [--timeout 2s]")
			return nil
		}
		fmt.Fprintln(stderr, "condfs hook: usage: condfs hook claude-code [--socket S] (--session ID | --context ATOM...) [--role R]...")
		return cli.Exit(cli.ExitUsage)
	}
	fs := cli.NewFlags("hook claude-code",
		"condfs hook claude-code [--socket S] (--session ID | --context ATOM...) [--role R]... [--timeout 2s]",
		`A Claude Code PreToolUse hook: reads the hook's JSON on stdin, decides tool_name with
tool_input as args through the daemon (tool.decide), and prints the permission decision
(allow, deny, or ask for approval_required). Any failure is a deny, with exit status 0.`, stderr)
	socket := fs.String("socket", cli.EnvOr("CONDFS_SOCKET", cli.DefaultSocket()), "control socket path (env CONDFS_SOCKET)")
	session := fs.String("session", "", "the condfs session whose context when() tests")
	atoms := fs.StringArray("context", nil, "the context, when there is no session: an atom (repeat) or a JSON description")
	roles := fs.StringArray("role", nil, "a caller role; repeat")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the daemon")
	viaRun := fs.Bool("bash-via-run", false, "run every Bash call that is not denied through condfs run under --session (the boundary for commands)")
	checkpoint := fs.Bool("checkpoint", false, "make a checkpoint of --session before each allowed tool call that can write, named after its tool_use_id (docs/changes.md)")
	if err := cli.ParseFlags(fs, args[1:]); err != nil {
		return err
	}
	if (*session == "") == (len(*atoms) == 0) {
		return cli.UsageErr(stderr, fs, "give --session or --context (one of them)")
	}
	if *viaRun && *session == "" {
		return cli.UsageErr(stderr, fs, "--bash-via-run needs --session: condfs run runs under a session")
	}
	if *checkpoint && *session == "" {
		return cli.UsageErr(stderr, fs, "--checkpoint needs --session: checkpoints are a session's")
	}
	var ctxParam []string
	if len(*atoms) > 0 {
		set, err := cli.ParseContext(*atoms)
		if err != nil {
			return cli.UsageErr(stderr, fs, "--context: %v", err)
		}
		ctxParam = set.Atoms()
	}
	decision, reason, updated := hookDecide(os.Stdin, hookOptions{
		socket: *socket, session: *session, atoms: ctxParam, roles: *roles,
		timeout: *timeout, viaRun: *viaRun, checkpoint: *checkpoint,
	})
	specific := map[string]any{
		"hookEventName":            "PreToolUse",
		"permissionDecision":       decision,
		"permissionDecisionReason": reason,
	}
	if updated != nil && decision != "deny" {
		// The tool runs with the input decided: its paths resolved.
		specific["updatedInput"] = json.RawMessage(updated)
	}
	out, _ := json.Marshal(map[string]any{"hookSpecificOutput": specific})
	fmt.Fprintf(stdout, "%s\n", out)
	return nil
}

// hookOptions are the hook's flags.
type hookOptions struct {
	socket, session string
	atoms, roles    []string
	timeout         time.Duration
	viaRun          bool // Bash through condfs run
	checkpoint      bool // a checkpoint before each call that can write
}

// hookDecide returns allow, deny or ask with a reason, and the tool input
// decided when the hook changed it (hook_paths.go); it never panics.
func hookDecide(stdin io.Reader, o hookOptions) (decision, reason string, updated []byte) {
	defer func() {
		if r := recover(); r != nil {
			decision, reason, updated = "deny", fmt.Sprintf("condfs: internal error (%v); denied", r), nil
		}
	}()
	tool, useID, cwd, input, why := hookInput(stdin)
	if why != "" {
		return "deny", "condfs: " + why, nil
	}
	changed, why := resolveHookPaths(tool, cwd, input)
	if why != "" {
		return "deny", "condfs: " + why, nil
	}
	if command, _ := input.Get("command").Text(); tool == "Bash" && strings.IndexByte(command, 0) >= 0 {
		// Bash drops a NUL from a script it reads ("r\x00m" runs rm), and
		// no argv carries one: the text decided is never what runs.
		return "deny", "condfs: the command has a NUL byte, which bash drops (what it runs is not the text decided); denied", nil
	}
	args := input.Bytes()
	if changed {
		updated = args
	}
	params := map[string]any{"tool": tool, "args": json.RawMessage(args)}
	if o.session != "" {
		params["session"] = o.session
	} else {
		params["context"] = o.atoms
	}
	if len(o.roles) > 0 {
		params["roles"] = o.roles
	}
	decision, reason = hookAsk(o.socket, o.timeout, tool, params)
	if decision == "deny" {
		return decision, reason, nil
	}
	if o.checkpoint && canWrite(tool) {
		// Made before Claude Code runs the call (or asks about it): once
		// the call is let through, nothing it does is before it.
		if why := hookCheckpoint(o.socket, o.timeout, o.session, useID); why != "" {
			return "deny", "condfs: " + why + "; denied (--checkpoint: every step that can write is undoable)", nil
		}
	}
	if o.viaRun && tool == "Bash" {
		return bashViaRun(decision, reason, input, o.socket, o.session, o.roles)
	}
	return decision, reason, updated
}

// readOnlyTools are Claude Code's tools that change no file in a view:
// every other tool, an MCP tool (mcp__...) or one not known here
// included, is taken to write.
var readOnlyTools = map[string]bool{
	"Read": true, "Glob": true, "Grep": true, "LS": true, "WebFetch": true, "WebSearch": true,
	"TodoWrite": true, "Task": true, "ExitPlanMode": true, "BashOutput": true, "KillShell": true,
	"KillBash": true, "ListMcpResourcesTool": true, "ReadMcpResourceTool": true,
}

func canWrite(tool string) bool { return !readOnlyTools[tool] }

// hookCheckpoint makes a checkpoint of session named after the call's
// tool_use_id (unnamed when the id cannot name one), or says why not. A
// name taken already is the same call asked about again: its checkpoint
// stands.
func hookCheckpoint(socket string, timeout time.Duration, session, useID string) string {
	params := map[string]any{"session": session}
	named := changes.ValidName(useID)
	if named {
		params["name"] = useID
	}
	c, err := control.DialTimeout(socket, timeout)
	if err != nil {
		return fmt.Sprintf("no checkpoint: the daemon at %s is unreachable (%v)", socket, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	err = c.Call("checkpoint.create", params, nil)
	var ce *control.Error
	switch {
	case err == nil:
		return ""
	case named && errors.As(err, &ce) && ce.Code == control.CodeInvalidParams && strings.Contains(ce.Message, "names a checkpoint already"):
		return ""
	case errors.As(err, &ce):
		return "no checkpoint: " + ce.Message
	}
	return fmt.Sprintf("no checkpoint (%v)", err)
}

// hookInput reads a PreToolUse event: the tool, the call's tool_use_id,
// the working directory and the tool's input, or why it cannot be decided.
func hookInput(stdin io.Reader) (tool, useID, cwd string, input *jsonwire.Value, why string) {
	data, err := io.ReadAll(io.LimitReader(stdin, maxHookInput+1))
	if err != nil {
		return "", "", "", nil, fmt.Sprintf("cannot read the hook input: %v", err)
	}
	if len(data) > maxHookInput {
		return "", "", "", nil, fmt.Sprintf("the hook input is over %d bytes", maxHookInput)
	}
	// Read strictly and by exact keys (internal/jsonwire): Claude Code
	// reads the input with JSON.parse, which matches keys exactly and reads
	// numbers as float64; encoding/json would fold "tool_namE" onto
	// "tool_name" and decide a tool other than the one that runs.
	// At most 2^20 values: parsed, a value is held in about 90 bytes.
	in, err := jsonwire.Parse(data, jsonwire.Rules{Agreed: true, MaxValues: 1 << 20})
	if err != nil {
		return "", "", "", nil, fmt.Sprintf("malformed hook input: %v", err)
	}
	if in.Kind != jsonwire.Object {
		return "", "", "", nil, "malformed hook input: not a JSON object"
	}
	event, _ := in.Get("hook_event_name").Text()
	tool, _ = in.Get("tool_name").Text()
	cwd, _ = in.Get("cwd").Text()
	useID, _ = in.Get("tool_use_id").Text()
	input = in.Get("tool_input")
	switch {
	case event != "PreToolUse":
		ev := "none"
		if event != "" {
			ev = event
		}
		return "", "", "", nil, fmt.Sprintf("this hook decides PreToolUse events, not %q", ev)
	case tool == "":
		return "", "", "", nil, "the hook input has no tool_name"
	case input == nil || input.Kind != jsonwire.Object:
		return "", "", "", nil, "tool_input must be a JSON object"
	}
	return tool, useID, cwd, input, ""
}

// hookAsk asks the daemon for the decision and turns it into the hook's.
func hookAsk(socket string, timeout time.Duration, tool string, params map[string]any) (decision, reason string) {
	deny := func(format string, a ...any) (string, string) {
		return "deny", "condfs: " + fmt.Sprintf(format, a...)
	}
	c, err := control.DialTimeout(socket, timeout)
	if err != nil {
		return deny("the daemon at %s is unreachable (%v); denied", socket, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	var res struct {
		Decision string   `json:"decision"`
		Reasons  []string `json:"reasons"`
	}
	if err := c.Call("tool.decide", params, &res); err != nil {
		var ce *control.Error
		if errors.As(err, &ce) {
			return deny("the daemon refused the call: %s", ce.Message)
		}
		return deny("no decision from the daemon (%v); denied", err)
	}
	why := strings.Join(res.Reasons, "; ")
	switch res.Decision {
	case "allow":
		return "allow", "condfs: allowed by policy"
	case "approval_required":
		return "ask", "condfs: the policy requires approval for " + tool
	case "deny":
		if why == "" {
			why = "denied by policy"
		}
		return "deny", "condfs: denied by policy: " + why
	}
	return deny("unknown decision %q; denied", res.Decision)
}

// bashViaRun rewrites a Bash call that is not denied so that the command
// decided runs through condfs run under session: bash -c COMMAND in the
// session's sandbox, whose files are its view and which executes only
// what its context allows. The command's text is decided by the policy
// first; what it does is then the sandbox's to confine.
func bashViaRun(decision, reason string, input *jsonwire.Value, socket, session string, roles []string) (string, string, []byte) {
	deny := func(why string) (string, string, []byte) { return "deny", "condfs: " + why + "; denied", nil }
	command, ok := input.Get("command").Text()
	if !ok {
		return deny("a Bash call's command must be a string")
	}
	self, err := os.Executable()
	if err != nil {
		return deny(fmt.Sprintf("cannot name condfs for condfs run (%v)", err))
	}
	if socket, err = filepath.Abs(socket); err != nil {
		return deny(fmt.Sprintf("cannot name the socket for condfs run (%v)", err))
	}
	argv := []string{self, "run", "--socket", socket, "--session", session}
	for _, r := range roles {
		argv = append(argv, "--role", r)
	}
	argv = append(argv, "--", "bash", "-c", command)
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = shellQuote(a)
	}
	input.Set("command", jsonwire.NewString(strings.Join(quoted, " ")))
	return decision, reason + " (run through condfs run)", input.Bytes()
}

// shellQuote quotes s as one word for sh and bash: inside single quotes
// nothing is special but the single quote, written '\”.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
