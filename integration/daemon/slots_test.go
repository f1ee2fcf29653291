package daemon

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/condfs/condfs/control"
	"github.com/condfs/condfs/internal/testenv"
)

// TestIdleConnectionsLeaveRootASlot: a uid admitted with --allow-uid opened --max-conns idle
// and half-written connections, and root's context.set was refused with
// -32013, so a session kept its old context (issue 22, finding 3). Root is
// always served now, and the uid's connections past its own cap are
// refused with an error line that names the flag.
func TestIdleConnectionsLeaveRootASlot(t *testing.T) {
	h := testenv.OpenHome(t, "")
	d := testenv.Start(t, h, "--allow-uid", "65534", "--socket-mode", "0666")
	os.Chmod(filepath.Dir(d.Socket), 0o755)
	d.Open("s", testenv.DM)

	// More connections than --max-conns (default 1024), half of them
	// dribbling half a request line.
	first, _ := testenv.ConverseAsNobody(t, "flood", d.Socket, "1100")
	var got struct {
		Held, Refused, Closed int
		DialFailed            int    `json:"dial_failed"`
		First                 string `json:"first_refusal"`
	}
	if err := json.Unmarshal([]byte(first), &got); err != nil {
		t.Fatalf("attacker: %q: %v", first, err)
	}
	t.Logf("uid 65534: %+v", got)

	// Root, on a new connection while the attacker holds its own, moves
	// the session from the DM to a guild.
	c, err := control.DialTimeout(d.Socket, 2*time.Second)
	if err != nil {
		t.Fatalf("root cannot connect: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var res struct {
		Atoms []string `json:"atoms"`
	}
	if err := c.Call("context.set", map[string]any{"session": "s", "context": testenv.Guild}, &res); err != nil {
		t.Errorf("root's context.set while uid 65534 holds its connections: %v", err)
	} else if !strings.Contains(strings.Join(res.Atoms, " "), "discord:guild:1") {
		t.Errorf("context.set answered %v", res.Atoms)
	}

	// The daemon kept no more than the uid's cap (1024/8) open, and told
	// every connection past it why it was closed.
	if got.Held > 128 {
		t.Errorf("uid 65534 holds %d connections, over its cap of 128", got.Held)
	}
	if got.Refused < 1100-128-got.DialFailed || !strings.Contains(got.First, "-32013") || !strings.Contains(got.First, "max-conns-per-uid") {
		t.Errorf("connections past the cap: %d refused, first answer %q; want an error line (-32013) naming --max-conns-per-uid", got.Refused, got.First)
	}
}
