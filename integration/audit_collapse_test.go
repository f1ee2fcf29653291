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
