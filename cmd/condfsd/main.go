// Command condfsd is the condfs daemon, its MCP gateway and its offline
// policy tools, and the sandbox init the daemon re-executes. Users type
// "condfs serve" (and mcp, policy, acl, blocks): the condfs client
// executes this binary. Run "condfsd help".
package main

import (
	"github.com/condfs/condfs/changes"
	"os"

	"github.com/condfs/condfs/internal/cli"
	"github.com/condfs/condfs/sandbox"
)

func commands() []cli.Command {
	return []cli.Command{
		{Name: "serve", Summary: "run the daemon: per-session views, the control socket, hot reload", Run: runServe},
		{Name: "policy", Summary: "lint a tool policy or decide calls against it, offline", Run: runPolicy},
		{Name: "acl", Summary: "check a path against conditions.toml, offline", Run: runACL},
		{Name: "blocks", Summary: "list the prompt blocks a context selects, offline", Run: runBlocks},
		{Name: "mcp", Summary: "enforce the policy between an MCP client and server (proxy)", Run: runMCP},
		{Name: "help", Summary: "show this help"},
	}
}

const intro = `condfsd is the condfs daemon and its offline tools; 'condfs COMMAND' runs
each of them (condfs help lists the client's commands too).
`

func main() {
	// The daemon re-executes itself as a sandbox's init (package sandbox):
	// that process must do nothing else.
	if len(os.Args) > 1 && os.Args[1] == "sandbox-init" {
		sandbox.InitMain()
	}
	// And as the child that mounts an unprivileged daemon's staged layer.
	if len(os.Args) > 1 && os.Args[1] == "layer-mount" {
		changes.MountMain()
	}
	// Usage lines and errors say "condfs", the name users type.
	p := cli.Program{Name: "condfs", Intro: intro, Commands: commands}
	os.Exit(p.Main(os.Args[1:], os.Stdout, os.Stderr))
}
