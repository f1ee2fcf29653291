package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
)

// auditTally counts the audit records of msg in a daemon's log that keep
// (each JSON line for which it is true), and how many decisions they stand
// for: each record one, plus its "suppressed" count, plus the counts of
// the records a session's close writes for what was not yet told
// ("flushed").
func auditTally(t *testing.T, log, msg string, keep func(line string) bool) (records, decisions int) {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if !keep(line) {
			continue
		}
		var r struct {
			Msg                  string
			Suppressed, Unlisted int
			Flushed              bool
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			continue
		}
		switch {
		case r.Flushed:
			decisions += r.Suppressed + r.Unlisted
		case r.Msg == msg:
			records++
			decisions += 1 + r.Suppressed
		}
	}
	return records, decisions
}

// TestIdenticalAllowedDecisionsCollapse: identical allowed tool.decide
// calls of a session are written once a second, each record saying how
// many it stands for, and what is still untold when the session closes is
// written then: every one is counted, none itemised. A distinct decision
// (a denial, a decision made with another context) has its own record at
// once, during the flood.
func TestIdenticalAllowedDecisionsCollapse(t *testing.T) {
	d, _ := runHome(t)
	c, err := control.Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	allowed := map[string]any{"session": "s", "tool": "exec", "args": map[string]any{"argv": []string{"ls"}, "cwd": "/workspace"}}
	const n = 2000
	start := time.Now()
	for i := 0; i < n; i++ {
		var res struct{ Decision string }
		if err := c.Call("tool.decide", allowed, &res); err != nil || res.Decision != "allow" {
			t.Fatalf("call %d: %v %q", i, err, res.Decision)
		}
		if i == n/2 {
			var deny struct{ Decision string }
			c.Call("tool.decide", map[string]any{"session": "s", "tool": "exec", "args": map[string]any{"argv": []string{"forbidden"}, "cwd": "/workspace"}}, &deny)
			var other struct{ Decision string }
			c.Call("tool.decide", map[string]any{"context": guildCtx, "tool": "exec", "args": map[string]any{"argv": []string{"ls"}, "cwd": "/workspace"}}, &other)
			if deny.Decision != "deny" || other.Decision != "allow" {
				t.Fatalf("distinct decisions: %q %q", deny.Decision, other.Decision)
			}
			d.within("the distinct decisions' records, during the flood", func() bool {
				return logHas(d.log(), `"msg":"decide"`, `"session":"s"`, `"decision":"deny"`) &&
					logHas(d.log(), `"msg":"decide"`, `"session":""`, `"decision":"allow"`)
			})
		}
	}
	took := time.Since(start)
	d.call("session.close", map[string]any{"id": "s"}, nil)
	ofSession := func(l string) bool {
		return strings.Contains(l, `"session":"s"`) && strings.Contains(l, `"decision":"allow"`) &&
			strings.Contains(l, `"tool":"exec"`)
	}
	var records, decisions int
	d.within("the session's counts are written", func() bool {
		records, decisions = auditTally(t, d.log(), "decide", ofSession)
		return decisions >= n
	})
	if max := int(took/time.Second) + 2; records > max || decisions != n {
		t.Errorf("%d identical allowed decisions in %v: %d records standing for %d, want at most %d records for exactly %d",
			n, took.Round(time.Millisecond), records, decisions, max, n)
	}
	// Made without a session, they are remembered per uid, and what is
	// untold of them is written when the daemon closes.
	for i := 0; i < 3; i++ {
		c.Call("tool.decide", map[string]any{"context": guildCtx, "tool": "exec", "args": map[string]any{"argv": []string{"ls"}, "cwd": "/workspace"}}, nil)
	}
	d.stop()
	if _, told := auditTally(t, d.log(), "decide", func(l string) bool {
		return strings.Contains(l, `"session":""`) && strings.Contains(l, `"decision":"allow"`) && strings.Contains(l, `"tool":"exec"`)
	}); told != 4 {
		t.Errorf("4 allowed decisions made with a context: %d told once the daemon closed", told)
	}
}

