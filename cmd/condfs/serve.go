package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	cctx "github.com/condfs/condfs/context"
	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/daemon"
)

// runDir is where the daemon keeps its socket and, for peers, views: /run/condfs
// for root, $XDG_RUNTIME_DIR/condfs for an ordinary user (who cannot
// write /run), else a per-uid directory under the temporary directory.
func runDir() string {
	if os.Geteuid() == 0 {
		return "/run/condfs"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "condfs")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("condfs-%d", os.Geteuid()))
}

var defaultSocket = filepath.Join(runDir(), "condfs.sock")

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", "condfs serve --root DIR [--socket PATH] [--mount DIR --context ATOM...]",
		`Run the daemon: one control socket, one FUSE view per session, live config reload.
--root DIR sets the defaults DIR/config/conditions.toml, DIR/config/policy.yaml,
DIR/blocks/conditional, DIR/memories and DIR/workspace. A missing conditions file
means no rules; a missing policy file denies every tool call. SIGINT and SIGTERM
unmount every view and remove the socket.`, stderr)
	root := fs.String("root", "", "the agent home holding config/, blocks/, memories/ and workspace/")
	conditions := fs.String("conditions", "", "conditions.toml (default ROOT/config/conditions.toml)")
	policy := fs.String("policy", "", "policy.yaml (default ROOT/config/policy.yaml)")
	blocks := fs.String("blocks-dir", "", "prompt blocks folder (default ROOT/blocks/conditional)")
	memories := fs.String("memories", "", "backing directory of memories/ (default ROOT/memories)")
	workspace := fs.String("workspace", "", "backing directory of workspace/ (default ROOT/workspace)")
	socket := fs.String("socket", defaultSocket, "control socket path (root: /run/condfs/condfs.sock; others: $XDG_RUNTIME_DIR/condfs/condfs.sock)")
	socketMode := fs.String("socket-mode", "0600", "socket file mode (octal)")
	socketGroup := fs.String("socket-group", "", "socket file group (name or id)")
	allowUIDs := fs.UintSlice("allow-uid", nil, "a uid besides the daemon's and root allowed on the socket; repeat")
	mount := fs.String("mount", "", "also open a first session named \"default\" mounted here")
	atoms := fs.StringArray("context", nil, "the first session's context: an atom (repeat) or a JSON description")
	audit := fs.String("audit", "", "audit log file, JSON lines (default: the log on stderr)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	allowOther := fs.Bool("allow-other", os.Geteuid() == 0, "let users other than the daemon's reach the views (root only: the daemon then acts as each caller; each view still admits only its owner)")
	mountRoot := fs.String("mount-root", filepath.Join(runDir(), "views"), "where peers other than root and the daemon's uid may have views mounted (the daemon creates the directory)")
	maxConns := fs.Int("max-conns", 1024, "most control connections served at once; an eighth of them is kept for root and the daemon's uid")
	maxConnsPerUID := fs.Int("max-conns-per-uid", 0, "most control connections of one uid other than root and the daemon's (default: max-conns/8); while connections are short, such a uid's connections idle for 10s are closed, the uid holding the most first")
	stateDir := fs.String("state-dir", "", "where sessions are kept across crashes and restarts (default: the socket's directory; \"none\" keeps none)")
	connections := fs.String("connections", defaultConnections(), "shared: one FUSE connection serves every session, each view a bind mount of it (root only; threads stay bounded at thousands of sessions); per-session: a connection per view")
	hubDir := fs.String("hub-dir", "", "where the shared connection is mounted, a directory only root can enter (default: the socket's directory/hub)")
	warmRuns := fs.Int("warm-runs", 16, "sandboxes kept for the next condfs run of sessions that run commands in a row (each: an idle init, its cgroup, a clone of the view; 0: none)")
	maxSessions := fs.Int("max-sessions", 0, "most sessions open at once; beyond it session.open is refused (default: derived from the file and thread limits)")
	cacheTTL := fs.Duration("cache-ttl", time.Minute, "how long the kernel may cache entries and attributes no rule governs; inotify on the backing trees keeps them fresh (1s: everything cached for a second, no inotify; use it for backing trees on network filesystems)")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics at /metrics on a Unix socket path or a loopback address such as 127.0.0.1:9464 (default: off)")
	allowHardlinks := fs.Bool("allow-hardlinks", false, "show multiply-linked files and allow link() in spaces with rules (unsafe)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	def := func(v *string, rel string) {
		if *v == "" && *root != "" {
			*v = filepath.Join(*root, rel)
		}
	}
	def(conditions, "config/conditions.toml")
	def(policy, "config/policy.yaml")
	def(blocks, "blocks/conditional")
	def(memories, "memories")
	def(workspace, "workspace")
	if *conditions == "" || *policy == "" || *blocks == "" || *memories == "" || *workspace == "" {
		return usageErr(stderr, fs, "give --root, or each of --conditions, --policy, --blocks-dir, --memories and --workspace")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageErr(stderr, fs, "--log-level: %v", err)
	}
	mode, err := strconv.ParseUint(*socketMode, 8, 32)
	if err != nil || mode&^0o777 != 0 {
		return usageErr(stderr, fs, "--socket-mode %q: want octal permission bits such as 0600", *socketMode)
	}
	group, err := control.SocketGroup(*socketGroup)
	if err != nil {
		return usageErr(stderr, fs, "%v", err)
	}
	if *maxConns < 0 || *maxConnsPerUID < 0 {
		return usageErr(stderr, fs, "--max-conns and --max-conns-per-uid must not be negative")
	}
	var first *cctx.Set
	if *mount != "" {
		abs, err := filepath.Abs(*mount)
		if err != nil {
			return usageErr(stderr, fs, "--mount: %v", err)
		}
		*mount = abs
		set, err := parseContextFlags(*atoms)
		if err != nil {
			return usageErr(stderr, fs, "--context: %v", err)
		}
		first = &set
	} else if len(*atoms) > 0 {
		return usageErr(stderr, fs, "--context needs --mount")
	}
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	auditLog := logger
	if *audit != "" {
		f, err := os.OpenFile(*audit, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
		defer f.Close()
		auditLog = slog.New(slog.NewJSONHandler(f, nil))
	}
	switch *stateDir {
	case "":
		*stateDir = filepath.Dir(*socket)
	case "none":
		*stateDir = ""
	}
	switch *connections {
	case "shared":
		if os.Geteuid() != 0 {
			return usageErr(stderr, fs, "--connections=shared needs a root daemon (bind mounts need CAP_SYS_ADMIN)")
		}
		if *hubDir == "" {
			*hubDir = filepath.Join(filepath.Dir(*socket), "hub")
		}
	case "per-session":
		*hubDir = ""
	default:
		return usageErr(stderr, fs, "--connections %q: want shared or per-session", *connections)
	}
	if *allowOther && os.Geteuid() != 0 {
		return usageErr(stderr, fs, "--allow-other needs a root daemon: one that cannot act as its callers serves its own uid only")
	}
	// Views create files as their callers ask, with the callers' modes:
	// the daemon's own umask must not narrow them (the kernel has applied
	// the caller's umask already).
	syscall.Umask(0)
	// Signals first: from here on SIGTERM means a clean shutdown.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var uids []uint32
	for _, u := range *allowUIDs {
		uids = append(uids, uint32(u))
	}
	dcfg := daemon.Config{
		Conditions: *conditions, Policy: *policy, BlocksDir: *blocks,
		Memories: *memories, Workspace: *workspace,
		Socket: *socket, SocketMode: os.FileMode(mode), SocketGroup: group, AllowUIDs: uids,
		AllowOther: *allowOther, AllowHardlinks: *allowHardlinks,
		MountRoot: *mountRoot, MaxConns: *maxConns, MaxConnsPerUID: *maxConnsPerUID, StateDir: *stateDir,
		HubDir: *hubDir, MaxSessions: *maxSessions, WarmRuns: *warmRuns, Metrics: *metricsAddr, CacheTTL: *cacheTTL,
		Logger: logger, Audit: auditLog,
	}
	if first != nil {
		dcfg.FirstMount, dcfg.FirstContext = *mount, *first
	}
	d, err := daemon.New(dcfg)
	if err != nil {
		fmt.Fprintf(stderr, "condfs serve: %v\n", err)
		return exitError{exitUsage}
	}
	served := make(chan error, 1)
	go func() { served <- d.Serve() }()
	logger.Info("condfs serving", "socket", *socket, "version", daemon.Version)
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
		return exitError{exitFail}
	}
	return nil
}

// parseContextFlags reads --context values: atoms, or one JSON value (an
// array of atoms or a description object).
func parseContextFlags(vals []string) (cctx.Set, error) {
	if len(vals) == 0 {
		return cctx.Set{}, errors.New(`a context is required: atoms such as --context discord:dm, or --context '{"kind":"none"}'`)
	}
	if len(vals) == 1 && (strings.HasPrefix(vals[0], "{") || strings.HasPrefix(vals[0], "[")) {
		return cctx.Parse([]byte(vals[0]))
	}
	return cctx.NewSet(vals)
}

// defaultConnections: a root daemon shares one FUSE connection among its
// sessions; one that is not root cannot bind mount, so mounts one each.
func defaultConnections() string {
	if os.Geteuid() == 0 {
		return "shared"
	}
	return "per-session"
}
