package testenv

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FileStatus is a config file's status: its generation and the error of its last load.
type FileStatus struct {
	Generation int     `json:"generation"`
	Error      *string `json:"error"`
}

// ConditionsStatus is conditions.toml's status, from the daemon's status.
func ConditionsStatus(d *Daemon) FileStatus {
	var st struct {
		Config struct {
			Conditions FileStatus `json:"conditions"`
		} `json:"config"`
	}
	d.Call("status", map[string]any{}, &st)
	return st.Config.Conditions
}

// ConfigmapWrite makes the Kubernetes ConfigMap layout's atomic swap.
func ConfigmapWrite(t *testing.T, h *Home, text *string, seq int) {
	dir := h.Path("config")
	stamp := "..2030_01_01_00_00_" + string(rune('0'+seq/10)) + string(rune('0'+seq%10)) + ".000000001"
	if err := os.MkdirAll(filepath.Join(dir, stamp), 0o755); err != nil {
		t.Fatal(err)
	}
	if text != nil {
		os.WriteFile(filepath.Join(dir, stamp, "conditions.toml"), []byte(*text), 0o644)
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	os.Remove(filepath.Join(dir, "..data_tmp"))
	if err := os.Symlink(stamp, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		os.RemoveAll(filepath.Join(dir, old))
	}
}

// WriteStyle changes conditions.toml in one of the ways editors and
// orchestrators do.
func WriteStyle(t *testing.T, h *Home, style string, text *string, seq int) {
	p := h.Path("config/conditions.toml")
	switch style {
	case "", "rename":
		if text == nil {
			os.Remove(p)
			return
		}
		tmp := h.Path("config/.conditions.toml.swp")
		os.WriteFile(tmp, []byte(*text), 0o644)
		if err := os.Rename(tmp, p); err != nil {
			t.Fatal(err)
		}
	case "configmap":
		ConfigmapWrite(t, h, text, seq)
	case "inplace":
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(*text)
		f.Close()
	case "truncate":
		os.Truncate(p, 0)
		time.Sleep(5 * time.Millisecond)
		f, _ := os.OpenFile(p, os.O_WRONLY, 0o644)
		f.WriteString(*text)
		f.Close()
	default:
		t.Fatalf("unknown reload style %q", style)
	}
}

// WaitReload waits for status to show the reload, then for it to settle.
func WaitReload(d *Daemon, before FileStatus, wantLoaded bool) FileStatus {
	deadline := time.Now().Add(5 * time.Second)
	var st FileStatus
	for {
		st = ConditionsStatus(d)
		if wantLoaded && st.Generation > before.Generation && st.Error == nil {
			break
		}
		if !wantLoaded && st.Error != nil {
			break
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("reload never showed in status (loaded=%v): before %+v, now %+v\n%s", wantLoaded, before, st, Tail(d.Log(), 30))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Settle: a ConfigMap swap may cause several events.
	stable := time.Now()
	for time.Since(stable) < 300*time.Millisecond {
		time.Sleep(50 * time.Millisecond)
		now := ConditionsStatus(d)
		if now.Generation != st.Generation || !equalErr(now.Error, st.Error) {
			st, stable = now, time.Now()
		}
	}
	return st
}

func equalErr(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
