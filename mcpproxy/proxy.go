// Package mcpproxy enforces the tool policy between an MCP client and an MCP
// server over the stdio transport (newline-delimited JSON-RPC 2.0).
//
// What is decided is exactly what is forwarded. Every line, both ways, is
// parsed once by internal/jsonwire, which refuses any text readers could
// read apart (keys duplicated exactly or under case folding, at any depth;
// a JSON-RPC member spelled in another case; invalid UTF-8; unpaired
// surrogates; from the client, numbers a float64 reader reads differently);
// what is passed on is that parse re-encoded as one line of printable
// ASCII, never the bytes read, so no reader can split it at a CR, U+2028
// or NEL. A refused client message is answered with an error and never
// forwarded; a refused server message is dropped and logged. A message
// is a request (a method and an id), a notification (a method) or an
// answer (an id and a result or an error), never two: one with a method
// and a result could be read as an answer by a client that tells answers
// by their result. Then:
//
//   - tools/call: decided first (Decider.Decide) on the parse that is
//     forwarded. Allowed calls are forwarded. Denied ones are answered to
//     the client with a tool result whose isError is true, and never reach
//     the server. Calls that need approval are put to the client
//     (elicitation/create) when it declared that capability, and forwarded
//     only on an explicit accept with approve = true; otherwise they are
//     denied.
//   - tools/list results: tools the roles can never call are left out.
//   - answers: every request either side sends is kept, by id and
//     method, until it is answered, and an answer is passed on only to
//     the request it answers (a server's answer to a client's tools/list
//     is filtered as that listing). A request whose id is already in
//     flight from the same side (1 and "1" are one id), or whose id is
//     null, is refused (the client gets an error, a server's is dropped);
//     an answer to no request in flight is dropped, and so is one to a
//     tools/call not yet decided (the server was never sent it). A listing's answer
//     could otherwise be read as another request's and pass unfiltered.
//     A cancelled request's id is free again; so that a late answer read
//     as a later request's cannot list tools, any answer whose result has
//     tools (a key that folds to tools included) is filtered as a
//     listing, and a key that folds to tools without being it is left
//     out of every listing.
//   - batches (older protocol versions): each message is handled, and
//     forwarded, on its own line.
//
// Every failure fails closed: a daemon that cannot be reached, a malformed
// tools/call, an approval that times out or whose client is gone, or one
// beyond MaxApprovals pending, is a denial; a listing that cannot be
// filtered lists no tools; a request beyond MaxInFlight is refused.
package mcpproxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/condfs/condfs/internal/jsonwire"
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
	// ClientGone, when set, is called once the client's input has ended
	// and the server's input is closed: the caller starts its own timer
	// to stop the server (Run goes on relaying what the server still
	// says until its output ends or ctx is done).
	ClientGone func()
	// Checkpoint, when set, is called before each allowed tools/call is
	// forwarded (after its last decision), so that what the call changes
	// can be undone; a call it fails for is denied, with its error.
	Checkpoint func(ctx context.Context, tool string) error
}

// MaxMessage bounds one message (a line) in either direction, and
// MaxValues the JSON values in one: a parsed value is held in about 90
// bytes, so a line of small values would hold 40 times its size.
const (
	MaxMessage = 64 << 20
	MaxValues  = 1 << 21
)

// MaxInFlight bounds the requests each side may have in flight (sent,
// not yet answered); a client request beyond it is answered with an
// error, a server's is dropped (and logged). MaxApprovals bounds the
// approval questions pending at once (each holds a call until the user
// answers): a call that needs one beyond it is denied.
const (
	MaxInFlight  = 4096
	MaxApprovals = 16
)

