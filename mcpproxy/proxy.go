// Package mcpproxy enforces the tool policy between an MCP client and an MCP
// server over the stdio transport (newline-delimited JSON-RPC 2.0). It
// relays every message both ways as raw bytes, except:
//
//   - tools/call: decided first (Decider.Decide). Allowed calls are
//     forwarded unchanged. Denied ones are answered to the client with a
//     tool result whose isError is true, and never reach the server. Calls
//     that need approval are put to the client (elicitation/create) when it
//     declared that capability, and forwarded only on an explicit accept
//     with approve = true; otherwise they are denied.
//   - tools/list results: tools the roles can never call are left out.
//
// Every failure fails closed: a daemon that cannot be reached, a malformed
// tools/call, or an approval that times out is a denial; a listing that
// cannot be filtered lists no tools.
package mcpproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Decider decides for the proxy (the daemon, over its socket).
type Decider interface {
	// Decide decides a call: "allow", "deny" or "approval_required", with
	// the reasons.
	Decide(ctx context.Context, tool string, args json.RawMessage) (decision string, reasons []string, err error)
	// Callable returns those of tools that could ever be called.
	Callable(ctx context.Context, tools []string) ([]string, error)
}

// Options configure a proxy.
type Options struct {
	Decider Decider
	Logger  *slog.Logger
	// ApprovalTimeout bounds how long a call waits for the user's answer
	// (default 5 minutes); DecideTimeout bounds one decision (default 5 s).
	ApprovalTimeout time.Duration
	DecideTimeout   time.Duration
}

// MaxMessage bounds one message (a line) in either direction.
const MaxMessage = 64 << 20

type proxy struct {
	opts   Options
	client *lockedWriter // to the client
	server *lockedWriter // to the server

	elicit   atomic.Bool  // the client declared the elicitation capability
	protocol atomic.Value // the protocol version the server agreed to (string)
	initID   atomic.Value // the id of the client's initialize request (string)

	mu        sync.Mutex
	lists     map[string]bool                 // ids of tools/list requests in flight
	approvals map[string]chan json.RawMessage // our elicitation ids -> answer
	// pending approvals asked by an input_required result (protocol
	// 2026-07-28, multi round-trip): requestState token -> the call it
	// was asked for, so that an answer approves exactly that call, once.
	asked  map[string]askedCall
	nextID int
	calls  sync.WaitGroup
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) line(b []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.w.Write(b); err != nil {
		return err
	}
	_, err := l.w.Write([]byte{'\n'})
	return err
}

// message is what the proxy reads of a JSON-RPC message; the rest stays raw.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

