package control

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os/user"
	"strconv"
	"sync"
	"time"
)

// Client is a control-socket client: one connection, calls in order.
//
// A call that fails on the connection (a write or read error, a deadline,
// an answer that is not its own) breaks the client: its request may still
// be answered later, and that answer must never be read as the next
// call's (a decision for another tool call). Every later call fails.
type Client struct {
	mu     sync.Mutex
	conn   net.Conn
	r      *bufio.Reader
	next   int
	broken error
}

// Dial connects to a daemon's socket.
func Dial(path string) (*Client, error) {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &Client{conn: c, r: bufio.NewReaderSize(c, 64<<10)}, nil
}

// DialTimeout connects to a daemon's socket within d.
func DialTimeout(path string, d time.Duration) (*Client, error) {
	c, err := net.DialTimeout("unix", path, d)
	if err != nil {
		return nil, err
	}
	return &Client{conn: c, r: bufio.NewReaderSize(c, 64<<10)}, nil
}

// SetDeadline bounds every call from now on (zero: no deadline).
func (c *Client) SetDeadline(t time.Time) error { return c.conn.SetDeadline(t) }

// Broken reports whether a call failed on the connection (no later call
// can succeed on it).
func (c *Client) Broken() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken != nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Call sends one request and decodes its result into out (if not nil).
// A JSON-RPC error comes back as *Error.
func (c *Client) Call(method string, params, out any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		// %v, not %w: a refusal (a *Error) must not read as this call's
		// answer.
		return fmt.Errorf("the connection to the daemon is unusable after an earlier failure: %v", c.broken)
	}
	c.next++
	req := map[string]any{"jsonrpc": "2.0", "id": c.next, "method": method, "params": params}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	result, usable, err := c.exchange(append(b, '\n'), c.next)
	if !usable {
		c.broken = err
		c.conn.Close()
	}
	if err != nil {
		return err
	}
	if out != nil {
		return json.Unmarshal(result, out)
	}
	return nil
}

// exchange writes one request line and reads the answer to id; usable
// says whether the connection may carry another call.
func (c *Client) exchange(req []byte, id int) (_ json.RawMessage, usable bool, _ error) {
	_, werr := c.conn.Write(req)
	// Even when the write fails, the daemon may have said why it closed
	// the connection (a refused peer): read that first.
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		if werr != nil {
			return nil, false, werr
		}
		return nil, false, fmt.Errorf("read answer: %w", err)
	}
	var resp struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *Error          `json:"error"`
	}
	if err := json.Unmarshal(line, &resp); err != nil {
		return nil, false, fmt.Errorf("bad answer %q: %w", line, err)
	}
	if resp.Error != nil && (resp.ID == nil || string(resp.ID) == "null") {
		// The daemon's word on the connection (a refused peer, a line
		// it could not read), not an answer: it is said, and the
		// connection is done.
		return nil, false, resp.Error
	}
	if string(resp.ID) != strconv.Itoa(id) {
		return nil, false, fmt.Errorf("the daemon answered request %s, not request %d", resp.ID, id)
	}
	if resp.Error != nil {
		return nil, true, resp.Error
	}
	return resp.Result, true, nil
}

func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(g.Gid)
}
