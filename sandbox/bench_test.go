package sandbox

import "testing"

// BenchmarkStartWait is one run of /bin/true: namespaces, root, exec, exit.
func BenchmarkStartWait(b *testing.B) {
	spec := testSpec(b, "")
	spec.Argv = []string{"/usr/bin/true"}
	for b.Loop() {
		r, err := Start(spec, nil, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		if ex := r.Wait(); ex.Code != 0 {
			b.Fatalf("exit %+v", ex)
		}
	}
}

// BenchmarkBegin is the part of a run that a sandbox built ahead leaves:
// the command begun in a prepared run, to its exit.
func BenchmarkBegin(b *testing.B) {
	spec := testSpec(b, "")
	cmd := Command{Argv: []string{"/usr/bin/true"}, Allowed: spec.Binaries}
	for b.Loop() {
		b.StopTimer()
		r, err := Prepare(spec)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := r.Begin(cmd, nil, nil, nil); err != nil {
			b.Fatal(err)
		}
		if ex := r.Wait(); ex.Code != 0 {
			b.Fatalf("exit %+v", ex)
		}
	}
}

// BenchmarkAgain is a kept sandbox's cost per command: Again (a new /tmp,
// IPC namespace and confined thread), then the command begun, to its exit.
func BenchmarkAgain(b *testing.B) {
	spec := testSpec(b, "")
	cmd := Command{Argv: []string{"/usr/bin/true"}, Allowed: spec.Binaries}
	r, err := Prepare(spec)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { r.Kill(); r.Gone() }()
	if err := r.Begin(cmd, nil, nil, nil); err != nil {
		b.Fatal(err)
	}
	r.Wait()
	for b.Loop() {
		if err := r.Again(); err != nil {
			b.Fatal(err)
		}
		if err := r.Begin(cmd, nil, nil, nil); err != nil {
			b.Fatal(err)
		}
		if ex := r.Wait(); ex.Code != 0 {
			b.Fatalf("exit %+v", ex)
		}
	}
}
