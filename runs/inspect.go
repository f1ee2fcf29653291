package runs

// Inspected HTTPS and secrets (docs/sandbox.md, "Inspected HTTPS"): the
// daemon's CA, made at the first run of network "policy" and trusted by
// every such run; the hosts [egress] inspect names, decided request by
// request; and [secrets.NAME], whose values only the gateway holds: a
// run's environment holds a placeholder, new for each command.

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/base32"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/condfs/condfs/acl"
	"github.com/condfs/condfs/egress"
	"github.com/condfs/condfs/sandbox"
)

// authority is the daemon's egress CA, made or loaded at its first need.
type authority struct {
	mu sync.Mutex
	ca *egress.Authority

	rootsMu  sync.Mutex
	rootsFor *acl.Egress // the snapshot roots was built for
	roots    *x509.CertPool
}

// egressCA is the daemon's CA (the state directory's; in memory without
// one), made or loaded now if it is not yet.
func (n *Node) egressCA() (*egress.Authority, error) {
	n.ca.mu.Lock()
	defer n.ca.mu.Unlock()
	if n.ca.ca == nil {
		ca, err := egress.LoadAuthority(n.cfg.StateDir)
		if err != nil {
			return nil, err
		}
		n.ca.ca = ca
	}
	return n.ca.ca, nil
}

// upstreamRoots verifies the servers of inspected hosts: the host's roots
// and the config's upstream_ca, built once per config snapshot.
func (n *Node) upstreamRoots() *x509.CertPool {
	e := n.cfg.Conditions().Egress()
	n.ca.rootsMu.Lock()
	defer n.ca.rootsMu.Unlock()
	if n.ca.roots != nil && n.ca.rootsFor == e {
		return n.ca.roots
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	for _, c := range e.UpstreamRoots() {
		pool.AddCert(c)
	}
	n.ca.rootsFor, n.ca.roots = e, pool
	return pool
}

// inspection is how s's gateways terminate HTTPS, as the config is at
// each connection and the session's context at each request.
func (n *Node) inspection(s *Session, ca *egress.Authority) *egress.Inspection {
	return &egress.Inspection{
		Authority: ca,
		Inspected: func(host string) bool { return n.cfg.Conditions().Egress().Inspected(host) },
		Roots:     n.upstreamRoots,
		Secret: func(name, host string, port int) (string, string) {
			sec := n.cfg.Conditions().Secret(name)
			switch {
			case sec == nil:
				return "", "the config has no such secret now"
			case !sec.Lists(host, port):
				return "", "the secret does not list " + net.JoinHostPort(host, strconv.Itoa(port))
			case !sec.Holds(s.view.Context()):
				return "", "the secret's when does not hold in the session's context"
			}
			return sec.Value(), ""
		},
	}
}

// trustVars name the run's bundle for the programs that read a variable
// rather than the system's file.
var trustVars = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"}

// trustEnv names the run's bundle (the host's and the daemon's CA) in env,
// in place of what the caller set.
func trustEnv(env []string) []string {
	ours := make([]string, len(trustVars))
	for i, k := range trustVars {
		ours[i] = k + "=" + sandbox.TrustBundle
	}
	return setEnv(env, ours)
}

// secretEnv puts each secret's placeholder, new for this command, in env
// (in place of what the caller set), and returns the placeholders with
// the secret each stands for.
func secretEnv(env []string, cfg *acl.Config) ([]string, map[string]string, error) {
	secrets := cfg.Secrets()
	if len(secrets) == 0 {
		return env, nil, nil
	}
	phs := map[string]string{}
	var ours []string
	for _, s := range secrets {
		var b [15]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, nil, fmt.Errorf("a placeholder: %w", err)
		}
		ph := "condfs-secret-" + s.Name() + "-" + strings.ToLower(base32.StdEncoding.EncodeToString(b[:]))
		phs[ph] = s.Name()
		ours = append(ours, s.Env()+"="+ph)
	}
	return setEnv(env, ours), phs, nil
}

// setEnv is env with ours in place of any variable of the same name.
func setEnv(env, ours []string) []string {
	names := map[string]bool{}
	for _, o := range ours {
		k, _, _ := strings.Cut(o, "=")
		names[k] = true
	}
	out := make([]string, 0, len(env)+len(ours))
	for _, e := range env {
		if k, _, _ := strings.Cut(e, "="); !names[k] {
			out = append(out, e)
		}
	}
	return append(out, ours...)
}
