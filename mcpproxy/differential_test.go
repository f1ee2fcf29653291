package mcpproxy

// The differential test of "what is decided is exactly what is forwarded".
// Messages generated to make parsers disagree (keys duplicated exactly or
// under case folding at any depth, a member spelled in another case, CR,
// U+2028, U+2029, NEL and other separators, BOMs, invalid UTF-8, unpaired
// surrogates, deep nesting, numbers float64 cannot hold, batches) go
// through the proxy's own client path. Whatever it forwards is read by the
// parsers real servers use: Go's encoding/json, the official Go SDK
// (jsonrpc.DecodeMessage and its case-sensitive segmentio decoding), Python's
// json over universal newlines, and Node's JSON.parse after a readline
// split. Each must read exactly the messages the proxy decided, one per
// line, with the name and arguments the decider saw.
//
// The same readers also read the raw lines, as the proxy forwarded them
// before: the test requires many of those to be read apart, so a generator
// that stopped making disagreements would fail it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/condfs/condfs/internal/jsonwire"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	segjson "github.com/segmentio/encoding/json"
)

// recorder allows every call and remembers what it was asked.
type recorder struct {
	mu    sync.Mutex
	calls [][2]string // tool, arguments
}

func (r *recorder) Decide(_ context.Context, tool string, args json.RawMessage) (string, []string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, [2]string{tool, string(args)})
	return "allow", nil, nil
}

func (r *recorder) Callable(_ context.Context, tools []string) ([]string, error) { return tools, nil }

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// through runs one client line through the proxy's client path and returns
// the lines forwarded to the server and the calls decided.
func through(t *testing.T, line []byte) (forwarded [][]byte, calls [][2]string) {
	t.Helper()
	var toServer, toClient bytes.Buffer
	rec := &recorder{}
	p := newProxy(Options{Decider: rec, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DecideTimeout: 1e9, ApprovalTimeout: 1e9},
		&toClient, nopCloser{&toServer})
	if err := p.clientLoop(context.Background(), bytes.NewReader(append(line, '\n'))); err != nil {
		t.Fatal(err)
	}
	p.calls.Wait()
	for _, l := range bytes.Split(toServer.Bytes(), []byte{'\n'}) {
		if len(l) > 0 {
			forwarded = append(forwarded, l)
		}
	}
	return forwarded, rec.calls
}

// A generated case.
type diffCase struct {
	line []byte
	what string
}

const (
	callMsg = `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"to":["ann@acme.com"],"n":1,"deep":{"x":[1,{"y":"z"}]}}}}`
	pingMsg = `{"jsonrpc":"2.0","id":%d,"method":"ping"}`
	evil    = `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"secret","arguments":{"to":["eve@evil.example"]}}}`
)

