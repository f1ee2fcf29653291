// Package metrics exposes a running daemon's activity in the Prometheus
// text exposition format (version 0.0.4). Every label value comes from a
// fixed set: never a path, a session id or an argument value, which would
// make the series unbounded. A nil *Metrics records nothing, so callers
// need no checks when metrics are off.
//
// The exposition is written here rather than with client_golang: every
// condfs process links this package (each `condfs run` client and each
// sandbox init among them), and the client library's package
// initialisation cost about a millisecond of every such start
// (docs/performance.md), for a handful of counters and histograms.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Metrics holds the daemon's series.
type Metrics struct {
	decisions  *counterVec
	denials    *counterVec
	egress     *counterVec
	switches   *histogramVec
	reloads    *counterVec
	fuseOps    *histogramVec
	conns      *counterVec
	sockErrors *counterVec
	changes    *counterVec
	sessions   func() int
	panics     func() map[string]int64
	configs    []configGauge
	started    time.Time
}

type configGauge struct {
	file   string
	status ConfigStatus
}

// Fixed label sets: anything else is counted as "other".
var (
	decisionValues = set("allow", "deny", "approval_required")
	egressValues   = set("allow", "deny", "approval_required", "refused", "cut")
	protoValues    = set("http", "https", "tcp")
	spaceValues    = set("memories", "workspace", "exec")
	pathOps        = set("lookup", "mutate", "create", "exchange", "io", "open of a special file")
	fileValues     = set("conditions", "policy")
	outcomeValues  = set("ok", "error", "unchanged")
	whereValues    = set("control", "fuse")
	errorCodes     = set("-32700", "-32600", "-32601", "-32602", "-32603", "-32001", "-32002", "-32003", "-32004",
		"-32010", "-32011", "-32012", "-32013", "-32031", "-32032")
	changeOps = set("checkpoint", "rollback", "dropped", "enospc", "conflict", "commit", "discard")
)

func set(vals ...string) map[string]bool {
	m := map[string]bool{}
	for _, v := range vals {
		m[v] = true
	}
	return m
}

func bounded(v string, allowed map[string]bool) string {
	if allowed[v] {
		return v
	}
	return "other"
}

// New builds the series. sessions and panics are read at each scrape.
func New(sessions func() int, panics func() map[string]int64) *Metrics {
	return &Metrics{
		decisions: newCounterVec("condfs_tool_decisions_total",
			"Tool calls decided, by decision and by the policy role that decided (\"none\" for a deny, \"unknown\" for a role the policy does not name).",
			"decision", "role"),
		denials: newCounterVec("condfs_path_denials_total", "Path requests the rules denied, by space and operation.", "space", "op"),
		egress: newCounterVec("condfs_egress_decisions_total",
			"Connections and HTTP requests of runs decided by the egress gateway, by protocol and outcome (refused: allowed, but not reachable as allowed; cut: ended by a later decision).",
			"protocol", "outcome"),
		switches: newHistogramVec("condfs_context_switch_seconds", "context.set latency: until the view enforces the new context.",
			exponentialBuckets(50e-6, 2, 14)),
		reloads: newCounterVec("condfs_config_reloads_total",
			"Config reloads, by file and outcome (ok, error: the last good config stays, unchanged).", "file", "outcome"),
		fuseOps: newHistogramVec("condfs_fuse_op_seconds", "FUSE requests served, by opcode, with their latency in the daemon.",
			exponentialBuckets(5e-6, 2.5, 12), "op"),
		conns:      newCounterVec("condfs_socket_connections_total", "Control socket connections accepted."),
		sockErrors: newCounterVec("condfs_socket_errors_total", "Control socket error answers, by JSON-RPC code.", "code"),
		changes: newCounterVec("condfs_changes_total",
			"Checkpoints created, rollbacks run, checkpoints dropped for max_checkpoints, changes refused for max_bytes (enospc) and paths a rollback left for a conflict.", "op"),
		sessions: sessions,
		panics:   panics,
		started:  time.Now(),
	}
}

// ConfigStatus reports a config file's generation and last good load for
// the gauges RegisterConfig adds.
type ConfigStatus func() (generation uint64, loadedAt time.Time)

// RegisterConfig adds the generation and last-good-load gauges of file
// ("conditions" or "policy"). It is called before Serve.
func (m *Metrics) RegisterConfig(file string, status ConfigStatus) {
	if m == nil {
		return
	}
	m.configs = append(m.configs, configGauge{bounded(file, fileValues), status})
}

// Decision counts a tool decision; role is the deciding role already
// mapped to a name the policy defines, "none" or "unknown".
func (m *Metrics) Decision(decision, role string) {
	if m == nil {
		return
	}
	m.decisions.inc(bounded(decision, decisionValues), role)
}

