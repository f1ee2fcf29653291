package egress

import (
	"bytes"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestH2WatchSeesTrailers: a HEADERS frame on a stream that has had one
// (trailers) is seen however the reads split the frames; new streams'
// HEADERS and other frames are not.
func TestH2WatchSeesTrailers(t *testing.T) {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	_ = enc.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"})
	block := append([]byte(nil), hb.Bytes()...)
	frames := func(trailer bool) []byte {
		var b bytes.Buffer
		b.WriteString(http2.ClientPreface)
		fr := http2.NewFramer(&b, nil)
		_ = fr.WriteSettings()
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true})
		_ = fr.WriteData(1, false, bytes.Repeat([]byte{1}, 3000))
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block, EndHeaders: true, EndStream: true})
		if trailer {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true, EndStream: true})
		} else {
			_ = fr.WriteData(1, true, nil)
		}
		return b.Bytes()
	}
	for _, trailer := range []bool{false, true} {
		for _, step := range []int{1, 7, 9, 100, 1 << 20} {
			w := &h2Watch{pre: len(http2.ClientPreface)}
			b := frames(trailer)
			for len(b) > 0 {
				k := min(step, len(b))
				w.scan(b[:k])
				b = b[k:]
			}
			if got := w.trailers.Load(); (got == 1) != trailer || (!trailer && got != 0) {
				t.Errorf("trailers %v, reads of %d: saw stream %d", trailer, step, got)
			}
		}
	}
}
