package egress

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const testPH = "condfs-secret-gh-abcdefghijklmnopqrstuvwx"

// secretGateway is a gateway whose run holds the placeholder of secret gh,
// which goes to api.test only.
func secretGateway() *Gateway {
	g := &Gateway{cfg: Config{Inspect: &Inspection{Secret: func(name, host string, port int) (string, string) {
		if name == "gh" && host == "api.test" && port == 443 {
			return "VALUE", ""
		}
		return "", "the secret does not list " + host
	}}}}
	g.SetSecrets(map[string]string{testPH: "gh"})
	return g
}

func TestSecretsIn(t *testing.T) {
	g := secretGateway()
	cases := []struct {
		name, method, target string
		header               map[string]string
		r                    Request
		leak                 bool
		want                 string // the Authorization header after
	}{
		{"a header value to the listed host", "GET", "/x", map[string]string{"Authorization": "Bearer " + testPH}, Request{Host: "api.test", Port: 443, Protocol: "https", Method: "GET", Path: "/x"}, false, "Bearer VALUE"},
		{"twice in one value", "GET", "/x", map[string]string{"Authorization": testPH + ":" + testPH}, Request{Host: "api.test", Port: 443, Protocol: "https", Method: "GET", Path: "/x"}, false, "VALUE:VALUE"},
		{"another host", "GET", "/x", map[string]string{"Authorization": "Bearer " + testPH}, Request{Host: "evil.test", Port: 443, Protocol: "https", Method: "GET", Path: "/x"}, true, ""},
		{"another port of the listed host", "GET", "/x", map[string]string{"Authorization": "Bearer " + testPH}, Request{Host: "api.test", Port: 8443, Protocol: "https", Method: "GET", Path: "/x"}, true, ""},
		{"plain HTTP to the listed host", "GET", "/x", map[string]string{"Authorization": "Bearer " + testPH}, Request{Host: "api.test", Port: 443, Protocol: "http", Method: "GET", Path: "/x"}, true, ""},
		{"the request line", "GET", "/x?t=" + testPH, nil, Request{Host: "api.test", Port: 443, Protocol: "https", Method: "GET", Path: "/x?t=" + testPH}, true, ""},
		{"the decoded path", "GET", "/%63" + testPH[1:], nil, Request{Host: "api.test", Port: 443, Protocol: "https", Method: "GET", Path: "/" + testPH}, true, ""},
		{"a header name", "GET", "/x", map[string]string{"X-" + testPH: "1"}, Request{Host: "api.test", Port: 443, Protocol: "https", Method: "GET", Path: "/x"}, true, ""},
		{"none", "GET", "/x", map[string]string{"Authorization": "Bearer other"}, Request{Host: "evil.test", Protocol: "https", Method: "GET", Path: "/x"}, false, "Bearer other"},
	}
	for _, c := range cases {
		req := &http.Request{Method: c.method, RequestURI: c.target, Header: http.Header{}}
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		in, leak := g.secretsIn(req, c.r)
		if (leak != "") != c.leak {
			t.Errorf("%s: leak %q", c.name, leak)
		}
		if strings.Contains(leak, "VALUE") {
			t.Errorf("%s: the value in %q", c.name, leak)
		}
		if !c.leak && req.Header.Get("Authorization") != c.want {
			t.Errorf("%s: Authorization %q, want %q", c.name, req.Header.Get("Authorization"), c.want)
		}
		if !c.leak && c.want == "Bearer VALUE" {
			h := http.Header{"X-Echo": {"saw VALUE"}}
			in.redact(h)
			if h.Get("X-Echo") != "saw "+testPH {
				t.Errorf("%s: not redacted: %v", c.name, h)
			}
		}
	}
	// A command's placeholders are kept one command more, then forgotten.
	g.SetSecrets(map[string]string{"condfs-secret-gh-next": "gh"})
	g.SetSecrets(nil)
	if m := *g.placeholders.Load(); len(m) != 1 || m["condfs-secret-gh-next"] != "gh" {
		t.Errorf("placeholders kept: %v", m)
	}
}

