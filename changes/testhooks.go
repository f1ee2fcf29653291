//go:build !condfstest

package changes

// userNSHost is the host uid and gid a layer's user namespace maps its
// root to: the daemon's (testhooks_condfstest.go may name others).
func userNSHost(uid, gid int) (int, int) { return uid, gid }
