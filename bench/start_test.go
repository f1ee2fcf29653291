package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BenchmarkClientStart: what the condfs client costs before it does
// anything, against the smallest Go program there is, in one run: a static
// hello-world built here, and `condfs help` (the client as make build makes
// it: without cgo, linking only the socket protocol, the run's descriptor
// passing and the hook). The ratio condfs-help/hello is the client's own
// start; everything a command costs beyond it is the daemon's and the
// sandbox's (BenchmarkRun).
//
//	cd bench && go test -run '^$' -bench ClientStart -benchtime 300x
func BenchmarkClientStart(b *testing.B) {
	dir := b.TempDir()
	src := filepath.Join(dir, "hello")
	if err := os.MkdirAll(src, 0o755); err != nil {
		b.Fatal(err)
	}
	for name, body := range map[string]string{
		"go.mod":  "module hello\n\ngo 1.22\n",
		"main.go": "package main\n\nimport \"os\"\n\nfunc main() { os.Stdout.WriteString(\"hello\\n\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	hello := filepath.Join(dir, "hello-bin")
	cmd := exec.Command("go", "build", "-o", hello, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build hello: %v\n%s", err, out)
	}
	cmd = exec.Command("go", "build", "-o", dir+"/", "./cmd/condfs")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build condfs: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name string
		argv []string
	}{
		{"hello", []string{hello}},
		{"condfs-help", []string{filepath.Join(dir, "condfs"), "help"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if out, err := exec.Command(c.argv[0], c.argv[1:]...).CombinedOutput(); err != nil {
					b.Fatalf("%v: %v %s", c.argv, err, out)
				}
			}
		})
	}
}
