package daemon

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
	"golang.org/x/sys/unix"
)

// The home the client libraries' tests run against
// (clients/python/tests/test_client.py, clients/typescript/test/): private/
// only in DMs, a block for DMs and one for guild 1, cat only in DMs, and a
// policy with an allow, a when(), an approval and a second role.
const clientRules = testenv.PrivateRule + `
[blocks.dm]
when = "discord:dm"
action = "load"

[blocks.guild]
when = "discord:guild:1"
action = "load"

[sandbox]
binaries = ["/bin/sh", "/usr/bin/true", "/usr/bin/cat", "/usr/bin/ls", "/usr/bin/sleep", "/usr/bin/head"]

[exec."/usr/bin/cat"]
when = "discord:dm"
action = "allow"
`

const clientPolicy = `version: 1
roles:
  default:
    tools:
      exec:
        mode: allow
        constraints: ['every(args.argv, . != "forbidden")']
      web_fetch:
        mode: allow
        constraints: ['when("discord:dm")']
      refund: {mode: approval_required}
  billing:
    tools:
      refund: {mode: allow}
`

// clientHome starts a daemon on the clients' home.
func clientHome(t *testing.T) *testenv.Daemon {
	t.Helper()
	h := testenv.NewHome(t, clientRules, clientPolicy)
	h.Write("blocks/conditional/dm.md", "+++\ndescription = \"DM etiquette\"\n+++\nBe discreet in DMs.\n")
	h.Write("blocks/conditional/guild.md", "+++\ndescription = \"Guild etiquette\"\n+++\nBe brief in guilds.\n")
	h.Write("memories/private/p.md", "dm secret\n")
	h.Write("memories/pub.md", "public\n")
	h.Write("workspace/w.txt", "work\n")
	return testenv.Start(t, h)
}

// requireTool fails in CI and skips elsewhere when a language's tools are
// missing (.ci/run installs them).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s is missing: %v", name, err)
	}
	t.Skipf("SKIPPING: %s is missing (in CI this fails)", name)
	return ""
}