type proxy struct {
	opts   Options
	client *lockedWriter // to the client
	server *lockedWriter // to the server

	elicit   atomic.Bool  // the client declared the elicitation capability
	protocol atomic.Value // the protocol version the server agreed to (string)

	// gone is closed when the client's input has ended: pending
	// approvals are denied.
	gone chan struct{}

	mu sync.Mutex
	// Requests in flight, by id as re-encoded -> method: the client's to
	// the server (forwarded, or being decided) and the server's to the
	// client. An answer is matched to exactly one of them and passed on
	// as its answer.
	toServer  inFlight
	toClient  inFlight
	approvals map[string]chan *jsonwire.Value // our elicitation ids -> answer
	// pending approvals asked by an input_required result (protocol
	// 2026-07-28, multi round-trip): requestState token -> the call it
	// was asked for, so that an answer approves exactly that call, once.
	asked map[string]askedCall
	calls sync.WaitGroup
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

// wireRules: what the proxy reads from the client must mean one thing to
// every reader, numbers included (a policy decides on them).
var wireRules = jsonwire.Rules{Agreed: true, MaxValues: MaxValues}

// serverRules: nothing is decided on a server's numbers; they pass exactly
// as written (re-encoded around them).
var serverRules = jsonwire.Rules{MaxValues: MaxValues}

// envelope are the keys of a JSON-RPC message the proxy reads.
var envelope = []string{"jsonrpc", "id", "method", "params", "result", "error"}

// message is a parsed JSON-RPC message: what the proxy decides on, and
// (re-encoded) exactly what it passes on.
type message struct {
	v      *jsonwire.Value
	id     []byte // the id as re-encoded, nil when absent
	method string
}

// readMessage reads a message object, refusing one whose envelope a
// reader could take apart from the proxy's reading.
func readMessage(v *jsonwire.Value) (message, error) {
	if v.Kind != jsonwire.Object {
		return message{}, fmt.Errorf("a message must be an object")
	}
	if k, ok := v.HasFolded(envelope...); ok {
		return message{}, fmt.Errorf("key %q: readers that fold case read it as a JSON-RPC member", k)
	}
	m := message{v: v}
	if id := v.Get("id"); id != nil {
		if id.Kind != jsonwire.String && id.Kind != jsonwire.Number && id.Kind != jsonwire.Null {
			return message{}, fmt.Errorf("id must be a string or a number")
		}
		// Only integers in their plain form, each reader's alike: servers
		// read numeric ids as they like (the Go SDK answers 2.5 as 2, and
		// 10000000000000000000, as float64 then int64, as -2^63), and an
		// answer the proxy cannot match to its request (a tools/list)
		// would pass unfiltered.
		if id.Kind == jsonwire.Number && !safeInteger(id.Str) {
			return message{}, fmt.Errorf("id %s: a numeric id must be an integer of at most 2^53-1 in magnitude", id.Str)
		}
		m.id = id.Bytes()
	}
	if mv := v.Get("method"); mv != nil {
		s, ok := mv.Text()
		if !ok || s == "" {
			return message{}, fmt.Errorf("method must be a non-empty string")
		}
		m.method = s
	}
	// One of the three, never two: a client that tells an answer by its
	// result would read a server's request that carries one (under the id
	// of the client's tools/list) as an answer, unfiltered.
	result, errv := v.Get("result") != nil, v.Get("error") != nil
	switch {
	case m.method != "" && (result || errv):
		return message{}, errors.New("a message is a request, a notification or an answer, never two: a method with a result or an error")
	case m.method == "" && (m.id == nil || result == errv):
		return message{}, errors.New("a message is a request, a notification or an answer: an answer has an id and a result or an error (one of them)")
	}
	return m, nil
}

// safeInteger reports whether a JSON number is an integer in plain form
// (no fraction or exponent, not -0) that float64, int64 and JavaScript's
// Number all read as the same value: |n| <= 2^53-1.
func safeInteger(n string) bool {
	if strings.ContainsAny(n, ".eE") || n == "-0" {
		return false
	}
	v, err := strconv.ParseInt(n, 10, 64)
	return err == nil && v >= -(1<<53-1) && v <= 1<<53-1
}

// A request has a method and an id; a notification a method and no id;
// an answer an id and no method. A method with id null is none of them:
// it cannot be answered so that its answer is told apart from another's,
// and is refused.
func (m *message) isRequest() bool  { return m.method != "" && m.id != nil && string(m.id) != "null" }
func (m *message) isResponse() bool { return m.method == "" && m.id != nil }
func (m *message) nullID() bool     { return m.method != "" && string(m.id) == "null" }
func (m *message) params() *jsonwire.Value {
	return m.v.Get("params")
}

// Run relays until the server's output ends (it returns nil then) or ctx
// is done. When the client's input ends, pending approvals are denied,
// calls being decided are answered, the server's input is closed and
// Options.ClientGone is called; what the server still says is relayed
// until its output ends or ctx is done. Run does not wait for a server
// that ignores the end of its input: the caller stops it on a timer and
// cancels ctx (a goroutine may then still be reading serverOut, or
// clientIn, until the caller closes them or its process exits).
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
	p := newProxy(opts, clientOut, serverIn)
	fromServer := make(chan error, 1)
	go func() { fromServer <- p.serverLoop(ctx, serverOut) }()
	fromClient := make(chan error, 1)
	go func() {
		err := p.clientLoop(ctx, clientIn)
		// The client is gone: pending approvals are denied, calls being
		// decided are answered (each within DecideTimeout), then the
		// server's input is closed so that it can end.
		close(p.gone)
		// Bounded: a call blocked writing to a client that reads no more
		// must not keep the server's input open.
		settled := make(chan struct{})
		go func() { p.calls.Wait(); close(settled) }()
		t := time.NewTimer(opts.DecideTimeout + time.Second)
		select {
		case <-settled:
		case <-t.C:
		}
		t.Stop()
		serverIn.Close()
		if opts.ClientGone != nil {
			opts.ClientGone()
		}
		fromClient <- err
	}()
	var clientErr error
	for {
		select {
		case err := <-fromServer:
			// The server has ended: so does the relay (a goroutine may
			// still be blocked reading the client; the caller's process
			// exits).
			if clientErr != nil {
				return clientErr
			}
			return err
		case clientErr = <-fromClient:
			fromClient = nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func newProxy(opts Options, clientOut, serverIn io.Writer) *proxy {
	return &proxy{
		opts: opts, client: &lockedWriter{w: clientOut}, server: &lockedWriter{w: serverIn},
		gone:     make(chan struct{}),
		toServer: inFlight{}, toClient: inFlight{},
		approvals: map[string]chan *jsonwire.Value{}, asked: map[string]askedCall{},
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
		if t := bytes.Trim(line, " \t\r\n"); len(t) > 0 {
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

// clientLoop handles what the client sends. Each line is parsed once,
// strictly; what the proxy forwards is that parse re-encoded, never the
// bytes it read.
func (p *proxy) clientLoop(ctx context.Context, in io.Reader) error {
	return readLines(in, func(line []byte) error {
		v, err := jsonwire.Parse(line, wireRules)
		if err != nil {
			return p.refuse(err)
		}
		if v.Kind == jsonwire.Array {
			// A batch (older protocol versions): handled message by
			// message, so that no tools/call slips through inside one.
			for _, e := range v.Elems {
				if err := p.fromClient(ctx, e); err != nil {
					return err
				}
			}
			return nil
		}
		return p.fromClient(ctx, v)
	})
}

func (p *proxy) fromClient(ctx context.Context, v *jsonwire.Value) error {
	m, err := readMessage(v)
	if err != nil {
		return p.refuse(err)
	}
	switch {
	case m.isResponse():
		p.mu.Lock()
		ch, ours := p.approvals[string(m.id)]
		delete(p.approvals, string(m.id))
		_, asked := p.toClient.take(m.id)
		p.mu.Unlock()
		switch {
		case ours:
			ch <- v
			return nil
		case !asked:
			// No request of the server's is waiting for it (or it was
			// answered already): the server never reads it.
			p.opts.Logger.Warn("client answer dropped: it answers no request in flight", "id", string(m.id))
			return nil
		}
		return p.server.line(v.Bytes())
	case m.nullID():
		return p.refuse(fmt.Errorf("a request's id may not be null: its answer could not be told from another's"))
	case m.isRequest():
		if err := p.track(p.toServer, m); err != nil {
			if errors.Is(err, errTooMany) {
				return p.answerError(m.id, err)
			}
			return p.refuse(err)
		}
	}
	switch {
	case m.method == "notifications/cancelled":
		// The server need not answer a cancelled request: its id is free
		// again (an answer that comes anyway is dropped, or read as that
		// of a later request under the id, which is filtered by shape
		// too: see fromServer).
		p.cancelled(p.toServer, m)
	case m.method == "initialize":
		p.elicit.Store(declared(m.params().Get("capabilities").Get("elicitation")))
	case m.method == "tools/call":
		if !m.isRequest() {
			return nil // a call without an id gets no answer: nothing runs
		}
		p.calls.Add(1)
		// Tracked, not yet sent: the server is given it, and may answer
		// it, only once it is decided (p.forward).
		go func() {
			defer p.calls.Done()
			p.call(ctx, m)
		}()
		return nil
	}
	return p.server.line(v.Bytes())
}

var errTooMany = errors.New("too many requests in flight")

// inFlight are the requests one side has sent and not had answered, by
// the id's text (a string's characters, a number's digits): a reader that
// takes 1 and "1" for one id is never given two requests under it. Each
// keeps its id exactly, and its method. Guarded by proxy.mu.
type inFlight map[string]request

type request struct {
	id, method string
	// sent: passed on to the other side; a tools/call is only once it is
	// decided, and until then no answer is its answer.
	sent bool
}

func idKey(id []byte) string {
	var s string
	if len(id) > 0 && id[0] == '"' && json.Unmarshal(id, &s) == nil {
		return s
	}
	return string(id)
}

// take ends the request an answer under id answers, exactly that id, and
// returns its method.
func (f inFlight) take(id []byte) (method string, ok bool) {
	r, ok := f[idKey(id)]
	if !ok || r.id != string(id) {
		return "", false
	}
	delete(f, idKey(id))
	return r.method, true
}

// answer is take for an answer from the other side: the request must
// have been sent to it (a server that guesses the id of a call pending
// approval does not answer it).
func (f inFlight) answer(id []byte) (method string, ok bool) {
	if r, ok := f[idKey(id)]; !ok || !r.sent {
		return "", false
	}
	return f.take(id)
}

// forward passes a decided tools/call on to the server, marked sent
// first so that its answer, however quick, is matched to it.
func (p *proxy) forward(m message) {
	p.mu.Lock()
	if r, ok := p.toServer[idKey(m.id)]; ok && r.id == string(m.id) {
		r.sent = true
		p.toServer[idKey(m.id)] = r
	}
	p.mu.Unlock()
	p.server.line(m.v.Bytes())
}

// track records a request in flight in reqs (toServer or toClient): its id
// must not be in flight already, and at most MaxInFlight may be.
func (p *proxy) track(reqs inFlight, m message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, dup := reqs[idKey(m.id)]; dup {
		return fmt.Errorf("id %s is already in flight (as %s): a request's id must differ from every other request's awaiting an answer", m.id, r.id)
	}
	if len(reqs) >= MaxInFlight {
		return fmt.Errorf("%w: %d awaiting an answer, the most condfs relays", errTooMany, len(reqs))
	}
	reqs[idKey(m.id)] = request{id: string(m.id), method: m.method, sent: m.method != "tools/call"}
	return nil
}

// cancelled ends, in reqs, the request a notifications/cancelled names.
func (p *proxy) cancelled(reqs inFlight, m message) {
	if id := m.params().Get("requestId"); id != nil {
		p.mu.Lock()
		reqs.take(id.Bytes())
		p.mu.Unlock()
	}
}

// untrack ends a client request the proxy answers itself.
func (p *proxy) untrack(id []byte) {
	p.mu.Lock()
	p.toServer.take(id)
	p.mu.Unlock()
}

// answerError answers a client request with a JSON-RPC error.
func (p *proxy) answerError(id []byte, why error) error {
	resp, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": json.RawMessage(id),
		"error": map[string]any{"code": -32600, "message": "condfs: request refused, not forwarded: " + why.Error()},
	})
	return p.client.line(resp)
}

// declared reports whether a capability is declared (present, not null).
func declared(v *jsonwire.Value) bool { return v != nil && v.Kind != jsonwire.Null }

// refuse answers a client message the proxy will not forward.
func (p *proxy) refuse(why error) error {
	resp, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": nil,
		"error": map[string]any{"code": -32600, "message": "condfs: message refused, not forwarded: " + why.Error()},
	})
	return p.client.line(resp)
}

// callKeys are the members of a tools/call's params the proxy reads.
var callKeys = []string{"name", "arguments", "inputResponses", "requestState", "_meta"}

// call decides one tools/call and forwards it or answers it. What is
// decided (the name, the arguments) is read from the parse that is
// forwarded; the decider gets the arguments as they will be forwarded.
func (p *proxy) call(ctx context.Context, m message) {
	params := m.params()
	if params == nil || params.Kind != jsonwire.Object {
		p.deny(m.id, "", []string{"malformed tools/call: params must be an object"})
		return
	}
	if k, ok := params.HasFolded(callKeys...); ok {
		p.deny(m.id, "", []string{fmt.Sprintf("malformed tools/call: params key %q (readers that fold case read it as another)", k)})
		return
	}
	name, ok := params.Get("name").Text()
	if !ok || name == "" {
		p.deny(m.id, "", []string{"malformed tools/call: params need a name"})
		return
	}
	argv := params.Get("arguments")
	args := []byte("{}")
	switch {
	case argv == nil || argv.Kind == jsonwire.Null:
	case argv.Kind == jsonwire.Object:
		args = argv.Bytes()
	default:
		p.deny(m.id, name, []string{"malformed tools/call: arguments must be an object"})
		return
	}
	decision, reasons := p.decide(ctx, name, args)
	if why := unaskable(name, args); decision == "approval_required" && why != "" {
		p.deny(m.id, name, append(reasons, why))
		return
	}
	switch decision {
	case "allow":
		p.forwardCall(ctx, m, name)
	case "approval_required":
		if answer := params.Get("inputResponses").Get(approvalKey); answer != nil {
			// The retry of a call we asked about (multi round-trip).
			state, _ := params.Get("requestState").Text()
			if p.answered(state, name, args, answer) {
				// Forwarded without condfs's part (the server never asked
				// for it).
				responses := params.Get("inputResponses")
				responses.Delete(approvalKey)
				if len(responses.Members) == 0 {
					params.Delete("inputResponses")
					params.Delete("requestState")
				}
				p.forwardCall(ctx, m, name)
				return
			}
			p.deny(m.id, name, []string{"approval required"})
			return
		}
		elicit, mrtr := p.elicit.Load(), p.multiRoundTrip()
		meta := params.Get("_meta")
		if version, _ := meta.Get("io.modelcontextprotocol/protocolVersion").Text(); version != "" {
			// Protocol 2026-07-28 and later: no initialize handshake; each
			// request carries its version and the client's capabilities.
			mrtr = version >= "2026-07-28"
			elicit = declared(meta.Get("io.modelcontextprotocol/clientCapabilities").Get("elicitation"))
		}
		if elicit && mrtr {
			p.askInResult(m.id, name, args, reasons)
			return
		}
		if !elicit {
			p.deny(m.id, name, []string{"approval required"})
			return
		}
		if ok, why := p.approved(ctx, name, args, reasons); !ok {
			p.deny(m.id, name, []string{why})
			return
		}
		// The user answered a question about the call as decided then; a
		// switch or reload while they did may have denied it.
		if now, why := p.decide(ctx, name, args); now != "allow" && now != "approval_required" {
			p.deny(m.id, name, why)
			return
		}
		p.forwardCall(ctx, m, name)
	default:
		p.deny(m.id, name, reasons)
	}
}

// forwardCall forwards a decided tools/call, with its checkpoint made
// first when the proxy makes them.
func (p *proxy) forwardCall(ctx context.Context, m message, name string) {
	if p.opts.Checkpoint != nil {
		cctx, cancel := context.WithTimeout(ctx, p.opts.DecideTimeout)
		err := p.opts.Checkpoint(cctx, name)
		cancel()
		if err != nil {
			p.opts.Logger.Warn("no checkpoint; denying", "tool", name, "err", err)
			p.deny(m.id, name, []string{"no checkpoint could be made before the call (" + err.Error() + "); denied: every call is undoable"})
			return
		}
	}
	p.forward(m)
}

// decide asks the decider about one call; no decision is a deny that
// says why.
func (p *proxy) decide(ctx context.Context, name string, args []byte) (string, []string) {
	dctx, cancel := context.WithTimeout(ctx, p.opts.DecideTimeout)
	decision, reasons, err := p.opts.Decider.Decide(dctx, name, args)
	cancel()
	if err != nil {
		p.opts.Logger.Warn("no decision; denying", "tool", name, "err", err)
		return "deny", []string{"the condfs daemon gave no decision: " + err.Error()}
	}
	return decision, reasons
}

// unaskable says why a call cannot be put to the user, or "": the user
// must see all of what they approve, and a padding argument first (or a
// tool name a server chose) would push the rest out of any question.
func unaskable(name string, args []byte) string {
	switch {
	case len(name) > maxApprovalName:
		return fmt.Sprintf("approval required, and the tool name (%d bytes) is too long to be shown for approval (at most %d)", len(name), maxApprovalName)
	case len(args) > MaxApprovalArgs:
		return fmt.Sprintf("approval required, and the arguments (%d bytes) are too long to be shown for approval (at most %d): allow such calls by policy, with constraints", len(args), MaxApprovalArgs)
	}
	return ""
}

// MaxApprovalArgs bounds the arguments of a call the user is asked to
// approve: the question shows them whole, and a longer call is denied.
// maxApprovalName bounds its tool name, shown quoted (a server names its
// tools: one named with a fake question, newlines and padding would push
// the real arguments out of sight).
const (
	MaxApprovalArgs = 8 << 10
	maxApprovalName = 256
)

// approvalKey names condfs's question among a call's input requests.
const approvalKey = "condfs-approval"

type askedCall struct {
	call    [32]byte // the tool name and arguments asked about
	expires time.Time
}

// callHash identifies a call by its tool and its arguments in a canonical
// form (decoded and encoded again: object keys sorted), so that a retry
// that re-encodes the same arguments still matches.
func callHash(name string, args []byte) [32]byte {
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
func approvalQuestion(name string, args []byte, reasons []string) map[string]any {
	// The arguments whole, as forwarded (compact JSON, every character
	// outside printable ASCII escaped): nothing is cut or hidden. The name
	// is quoted wherever it is shown (the approve field's description,
	// shown beside the checkbox, too).
	text := fmt.Sprintf("Allow the tool call %s with the arguments %s?", strconv.QuoteToASCII(name), args)
	if len(reasons) > 0 {
		text += " " + strings.Join(reasons, "; ")
	}
	return map[string]any{
		"message": text,
		"requestedSchema": map[string]any{
			"type": "object",
			"properties": map[string]any{
				"approve": map[string]any{"type": "boolean", "title": "Approve", "description": "Run " + strconv.QuoteToASCII(name) + " with these arguments"},
			},
			"required": []string{"approve"},
		},
	}
}

// askInResult answers the call with an input_required result that asks
// the user (the client retries the call with the answer).
func (p *proxy) askInResult(id []byte, name string, args []byte, reasons []string) {
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
	if len(p.asked) >= MaxInFlight {
		p.mu.Unlock()
		p.deny(id, name, []string{fmt.Sprintf("approval required, and %d approval questions are pending already, the most condfs keeps", MaxInFlight)})
		return
	}
	p.asked[state] = askedCall{call: callHash(name, args), expires: now.Add(p.opts.ApprovalTimeout)}
	p.toServer.take(id)
	p.mu.Unlock()
	resp, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": json.RawMessage(id),
		"result": map[string]any{
			"resultType":    "input_required",
			"inputRequests": map[string]any{approvalKey: map[string]any{"method": "elicitation/create", "params": approvalQuestion(name, args, reasons)}},
			"requestState":  state,
		},
	})
	p.client.line(resp)
}

// answered checks the answer to a question askInResult asked, for exactly
// this call and once.
func (p *proxy) answered(state, name string, args []byte, answer *jsonwire.Value) bool {
	p.mu.Lock()
	a, ok := p.asked[state]
	delete(p.asked, state)
	p.mu.Unlock()
	if !ok || time.Now().After(a.expires) || a.call != callHash(name, args) {
		return false
	}
	return accepted(answer)
}

// accepted reads an elicitation result: accepted, with approve true.
func accepted(r *jsonwire.Value) bool {
	action, _ := r.Get("action").Text()
	approve := r.Get("content").Get("approve")
	return action == "accept" && approve != nil && approve.Kind == jsonwire.Bool && approve.Bool
}

// approved asks the client's user with an elicitation/create request
// (protocols before 2026-07-28); when it is not approved, it says why.
// At most MaxApprovals questions are pending; each ends when the user
// answers, the timeout passes, or the client is gone.
func (p *proxy) approved(ctx context.Context, name string, args []byte, reasons []string) (bool, string) {
	const no = "approval required"
	// An id no server can guess: a server's own request under the id of
	// a pending question would have the user's answer to it approve the
	// call (and such requests are dropped besides, see fromServer).
	var tok [16]byte
	rand.Read(tok[:])
	id := fmt.Sprintf("%q", approvalIDPrefix+hex.EncodeToString(tok[:]))
	p.mu.Lock()
	if n := len(p.approvals); n >= MaxApprovals {
		p.mu.Unlock()
		return false, fmt.Sprintf("%s, and %d approval questions are pending already, the most condfs asks at once: answer them, then call again", no, n)
	}
	ch := make(chan *jsonwire.Value, 1)
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
		return false, no
	}
	timer := time.NewTimer(p.opts.ApprovalTimeout)
	defer timer.Stop()
	select {
	case resp := <-ch:
		return accepted(resp.Get("result")), no
	case <-timer.C:
		return false, no + ", and the user gave no answer in time"
	case <-p.gone:
		return false, no + ", and the client is gone"
	case <-ctx.Done():
		return false, no
	}
}

