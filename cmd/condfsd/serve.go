package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/daemon"
	"github.com/condfs/condfs/internal/cli"
	"github.com/spf13/pflag"
)

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlags("serve", "condfs serve --root DIR [--socket PATH] [--mount DIR --context ATOM...]",
		`Run the daemon: one control socket, one FUSE view per session, live config reload.
--root DIR sets the defaults DIR/config/conditions.toml, DIR/config/policy.yaml,
DIR/blocks/conditional, DIR/memories and DIR/workspace. A missing conditions file
means no rules; a missing policy file denies every tool call. SIGINT and SIGTERM
unmount every view and remove the socket.`, stderr)
	f := &serveFlags{}
	fs.StringVar(&f.root, "root", "", "the agent home holding config/, blocks/, memories/ and workspace/")
	fs.StringVar(&f.conditions, "conditions", "", "conditions.toml (default ROOT/config/conditions.toml)")
	fs.StringVar(&f.policy, "policy", "", "policy.yaml (default ROOT/config/policy.yaml)")
	fs.StringVar(&f.blocks, "blocks-dir", "", "prompt blocks folder (default ROOT/blocks/conditional)")
	fs.StringVar(&f.memories, "memories", "", "backing directory of memories/ (default ROOT/memories)")
	fs.StringVar(&f.workspace, "workspace", "", "backing directory of workspace/ (default ROOT/workspace)")
	fs.StringVar(&f.socket, "socket", cli.DefaultSocket(), "control socket path (root: /run/condfs/condfs.sock; others: $XDG_RUNTIME_DIR/condfs/condfs.sock)")
	fs.StringVar(&f.socketMode, "socket-mode", "0600", "socket file mode (octal)")
	fs.StringVar(&f.socketGroup, "socket-group", "", "socket file group (name or id)")
	fs.UintSliceVar(&f.allowUIDs, "allow-uid", nil, "a uid besides the daemon's and root allowed on the socket; repeat")
	fs.StringVar(&f.mount, "mount", "", "also open a first session named \"default\" mounted here")
	fs.StringArrayVar(&f.atoms, "context", nil, "the first session's context: an atom (repeat) or a JSON description")
	fs.StringVar(&f.audit, "audit", "", "audit log file, JSON lines (default: the log on stderr)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&f.allowOther, "allow-other", os.Geteuid() == 0, "let users other than the daemon's reach the views (root only: the daemon then acts as each caller; each view still admits only its owner)")
	fs.StringVar(&f.mountRoot, "mount-root", filepath.Join(cli.RunDir(), "views"), "where peers other than root and the daemon's uid may have views mounted (the daemon creates the directory)")
	fs.IntVar(&f.maxConns, "max-conns", 1024, "most control connections served at once; an eighth of them is kept for root and the daemon's uid")
	fs.IntVar(&f.maxConnsPerUID, "max-conns-per-uid", 0, "most control connections of one uid other than root and the daemon's (default: max-conns/8); while connections are short, such a uid's connections idle for 10s are closed, the uid holding the most first")
	fs.StringVar(&f.stateDir, "state-dir", "", "where sessions are kept across crashes and restarts (default: the socket's directory; \"none\" keeps none)")
	fs.StringVar(&f.connections, "connections", defaultConnections(), "shared: one FUSE connection serves every session, each view a bind mount of it (root only; threads stay bounded at thousands of sessions); per-session: a connection per view")
	fs.StringVar(&f.hubDir, "hub-dir", "", "where the shared connection is mounted, a directory only root can enter (default: the socket's directory/hub)")
	fs.StringVar(&f.egressCapture, "egress-capture", "", `how runs with network "policy" reach the egress gateway: "kernel" (nftables in the run's namespace), "netstack" (a veth pair and a user-space stack), or "" (the kernel's where it has nftables NAT)`)
	fs.IntVar(&f.warmRuns, "warm-runs", 16, "sandboxes kept for the next condfs run of sessions that run commands in a row (each: an idle init, its cgroup, a clone of the view; 0: none)")
	fs.IntVar(&f.maxSessions, "max-sessions", 0, "most sessions open at once; beyond it session.open is refused (default: derived from the file and thread limits); an eighth of them is kept for root and the daemon's uid")
	fs.IntVar(&f.maxSessionsPerUID, "max-sessions-per-uid", 0, "most sessions one uid other than root and the daemon's may have opened at once (default: max-sessions/8)")
	fs.DurationVar(&f.cacheTTL, "cache-ttl", time.Minute, "how long the kernel may cache entries and attributes no rule governs; inotify on the backing trees keeps them fresh (1s: everything cached for a second, no inotify; use it for backing trees on network filesystems)")
	fs.StringVar(&f.metricsAddr, "metrics", "", "serve Prometheus metrics at /metrics on a Unix socket path or a loopback address such as 127.0.0.1:9464 (default: off)")
	fs.BoolVar(&f.allowHardlinks, "allow-hardlinks", false, "show multiply-linked files and allow link() in spaces with rules (unsafe)")
	fs.BoolVar(&f.stagedWatch, "staged-watch", true, "mount a staged layer afresh when names change in its backing tree (false: only at commits, discards and rollbacks)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return err
	}
	dcfg, closeAudit, err := f.config(fs, stderr)
	if err != nil {
		return err
	}
	defer closeAudit()
	// Views create files as their callers ask, with the callers' modes:
	// the daemon's own umask must not narrow them (the kernel has applied
	// the caller's umask already).
	syscall.Umask(0)
	return serveDaemon(dcfg, stderr)
}

