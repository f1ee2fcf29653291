package changes

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

// TestStagedLayerAllocationBoundedByMaxBytes: fallocate through a staged
// view would reserve, in one call, blocks the layer counts nowhere (with
// --keep-size the file's size stays 0), so max_bytes would never be
// reached: it answers EOPNOTSUPP there (programs write instead, which is
// counted), and the state directory holds no more than the writes made.
func TestStagedLayerAllocationBoundedByMaxBytes(t *testing.T) {
	d, mnt, _ := stagedHome(t, testenv.ChangesRules+"\n[changes]\nmax_bytes = \"1MiB\"\n", nil)
	for i := 0; i < 4; i++ {
		for _, keep := range []string{"-n ", ""} {
			f := "f" + strconv.Itoa(i) + strings.TrimSpace(keep)
			out, _ := testenv.CommandAs(testenv.Nobody, "/bin/sh", "-c", "cd "+mnt+"/workspace && : > "+f+" && fallocate "+keep+"-l 16M "+f).CombinedOutput()
			if !strings.Contains(string(out), "not supported") && !strings.Contains(string(out), "unsupported") && !strings.Contains(string(out), "No space left") {
				t.Errorf("fallocate %s-l 16M in a staged view: %q", keep, out)
			}
		}
	}
	out, err := exec.Command("du", "-sk", filepath.Join(d.Home.Root, "run", "changes", "s")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if kb, _ := strconv.Atoi(strings.Fields(string(out))[0]); kb > 2048 {
		t.Fatalf("the layer holds %d KiB after fallocate, max_bytes 1MiB", kb)
	}
}
