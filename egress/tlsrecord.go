package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// The TLS record layer as the gateway reads it to decide a connection by
// its SNI without terminating it: the client hello (through crypto/tls's
// own parser), the records that carry it, its server_name extension, and
// the server's first record (a HelloRetryRequest asks for a second hello,
// which must name the decided host too).

// errAbortHello stops crypto/tls once it has parsed the client hello.
var errAbortHello = errors.New("hello read")

// clientHello reads a TLS client hello from br, through crypto/tls's own
// parser, and returns its SNI and the bytes read, to be replayed upstream.
func clientHello(c net.Conn, br *bufio.Reader) (sni string, read []byte, err error) {
	rec := &recorder{r: br}
	var hello *tls.ClientHelloInfo
	_ = c.SetReadDeadline(time.Now().Add(headWait))
	err = tls.Server(readOnly{rec}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		hello = h
		return nil, errAbortHello
	}}).Handshake()
	_ = c.SetReadDeadline(time.Time{})
	if hello == nil {
		if err == nil {
			err = errors.New("no client hello")
		}
		return "", nil, err
	}
	return hello.ServerName, rec.buf.Bytes(), nil
}

// A server asks for a second client hello with a HelloRetryRequest (TLS
// 1.3): a server hello whose random is this constant (RFC 8446 4.1.3).
// The second hello's SNI is the one the server serves, so it is checked as
// the first was (TestEgressSNICheckedOnRetriedHello).
var helloRetryRandom = []byte{
	0xCF, 0x21, 0xAD, 0x74, 0xE5, 0x9A, 0x61, 0x11, 0xBE, 0x1D, 0x8C, 0x02, 0x1E, 0x65, 0xB8, 0x91,
	0xC2, 0xA2, 0x11, 0x16, 0x7A, 0xBB, 0x8C, 0x5E, 0x07, 0x9E, 0x09, 0xE2, 0xC8, 0xA8, 0x33, 0x9C,
}

// TLS record layer (RFC 8446 5.1).
const (
	recordHeader     = 5
	maxRecord        = recordHeader + 16384 + 256
	recordCCS        = 20
	recordAlert      = 21
	recordHandshake  = 22
	maxHelloRecords  = 64 << 10 // a client hello's records, at most
	serverHelloBytes = 4 + 2 + 32
)

// helloGuard holds a TLS connection's program side after its first
// client hello until the server's first handshake message says whether a
// second hello comes; that one, too, must name the decided host.
type helloGuard struct {
	f       *flow
	r       Request
	verdict Verdict
	hello   []byte // the first client hello's records, exactly
	src     *bufio.Reader
	up      net.Conn
	retry   chan error // the server's first message: errRetry, nil (none), or why it could not be read
}

var errRetry = errors.New("hello retry request")

// client is the relay's gate for the program's bytes: it sends the first
// hello, and the second when the server asks for one and it names the
// host; false when the connection was cut.
func (hg *helloGuard) client() bool {
	if _, err := hg.up.Write(hg.hello); err != nil {
		return false
	}
	err := <-hg.retry
	switch {
	case err == nil:
		return true
	case !errors.Is(err, errRetry):
		hg.cut("cut: the server's first TLS record could not be read as an alert or a server hello: " + err.Error())
		return false
	}
	_ = hg.f.client.SetReadDeadline(time.Now().Add(headWait))
	defer hg.f.client.SetReadDeadline(time.Time{})
	for {
		h, err := hg.src.Peek(recordHeader)
		if err != nil {
			hg.cut("cut: no second client hello after the server's retry request: " + err.Error())
			return false
		}
		switch h[0] {
		case recordCCS: // middlebox compatibility (RFC 8446 D.4): one byte
			var ccs [recordHeader + 1]byte
			if h[3] != 0 || h[4] != 1 {
				hg.cut("cut: a change cipher spec record that is not one byte")
				return false
			}
			if _, err := io.ReadFull(hg.src, ccs[:]); err != nil {
				return false
			}
			if _, err := hg.up.Write(ccs[:]); err != nil {
				return false
			}
		case recordHandshake:
			second, err := handshakeRecords(hg.src)
			if err == nil {
				err = oneHostName(second)
			}
			if err != nil {
				hg.cut("cut: the second client hello's records: " + err.Error())
				return false
			}
			sni, _, err := clientHello(readOnly{}, bufio.NewReader(bytes.NewReader(second)))
			if err != nil || sni == "" || canonicalHost(sni) != hg.r.Host {
				hg.cut("cut: the second client hello names " + strconv.Quote(sni) + ", not " + strconv.Quote(hg.r.Host))
				return false
			}
			_, err = hg.up.Write(second)
			return err == nil
		default:
			hg.cut(fmt.Sprintf("cut: a TLS record of type %d before the second client hello", h[0]))
			return false
		}
	}
}

