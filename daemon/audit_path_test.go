package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/condfs/condfs/control"
)

type countingWriter struct{ n atomic.Int64 }

func (w *countingWriter) Write(b []byte) (int, error) { w.n.Add(int64(len(b))); return len(b), nil }

// TestPathCheckAuditClipped: what a caller names in tool.decide records
// is clipped (auditClip, a KiB), and so is path.check's path, which would
// otherwise go into the denial record whole (auditPathAs: "path", path) and
// into the denial limiter's keys (denialKey{space, path, op}), and
// acl.Canon bounds no length: a request line holds a path of up to 1 MiB.
// Unclipped, the limiter would write 256 distinct denials per key per
// second and keep the last 256 per key (the uid's own key, never
// forgotten, and each of its sessions'): any admitted uid would write
// about 256 MiB of audit a second per key and make the daemon hold 256 MiB
// per key until it closes.
func TestPathCheckAuditClipped(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"config", "memories", "workspace", "blocks"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "config/conditions.toml"), []byte("[memories.\"/private/\"]\nwhen = \"discord:dm\"\naction = \"allow\"\n"), 0o644)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	audit := &countingWriter{}
	d, err := New(Config{
		Conditions: filepath.Join(root, "config/conditions.toml"), Policy: filepath.Join(root, "config/policy.yaml"),
		BlocksDir: filepath.Join(root, "blocks"), Memories: filepath.Join(root, "memories"), Workspace: filepath.Join(root, "workspace"),
		Socket: filepath.Join(root, "run/condfs.sock"), SocketGroup: -1, Logger: quiet, Audit: slog.New(slog.NewJSONHandler(audit, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { d.Serve(); close(done) }()
	defer func() { d.Close(); <-done }()
	ctx := control.WithPeerUID(context.Background(), 65534)
	const n, size = 32, 256 << 10
	for i := 0; i < n; i++ {
		p, _ := json.Marshal(map[string]any{"context": []string{"tui"}, "space": "memories",
			"path": fmt.Sprintf("/private/%d%s", i, strings.Repeat("a", size))})
		res, cerr := d.mPathCheck(ctx, p)
		if cerr != nil {
			t.Fatal(cerr)
		}
		if b, _ := json.Marshal(res); !strings.Contains(string(b), `"deny"`) {
			t.Fatalf("not denied: %.200s", b)
		}
	}
	held := 0
	d.denials.mu.Lock()
	if sd := d.denials.sessions[checker(65534)]; sd != nil {
		for k := range sd.seen {
			held += len(k.path)
		}
	}
	d.denials.mu.Unlock()
	t.Logf("%d denied path.checks of %d KiB by uid 65534: %d KiB of audit written, %d KiB held by the denial limiter", n, size>>10, audit.n.Load()>>10, held>>10)
	if audit.n.Load() > int64(n)*4*auditClip {
		t.Errorf("HOLE: path.check's denied path is audited whole (%d KiB for %d records; tool.decide's names are clipped to %d bytes): at 256 distinct paths a second per limiter key, one uid writes ~256 MiB of audit a second", audit.n.Load()>>10, n, auditClip)
	}
	if held > n*4*auditClip {
		t.Errorf("HOLE: the denial limiter holds %d KiB of one uid's path.check paths (up to 256 of 1 MiB per key, for the uid and for each of its sessions, kept until the session closes or forever for the uid's key)", held>>10)
	}
}