// serveFlags are condfs serve's flags.
type serveFlags struct {
	root              string
	conditions        string
	policy            string
	blocks            string
	memories          string
	workspace         string
	socket            string
	socketMode        string
	socketGroup       string
	allowUIDs         []uint
	mount             string
	atoms             []string
	audit             string
	logLevel          string
	allowOther        bool
	mountRoot         string
	maxConns          int
	maxConnsPerUID    int
	stateDir          string
	connections       string
	hubDir            string
	warmRuns          int
	egressCapture     string
	maxSessions       int
	maxSessionsPerUID int
	cacheTTL          time.Duration
	metricsAddr       string
	allowHardlinks    bool
	stagedWatch       bool
}

// defaultConnections: a root daemon shares one FUSE connection among its
// sessions; one that is not root cannot bind mount, so mounts one each.
func defaultConnections() string {
	if os.Geteuid() == 0 {
		return "shared"
	}
	return "per-session"
}

// config checks the flags and turns them into the daemon's Config; the
// returned func closes the audit log file (if any) once the daemon is done.
func (f *serveFlags) config(fs *pflag.FlagSet, stderr io.Writer) (cfg daemon.Config, closeAudit func(), err error) {
	var none daemon.Config
	nop := func() {}
	closeAudit = nop
	def := func(v *string, rel string) {
		if *v == "" && f.root != "" {
			*v = filepath.Join(f.root, rel)
		}
	}
	def(&f.conditions, "config/conditions.toml")
	def(&f.policy, "config/policy.yaml")
	def(&f.blocks, "blocks/conditional")
	def(&f.memories, "memories")
	def(&f.workspace, "workspace")
	if f.conditions == "" || f.policy == "" || f.blocks == "" || f.memories == "" || f.workspace == "" {
		return none, nop, cli.UsageErr(stderr, fs, "give --root, or each of --conditions, --policy, --blocks-dir, --memories and --workspace")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return none, nop, cli.UsageErr(stderr, fs, "--log-level: %v", err)
	}
	mode, err := strconv.ParseUint(f.socketMode, 8, 32)
	if err != nil || mode&^0o777 != 0 {
		return none, nop, cli.UsageErr(stderr, fs, "--socket-mode %q: want octal permission bits such as 0600", f.socketMode)
	}
	group, err := control.SocketGroup(f.socketGroup)
	if err != nil {
		return none, nop, cli.UsageErr(stderr, fs, "%v", err)
	}
	if f.maxConns < 0 || f.maxConnsPerUID < 0 {
		return none, nop, cli.UsageErr(stderr, fs, "--max-conns and --max-conns-per-uid must not be negative")
	}
	var first *cctx.Set
	if f.mount != "" {
		abs, err := filepath.Abs(f.mount)
		if err != nil {
			return none, nop, cli.UsageErr(stderr, fs, "--mount: %v", err)
		}
		f.mount = abs
		set, err := cli.ParseContext(f.atoms)
		if err != nil {
			return none, nop, cli.UsageErr(stderr, fs, "--context: %v", err)
		}
		first = &set
	} else if len(f.atoms) > 0 {
		return none, nop, cli.UsageErr(stderr, fs, "--context needs --mount")
	}
	return f.configure(fs, stderr, level, mode, group, first)
}

