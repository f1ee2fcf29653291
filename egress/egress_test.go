package egress

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func TestNormalPath(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"/a/b", "/a/b"},
		{"/a/./b/../c", "/a/c"},
		{"/a/%2e%2E/b", "/b"},
		{"/%7euser/%41", "/~user/A"},
		{"/a/b/", "/a/b/"},
		{"/a/..", "/"},
		{"/../../x", "/x"},
		{"/p?q=%2e&x", "/p?q=%2e&x"},
		{"/p?", "/p?"},
		{"http://h.test", "/"},
		{"http://h.test?x=1", "/?x=1"},
		{"http://h.test:8080/a/../b", "/b"},
	} {
		req := &http.Request{Method: "GET", RequestURI: c.in}
		got, err := normalPath(req)
		if err != nil || got != c.want {
			t.Errorf("%q: got %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"/pub/..%2Fprivate/x", "/a%5Cb", "/a%00", "/pub/..;/private", "/.;x/y", "/a/..%3Bx/b", "a/b", "/a%zz", "/a%4", "/a b", "/a\x00", "//evil/x", "/a/../..//evil", "/x#frag", "/é",
		// Path parameters and empty segments, which servers drop or merge
		// (TestEgressParamSegmentPathDecided).
		"/a;v=1/b", "/;x/private/s", "/;/private/s", "/private;x", "/a%3Bb", "/a//b", "/a/b//"} {
		if got, err := normalPath(&http.Request{Method: "GET", RequestURI: bad}); err == nil {
			t.Errorf("%q: got %q, want an error", bad, got)
		}
	}
	if got, err := normalPath(&http.Request{Method: "OPTIONS", RequestURI: "*"}); err != nil || got != "*" {
		t.Errorf("OPTIONS *: %q %v", got, err)
	}
}

func TestCanonicalHost(t *testing.T) {
	for in, want := range map[string]string{
		"Example.COM.": "example.com", "a_b.test": "a_b.test", "1.2.3.4": "1.2.3.4", "[::1]": "::1",
		"::ffff:10.0.0.1": "10.0.0.1", "": "", "a..b": "", "-": "-", "010.1": "", "1.2.3": "",
		"fe80::1%eth0": "", "a b": "", strings.Repeat("a", 64) + ".test": "", "[x]": "",
	} {
		if got := canonicalHost(in); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}

func TestSniff(t *testing.T) {
	for _, c := range []struct {
		in   string
		wait time.Duration
		want string
	}{
		{"GET / HTTP/1.1\r\n", sniffWait, "http"},
		{"\r\nGET / HTTP/1.1\r\n", sniffWait, "http"},
		{" GET /private HTTP/1.1\r\n", sniffWait, "http"},
		{"GET\t/private\tHTTP/1.1\r\n", sniffWait, "http"},
		{"get / HTTP/1.1\r\n", sniffWait, "http"},
		{"M-SEARCH * HTTP/1.1\r\n", sniffWait, "http"},
		{"GET\x1c/private\x1cHTTP/1.1\r\n", sniffWait, "http"},
		{"GET /private/\xc3\xa9 HTTP/1.1\r\n", sniffWait, "http"},
		{"GET /private/x\r\n", sniffWait, "http"},
		{"CONNECT a:1\r\n", sniffWait, "http"},
		{"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", sniffWait, "tcp"},
		{"*1\r\n$4\r\nPING\r\n", sniffWait, "tcp"},
		{"\x16\x03\x01", sniffWait, "https"},
		{"SSH-2.0-x\r\n", sniffWait, "tcp"},
		{"\x00\x01", sniffWait, "tcp"},
		{"", sniffWait, "silent"},
		{"", 0, "silent-forever"},
		{"GET /private", sniffWait, ""}, // a pause inside the line: refused, never tcp
		{"  ", sniffWait, ""},
	} {
		t.Run("", func(t *testing.T) {
			t.Parallel() // several wait out headWait
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			go func() {
				if c.in != "" {
					b.Write([]byte(c.in))
				}
			}()
			got := make(chan string, 1)
			go func() { got <- sniff(a, bufio.NewReader(a), c.wait) }()
			var g string
			select {
			case g = <-got:
			case <-time.After(headWait + 2*time.Second):
				g = "silent-forever"
			}
			if g != c.want {
				t.Errorf("%q: got %q, want %q", c.in, g, c.want)
			}
		})
	}
}

func TestClientHello(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		c := tlsClient(b, "api.test")
		c.Handshake()
		b.Close()
	}()
	br := bufio.NewReader(a)
	if sniff(a, br, sniffWait) != "https" {
		t.Fatal("not https")
	}
	sni, head, err := clientHello(a, br)
	if err != nil || sni != "api.test" || len(head) == 0 || head[0] != 0x16 {
		t.Fatalf("sni %q, %d bytes, %v", sni, len(head), err)
	}
}

func TestAnswer(t *testing.T) {
	g := &Gateway{names: newNames()}
	ask := func(name string, typ dnsmessage.Type) dnsmessage.Message {
		t.Helper()
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9, RecursionDesired: true})
		b.StartQuestions()
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
		q, _ := b.Finish()
		var m dnsmessage.Message
		if err := m.Unpack(g.answer(q)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return m
	}
	m := ask("Web.Test.", dnsmessage.TypeA)
	if m.ID != 9 || len(m.Answers) != 1 {
		t.Fatalf("A: %+v", m)
	}
	a := netip.AddrFrom4(m.Answers[0].Body.(*dnsmessage.AResource).A)
	if !nameRange.Contains(a) {
		t.Fatalf("A %s outside the name range", a)
	}
	if n, ok := g.names.name(a); !ok || n != "web.test" {
		t.Fatalf("%s stands for %q", a, n)
	}
	if m2 := ask("web.test.", dnsmessage.TypeA); netip.AddrFrom4(m2.Answers[0].Body.(*dnsmessage.AResource).A) != a {
		t.Fatal("a second query got another address")
	}
	if m := ask("web.test.", dnsmessage.TypeTXT); len(m.Answers) != 0 || m.RCode != dnsmessage.RCodeSuccess {
		t.Fatalf("TXT: %+v", m)
	}
	if m := ask("web.test.", dnsmessage.TypeAAAA); len(m.Answers) != 0 {
		t.Fatalf("AAAA: %+v", m)
	}
	if m := ask("bad!name.test.", dnsmessage.TypeA); m.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("bad name: %+v", m)
	}
	if m := ask("localhost.", dnsmessage.TypeA); netip.AddrFrom4(m.Answers[0].Body.(*dnsmessage.AResource).A).String() != "127.0.0.1" {
		t.Fatalf("localhost: %+v", m)
	}
	if g.answer([]byte("junk")) != nil {
		t.Fatal("junk answered")
	}
}

