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
