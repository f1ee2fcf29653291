package sandbox

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sync"
)

// The daemon and the init talk over a stream socketpair in JSON lines.
//
// daemon -> init: spec (once, first), allow, signal.
// init -> daemon: ready or error (once, answering spec), ack (answering
// allow, same id), exit (the command's status, just before the init exits).
type message struct {
	Op     string    `json:"op"`
	Spec   *initSpec `json:"spec,omitempty"`
	ID     uint64    `json:"id,omitempty"`
	Paths  []string  `json:"paths,omitempty"`
	Sig    int       `json:"sig,omitempty"`
	Step   string    `json:"step,omitempty"`
	Err    string    `json:"err,omitempty"`
	Code   int       `json:"code,omitempty"`
	Signal int       `json:"signal,omitempty"`
}

const (
	opSpec   = "spec"
	opAllow  = "allow"
	opSignal = "signal"
	opReady  = "ready"
	opError  = "error"
	opAck    = "ack"
	opExit   = "exit"
)

// maxMessage bounds one line: a Spec with its binaries fits many times over.
const maxMessage = 4 << 20

type channel struct {
	mu  sync.Mutex // serialises writes
	w   io.Writer
	dec *bufio.Scanner
}

func newChannel(rw io.ReadWriter) *channel {
	sc := bufio.NewScanner(rw)
	sc.Buffer(make([]byte, 64<<10), maxMessage)
	return &channel{w: rw, dec: sc}
}

func (c *channel) send(m message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", m.Op, err)
	}
	b = append(b, '\n')
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.w.Write(b); err != nil {
		return fmt.Errorf("send %s: %w", m.Op, err)
	}
	return nil
}

// recv reads the next message; only one goroutine may call it.
func (c *channel) recv() (message, error) {
	if !c.dec.Scan() {
		if err := c.dec.Err(); err != nil {
			return message{}, err
		}
		return message{}, io.EOF
	}
	var m message
	if err := json.Unmarshal(c.dec.Bytes(), &m); err != nil {
		return message{}, fmt.Errorf("decode: %w", err)
	}
	return m, nil
}