func TestNamesForgetOldest(t *testing.T) {
	n := newNames()
	first := n.addr("n0.test")
	for i := 1; i <= maxNames; i++ {
		n.addr("n" + strings.Repeat("x", i%50) + string(rune('a'+i%26)) + ".test" + string(rune('a'+i/26%26)) + string(rune('a'+i/676)))
	}
	if _, ok := n.name(first); ok && len(n.byName) > maxNames {
		t.Fatal("over maxNames")
	}
	if len(n.byName) > maxNames || len(n.byAddr) > maxNames {
		t.Fatalf("%d names, %d addresses", len(n.byName), len(n.byAddr))
	}
	if got, _ := n.name(first); got == "n0.test" {
		t.Fatal("the oldest name was kept")
	}
}

func TestPrivate(t *testing.T) {
	g := &Gateway{}
	for _, s := range []string{"127.0.0.1", "10.1.2.3", "169.254.169.254", "172.16.0.1", "192.168.1.1", "100.64.0.1",
		"0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "64:ff9b::a9fe:a9fe", "198.18.0.1"} {
		if g.private(netip.MustParseAddr(s)) == "" {
			t.Errorf("%s not refused", s)
		}
	}
	for _, s := range []string{"93.184.216.34", "2606:2800:220:1::1"} {
		if r := g.private(netip.MustParseAddr(s)); r != "" && !strings.Contains(r, "this host") {
			t.Errorf("%s refused: %s", s, r)
		}
	}
}