// Egress counts one decision of a run's egress gateway.
func (m *Metrics) Egress(protocol, outcome string) {
	if m == nil {
		return
	}
	m.egress.inc(bounded(protocol, protoValues), bounded(outcome, egressValues))
}

// Change counts n of a change operation (checkpoint, rollback, dropped,
// enospc, conflict).
func (m *Metrics) Change(op string, n int) {
	if m == nil {
		return
	}
	for range n {
		m.changes.inc(bounded(op, changeOps))
	}
}

// PathDenial counts a denial of a path request.
func (m *Metrics) PathDenial(space, op string) {
	if m == nil {
		return
	}
	m.denials.inc(bounded(space, spaceValues), bounded(op, pathOps))
}

// ContextSwitch records a context.set that took d.
func (m *Metrics) ContextSwitch(d time.Duration) {
	if m == nil {
		return
	}
	m.switches.observe(d.Seconds())
}

// Reload counts a reload of file with its outcome.
func (m *Metrics) Reload(file, outcome string) {
	if m == nil {
		return
	}
	m.reloads.inc(bounded(file, fileValues), bounded(outcome, outcomeValues))
}

// FUSEOp records a FUSE request of opcode op (go-fuse's RawFileSystem
// method names, a fixed set) that started at start.
func (m *Metrics) FUSEOp(op string, start time.Time) {
	if m == nil {
		return
	}
	m.fuseOps.observe(time.Since(start).Seconds(), op)
}

// Conn counts an accepted socket connection.
func (m *Metrics) Conn() {
	if m == nil {
		return
	}
	m.conns.inc()
}

// SocketError counts an error answer.
func (m *Metrics) SocketError(code int) {
	if m == nil {
		return
	}
	m.sockErrors.inc(bounded(strconv.Itoa(code), errorCodes))
}

// WriteTo writes the exposition of every series.
func (m *Metrics) WriteTo(w *strings.Builder) {
	m.decisions.write(w)
	m.denials.write(w)
	m.egress.write(w)
	m.switches.write(w)
	m.reloads.write(w)
	m.fuseOps.write(w)
	m.conns.write(w)
	m.sockErrors.write(w)
	m.changes.write(w)
	gauge(w, "condfs_sessions_open", "Sessions open now.", nil, float64(m.sessions()))
	panics := m.panics()
	if len(panics) > 0 {
		header(w, "condfs_panics_recovered_total", "Requests that panicked and failed closed, by where (control, fuse).", "counter")
		counts := map[string]int64{}
		for where, n := range panics {
			counts[bounded(where, whereValues)] += n
		}
		for _, where := range sortedKeys(counts) {
			sample(w, "condfs_panics_recovered_total", []string{"where", where}, float64(counts[where]))
		}
	}
	if len(m.configs) > 0 {
		header(w, "condfs_config_generation", "Successful loads of the config file, the load at start being 1.", "gauge")
		for _, c := range m.configs {
			g, _ := c.status()
			sample(w, "condfs_config_generation", []string{"file", c.file}, float64(g))
		}
		header(w, "condfs_config_last_good_load_timestamp_seconds", "When the config file last loaded successfully (Unix time).", "gauge")
		for _, c := range m.configs {
			_, t := c.status()
			sample(w, "condfs_config_last_good_load_timestamp_seconds", []string{"file", c.file}, float64(t.UnixNano())/1e9)
		}
	}
	writeRuntime(w, m.started)
}

// Serve serves /metrics on addr until ctx ends: a Unix socket path
// (created 0600), or a loopback host:port. Any other address is refused:
// the metrics describe what every session does, for the node's operator.
func (m *Metrics) Serve(ctx context.Context, addr string, log *slog.Logger) (stop func(), err error) {
	var ln net.Listener
	switch {
	case strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "./"):
		if st, err := os.Lstat(addr); err == nil && st.Mode()&os.ModeSocket != 0 {
			os.Remove(addr) // a socket left by a crashed daemon
		}
		ln, err = net.Listen("unix", addr)
		if err == nil {
			err = os.Chmod(addr, 0o600)
		}
	default:
		host, _, serr := net.SplitHostPort(addr)
		ip := net.ParseIP(host)
		if serr != nil || !(host == "localhost" || (ip != nil && ip.IsLoopback())) {
			return nil, fmt.Errorf("--metrics %q: want a Unix socket path or a loopback address such as 127.0.0.1:9464", addr)
		}
		ln, err = net.Listen("tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		m.WriteTo(&b)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(b.String()))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-stopped:
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	return func() {
		close(stopped)
		<-done
		if ln.Addr().Network() == "unix" {
			os.Remove(addr)
		}
	}, nil
}
