// Package metrics exposes a running daemon's activity in the Prometheus
// text format (client_golang). Every label value comes from a fixed set:
// never a path, a session id or an argument value, which would make the
// series unbounded. A nil *Metrics records nothing, so callers need no
// checks when metrics are off.
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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds the daemon's collectors, in their own registry.
type Metrics struct {
	reg        *prometheus.Registry
	decisions  *prometheus.CounterVec
	denials    *prometheus.CounterVec
	switches   prometheus.Histogram
	reloads    *prometheus.CounterVec
	fuseOps    *prometheus.HistogramVec
	conns      prometheus.Counter
	sockErrors *prometheus.CounterVec
}

// Fixed label sets: anything else is counted as "other".
var (
	decisionValues = set("allow", "deny", "approval_required")
	spaceValues    = set("memories", "workspace", "exec")
	pathOps        = set("lookup", "mutate", "create", "exchange", "io", "open of a special file")
	fileValues     = set("conditions", "policy")
	outcomeValues  = set("ok", "error", "unchanged")
	errorCodes     = set("-32700", "-32600", "-32601", "-32602", "-32603", "-32001", "-32002", "-32003", "-32004",
		"-32010", "-32011", "-32012", "-32013")
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

// New builds the collectors. sessions and panics are read at each scrape.
func New(sessions func() int, panics func() map[string]int64) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "condfs_tool_decisions_total", Help: "Tool calls decided, by decision and by the policy role that decided (\"none\" for a deny, \"unknown\" for a role the policy does not name).",
	}, []string{"decision", "role"})
	m.denials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "condfs_path_denials_total", Help: "Path requests the rules denied, by space and operation.",
	}, []string{"space", "op"})
	m.switches = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "condfs_context_switch_seconds", Help: "context.set latency: until the view enforces the new context.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14),
	})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "condfs_config_reloads_total", Help: "Config reloads, by file and outcome (ok, error: the last good config stays, unchanged).",
	}, []string{"file", "outcome"})
	m.fuseOps = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "condfs_fuse_op_seconds", Help: "FUSE requests served, by opcode, with their latency in the daemon.",
		Buckets: prometheus.ExponentialBuckets(5e-6, 2.5, 12),
	}, []string{"op"})
	m.conns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "condfs_socket_connections_total", Help: "Control socket connections accepted.",
	})
	m.sockErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "condfs_socket_errors_total", Help: "Control socket error answers, by JSON-RPC code.",
	}, []string{"code"})
	m.reg.MustRegister(m.decisions, m.denials, m.switches, m.reloads, m.fuseOps, m.conns, m.sockErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "condfs_sessions_open", Help: "Sessions open now.",
	}, func() float64 { return float64(sessions()) }))
	panicDesc := prometheus.NewDesc("condfs_panics_recovered_total", "Requests that panicked and failed closed, by where (control, fuse).", []string{"where"}, nil)
	m.reg.MustRegister(funcCollector{desc: panicDesc, collect: func(ch chan<- prometheus.Metric) {
		for where, n := range panics() {
			ch <- prometheus.MustNewConstMetric(panicDesc, prometheus.CounterValue, float64(n), bounded(where, set("control", "fuse")))
		}
	}})
	return m
}

// ConfigStatus reports a config file's generation and last good load for
// the gauges RegisterConfig adds.
type ConfigStatus func() (generation uint64, loadedAt time.Time)

// RegisterConfig adds the generation and last-good-load gauges of file
// ("conditions" or "policy").
func (m *Metrics) RegisterConfig(file string, status ConfigStatus) {
	if m == nil {
		return
	}
	file = bounded(file, fileValues)
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "condfs_config_generation", Help: "Successful loads of the config file, the load at start being 1.", ConstLabels: prometheus.Labels{"file": file},
	}, func() float64 { g, _ := status(); return float64(g) }))
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "condfs_config_last_good_load_timestamp_seconds", Help: "When the config file last loaded successfully (Unix time).", ConstLabels: prometheus.Labels{"file": file},
	}, func() float64 { _, t := status(); return float64(t.UnixNano()) / 1e9 }))
}

type funcCollector struct {
	desc    *prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c funcCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c funcCollector) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// Decision counts a tool decision; role is the deciding role already
// mapped to a name the policy defines, "none" or "unknown".
func (m *Metrics) Decision(decision, role string) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(bounded(decision, decisionValues), role).Inc()
}

// PathDenial counts a denial of a path request.
func (m *Metrics) PathDenial(space, op string) {
	if m == nil {
		return
	}
	m.denials.WithLabelValues(bounded(space, spaceValues), bounded(op, pathOps)).Inc()
}

// ContextSwitch records a context.set that took d.
func (m *Metrics) ContextSwitch(d time.Duration) {
	if m == nil {
		return
	}
	m.switches.Observe(d.Seconds())
}

// Reload counts a reload of file with its outcome.
func (m *Metrics) Reload(file, outcome string) {
	if m == nil {
		return
	}
	m.reloads.WithLabelValues(bounded(file, fileValues), bounded(outcome, outcomeValues)).Inc()
}

// FUSEOp records a FUSE request of opcode op (go-fuse's RawFileSystem
// method names, a fixed set) that started at start.
func (m *Metrics) FUSEOp(op string, start time.Time) {
	if m == nil {
		return
	}
	m.fuseOps.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

// Conn counts an accepted socket connection.
func (m *Metrics) Conn() {
	if m == nil {
		return
	}
	m.conns.Inc()
}

// SocketError counts an error answer.
func (m *Metrics) SocketError(code int) {
	if m == nil {
		return
	}
	m.sockErrors.WithLabelValues(bounded(strconv.Itoa(code), errorCodes)).Inc()
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
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
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