// configure is config's second half: logs, state, connections, the
// daemon's Config.
func (f *serveFlags) configure(fs *pflag.FlagSet, stderr io.Writer, level slog.Level, mode uint64, group int, first *cctx.Set) (cfg daemon.Config, closeAudit func(), err error) {
	var none daemon.Config
	nop := func() {}
	closeAudit = nop
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	auditLog := logger
	if f.audit != "" {
		af, err := os.OpenFile(f.audit, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return none, nop, fmt.Errorf("audit log: %w", err)
		}
		closeAudit = func() { af.Close() }
		auditLog = slog.New(slog.NewJSONHandler(af, nil))
	}
	switch f.stateDir {
	case "":
		f.stateDir = filepath.Dir(f.socket)
	case "none":
		f.stateDir = ""
	}
	switch f.connections {
	case "shared":
		if os.Geteuid() != 0 {
			return none, nop, cli.UsageErr(stderr, fs, "--connections=shared needs a root daemon (bind mounts need CAP_SYS_ADMIN)")
		}
		if f.hubDir == "" {
			f.hubDir = filepath.Join(filepath.Dir(f.socket), "hub")
		}
	case "per-session":
		f.hubDir = ""
	default:
		return none, nop, cli.UsageErr(stderr, fs, "--connections %q: want shared or per-session", f.connections)
	}
	if f.allowOther && os.Geteuid() != 0 {
		return none, nop, cli.UsageErr(stderr, fs, "--allow-other needs a root daemon: one that cannot act as its callers serves its own uid only")
	}
	var uids []uint32
	for _, u := range f.allowUIDs {
		uids = append(uids, uint32(u))
	}
	dcfg := daemon.Config{
		Conditions: f.conditions, Policy: f.policy, BlocksDir: f.blocks,
		Memories: f.memories, Workspace: f.workspace,
		Socket: f.socket, SocketMode: os.FileMode(mode), SocketGroup: group, AllowUIDs: uids,
		AllowOther: f.allowOther, AllowHardlinks: f.allowHardlinks, NoStagedWatch: !f.stagedWatch,
		MountRoot: f.mountRoot, MaxConns: f.maxConns, MaxConnsPerUID: f.maxConnsPerUID, StateDir: f.stateDir,
		HubDir: f.hubDir, MaxSessions: f.maxSessions, MaxSessionsPerUID: f.maxSessionsPerUID, WarmRuns: f.warmRuns, EgressCapture: f.egressCapture, Metrics: f.metricsAddr, CacheTTL: f.cacheTTL,
		Logger: logger, Audit: auditLog,
	}
	if first != nil {
		dcfg.FirstMount, dcfg.FirstContext = f.mount, *first
	}
	return dcfg, closeAudit, nil
}

// serveDaemon runs the daemon of dcfg until SIGINT or SIGTERM, then stops
// it (every view unmounted, the socket removed).
func serveDaemon(dcfg daemon.Config, stderr io.Writer) error {
	logger := dcfg.Logger
	// Signals first: from here on SIGTERM means a clean shutdown.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	d, err := daemon.New(dcfg)
	if err != nil {
		fmt.Fprintf(stderr, "condfs serve: %v\n", err)
		return cli.Exit(cli.ExitUsage)
	}
	served := make(chan error, 1)
	go func() { served <- d.Serve() }()
	logger.Info("condfs serving", "socket", dcfg.Socket, "version", daemon.Version)
	select {
	case sig := <-sigs:
		logger.Info("shutting down", "signal", sig.String())
	case err := <-served:
		if err != nil {
			logger.Error("control socket", "err", err)
		}
	}
	if err := d.Close(); err != nil {
		logger.Error("shutdown", "err", err)
		return cli.Exit(cli.ExitFail)
	}
	return nil
}
