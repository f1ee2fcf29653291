package integration

import (
	"strconv"
	"strings"
	"testing"
)

// limitRules: runRules with python3 (to allocate and write exactly), a
// 64 MiB memory limit and 1 MiB of /tmp and /dev/shm together.
var limitRules = strings.Replace(runRules, `"/usr/bin/tr"]`, `"/usr/bin/tr", "/usr/bin/python3", "/workspace/bin/"]
memory = "64MiB"
tmp_size = "1MiB"`, 1)

// TestRunLimits: [sandbox] memory and tmp_size hold for a run's command
// (cgroup v1 memory controller on this root daemon's machine), and what
// stays under them runs.
func TestRunLimits(t *testing.T) {
	d, _ := runHomeWith(t, limitRules)
	py := func(code string) (string, int) {
		t.Helper()
		return condfsRun(t, d, "", "--", "python3", "-c", code)
	}
	if out, code := py("b = bytearray(16 << 20); b[-1] = 1; print(len(b))"); code != 0 || strings.TrimSpace(out) != "16777216" {
		t.Errorf("16 MiB under a 64 MiB limit: exit %d %q", code, out)
	}
	// Touched page by page, so an overcommitting kernel must back it.
	if out, code := py("b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('kept')"); code == 0 || strings.Contains(out, "kept") {
		t.Errorf("256 MiB under a 64 MiB limit: exit %d %q", code, out)
	}
	write := func(path string, n int) string {
		return "open(" + pyQuote(path) + ", 'wb').write(b'x' * " + strconv.Itoa(n) + ")"
	}
	if out, code := py(write("/tmp/a", 600<<10)); code != 0 {
		t.Errorf("600 KiB in /tmp under 1 MiB: exit %d %q", code, out)
	}
	if out, code := py(write("/tmp/a", 2<<20)); code == 0 || !strings.Contains(out, "No space left") {
		t.Errorf("2 MiB in /tmp under 1 MiB: exit %d %q", code, out)
	}
	// /tmp and /dev/shm share the bound.
	if out, code := py(write("/tmp/a", 600<<10) + "; " + write("/dev/shm/b", 600<<10)); code == 0 || !strings.Contains(out, "No space left") {
		t.Errorf("600 KiB in /tmp and 600 KiB in /dev/shm under 1 MiB together: exit %d %q", code, out)
	}
}

func pyQuote(s string) string { return "'" + s + "'" }