func TestCheckRequest(t *testing.T) {
	parse := func(raw string) (*http.Request, []string) {
		t.Helper()
		br := bufio.NewReader(strings.NewReader(raw))
		hosts, err := requestHead(br)
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return nil, nil // refused as the gateway refuses it: 400
		}
		return req, hosts
	}
	fixed := &target{"web.test", 80}
	for _, c := range []struct {
		raw   string
		fixed *target
		code  int
		path  string
	}{
		{"GET /a/../b HTTP/1.1\r\nHost: web.test\r\n\r\n", fixed, 0, "/b"},
		{"GET /a HTTP/1.1\r\nHost: WEB.test:80\r\n\r\n", fixed, 0, "/a"},
		{"GET /a HTTP/1.1\r\nHost: other.test\r\n\r\n", fixed, 400, ""},
		{"GET /a HTTP/1.1\r\nHost: web.test:81\r\n\r\n", fixed, 400, ""},
		{"GET /a HTTP/1.1\r\nHost: web.test\r\nHost: web.test\r\n\r\n", fixed, 400, ""},
		{"GET /a HTTP/1.0\r\n\r\n", fixed, 400, ""},
		{"GET http://other.test/a HTTP/1.1\r\nHost: web.test\r\n\r\n", fixed, 400, ""},
		{"GET /a HTTP/1.1\r\nHost: web.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", fixed, 501, ""},
		{"GET /a HTTP/1.1\r\nHost: web.test\r\nContent-Length: 3\r\n\r\nabc", fixed, 400, ""},
		{"DELETE /a HTTP/1.1\r\nHost: web.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", fixed, 400, ""},
		{"POST /a HTTP/1.1\r\nHost: web.test\r\nContent-Length: 3\r\n\r\nabc", fixed, 0, "/a"},
		{"GET http://web.test/a?b HTTP/1.1\r\nHost: web.test\r\n\r\n", nil, 0, "/a?b"},
		{"GET /a HTTP/1.1\r\nHost: web.test\r\n\r\n", nil, 400, ""},
		{"GET https://web.test/a HTTP/1.1\r\nHost: web.test\r\n\r\n", nil, 400, ""},
		{"GET http://web.test/a HTTP/1.1\r\nHost: other.test\r\n\r\n", nil, 400, ""},
	} {
		req, hosts := parse(c.raw)
		var r Request
		code, msg := 400, "unreadable"
		if req != nil {
			_, r, code, msg = checkRequest(req, hosts, c.fixed, "http")
		}
		if code != c.code || code == 0 && r.Path != c.path {
			t.Errorf("%q: code %d (%s), path %q; want %d %q", c.raw, code, msg, r.Path, c.code, c.path)
		}
	}
	if _, err := requestHead(bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n"))); err == nil {
		t.Error("a folded header was taken")
	}
	big := "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 5000) + "\r\n\r\n"
	if _, err := requestHead(bufio.NewReaderSize(strings.NewReader(big), 4096)); err == nil {
		t.Error("a head over the buffer was taken")
	}
}

func TestHostsResolver(t *testing.T) {
	p := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(p, []byte("# c\n10.0.0.1 a.test B.test\n::1 a.test # x\nbad line\n"), 0o644)
	got, err := HostsResolver(p)(context.Background(), "b.test")
	if err != nil || len(got) != 1 || got[0].String() != "10.0.0.1" {
		t.Fatalf("b.test: %v %v", got, err)
	}
	if got, _ := HostsResolver(p)(context.Background(), "a.test"); len(got) != 2 {
		t.Fatalf("a.test: %v", got)
	}
	if _, err := HostsResolver(p+".missing")(context.Background(), "a.test"); err == nil {
		t.Fatal("a missing hosts file fell through to DNS")
	}
}

func TestVerdictFailsClosed(t *testing.T) {
	g := &Gateway{flows: map[*flow]struct{}{}}
	if v := g.verdict(Request{Host: "a.test"}); v.Allowed() {
		t.Fatal("no decider allowed")
	}
	g.SetDecider(func(Request) Verdict { panic("boom") })
	if v := g.verdict(Request{Host: "a.test"}); v.Allowed() || !strings.Contains(v.Reasons[0], "boom") {
		t.Fatalf("a panicking decider: %+v", v)
	}
}

