// Command condfs is condfs's client: it runs commands in a session's
// sandbox, talks to the daemon over its control socket and enforces the
// policy in an agent runtime's hook. The daemon and the offline policy
// tools are condfsd, beside it: "condfs serve" (mcp, policy, acl, blocks)
// executes it, so one name serves every command. Run "condfs help".
//
// Why two binaries: every "condfs run" and hook call starts this one, and
// a binary that also holds the daemon (FUSE, gVisor's stack, nftables, the
// MCP SDK) took 6 ms of the 24 a run cost to start (docs/performance.md).
package main

import (
	"io"
	"os"

	"github.com/condfs/condfs/internal/cli"
)

func program() cli.Program {
	return cli.Program{Name: "condfs", Intro: intro, Commands: commands}
}

func commands() []cli.Command {
	return []cli.Command{
		{Name: "serve", Summary: "run the daemon: per-session views, the control socket, hot reload", Run: daemonCommand("serve")},
		{Name: "ctl", Summary: "talk to a running daemon over its control socket", Run: runCtl},
		{Name: "policy", Summary: "lint a tool policy or decide calls against it, offline", Run: daemonCommand("policy")},
		{Name: "acl", Summary: "check a path against conditions.toml, offline", Run: daemonCommand("acl")},
		{Name: "blocks", Summary: "list the prompt blocks a context selects, offline", Run: daemonCommand("blocks")},
		{Name: "hook", Summary: "enforce the policy in an agent runtime's hook (claude-code)", Run: runHook},
		{Name: "mcp", Summary: "enforce the policy between an MCP client and server (proxy)", Run: daemonCommand("mcp")},
		{Name: "run", Summary: "run a command in a sandbox under a session's authority", Run: runRun},
		{Name: "completion", Summary: "print a shell completion script (bash, zsh or fish)", Run: runCompletion},
		{Name: "help", Summary: "show this help"},
	}
}

const intro = `condfs gives AI agents per-session, context-aware file and tool authority.

Each agent session (a Discord DM, a guild channel, a cron heartbeat, ...) gets
its own FUSE view of memories/ and workspace/ in which paths that its context
may not see do not exist, and its tool calls are decided against a policy.
'condfs run' runs a command in a sandbox whose only files are the session's
view and which may execute only what its context allows; condfs does not
confine processes it did not start (docs/security.md).
`

func main() {
	// A command of condfsd's becomes condfsd (the same process, so that
	// signals, the exit status and a supervisor's view of it are the
	// daemon's own).
	if len(os.Args) > 1 && isDaemonCommand(os.Args[1]) {
		execDaemon(os.Args[1:])
	}
	os.Exit(program().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs one command in this process (completion reads --help so).
func run(args []string, stdout, stderr io.Writer) int { return program().Main(args, stdout, stderr) }