func (m *message) isRequest() bool  { return m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null" }
func (m *message) isResponse() bool { return m.Method == "" && len(m.ID) > 0 }

// Run relays until the server's output ends (it returns nil then) or the
// client's input ends (it closes the server's input and returns once the
// server's output ends, or ctx is done).
func Run(ctx context.Context, opts Options, clientIn io.Reader, clientOut io.Writer, serverIn io.WriteCloser, serverOut io.Reader) error {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ApprovalTimeout == 0 {
		opts.ApprovalTimeout = 5 * time.Minute
	}
	if opts.DecideTimeout == 0 {
		opts.DecideTimeout = 5 * time.Second
	}
	p := &proxy{
		opts: opts, client: &lockedWriter{w: clientOut}, server: &lockedWriter{w: serverIn},
		lists: map[string]bool{}, approvals: map[string]chan json.RawMessage{}, asked: map[string]askedCall{},
	}
	fromServer := make(chan error, 1)
	go func() { fromServer <- p.serverLoop(ctx, serverOut) }()
	fromClient := make(chan error, 1)
	go func() {
		err := p.clientLoop(ctx, clientIn)
		// The client is gone: let calls being decided finish, then close
		// the server's input so that it can end.
		p.calls.Wait()
		serverIn.Close()
		fromClient <- err
	}()
	select {
	case err := <-fromServer:
		// The server has ended: so does the relay (a goroutine may still
		// be blocked reading the client; the caller's process exits).
		return err
	case clientErr := <-fromClient:
		select {
		case err := <-fromServer:
			if clientErr != nil {
				return clientErr
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func readLines(r io.Reader, each func(line []byte) error) error {
	br := bufio.NewReaderSize(r, 1<<16)
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A long message: gather it whole (bounded).
			buf := append([]byte(nil), line...)
			for err == bufio.ErrBufferFull {
				line, err = br.ReadSlice('\n')
				buf = append(buf, line...)
				if len(buf) > MaxMessage {
					return fmt.Errorf("a message over %d bytes", MaxMessage)
				}
			}
			line = buf
		}
		if t := bytes.TrimSpace(line); len(t) > 0 {
			// A copy: the reader's buffer is reused, and a message may be
			// handled after the next read (a tools/call being decided).
			if cerr := each(append([]byte(nil), t...)); cerr != nil {
				return cerr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// clientLoop handles what the client sends.
func (p *proxy) clientLoop(ctx context.Context, in io.Reader) error {
	return readLines(in, func(line []byte) error {
		if line[0] == '[' {
			// A batch (older protocol versions): handled message by
			// message, so that no tools/call slips through inside one.
			var batch []json.RawMessage
			if err := json.Unmarshal(line, &batch); err != nil {
				return p.refuse(err)
			}
			for _, m := range batch {
				if err := p.fromClient(ctx, m); err != nil {
					return err
				}
			}
			return nil
		}
		return p.fromClient(ctx, line)
	})
}

func (p *proxy) fromClient(ctx context.Context, raw []byte) error {
	// The server must read exactly what the proxy decided on. A message
	// the proxy cannot parse, or one with two keys that parsers may pick
	// between ("method" and "Method": encoding/json matches keys without
	// case and takes the last, other parsers do not), could carry a
	// tools/call past the decision: it is refused, never forwarded.
	var m message
	if err := strictKeys(raw); err != nil {
		return p.refuse(err)
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return p.refuse(err)
	}
	switch {
	case m.isResponse():
		p.mu.Lock()
		ch, ours := p.approvals[string(m.ID)]
		delete(p.approvals, string(m.ID))
		p.mu.Unlock()
		if ours {
			ch <- raw
			return nil
		}
	case m.Method == "initialize":
		p.initID.Store(string(m.ID))
		var params struct {
			Capabilities struct {
				Elicitation json.RawMessage `json:"elicitation"`
			} `json:"capabilities"`
		}
		json.Unmarshal(m.Params, &params)
		p.elicit.Store(len(params.Capabilities.Elicitation) > 0 && string(params.Capabilities.Elicitation) != "null")
	case m.Method == "tools/list" && m.isRequest():
		p.mu.Lock()
		p.lists[string(m.ID)] = true
		p.mu.Unlock()
	case m.Method == "tools/call":
		if !m.isRequest() {
			return nil // a call without an id gets no answer: nothing runs
		}
		p.calls.Add(1)
		go func() {
			defer p.calls.Done()
			p.call(ctx, m, raw)
		}()
		return nil
	}
	return p.server.line(raw)
}

// refuse answers a client message the proxy will not forward.
func (p *proxy) refuse(why error) error {
	resp, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": nil,
		"error": map[string]any{"code": -32600, "message": "condfs: message refused, not forwarded: " + why.Error()},
	})
	return p.client.line(resp)
}

// strictKeys fails on invalid JSON and on an object, at any depth, with
// two keys equal when case is ignored.
func strictKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		keys   map[string]bool
		object bool
		key    bool // the next token is a key
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			top := &stack[n-1]
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:n-1]
				continue
			}
			if top.key {
				k := strings.ToLower(tok.(string))
				if top.keys[k] {
					return fmt.Errorf("duplicate key %q", tok)
				}
				top.keys[k] = true
				top.key = false
				continue
			}
			top.key = true
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{keys: map[string]bool{}, object: true, key: true})
		case json.Delim('['):
			stack = append(stack, frame{})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
	}
}

// call decides one tools/call and forwards it or answers it.
func (p *proxy) call(ctx context.Context, m message, raw []byte) {
	var params struct {
		Name           *string                    `json:"name"`
		Arguments      json.RawMessage            `json:"arguments"`
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
		RequestState   string                     `json:"requestState"`
		Meta           struct {
			Version      string `json:"io.modelcontextprotocol/protocolVersion"`
			Capabilities struct {
				Elicitation json.RawMessage `json:"elicitation"`
			} `json:"io.modelcontextprotocol/clientCapabilities"`
		} `json:"_meta"`
	}
	if err := json.Unmarshal(m.Params, &params); err != nil || params.Name == nil || *params.Name == "" {
		p.deny(m.ID, "", []string{"malformed tools/call: params need a name"})
		return
	}
	name := *params.Name
	args := params.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	if args[0] != '{' {
		p.deny(m.ID, name, []string{"malformed tools/call: arguments must be an object"})
		return
	}
	dctx, cancel := context.WithTimeout(ctx, p.opts.DecideTimeout)
	decision, reasons, err := p.opts.Decider.Decide(dctx, name, args)
	cancel()
	if err != nil {
		p.opts.Logger.Warn("no decision; denying", "tool", name, "err", err)
		p.deny(m.ID, name, []string{"the condfs daemon gave no decision: " + err.Error()})
		return
	}
	switch decision {
	case "allow":
		p.server.line(raw)
	case "approval_required":
		if answer, ok := params.InputResponses[approvalKey]; ok {
			// The retry of a call we asked about (multi round-trip).
			if fwd, ok := p.answered(params.RequestState, name, args, answer, raw); ok {
				p.server.line(fwd)
				return
			}
			p.deny(m.ID, name, []string{"approval required"})
			return
		}
		elicit, mrtr := p.elicit.Load(), p.multiRoundTrip()
		if meta := params.Meta; meta.Version != "" {
			// Protocol 2026-07-28 and later: no initialize handshake; each
			// request carries its version and the client's capabilities.
			mrtr = meta.Version >= "2026-07-28"
			elicit = len(meta.Capabilities.Elicitation) > 0 && string(meta.Capabilities.Elicitation) != "null"
		}
		if elicit && mrtr {
			p.askInResult(m.ID, name, args, reasons)
			return
		}
		if elicit && p.approved(ctx, name, args, reasons) {
			p.server.line(raw)
			return
		}
		p.deny(m.ID, name, []string{"approval required"})
	default:
		p.deny(m.ID, name, reasons)
	}
}