// TestHandshakeRecords: a client hello is taken as the records that carry
// it exactly, split however the program split it; a message that ends
// inside a record, or records of another type, are refused.
func TestHandshakeRecords(t *testing.T) {
	a, b := net.Pipe()
	go func() {
		tlsClient(b, "api.test").Handshake()
		b.Close()
	}()
	_, head, err := clientHello(a, bufio.NewReader(a))
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	n := int(head[3])<<8 | int(head[4])
	one := head[:recordHeader+n]
	payload := one[recordHeader:]
	record := func(typ byte, p []byte) []byte {
		return append([]byte{typ, 3, 1, byte(len(p) >> 8), byte(len(p))}, p...)
	}
	// The same hello in three records, the first holding 2 bytes of its
	// header.
	split := append(append(record(recordHandshake, payload[:2]), record(recordHandshake, payload[2:100])...), record(recordHandshake, payload[100:])...)
	for name, c := range map[string]struct {
		in   []byte
		want []byte
	}{
		"one record":    {append(slices.Clone(one), 0x17, 3, 3, 0, 1, 'x'), one},
		"three records": {split, split},
		"trailing":      {record(recordHandshake, append(slices.Clone(payload), 1, 0, 0, 0)), nil},
		"alert":         {record(recordAlert, []byte{2, 40}), nil},
		"cut short":     {one[:len(one)-1], nil},
	} {
		got, err := handshakeRecords(bufio.NewReader(bytes.NewReader(c.in)))
		if c.want == nil && err == nil || c.want != nil && (err != nil || !bytes.Equal(got, c.want)) {
			t.Errorf("%s: %d bytes, %v", name, len(got), err)
		}
	}
}

// TestServerRetries classifies a server's first record.
func TestServerRetries(t *testing.T) {
	hello := func(random []byte) []byte {
		p := append([]byte{2, 0, 0, 70, 3, 3}, random...)
		p = append(p, make([]byte, 70+4-len(p))...)
		return append([]byte{recordHandshake, 3, 3, 0, byte(len(p))}, p...)
	}
	for name, c := range map[string]struct {
		in      []byte
		retry   bool
		refused bool
	}{
		"server hello": {in: hello(make([]byte, 32))},
		"retry":        {in: hello(helloRetryRandom), retry: true},
		"alert":        {in: []byte{recordAlert, 3, 3, 0, 2, 2, 40}},
		"short":        {in: []byte{recordHandshake, 3, 3, 0, 4, 2, 0, 0, 0}, refused: true},
		"not a hello":  {in: append([]byte{recordHandshake, 3, 3, 0, 40, 11}, make([]byte, 39)...), refused: true},
		"plain text":   {in: []byte("HTTP/1.1 400 Bad Request\r\n"), refused: true},
	} {
		err := serverRetries(bufio.NewReader(bytes.NewReader(c.in)))
		if errors.Is(err, errRetry) != c.retry || (err != nil && !c.retry) != c.refused {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestOneHostName: a client hello's server_name must be exactly one
// host_name entry (Go's parser skips entries of other types).
func TestOneHostName(t *testing.T) {
	hello := func(list []byte) []byte {
		ext := append([]byte{0, 0, byte(len(list) >> 8), byte(len(list))}, list...)
		body := append([]byte{3, 3}, make([]byte, 32)...)
		body = append(body, 0, 0, 2, 0x13, 0x01, 1, 0, byte(len(ext)>>8), byte(len(ext)))
		body = append(body, ext...)
		hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
		return append([]byte{recordHandshake, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
	}
	entry := func(typ byte, name string) []byte {
		return append([]byte{typ, byte(len(name) >> 8), byte(len(name))}, name...)
	}
	list := func(es ...[]byte) []byte {
		var b []byte
		for _, e := range es {
			b = append(b, e...)
		}
		return append([]byte{byte(len(b) >> 8), byte(len(b))}, b...)
	}
	for name, c := range map[string]struct {
		in []byte
		ok bool
	}{
		"one host name":         {hello(list(entry(0, "api.test"))), true},
		"two host names":        {hello(list(entry(0, "api.test"), entry(0, "other.test"))), false},
		"another type first":    {hello(list(entry(1, "other.test"), entry(0, "api.test"))), false},
		"another type only":     {hello(list(entry(1, "api.test"))), false},
		"a list longer than it": {hello(append(list(entry(0, "api.test")), 0)), false},
	} {
		if err := oneHostName(c.in); (err == nil) != c.ok {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A hello as crypto/tls writes it.
	a, b := net.Pipe()
	go func() {
		tlsClient(b, "api.test").Handshake()
		b.Close()
	}()
	br := bufio.NewReader(a)
	_, head, err := clientHello(a, br)
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	recs, err := handshakeRecords(bufio.NewReader(bytes.NewReader(head)))
	if err != nil || oneHostName(recs) != nil {
		t.Fatalf("crypto/tls's hello: %v, %v", err, oneHostName(recs))
	}
}
