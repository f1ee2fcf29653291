// Package sandbox runs one command of a session in a sandbox whose only
// /workspace and /memories are the session's view, which holds only the
// binaries the session's context allows, and nothing else of the host
// (docs/sandbox.md, shared spec sandbox.md).
//
// Shape (runc's): Start, in the daemon, re-executes the daemon's own binary
// (/proc/self/exe sandbox-init) in new mount, PID, IPC, UTS and cgroup
// namespaces (and network unless Network is "host"; and user when UserNS).
// The daemon puts that init into the run's cgroups, then sends it the Spec
// over a socketpair (the init's fd 3). The init builds the root, forks the
// command on a locked OS thread that confineHook has confined, answers
// "ready" or names the step that failed, and stays as PID 1: it reaps,
// forwards the signals the daemon relays, applies live allowlist updates and
// exits with the command's status. Killing the init kills the PID namespace,
// so every process of the run dies with it.
//
// Fail-closed choices:
//   - Any step of building the root that fails ends the run before the command
//     exists; Start returns that step's error.
//   - An Allow that the init does not confirm kills the run: a run never keeps
//     a binary its context no longer allows.
//   - A binary the init cannot attach is absent, never present unconfined.
//   - Every descriptor of the init but 0, 1 and 2 is close-on-exec before the
//     command is forked.
//   - Without a cgroup, limits fall back to rlimits; a run as uid 0 with a pids
//     limit and no cgroup is refused (RLIMIT_NPROC does not bind root).
package sandbox