// deny answers a tools/call with a tool error that says why.
func (p *proxy) deny(id []byte, tool string, reasons []string) {
	text := "Denied by policy"
	if tool != "" {
		text += " (condfs): " + tool
	}
	if len(reasons) > 0 {
		text += ": " + strings.Join(reasons, "; ")
	}
	p.untrack(id)
	resp, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": json.RawMessage(id),
		"result": map[string]any{
			"content": []map[string]any{{"type": "text", "text": text}},
			"isError": true,
		},
	})
	p.client.line(resp)
}

// serverLoop relays what the server sends, filtering tools/list results.
// Each line is parsed strictly and passed on re-encoded: the client reads
// the listing the proxy filtered, not a line it could read otherwise. A
// line that does not parse is dropped (and logged).
func (p *proxy) serverLoop(ctx context.Context, out io.Reader) error {
	return readLines(out, func(line []byte) error {
		v, err := jsonwire.Parse(line, serverRules)
		if err != nil {
			p.opts.Logger.Warn("server message dropped: it does not parse exactly", "err", err)
			return nil
		}
		if v.Kind == jsonwire.Array {
			for _, e := range v.Elems {
				if err := p.fromServer(ctx, e); err != nil {
					return err
				}
			}
			return nil
		}
		return p.fromServer(ctx, v)
	})
}

