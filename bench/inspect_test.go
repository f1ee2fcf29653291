package bench

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// inspectClient, one program for both sides: "setup N" makes N HTTPS
// connections in a row (TCP, the TLS handshake verified for srv.bench, one
// GET and its answer, close) and prints the median in microseconds; "bulk
// N" reads N bytes in one GET and prints the seconds. The CA file is the
// bench's own (direct) or "" (the run's system bundle, which holds the
// daemon's CA).
const inspectClient = `
import socket, ssl, sys, time, statistics
host, port, what, n, cafile = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
ctx = ssl.create_default_context(cafile=cafile or None)
ctx.set_alpn_protocols(["http/1.1"])
addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
def get(path):
    raw = socket.create_connection(addr)
    # As curl does: without it, the request waits for the ack of the
    # handshake's last flight (40 ms of delayed ack) on both paths.
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s = ctx.wrap_socket(raw, server_hostname="srv.bench")
    s.sendall(("GET %s HTTP/1.1\r\nHost: srv.bench:%d\r\nConnection: close\r\n\r\n" % (path, port)).encode())
    got = 0
    buf = bytearray(1 << 20)
    while True:
        k = s.recv_into(buf)
        if k == 0:
            break
        got += k
    s.close()
    return got
if what == "setup":
    ts = []
    for i in range(n):
        t = time.perf_counter()
        get("/one")
        ts.append(time.perf_counter() - t)
    print(statistics.median(ts) * 1e6)
else:
    t = time.perf_counter()
    got = get("/bulk")
    print(time.perf_counter() - t if got >= n else -1)
`

// BenchmarkEgressInspect: HTTPS to an inspected host (the gateway
// terminates the run's TLS with its CA's leaf, decides the request by
// method and path, and sends it again over TLS it verifies against
// upstream_ca), against the same client on the host connecting straight
// to the server, in one run: a new connection with one request, and a
// 64 MiB download. Kernel capture. Root.
//
//	cd bench && go test -run '^$' -bench EgressInspect -benchtime 3x
func BenchmarkEgressInspect(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("the egress benchmark needs root (it mounts a view)")
	}
	dir := b.TempDir()
	caPEM, cert := benchCA(b)
	caFile := filepath.Join(dir, "ca.pem")
	os.WriteFile(caFile, caPEM, 0o644)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	const bulk = 64 << 20
	chunk := make([]byte, 1<<20)
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/bulk" {
			fmt.Fprint(w, "ok")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(bulk))
		for i := 0; i < bulk>>20; i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	hosts := filepath.Join(dir, "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1 srv.bench\n"), 0o644)
	conditions := `[sandbox]
binaries = ["/usr/bin/python3"]
network = "policy"
reach_private = ["127.0.0.1"]
hosts = "` + hosts + `"

[egress]
inspect = ["srv.bench"]
upstream_ca = "` + caFile + `"
`
	policy := `version: 1
roles:
  default:
    tools:
      exec: {mode: allow}
      connect:
        mode: allow
        constraints: ['args.host == "srv.bench"', 'args.protocol == "https"', 'args.method == "GET"', 'args.path in ["/one", "/bulk"]']
`
	h := newRunHome(b, conditions, policy, "--egress-capture", "kernel")
	os.WriteFile(filepath.Join(h.root, "workspace/client.py"), []byte(inspectClient), 0o644)
	client := func(through bool, args ...string) float64 {
		b.Helper()
		argv := append([]string{"python3", filepath.Join(h.root, "workspace/client.py"), "127.0.0.1", port}, append(args, caFile)...)
		if through {
			argv = append(h.run("python3", "/workspace/client.py", "srv.bench", port), append(args, "")...)
		}
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		v, perr := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		if err != nil || perr != nil || v < 0 {
			b.Fatalf("%v: %v %s", argv, err, out)
		}
		return v
	}
	b.Run("setup", func(b *testing.B) {
		var direct, gw float64
		for b.Loop() {
			direct += client(false, "setup", "100")
			gw += client(true, "setup", "100")
		}
		n := float64(b.N)
		b.ReportMetric(direct/n, "direct-us")
		b.ReportMetric(gw/n, "gateway-us")
		b.ReportMetric((gw-direct)/n, "added-us")
	})
	b.Run("bulk-64MiB", func(b *testing.B) {
		var direct, gw float64
		var cpu time.Duration
		for b.Loop() {
			direct += client(false, "bulk", strconv.Itoa(bulk))
			c0 := processCPU(b, h.daemon)
			gw += client(true, "bulk", strconv.Itoa(bulk))
			c1 := processCPU(b, h.daemon)
			client(true, "setup", "1")
			cpu += 2*c1 - c0 - processCPU(b, h.daemon)
		}
		b.ReportMetric(bulk/direct/float64(1<<20)*float64(b.N), "direct-MiB/s")
		b.ReportMetric(bulk/gw/float64(1<<20)*float64(b.N), "gateway-MiB/s")
		b.ReportMetric(direct/gw, "ratio")
		// The daemon's CPU time for the download (what the kernel does for
		// its sockets in its time included; a run with one small request
		// taken off, for the run's start and end), per MiB: the gateway's
		// own cost, which the machine's load moves less than throughput.
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/(bulk>>20), "daemon-cpu-us/MiB")
	})
}

// benchCA is a CA's certificate and a leaf it signed for srv.bench.
func benchCA(b *testing.B) ([]byte, tls.Certificate) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, ca, ca, &key.PublicKey, key)
	if err != nil {
		b.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(der)
	lkey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "srv.bench"}, DNSNames: []string{"srv.bench"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	ld, err := x509.CreateCertificate(rand.Reader, leaf, ca, &lkey.PublicKey, key)
	if err != nil {
		b.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), tls.Certificate{Certificate: [][]byte{ld}, PrivateKey: lkey}
}

// processCPU is the CPU time process pid has used (user and system, to the
// clock tick).
func processCPU(b *testing.B, pid int) time.Duration {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100
}