func repoPath(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("../..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// clientEnv is what the clients' live tests read.
func clientEnv(d *testenv.Daemon) []string {
	return append(os.Environ(),
		"CONDFS_SOCKET="+d.Socket,
		"CONDFS_TEST_MNT="+d.Home.Path("mnt"),
		"CONDFS_BIN="+testenv.Condfs(),
	)
}

// TestPythonClient installs clients/python into a fresh venv offline (no
// package index: its build backend is of the standard library) and runs its
// tests with that venv against a real daemon: every method, errors,
// concurrency, runs (exit codes, bytes, input, timeouts), a connection the
// daemon closed.
func TestPythonClient(t *testing.T) {
	python := requireTool(t, "python3")
	d := clientHome(t)
	venv := filepath.Join(t.TempDir(), "venv")
	if out, err := exec.Command(python, "-m", "venv", venv).CombinedOutput(); err != nil {
		t.Fatalf("python3 -m venv: %v\n%s", err, out)
	}
	pkg := repoPath(t, "clients/python")
	pip := exec.Command(filepath.Join(venv, "bin", "pip"), "install", "--no-index", "--no-cache-dir", pkg)
	pip.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1")
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install --no-index %s: %v\n%s", pkg, err, out)
	}
	// Run from elsewhere, so that the installed package is the one tested.
	cmd := exec.Command(filepath.Join(venv, "bin", "python"), "-m", "unittest", "discover", "-v", "-s", filepath.Join(pkg, "tests"))
	cmd.Dir = t.TempDir()
	cmd.Env = append(clientEnv(d), "CONDFS_SCHEMA="+repoPath(t, "docs/control.schema.json"))
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil || !regexp.MustCompile(`(?m)^OK$`).MatchString(text) {
		t.Fatalf("python tests: %v\n%s\ndaemon log:\n%s", err, text, testenv.Tail(d.Log(), 30))
	}
	if !regexp.MustCompile(`Ran [1-9][0-9]* tests`).MatchString(text) {
		t.Fatalf("python tests ran nothing:\n%s", text)
	}
	t.Logf("python: %s", lastLines(text, 3))
}

// TestNodeClient builds clients/typescript and runs its tests against a
// real daemon; then installs the folder into a new project as a user does
// (npm install ./clients/typescript) and calls the daemon through it.
func TestNodeClient(t *testing.T) {
	npm := requireTool(t, "npm")
	node := requireTool(t, "node")
	d := clientHome(t)
	pkg := repoPath(t, "clients/typescript")
	cmd := exec.Command(npm, "test")
	cmd.Dir = pkg
	cmd.Env = append(clientEnv(d), "CONDFS_SCHEMA="+repoPath(t, "docs/control.schema.json"))
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil || !regexp.MustCompile(`(?m)^# fail 0$`).MatchString(text) || !regexp.MustCompile(`(?m)^# skipped 0$`).MatchString(text) {
		t.Fatalf("npm test: %v\n%s\ndaemon log:\n%s", err, text, testenv.Tail(d.Log(), 30))
	}
	t.Logf("node: %s", lastLines(text, 8))

	project := t.TempDir()
	if err := os.WriteFile(filepath.Join(project, "package.json"), []byte(`{"name":"uses-condfs","version":"1.0.0","type":"module","private":true}`), 0o644); err != nil {
		t.Fatal(err)
	}
	install := exec.Command(npm, "install", "--no-audit", "--no-fund", pkg)
	install.Dir = project
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("npm install %s: %v\n%s", pkg, err, out)
	}
	use := exec.Command(node, "--input-type=module", "-e", `
import { Client } from "@condfs/client";
const c = new Client(process.env.CONDFS_SOCKET);
const st = await c.status();
const d = await c.decide("web_fetch", {}, { context: ["discord:dm"] });
console.log(st.version, d.decision);
await c.close();
`)
	use.Dir = project
	use.Env = clientEnv(d)
	if out, err := use.CombinedOutput(); err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), " allow") {
		t.Fatalf("@condfs/client installed from the folder: %v\n%s", err, out)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// TestControlResultsMatchSchema makes every method on a real daemon (run
// with stdio passed as SCM_RIGHTS, as the clients do) and checks each
// result against docs/control.schema.json: every key the daemon sends is in
// the schema, every key the schema requires is sent, and each value has the
// schema's type. With daemon/schema_test.go (params) it keeps the schema
// the daemon's, and the clients' tests keep their types the schema's.
func TestControlResultsMatchSchema(t *testing.T) {
	d := clientHome(t)
	raw, err := os.ReadFile(repoPath(t, "docs/control.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Methods map[string]struct {
			Result map[string]any `json:"result"`
		} `json:"methods"`
		Defs map[string]map[string]any `json:"$defs"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	mnt := d.Home.Path("mnt/schema")
	calls := []struct {
		method string
		params map[string]any
	}{
		{"session.open", map[string]any{"id": "schema", "mount": mnt, "context": testenv.DM}},
		{"session.list", nil},
		{"context.set", map[string]any{"session": "schema", "context": map[string]any{"kind": "discord", "channel_id": "7"}}},
		{"context.get", map[string]any{"session": "schema"}},
		{"context.set", map[string]any{"session": "schema", "context": testenv.DM}},
		{"blocks.list", map[string]any{"session": "schema"}},
		{"path.check", map[string]any{"session": "schema", "space": "memories", "path": "/private/p.md"}},
		{"path.check", map[string]any{"context": testenv.Guild, "space": "exec", "path": "/usr/bin/cat"}},
		{"tool.decide", map[string]any{"session": "schema", "tool": "web_fetch", "args": map[string]any{}}},
		{"tool.decide", map[string]any{"tool": "refund", "roles": []string{"billing"}, "args": map[string]any{}}},
		{"tool.decide", map[string]any{"context": testenv.Guild, "tool": "web_fetch"}},
		{"tools.callable", map[string]any{"tools": []string{"web_fetch", "refund", "nope"}}},
		{"config.reload", nil},
		{"status", nil},
		{"run", map[string]any{"session": "schema", "argv": []string{"sh", "-c", "exit 3"}}},
		{"run", map[string]any{"session": "schema", "argv": []string{"sleep", "10"}, "timeout_ms": 100}},
		{"checkpoint.create", map[string]any{"session": "schema", "name": "c"}},
		{"checkpoint.list", map[string]any{"session": "schema"}},
		{"changes.diff", map[string]any{"session": "schema", "content": true}},
		{"checkpoint.rollback", map[string]any{"session": "schema", "checkpoint": "c"}},
		{"session.close", map[string]any{"id": "schema"}},
	}
	// Commit and discard are for staged sessions, which do not exist yet:
	// their only answer is -32032 (no result to check).
	d.Call("session.open", map[string]any{"id": "schema2", "mount": d.Home.Path("mnt/schema2"), "context": testenv.DM}, nil)
	for _, m := range []string{"changes.commit", "changes.discard"} {
		d.CallErr(m, map[string]any{"session": "schema2"}, control.CodeNotStaged)
	}
	d.Call("session.close", map[string]any{"id": "schema2"}, nil)
	seen := map[string]bool{"changes.commit": true, "changes.discard": true}
	for _, c := range calls {
		var result any
		if c.method == "run" {
			result = runRaw(t, d.Socket, c.params)
		} else {
			var r json.RawMessage
			d.Call(c.method, c.params, &r)
			if err := json.Unmarshal(r, &result); err != nil {
				t.Fatal(err)
			}
		}
		seen[c.method] = true
		for _, p := range checkSchema(schema.Defs, schema.Methods[c.method].Result, result, c.method) {
			t.Errorf("%s", p)
		}
	}
	for m := range schema.Methods {
		if !seen[m] {
			t.Errorf("%s: no call of it here", m)
		}
	}
}

// runRaw sends a run with /dev/null and two pipes as its stdio and returns
// the answer's result.
func runRaw(t *testing.T, socket string, params map[string]any) any {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	line, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "run", "params": params})
	_, _, err = conn.(*net.UnixConn).WriteMsgUnix(append(line, '\n'), unix.UnixRights(int(null.Fd()), p[1], p[1]), nil)
	unix.Close(p[1])
	if err != nil {
		t.Fatal(err)
	}
	answer, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Result any             `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(answer, &resp); err != nil || resp.Error != nil {
		t.Fatalf("run %v: %s %v", params, answer, err)
	}
	return resp.Result
}

// checkSchema checks v against the subset of JSON Schema that
// docs/control.schema.json uses ($ref, type, enum, properties, required,
// additionalProperties false, items, oneOf), and says what does not hold.
func checkSchema(defs map[string]map[string]any, s map[string]any, v any, at string) []string {
	if ref, ok := s["$ref"].(string); ok {
		def, ok := defs[strings.TrimPrefix(ref, "#/$defs/")]
		if !ok {
			return []string{fmt.Sprintf("%s: %s is no $def", at, ref)}
		}
		return checkSchema(defs, def, v, at)
	}
	if alts, ok := s["oneOf"].([]any); ok {
		for _, a := range alts {
			if len(checkSchema(defs, a.(map[string]any), v, at)) == 0 {
				return nil
			}
		}
		return []string{fmt.Sprintf("%s: %v matches none of oneOf", at, v)}
	}
	var problems []string
	if enum, ok := s["enum"].([]any); ok && !slices.Contains(enum, v) {
		problems = append(problems, fmt.Sprintf("%s: %v is not one of %v", at, v, enum))
	}
	if ty, ok := s["type"]; ok {
		var types []string
		switch ty := ty.(type) {
		case string:
			types = []string{ty}
		case []any:
			for _, x := range ty {
				types = append(types, x.(string))
			}
		}
		if !slices.Contains(types, jsonType(v)) && !(jsonType(v) == "integer" && slices.Contains(types, "number")) {
			return append(problems, fmt.Sprintf("%s: a %s, the schema says %v", at, jsonType(v), types))
		}
	}
	switch v := v.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for k, x := range v {
			ps, ok := props[k].(map[string]any)
			if !ok {
				if s["additionalProperties"] == false {
					problems = append(problems, fmt.Sprintf("%s: the daemon sends %q, which the schema lacks", at, k))
				}
				continue
			}
			problems = append(problems, checkSchema(defs, ps, x, at+"."+k)...)
		}
		req, _ := s["required"].([]any)
		for _, k := range req {
			if _, ok := v[k.(string)]; !ok {
				problems = append(problems, fmt.Sprintf("%s: the schema requires %q, which the daemon did not send", at, k))
			}
		}
	case []any:
		if items, ok := s["items"].(map[string]any); ok {
			for i, x := range v {
				problems = append(problems, checkSchema(defs, items, x, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	}
	return problems
}

func jsonType(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case float64:
		if v == float64(int64(v)) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// TestRuntimeExamplePython runs the Python agent loop of examples/runtime
// against a daemon on a copy of the example agent's home: the context
// follows each message, the DM reads Ann's private note, the guild may not
// run cat, and the e-mail to an outside address is denied.
func TestRuntimeExamplePython(t *testing.T) {
	python := requireTool(t, "python3")
	testenv.RequireFUSE(t)
	root := filepath.Join(t.TempDir(), "agent")
	if out, err := exec.Command("cp", "-a", repoPath(t, "examples/agent"), root).CombinedOutput(); err != nil {
		t.Fatalf("copy examples/agent: %v %s", err, out)
	}
	d := testenv.Start(t, testenv.HomeAt(t, root))
	cmd := exec.Command(python, repoPath(t, "examples/runtime/agent_loop.py"), filepath.Join(root, "view"))
	cmd.Env = clientEnv(d)
	out, err := cmd.CombinedOutput()
	text := string(out)
	for _, want := range []string{
		"[discord:channel:42, discord:dm, discord:dm:42]",
		"prompt blocks: ['dm-etiquette']",
		"Ann prefers short answers",
		"run refused here: cat",
		"send_email ['ann@acme.com', 'eve@evil.example']: deny",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the example's output lacks %q", want)
		}
	}
	if err != nil || strings.Count(text, "Ann prefers") != 1 || t.Failed() {
		t.Fatalf("examples/runtime/agent_loop.py: %v\n%s", err, text)
	}
}