func (p *proxy) fromServer(ctx context.Context, v *jsonwire.Value) error {
	m, err := readMessage(v)
	if err != nil {
		p.opts.Logger.Warn("server message dropped", "err", err)
		return nil
	}
	switch {
	case m.nullID():
		p.opts.Logger.Warn("server request dropped: its id is null")
		return nil
	case m.isRequest() && p.approvalID(m.id):
		p.opts.Logger.Warn("server request dropped: its id is in condfs's approval namespace", "id", string(m.id))
		return nil
	case m.method == "notifications/cancelled":
		p.cancelled(p.toClient, m)
	case m.isRequest():
		if err := p.track(p.toClient, m); err != nil {
			p.opts.Logger.Warn("server request dropped", "id", string(m.id), "err", err)
			return nil
		}
	case m.isResponse():
		p.mu.Lock()
		method, asked := p.toServer.answer(m.id)
		p.mu.Unlock()
		if !asked {
			// An answer the client never asked for, or a second one: it
			// could be read as the answer to a request of the same id
			// made later (a listing, unfiltered).
			p.opts.Logger.Warn("server answer dropped: it answers no request in flight", "id", string(m.id))
			return nil
		}
		if method == "initialize" {
			version, _ := v.Get("result").Get("protocolVersion").Text()
			p.protocol.Store(version)
		}
		// A listing's answer is filtered, and so is any answer that holds
		// a listing (a result with tools), whatever it answers.
		if r := v.Get("result"); r != nil && (method == "tools/list" || listsTools(r)) {
			p.filterList(ctx, v)
		}
	}
	return p.client.line(v.Bytes())
}