// cut cuts the connection, audited with why unless it was cut already (a
// switch's cut also ends the reads the guard waits on).
func (hg *helloGuard) cut(why string) {
	hg.f.mu.Lock()
	done := hg.f.cutDone
	hg.f.mu.Unlock()
	if !done {
		hg.f.g.audit(Event{Request: hg.r, Verdict: hg.verdict, Addr: hg.f.dialled(), Refused: why})
	}
	hg.f.cut()
}

// serverRetries reads (without taking) the server's first TLS record: nil
// for an alert or a server hello, errRetry for a HelloRetryRequest, and an
// error for anything else (a server hello split across records included:
// it cannot be classified, and servers do not split it).
func serverRetries(br *bufio.Reader) error {
	h, err := br.Peek(recordHeader)
	if err != nil {
		return err
	}
	n := int(h[3])<<8 | int(h[4])
	switch {
	case h[0] == recordAlert:
		return nil
	case h[0] != recordHandshake:
		return fmt.Errorf("a record of type %d", h[0])
	case n < serverHelloBytes:
		return fmt.Errorf("a handshake record of %d bytes", n)
	}
	b, err := br.Peek(recordHeader + serverHelloBytes)
	if err != nil {
		return err
	}
	if b[recordHeader] != 2 {
		return fmt.Errorf("a handshake message of type %d", b[recordHeader])
	}
	if bytes.Equal(b[recordHeader+6:recordHeader+serverHelloBytes], helloRetryRandom) {
		return errRetry
	}
	return nil
}

// handshakeRecords reads the handshake records that carry one whole
// handshake message (a client hello) and returns them as read; the message
// must end where a record does.
func handshakeRecords(br *bufio.Reader) ([]byte, error) {
	var out []byte
	need := -1 // the message's length with its 4-byte header, once known
	got := 0
	for need < 0 || got < need {
		var h [recordHeader]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return nil, err
		}
		n := int(h[3])<<8 | int(h[4])
		if h[0] != recordHandshake || n == 0 || n > 16384 || len(out)+recordHeader+n > maxHelloRecords {
			return nil, fmt.Errorf("a record of type %d and %d bytes where a handshake message was", h[0], n)
		}
		rec := make([]byte, recordHeader+n)
		copy(rec, h[:])
		if _, err := io.ReadFull(br, rec[recordHeader:]); err != nil {
			return nil, err
		}
		out = append(out, rec...)
		if need < 0 {
			// The message's header may itself be split; take its
			// length once 4 bytes of payload are here.
			payload := payloadOf(out)
			if len(payload) >= 4 {
				need = 4 + (int(payload[1])<<16 | int(payload[2])<<8 | int(payload[3]))
			}
		}
		got += n
	}
	if got != need {
		return nil, fmt.Errorf("the handshake message ends inside a record (%d of %d bytes)", need, got)
	}
	return out, nil
}

// oneHostName refuses a client hello (its records, as handshakeRecords
// returns them) whose server_name extension is not exactly one host_name
// entry: Go's parser, which names the host decided, takes the first
// host_name entry and skips entries of other types, where a server's may
// read another (OpenSSL and BoringSSL refuse such a list).
func oneHostName(recs []byte) error {
	p := payloadOf(recs)
	// type, length, version, random; then the session id, the cipher
	// suites and the compression methods, each behind its length.
	off := 4 + 2 + 32
	for _, width := range []int{1, 2, 1} {
		n, ok := field(p, off, width)
		if !ok {
			return errors.New("a client hello cut short")
		}
		off += width + n
	}
	extLen, ok := field(p, off, 2)
	if !ok || off+2+extLen > len(p) {
		return nil // no extensions: no SNI, which the caller refuses
	}
	exts := p[off+2 : off+2+extLen]
	for len(exts) >= 4 {
		typ, n := int(exts[0])<<8|int(exts[1]), int(exts[2])<<8|int(exts[3])
		if 4+n > len(exts) {
			return errors.New("an extension cut short")
		}
		if typ == 0 {
			list := exts[4 : 4+n]
			// list length (2), then one entry: type 0, length (2), name.
			if len(list) < 5 || int(list[0])<<8|int(list[1]) != len(list)-2 || list[2] != 0 ||
				int(list[3])<<8|int(list[4]) != len(list)-5 {
				return errors.New("the server_name extension is not exactly one host name")
			}
		}
		exts = exts[4+n:]
	}
	return nil
}

// field reads the big-endian length of width bytes at off in p.
func field(p []byte, off, width int) (int, bool) {
	if off+width > len(p) {
		return 0, false
	}
	n := 0
	for _, b := range p[off : off+width] {
		n = n<<8 | int(b)
	}
	return n, true
}

// payloadOf joins the payloads of the records in recs.
func payloadOf(recs []byte) []byte {
	var p []byte
	for len(recs) >= recordHeader {
		n := int(recs[3])<<8 | int(recs[4])
		p = append(p, recs[recordHeader:recordHeader+n]...)
		recs = recs[recordHeader+n:]
	}
	return p
}
