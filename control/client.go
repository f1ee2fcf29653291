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
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
	next int
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

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Call sends one request and decodes its result into out (if not nil).
// A JSON-RPC error comes back as *Error.
func (c *Client) Call(method string, params, out any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	req := map[string]any{"jsonrpc": "2.0", "id": c.next, "method": method, "params": params}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	_, werr := c.conn.Write(append(b, '\n'))
	// Even when the write fails, the daemon may have said why it closed
	// the connection (a refused peer): read that first.
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		if werr != nil {
			return werr
		}
		return fmt.Errorf("read answer: %w", err)
	}
	var resp struct {
		Result json.RawMessage `json:"result"`
		Error  *Error          `json:"error"`
	}
	if err := json.Unmarshal(line, &resp); err != nil {
		return fmt.Errorf("bad answer %q: %w", line, err)
	}
	if resp.Error != nil {
		return resp.Error
	}
	if out != nil {
		return json.Unmarshal(resp.Result, out)
	}
	return nil
}

func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(g.Gid)
}