// TestIdenticalAllowedRequestsCollapse: a run's identical allowed plain
// HTTP requests are written once a second, each record saying how many it
// stands for, and none goes uncounted once the session closes.
func TestIdenticalAllowedRequestsCollapse(t *testing.T) {
	d := egressHome(t)
	start := time.Now()
	out := egressPy(t, d, `
import urllib.request
n = 0
for i in range(200):
    urllib.request.urlopen("http://web.test/a", timeout=10).read()
    n += 1
print("fetched", n)
`)
	took := time.Since(start)
	if !strings.Contains(out, "fetched 200") {
		t.Fatalf("the run: %q", out)
	}
	d.call("session.close", map[string]any{"id": "s"}, nil)
	ofRequests := func(l string) bool {
		return strings.Contains(l, `"session":"s"`) && strings.Contains(l, `"decision":"allow"`) && strings.Contains(l, `"method":"GET"`)
	}
	var records, decisions int
	d.within("the session's counts are written", func() bool {
		records, decisions = auditTally(t, d.log(), "connect", ofRequests)
		return decisions >= 200
	})
	if max := int(took/time.Second) + 2; records > max || decisions != 200 {
		t.Errorf("200 identical allowed requests in %v: %d records standing for %d, want at most %d records for exactly 200",
			took.Round(time.Millisecond), records, decisions, max)
	}
}

// logHas reports whether a line of log holds every one of parts.
func logHas(log string, parts ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// TestRequestCarryingASecretHasItsOwnRecord: a request into which the
// gateway put a secret is never collapsed into an identical request that
// carried none (nor the reverse): its record names the secret, at once.
func TestRequestCarryingASecretHasItsOwnRecord(t *testing.T) {
	ih := newInspectHome(t)
	d := ih.d
	// Each pair within a window of the other, on a loaded machine too.
	out, _ := condfsRun(t, d, "", "--", "python3", "-c", `
import os, urllib.request
u = "https://api.test/same"
for i in range(5):
    urllib.request.urlopen(u, timeout=10).read()
    urllib.request.urlopen(urllib.request.Request(u, headers={"Authorization": "Bearer " + os.environ["GH_TOKEN"]}), timeout=10).read()
print("fetched")
`)
	if out != "fetched\n" {
		t.Fatalf("the requests: %q", out)
	}
	d.call("session.close", map[string]any{"id": "s"}, nil)
	for _, with := range []bool{true, false} {
		keep := func(l string) bool {
			return strings.Contains(l, `"path":"/same"`) && strings.Contains(l, `"decision":"allow"`) && strings.Contains(l, `"secrets":["gh"]`) == with
		}
		var told int
		d.within("the session's counts are written", func() bool {
			_, told = auditTally(t, d.log(), "connect", keep)
			return told >= 5
		})
		if told != 5 {
			t.Errorf("5 requests with the secret %v: %d told by records that say so\n%s", with, told, d.log())
		}
	}
}

// TestDecisionsOfOtherRolesOrContextsAreNotCollapsed: two allowed
// decisions whose roles and atoms, laid end to end, read the same (roles
// [default], atoms [a, b]; roles [default, a], atoms [b]) each have their
// own record: the roles and the context a reader sees are the decision's.
func TestDecisionsOfOtherRolesOrContextsAreNotCollapsed(t *testing.T) {
	d, _ := runHome(t)
	c, err := control.Dial(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	call := func(atoms, roles []string) {
		var res struct{ Decision string }
		if err := c.Call("tool.decide", map[string]any{"context": atoms, "roles": roles, "tool": "exec",
			"args": map[string]any{"argv": []string{"ls"}, "cwd": "/workspace"}}, &res); err != nil || res.Decision != "allow" {
			t.Fatalf("%v %v: %v %q", atoms, roles, err, res.Decision)
		}
	}
	call([]string{"discord:channel:2", "discord:guild:1"}, []string{"default"})
	call([]string{"discord:guild:1"}, []string{"default", "discord:channel:2"})
	d.within("a record of each", func() bool {
		return logHas(d.log(), `"msg":"decide"`, `"atoms":["discord:channel:2","discord:guild:1"]`, `"roles":["default"]`) &&
			logHas(d.log(), `"msg":"decide"`, `"atoms":["discord:guild:1"]`, `"roles":["default","discord:channel:2"]`)
	})
}

// TestDenialsInOtherContextsAreNotCollapsed: the same path denied in two
// contexts within a second has a record for each, each naming its own
// context.
func TestDenialsInOtherContextsAreNotCollapsed(t *testing.T) {
	d, _ := runHome(t)
	other := []string{"discord:guild:9"}
	for _, ctx := range [][]string{guildCtx, other} {
		var ex struct{ Decision string }
		if err := d.client.Call("path.check", map[string]any{"context": ctx, "space": "memories", "path": "/private/p.md"}, &ex); err != nil || ex.Decision != "deny" {
			t.Fatalf("%v: %v %q", ctx, err, ex.Decision)
		}
	}
	d.within("a record of each", func() bool {
		return logHas(d.log(), `"msg":"deny"`, `"path":"/private/p.md"`, `"atoms":["discord:channel:2","discord:guild:1"]`) &&
			logHas(d.log(), `"msg":"deny"`, `"path":"/private/p.md"`, `"atoms":["discord:guild:9"]`)
	})
}