// approvalIDPrefix begins the id of every question the proxy asks the
// client (elicitation/create requests).
const approvalIDPrefix = "condfs-approval-"

// approvalID reports whether id (as re-encoded) is, or could be, one of
// the proxy's questions: a string in its namespace, or one pending.
func (p *proxy) approvalID(id []byte) bool {
	var s string
	if json.Unmarshal(id, &s) == nil && strings.HasPrefix(s, approvalIDPrefix) {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, pending := p.approvals[string(id)]
	return pending
}

// listsTools reports whether a result has tools, under any case folding
// (encoding/json reads "Tools" as tools).
func listsTools(r *jsonwire.Value) bool {
	if r.Kind != jsonwire.Object {
		return false
	}
	_, folded := r.HasFolded("tools")
	return folded || r.Get("tools") != nil
}

// filterList leaves out of a tools/list result the tools the roles can
// never call; every other field (nextCursor included) stays.
func (p *proxy) filterList(ctx context.Context, v *jsonwire.Value) {
	result := v.Get("result")
	if result.Kind != jsonwire.Object {
		// Not a listing the proxy can filter: list nothing.
		result = jsonwire.NewObject()
		v.Set("result", result)
	}
	// A key that folds to tools without being it is a listing to readers
	// that fold case, unfiltered: it goes, whole.
	for k, ok := result.HasFolded("tools"); ok; k, ok = result.HasFolded("tools") {
		result.Delete(k)
	}
	var tools []*jsonwire.Value
	if t := result.Get("tools"); t != nil && t.Kind == jsonwire.Array {
		tools = t.Elems
	}
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i], _ = t.Get("name").Text()
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
	kept := &jsonwire.Value{Kind: jsonwire.Array, Elems: []*jsonwire.Value{}}
	for i, t := range tools {
		// A tool whose name is missing or not a string is never callable.
		if names[i] != "" && keep[names[i]] && t.Get("name").Kind == jsonwire.String {
			kept.Elems = append(kept.Elems, t)
		}
	}
	result.Set("tools", kept)
}