// generate makes cases meant to be read apart.
func generate(rng *rand.Rand, n int) []diffCase {
	folds := []func(string) string{
		func(k string) string { return strings.Replace(k, "s", "ſ", 1) },
		func(k string) string { return strings.Replace(k, "k", "\u212a", 1) },
		func(k string) string { return strings.ToUpper(k[:1]) + k[1:] },
		func(k string) string { return strings.ToUpper(k) },
	}
	seps := []string{"\r", "\u2028", "\u2029", "\u0085", "\v", "\f", "\r\n", "\x1c", "\x1e"}
	var cases []diffCase
	add := func(what, s string) { cases = append(cases, diffCase{[]byte(s), what}) }
	for i := 0; len(cases) < n; i++ {
		id := i + 100
		base := fmt.Sprintf(callMsg, id)
		switch rng.Intn(12) {
		case 0: // a folded or exact duplicate of an envelope key, last
			k := []string{"params", "method", "id", "jsonrpc"}[rng.Intn(4)]
			f := folds[rng.Intn(len(folds))](k)
			if rng.Intn(4) == 0 {
				f = k
			}
			val := map[string]string{"params": `{"name":"secret","arguments":{}}`, "method": `"ping"`, "id": `"other"`, "jsonrpc": `"1.0"`}[k]
			add("dup envelope "+f, base[:len(base)-1]+`,"`+f+`":`+val+`}`)
		case 1: // a folded duplicate one level down
			k := []string{"name", "arguments"}[rng.Intn(2)]
			f := folds[rng.Intn(len(folds))](k)
			val := map[string]string{"name": `"secret"`, "arguments": `{"to":["eve@evil.example"]}`}[k]
			add("dup params "+f, strings.Replace(base, `"params":{`, `"params":{"`+f+`":`+val+`,`, 1))
		case 2: // a duplicate deep in the arguments
			f := folds[rng.Intn(len(folds))]("to")
			if rng.Intn(2) == 0 {
				f = "to"
			}
			add("dup args "+f, strings.Replace(base, `"n":1`, `"n":1,"`+f+`":["eve@evil.example"]`, 1))
		case 3: // a member spelled in another case, alone
			k := []string{"method", "params", "id"}[rng.Intn(3)]
			add("case "+k, strings.Replace(fmt.Sprintf(pingMsg, id)[:len(fmt.Sprintf(pingMsg, id))-1]+`,"params":{"name":"secret"}}`, `"`+k+`"`, `"`+folds[2](k)+`"`, 1))
		case 4: // a call hidden behind a separator used as whitespace
			sep := seps[rng.Intn(len(seps))]
			add(fmt.Sprintf("hidden %q", sep), fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"x":`, id)+sep+fmt.Sprintf(evil, id+1)+sep+`}}`)
		case 5: // separators inside strings
			sep := seps[rng.Intn(len(seps))]
			add(fmt.Sprintf("in string %q", sep), strings.Replace(base, `"ann@acme.com"`, `"ann`+sep+`@acme.com"`, 1))
		case 6: // BOM, invalid UTF-8
			switch rng.Intn(3) {
			case 0:
				add("BOM", "\ufeff"+base)
			case 1:
				add("invalid UTF-8", strings.Replace(base, `"echo"`, "\"ech\xffo\"", 1))
			default:
				add("invalid UTF-8 key", strings.Replace(base, `"n":1`, "\"n\xc0\":1", 1))
			}
		case 7: // unpaired surrogates
			s := []string{`\ud800`, `\udfff`, `\ud800\u0041`, `\ud83d\ude00`}[rng.Intn(4)]
			add("surrogate "+s, strings.Replace(base, `"echo"`, `"ech`+s+`o"`, 1))
		case 8: // deep nesting
			d := []int{100, 129, 1100, 12000}[rng.Intn(4)]
			add(fmt.Sprintf("depth %d", d), strings.Replace(base, `"n":1`, `"n":`+strings.Repeat("[", d)+strings.Repeat("]", d), 1))
		case 9: // numbers
			num := []string{"1e400", "-1e400", "1e-400", "0.1000000000000000055511151231257827", "12345678901234567890", "9007199254740993", "1.99999999999999999999", "0.1", "2.5e3", "-0", "9007199254740992"}[rng.Intn(11)]
			add("number "+num, strings.Replace(base, `"n":1`, `"n":`+num, 1))
		case 10: // batches
			add("batch", "["+base+","+fmt.Sprintf(pingMsg, id+1)+"]")
		default: // valid messages, varied
			switch rng.Intn(3) {
			case 0:
				add("plain call", base)
			case 1:
				add("escaped", strings.Replace(base, `"name"`, `"\u006eame"`, 1))
			default:
				add("spaced", strings.ReplaceAll(base, ":", " :\t"))
			}
		}
	}
	return cases
}

// tag writes a decoded value in a form every reader below writes alike:
// numbers as exact rationals, objects with sorted keys.
func tag(x any) string {
	switch v := x.(type) {
	case nil:
		return "z"
	case bool:
		return fmt.Sprint("b", v)
	case json.Number:
		r, ok := new(big.Rat).SetString(string(v))
		if !ok {
			return "n?" + string(v)
		}
		return "n" + r.RatString()
	case string:
		return tagStr(v)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = tag(e)
		}
		return "a[" + strings.Join(parts, ",") + "]"
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = tagStr(k) + ":" + tag(v[k])
		}
		return "o{" + strings.Join(parts, ",") + "}"
	}
	return fmt.Sprintf("?%T", x)
}

// tagStr writes a string as its code points in hex.
func tagStr(s string) string {
	parts := []string{}
	for _, r := range s {
		parts = append(parts, fmt.Sprintf("%x", r))
	}
	return "s(" + strings.Join(parts, ".") + ")"
}

func decodeTagged(line []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var x any
	if dec.Decode(&x) != nil || dec.More() {
		return "", false
	}
	return tag(x), true
}

// goRead reads a line the Go ways: encoding/json, and the official
// SDK's envelope decoding plus its case-sensitive params decoding. A line
// the two read differently counts as read apart.
func goRead(line []byte) string {
	t, ok := decodeTagged(line)
	if !ok {
		return "E"
	}
	msg, err := jsonrpc.DecodeMessage(line)
	if err != nil {
		return "E"
	}
	var env struct {
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	json.Unmarshal(line, &env) // folds case, as structs do in encoding/json
	if req, ok := msg.(*jsonrpc.Request); ok {
		if req.Method != env.Method {
			return "D method"
		}
		if req.Method == "tools/call" {
			var sdk, std mcp.CallToolParamsRaw
			dec := segjson.NewDecoder(bytes.NewReader(req.Params))
			dec.DontMatchCaseInsensitiveStructFields()
			dec.Decode(&sdk)
			json.Unmarshal(env.Params, &std)
			sa, _ := decodeTagged(sdk.Arguments)
			ta, _ := decodeTagged(std.Arguments)
			if sdk.Name != std.Name || sa != ta {
				return "D params"
			}
		}
	}
	return "M " + t
}

// A reader script writes, for each line it reads, "M " and the message in
// the tagged form, or "E".
const pyReader = `
import io, json, sys
from fractions import Fraction
def ts(s): return "s(" + ".".join("%x" % ord(c) for c in s) + ")"
def tag(x):
    if x is None: return "z"
    if x is True: return "btrue"
    if x is False: return "bfalse"
    if isinstance(x, int): return "n" + str(x)
    if isinstance(x, float):
        if x != x or x in (float("inf"), float("-inf")): return "n?" + repr(x)
        f = Fraction(repr(x))  # the float's shortest decimal, as the others print it
        return "n" + (str(f.numerator) if f.denominator == 1 else str(f))
    if isinstance(x, str): return ts(x)
    if isinstance(x, list): return "a[" + ",".join(tag(e) for e in x) + "]"
    return "o{" + ",".join(ts(k) + ":" + tag(x[k]) for k in sorted(x)) + "}"
# The MCP Python SDK's stdio server: a text wrapper over stdin, universal newlines.
src = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape", newline=None)
out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="backslashreplace")
for line in src:
    if not line.strip():
        continue
    try:
        out.write("M " + tag(json.loads(line)) + "\n")
    except Exception:
        out.write("E\n")
out.flush()
`

const nodeReader = `
const readline = require("readline");
// Numbers are float64: printed shortest, made exact by normalizeNode.
function ts(s) { return "s(" + Array.from(s).map(c => c.codePointAt(0).toString(16)).join(".") + ")"; }
function tag(x) {
  if (x === null) return "z";
  if (x === true) return "btrue";
  if (x === false) return "bfalse";
  if (typeof x === "number") { if (!isFinite(x)) return "n?" + x; return "N" + x.toString(); }
  if (typeof x === "string") return ts(x);
  if (Array.isArray(x)) return "a[" + x.map(tag).join(",") + "]";
  return "o{" + Object.keys(x).sort().map(k => ts(k) + ":" + tag(x[k])).join(",") + "}";
}
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
const out = [];
rl.on("line", (line) => {
  if (line.trim() === "") return;
  try { out.push("M " + tag(JSON.parse(line))); } catch (e) { out.push("E"); }
});
rl.on("close", () => { process.stdout.write(out.join("\n") + "\n"); });
`

// Sentinel lines separate cases in a reader's input.
const sentinel = `{"condfs-sentinel":true}`

// runReader feeds groups of lines to a reader process and returns, per
// group, what it read.
func runReader(t *testing.T, argv []string, groups [][][]byte) [][]string {
	t.Helper()
	var in bytes.Buffer
	for _, g := range groups {
		for _, l := range g {
			in.Write(l)
			in.WriteByte('\n')
		}
		in.WriteString(sentinel + "\n")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = &in
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	sent := "M " + tagOf([]byte(sentinel))
	var res [][]string
	var cur []string
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if l == sent {
			res = append(res, cur)
			cur = nil
			continue
		}
		cur = append(cur, l)
	}
	if len(res) != len(groups) {
		t.Fatalf("%v read %d groups of %d", argv, len(res), len(groups))
	}
	return res
}

func tagOf(line []byte) string {
	s, _ := decodeTagged(line)
	return s
}

// normalizeNode turns Node's float64 numbers ("N1e+21") into the exact
// rational form the other readers print.
func normalizeNode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		if s[i] == 'N' && (i == 0 || strings.ContainsRune("[,:{", rune(s[i-1]))) {
			j := i + 1
			for j < len(s) && strings.ContainsRune("0123456789.eE+-", rune(s[j])) {
				j++
			}
			if r, ok := new(big.Rat).SetString(s[i+1 : j]); ok {
				b.WriteString("n" + r.RatString())
			} else {
				b.WriteString("n?" + s[i+1:j])
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
		i++
	}
	return b.String()
}

func needTool(t *testing.T, name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is needed for the differential test (CI installs it): %v", name, err)
		}
		t.Skipf("no %s: the differential test needs it", name)
	}
	return p
}

func TestForwardedIsDecided(t *testing.T) {
	python, node := needTool(t, "python3"), needTool(t, "node")
	dir := t.TempDir()
	py, js := filepath.Join(dir, "reader.py"), filepath.Join(dir, "reader.js")
	os.WriteFile(py, []byte(pyReader), 0o644)
	os.WriteFile(js, []byte(nodeReader), 0o644)

	seed := int64(20261202)
	cases := generate(rand.New(rand.NewSource(seed)), 1500)
	var fwdGroups, rawGroups [][][]byte
	var decided [][][2]string
	for _, c := range cases {
		fwd, calls := through(t, c.line)
		fwdGroups = append(fwdGroups, fwd)
		decided = append(decided, calls)
		rawGroups = append(rawGroups, [][]byte{c.line})
	}
	readers := map[string]func([][][]byte) [][]string{
		"python": func(g [][][]byte) [][]string { return runReader(t, []string{python, py}, g) },
		"node": func(g [][][]byte) [][]string {
			res := runReader(t, []string{node, js}, g)
			for _, r := range res {
				for i := range r {
					r[i] = normalizeNode(r[i])
				}
			}
			return res
		},
		"go": func(g [][][]byte) [][]string {
			res := make([][]string, len(g))
			for i, lines := range g {
				for _, l := range lines {
					// Go servers split at '\n' only.
					for _, part := range bytes.Split(l, []byte{'\n'}) {
						if len(bytes.TrimSpace(part)) > 0 {
							res[i] = append(res[i], goRead(part))
						}
					}
				}
			}
			return res
		},
	}

	forwarded, refused, rawApart := 0, 0, 0
	fwdRead := map[string][][]string{}
	rawRead := map[string][][]string{}
	for name, read := range readers {
		fwdRead[name] = read(fwdGroups)
		rawRead[name] = read(rawGroups)
	}
	for i, c := range cases {
		if len(fwdGroups[i]) == 0 {
			refused++
		} else {
			forwarded++
		}
		// What the proxy decided: each forwarded line as it parses it.
		var want []string
		for _, l := range fwdGroups[i] {
			v, err := jsonwire.Parse(l, wireRules)
			if err != nil || !bytes.Equal(v.Bytes(), l) {
				t.Fatalf("case %d (%s): forwarded %q is not its own parse: %v", i, c.what, l, err)
			}
			want = append(want, "M"+tagOf(l))
			for _, b := range l {
				if b < 0x20 || b >= 0x7f {
					t.Fatalf("case %d (%s): forwarded byte %#x", i, c.what, b)
				}
			}
		}
		for name := range readers {
			got := fwdRead[name][i]
			if len(got) != len(want) {
				t.Errorf("case %d (%s): %s read %d messages of the %d forwarded: %q", i, c.what, name, len(got), len(want), got)
				continue
			}
			for j := range want {
				if strings.TrimPrefix(got[j], "M ") != strings.TrimPrefix(want[j], "M") {
					t.Errorf("case %d (%s): %s read %s\nthe proxy decided %s", i, c.what, name, got[j], want[j])
				}
			}
		}
		// The decider saw the forwarded calls' names and arguments.
		var calls [][2]string
		for _, l := range fwdGroups[i] {
			v, _ := jsonwire.Parse(l, wireRules)
			if m, _ := v.Get("method").Text(); m == "tools/call" {
				name, _ := v.Get("params").Get("name").Text()
				args := "{}"
				if a := v.Get("params").Get("arguments"); a != nil {
					args = string(a.Bytes())
				}
				calls = append(calls, [2]string{name, args})
			}
		}
		if fmt.Sprint(calls) != fmt.Sprint(decided[i]) {
			t.Errorf("case %d (%s): decided %v, forwarded %v", i, c.what, decided[i], calls)
		}
		// The line as the proxy used to forward it: read apart?
		old := legacyView(c.line)
		for name := range readers {
			got := rawRead[name][i]
			if len(got) != 1 || strings.TrimPrefix(got[0], "M ") != old {
				rawApart++
				break
			}
		}
	}
	t.Logf("seed %d: %d cases, %d forwarded, %d refused; forwarded raw, %d would have been read apart", seed, len(cases), forwarded, refused, rawApart)
	if forwarded < len(cases)/4 || refused < len(cases)/4 {
		t.Fatalf("the generator lost its mix: %d forwarded, %d refused", forwarded, refused)
	}
	if rawApart < len(cases)/4 {
		t.Fatalf("only %d of %d raw lines were read apart: the generator no longer makes disagreements", rawApart, len(cases))
	}
}

// legacyView is what a gateway reading with encoding/json (as this one did)
// took a line to be: a single message, keys folded, the last duplicate won.
func legacyView(line []byte) string {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var x any
	if dec.Decode(&x) != nil {
		return "E"
	}
	return tag(x)
}
