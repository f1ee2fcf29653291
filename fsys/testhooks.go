//go:build !condfstest

package fsys

// testHooks are off outside the integration tests' build
// (testhooks_condfstest.go).
func testHooks() hooks { return hooks{} }