// approvalKey names condfs's question among a call's input requests.
const approvalKey = "condfs-approval"

type askedCall struct {
	call    [32]byte // the tool name and arguments asked about
	expires time.Time
}

// callHash identifies a call by its tool and its arguments in a canonical
// form (decoded and encoded again: object keys sorted), so that a retry
// that re-encodes the same arguments still matches.
func callHash(name string, args json.RawMessage) [32]byte {
	var v any
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	if dec.Decode(&v) == nil {
		if canon, err := json.Marshal(v); err == nil {
			args = canon
		}
	}
	return sha256.Sum256(append(append([]byte(name), 0), args...))
}

// multiRoundTrip reports whether the agreed protocol asks for client input
// in results (2026-07-28 and later) rather than by requests to the client.
func (p *proxy) multiRoundTrip() bool {
	v, _ := p.protocol.Load().(string)
	return v >= "2026-07-28"
}

// approvalQuestion is what the user is asked about a call.
func approvalQuestion(name string, args json.RawMessage, reasons []string) map[string]any {
	text := fmt.Sprintf("Allow the tool call %s(%s)?", name, summary(args))
	if len(reasons) > 0 {
		text += " " + strings.Join(reasons, "; ")
	}
	return map[string]any{
		"message": text,
		"requestedSchema": map[string]any{
			"type": "object",
			"properties": map[string]any{
				"approve": map[string]any{"type": "boolean", "title": "Approve", "description": "Run " + name + " with these arguments"},
			},
			"required": []string{"approve"},
		},
	}
}

// askInResult answers the call with an input_required result that asks
// the user (the client retries the call with the answer).
func (p *proxy) askInResult(id json.RawMessage, name string, args json.RawMessage, reasons []string) {
	var tok [16]byte
	rand.Read(tok[:])
	state := hex.EncodeToString(tok[:])
	p.mu.Lock()
	now := time.Now()
	for k, a := range p.asked {
		if now.After(a.expires) {
			delete(p.asked, k)
		}
	}
	p.asked[state] = askedCall{call: callHash(name, args), expires: now.Add(p.opts.ApprovalTimeout)}
	p.mu.Unlock()
	resp, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": id,
		"result": map[string]any{
			"resultType":    "input_required",
			"inputRequests": map[string]any{approvalKey: map[string]any{"method": "elicitation/create", "params": approvalQuestion(name, args, reasons)}},
			"requestState":  state,
		},
	})
	p.client.line(resp)
}

