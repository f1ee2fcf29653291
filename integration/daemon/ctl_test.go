package daemon

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestCtl drives the daemon with condfs ctl, for people and with --json.
func TestCtl(t *testing.T) {
	h := testenv.NewHome(t, e2eConditions, e2ePolicy)
	h.Write("blocks/conditional/dm.md", "+++\ndescription = \"dm block\"\n+++\nbe kind\n")
	d := testenv.Start(t, h)
	ctl := func(args ...string) string {
		out, err := exec.Command(testenv.Condfs(), append([]string{"ctl", "--socket", d.Socket}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	mnt := h.Path("mnt/c")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"open", "c", mnt, "--context", "discord:dm", "--context", "discord:dm:7"}, "session c mounted at " + mnt},
		{[]string{"list"}, "discord:dm discord:dm:7"},
		{[]string{"context", "c"}, "context: discord:dm discord:dm:7"},
		{[]string{"blocks", "c"}, "== dm: dm block\nbe kind"},
		{[]string{"check", "c", "memories", "/private/x"}, "/private/x: allow (allow rule /private/ holds)"},
		{[]string{"decide", "--session", "c", "--tool", "refund", "--args", `{"amount": 500}`}, "allow (role default)"},
		{[]string{"context", "c", "discord:guild:1", "discord:channel:2"}, "context: discord:channel:2 discord:guild:1"},
		{[]string{"decide", "--session", "c", "--tool", "refund", "--args", `{"amount": 500}`}, "deny (role -)\n  because constraint"},
		{[]string{"--json", "status"}, `"generation":1`},
		{[]string{"reload"}, "conditions:"},
		{[]string{"close", "c"}, "closed"},
	} {
		if out := ctl(tc.args...); !strings.Contains(out, tc.want) {
			t.Fatalf("ctl %v:\n%s\nwant %q", tc.args, out, tc.want)
		}
	}
	out, err := exec.Command(testenv.Condfs(), "ctl", "--socket", d.Socket, "context", "nope").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `unknown session "nope": open it with session.open`) {
		t.Fatalf("unknown session: %v %s", err, out)
	}
	out, err = exec.Command(testenv.Condfs(), "ctl", "--socket", h.Path("no.sock"), "status").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is condfs serve running?") {
		t.Fatalf("no daemon: %v %s", err, out)
	}
}
