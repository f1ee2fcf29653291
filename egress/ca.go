package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Authority is the daemon's own certificate authority: the gateway
// presents, for each inspected host, a short-lived leaf it signs, and
// every run of network "policy" trusts it (docs/sandbox.md, "Inspected
// HTTPS"). Its key is ECDSA P-256, kept in a file of mode 0600 under the
// daemon's state directory (or only in memory without one); it never
// enters a run.
//
// Fail-closed choices: a key file that is not a regular file of the
// daemon's uid with mode 0600, or that does not match its certificate,
// is an error, never replaced; leaves are cached at most maxLeaves, and
// minted one at a time (a cached leaf never waits for a mint).
type Authority struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey // every leaf's: one key, many names

	mu     sync.Mutex // guards leaves
	leaves map[string]*tls.Certificate
	mint   sync.Mutex // held while a leaf is minted: one at a time
	// minting, when set (tests), is called as a leaf is minted.
	minting func()
}

const (
	caKeyFile  = "egress-ca.key"
	caCertFile = "egress-ca.pem"
	// leafLife is a leaf's validity; one with less than leafRenew left
	// is minted again.
	leafLife  = 24 * time.Hour
	leafRenew = time.Hour
	// maxLeaves bounds the cache: one run naming many hosts must not
	// grow the daemon without bound.
	maxLeaves = 1024
	caLife    = 10 * 365 * 24 * time.Hour
)

// LoadAuthority loads the authority kept in dir, or makes one there (dir
// made 0700 when missing). With dir "" it is made in memory and lasts as
// long as the process.
func LoadAuthority(dir string) (*Authority, error) {
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	a := &Authority{leafKey: leafKey, leaves: map[string]*tls.Certificate{}}
	if dir == "" {
		if a.cert, a.key, err = newCA(); err != nil {
			return nil, err
		}
		a.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.cert.Raw})
		return a, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	keyPath, certPath := filepath.Join(dir, caKeyFile), filepath.Join(dir, caCertFile)
	keyPEM, err := readKeyFile(keyPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := a.create(keyPath, certPath); err != nil {
			return nil, err
		}
		return a, nil
	case err != nil:
		return nil, err
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	if err := a.parse(keyPEM, certPEM); err != nil {
		return nil, fmt.Errorf("egress CA in %s: %w", dir, err)
	}
	return a, nil
}

// readKeyFile reads the CA's key: a regular file of the daemon's uid,
// mode 0600, opened without following a symlink.
func readKeyFile(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	if !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 || sys == nil || int(sys.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("egress CA: %s must be a regular file of uid %d with mode 0600 (it is %v): refused, not replaced", p, os.Geteuid(), st.Mode())
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	return b, nil
}

// create makes a new CA and writes it: the key first, created exclusively
// with mode 0600, the certificate then (a crash between the two leaves a
// key without a certificate, an error at the next start, never a key
// readable by others).
func (a *Authority) create(keyPath, certPath string) error {
	cert, key, err := newCA()
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	a.cert, a.key = cert, key
	a.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	f, err := os.OpenFile(keyPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	_, werr := f.Write(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	if err := f.Sync(); werr == nil {
		werr = err
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		os.Remove(keyPath)
		return fmt.Errorf("egress CA: %w", werr)
	}
	tmp := certPath + ".tmp"
	if err := os.WriteFile(tmp, a.certPEM, 0o644); err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	if err := os.Rename(tmp, certPath); err != nil {
		return fmt.Errorf("egress CA: %w", err)
	}
	return nil
}

func (a *Authority) parse(keyPEM, certPEM []byte) error {
	kb, _ := pem.Decode(keyPEM)
	cb, _ := pem.Decode(certPEM)
	if kb == nil || cb == nil {
		return errors.New("no PEM key or certificate")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return err
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return err
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) || !cert.IsCA {
		return errors.New("the certificate is not the key's CA certificate")
	}
	a.cert, a.key, a.certPEM = cert, key, pem.EncodeToMemory(cb)
	return nil
}

func newCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("egress CA: %w", err)
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "condfs egress CA (" + host + ")", Organization: []string{"condfs"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLife),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("egress CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("egress CA: %w", err)
	}
	return cert, key, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// CertPEM is the CA's certificate, for the runs' trust.
func (a *Authority) CertPEM() []byte { return append([]byte(nil), a.certPEM...) }

// Cert is the CA's certificate.
func (a *Authority) Cert() *x509.Certificate { return a.cert }

// Leaf is the certificate the gateway presents for host (a canonical name
// or address): cached, and minted again when it nears its end.
func (a *Authority) Leaf(host string) (*tls.Certificate, error) {
	now := time.Now()
	if c := a.cached(host, now); c != nil {
		return c, nil
	}
	a.mint.Lock()
	defer a.mint.Unlock()
	if c := a.cached(host, now); c != nil {
		return c, nil // minted while this waited
	}
	if a.minting != nil {
		a.minting()
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(leafLife),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net4or6(host); ip != nil {
		tmpl.IPAddresses = ip
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &a.leafKey.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: a leaf for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress CA: a leaf for %s: %w", host, err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, a.cert.Raw}, PrivateKey: a.leafKey, Leaf: leaf}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.leaves) >= maxLeaves {
		// Half the cache goes (the map's order is random): minting again
		// costs a signature, and one run naming many hosts cannot hold it.
		for h := range a.leaves {
			if len(a.leaves) < maxLeaves/2 {
				break
			}
			delete(a.leaves, h)
		}
	}
	a.leaves[host] = c
	return c, nil
}

// cached is host's leaf if the cache holds one far enough from its end.
func (a *Authority) cached(host string, now time.Time) *tls.Certificate {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c := a.leaves[host]; c != nil && now.Add(leafRenew).Before(c.Leaf.NotAfter) {
		return c
	}
	return nil
}

// net4or6 is host as an address list for a leaf, or nil for a name.
func net4or6(host string) []net.IP {
	if a, err := netip.ParseAddr(host); err == nil {
		return []net.IP{net.IP(a.AsSlice())}
	}
	return nil
}