// answered checks the answer to a question askInResult asked, for exactly
// this call and once, and returns the call to forward without condfs's
// part (the server never asked for it).
func (p *proxy) answered(state, name string, args, answer json.RawMessage, raw []byte) ([]byte, bool) {
	p.mu.Lock()
	a, ok := p.asked[state]
	delete(p.asked, state)
	p.mu.Unlock()
	if !ok || time.Now().After(a.expires) || a.call != callHash(name, args) {
		return nil, false
	}
	var r struct {
		Action  string `json:"action"`
		Content struct {
			Approve *bool `json:"approve"`
		} `json:"content"`
	}
	if json.Unmarshal(answer, &r) != nil || r.Action != "accept" || r.Content.Approve == nil || !*r.Content.Approve {
		return nil, false
	}
	var msg map[string]json.RawMessage
	if json.Unmarshal(raw, &msg) != nil {
		return nil, false
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(msg["params"], &params) != nil {
		return nil, false
	}
	var responses map[string]json.RawMessage
	json.Unmarshal(params["inputResponses"], &responses)
	delete(responses, approvalKey)
	if len(responses) == 0 {
		delete(params, "inputResponses")
		delete(params, "requestState")
	} else {
		params["inputResponses"], _ = json.Marshal(responses)
	}
	msg["params"], _ = json.Marshal(params)
	out, err := json.Marshal(msg)
	return out, err == nil
}

// approved asks the client's user with an elicitation/create request
// (protocols before 2026-07-28).
func (p *proxy) approved(ctx context.Context, name string, args json.RawMessage, reasons []string) bool {
	p.mu.Lock()
	p.nextID++
	id := fmt.Sprintf("%q", fmt.Sprintf("condfs-approval-%d", p.nextID))
	ch := make(chan json.RawMessage, 1)
	p.approvals[id] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.approvals, id)
		p.mu.Unlock()
	}()
	req, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": json.RawMessage(id), "method": "elicitation/create",
		"params": approvalQuestion(name, args, reasons),
	})
	if err := p.client.line(req); err != nil {
		return false
	}
	select {
	case raw := <-ch:
		var resp struct {
			Result *struct {
				Action  string `json:"action"`
				Content struct {
					Approve *bool `json:"approve"`
				} `json:"content"`
			} `json:"result"`
		}
		if json.Unmarshal(raw, &resp) != nil || resp.Result == nil {
			return false
		}
		r := resp.Result
		return r.Action == "accept" && r.Content.Approve != nil && *r.Content.Approve
	case <-time.After(p.opts.ApprovalTimeout):
		return false
	case <-ctx.Done():
		return false
	}
}

// summary shortens a call's arguments for a question to the user.
func summary(args json.RawMessage) string {
	s := string(args)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// deny answers a tools/call with a tool error that says why.
func (p *proxy) deny(id json.RawMessage, tool string, reasons []string) {
	text := "Denied by policy"
	if tool != "" {
		text += " (condfs): " + tool
	}
	if len(reasons) > 0 {
		text += ": " + strings.Join(reasons, "; ")
	}
	resp, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": id,
		"result": map[string]any{
			"content": []map[string]any{{"type": "text", "text": text}},
			"isError": true,
		},
	})
	p.client.line(resp)
}

// serverLoop relays what the server sends, filtering tools/list results.
func (p *proxy) serverLoop(ctx context.Context, out io.Reader) error {
	return readLines(out, func(line []byte) error {
		var m message
		if line[0] == '{' && json.Unmarshal(line, &m) == nil && m.isResponse() {
			if id, _ := p.initID.Load().(string); id != "" && id == string(m.ID) {
				var r struct {
					ProtocolVersion string `json:"protocolVersion"`
				}
				json.Unmarshal(m.Result, &r)
				p.protocol.Store(r.ProtocolVersion)
			}
			p.mu.Lock()
			isList := p.lists[string(m.ID)]
			delete(p.lists, string(m.ID))
			p.mu.Unlock()
			if isList && len(m.Result) > 0 {
				return p.client.line(p.filterList(ctx, line, m))
			}
		}
		return p.client.line(line)
	})
}

// filterList leaves out the tools the roles can never call; every other
// field (nextCursor included) stays.
func (p *proxy) filterList(ctx context.Context, line []byte, m message) []byte {
	var result map[string]json.RawMessage
	if err := json.Unmarshal(m.Result, &result); err != nil {
		// Not a listing the proxy can filter: list nothing.
		result = map[string]json.RawMessage{}
	}
	var tools []json.RawMessage
	json.Unmarshal(result["tools"], &tools)
	names := make([]string, len(tools))
	for i, t := range tools {
		var tool struct {
			Name string `json:"name"`
		}
		json.Unmarshal(t, &tool)
		names[i] = tool.Name
	}
	dctx, cancel := context.WithTimeout(ctx, p.opts.DecideTimeout)
	callable, err := p.opts.Decider.Callable(dctx, names)
	cancel()
	keep := map[string]bool{}
	if err != nil {
		p.opts.Logger.Warn("cannot filter tools/list; listing none", "err", err)
	} else {
		for _, n := range callable {
			keep[n] = true
		}
	}
	kept := []json.RawMessage{}
	for i, t := range tools {
		if keep[names[i]] {
			kept = append(kept, t)
		}
	}
	result["tools"], _ = json.Marshal(kept)
	newResult, _ := json.Marshal(result)
	out, _ := json.Marshal(map[string]json.RawMessage{"jsonrpc": json.RawMessage(`"2.0"`), "id": m.ID, "result": newResult})
	return out
}