func TestScanBody(t *testing.T) {
	g := secretGateway()
	body := func(n int, at int) []byte {
		b := bytes.Repeat([]byte("x"), n)
		if at >= 0 {
			copy(b[at:], testPH)
		}
		return b
	}
	cases := []struct {
		name       string
		body       []byte
		host       string
		early, mid bool
	}{
		{"small, another host", body(1000, 10), "evil.test", true, false},
		{"small, the listed host", body(1000, 10), "api.test", false, false},
		{"across the read-ahead's end", body(200<<10, scanAhead-10), "evil.test", false, true},
		{"long, far in", body(300<<10, 250<<10), "evil.test", false, true},
		{"long, none", body(300<<10, -1), "evil.test", false, false},
	}
	for _, c := range cases {
		req := &http.Request{Method: "POST", Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(c.body)), ContentLength: int64(len(c.body))}
		b, early := g.scanBody(req, Request{Host: c.host, Port: 443, Protocol: "https", Method: "POST", Path: "/"})
		if (early != "") != c.early {
			t.Errorf("%s: early %q", c.name, early)
			continue
		}
		if early != "" {
			continue
		}
		got, err := io.ReadAll(req.Body)
		if c.mid != (err != nil && b.leak() != "") {
			t.Errorf("%s: %v, leak %q", c.name, err, b.leak())
		}
		if bytes.Contains(got, []byte(testPH)) && c.host != "api.test" {
			t.Errorf("%s: the whole placeholder was passed on", c.name)
		}
		if !c.mid && !bytes.Equal(got, c.body) {
			t.Errorf("%s: %d bytes passed on of %d", c.name, len(got), len(c.body))
		}
	}
}

func TestAuthority(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadAuthority(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, caKeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	b, err := LoadAuthority(dir)
	if err != nil || !bytes.Equal(a.CertPEM(), b.CertPEM()) {
		t.Fatalf("loaded again: %v, same CA %v", err, bytes.Equal(a.CertPEM(), b.CertPEM()))
	}
	roots := x509.NewCertPool()
	roots.AddCert(a.Cert())
	for _, host := range []string{"api.test", "10.0.0.1"} {
		leaf, err := a.Leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("%s: %v", host, err)
		}
		if again, _ := a.Leaf(host); again != leaf {
			t.Errorf("%s: not cached", host)
		}
	}
	for i := 0; i < maxLeaves+10; i++ {
		a.Leaf("h" + strings.Repeat("x", i%7) + "-" + string(rune('a'+i%26)) + ".test" + string(rune('a'+i/26%26)) + string(rune('a'+i/676)))
	}
	if len(a.leaves) > maxLeaves {
		t.Errorf("%d leaves cached", len(a.leaves))
	}
	os.Chmod(filepath.Join(dir, caKeyFile), 0o644)
	if _, err := LoadAuthority(dir); err == nil {
		t.Error("a key file of mode 0644 was loaded")
	}
	if m, err := LoadAuthority(""); err != nil || m.Cert() == nil {
		t.Errorf("in memory: %v", err)
	}
}

// TestCachedLeafNotBehindMint: a leaf in the cache is served while
// another is minted (a run naming many inspected hosts mints leaf after
// leaf; every other session's handshake waited behind them: 6.6 ms mean,
// 50 ms worst on a loaded machine, under 16 minting).
func TestCachedLeafNotBehindMint(t *testing.T) {
	a, err := LoadAuthority("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Leaf("victim.test"); err != nil {
		t.Fatal(err)
	}
	// The first mint (new.test's) is held until the test ends; a send
	// that may not block would let it pass the hook unheld when the
	// minting goroutine reaches it before the test waits for it.
	entered, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	a.minting = func() {
		first.Do(func() {
			entered <- struct{}{}
			<-release
		})
	}
	defer close(release)
	go a.Leaf("new.test")
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("new.test's leaf was never minted")
	}
	got := make(chan error, 1)
	go func() { _, err := a.Leaf("victim.test"); got <- err }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a cached leaf waited for another host's to be minted")
	}
}

// TestRunLeafMintsBounded: a run naming new inspected hosts gets leafBurst
// leaves minted at once and leafRate a second after (the daemon's one CA
// mints one at a time for every session, and its cache holds maxLeaves:
// a run naming thousands of hosts took both from every other session);
// the hosts it has are served still.
func TestRunLeafMintsBounded(t *testing.T) {
	a, err := LoadAuthority("")
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{mints: newMints()}
	if _, err := g.leaf(context.Background(), a, "known.test"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	minted := 0
	for i := 0; i < 4*leafBurst; i++ {
		if _, err := g.leaf(ctx, a, fmt.Sprintf("h%d.test", i)); err != nil {
			break
		}
		minted++
	}
	if max := leafBurst + leafRate/2; minted > max {
		t.Errorf("%d leaves minted in 300 ms for one run, over %d", minted, max)
	}
	if _, err := g.leaf(ctx, a, "known.test"); err != nil {
		t.Errorf("a cached leaf refused: %v", err)
	}
}
