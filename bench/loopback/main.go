// Command loopback mounts go-fuse's plain loopback filesystem, the
// baseline the FUSE benchmarks compare condfs with. It runs in its own
// process (a Go process must not use a FUSE mount it serves) and unmounts
// on SIGTERM.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: loopback BACKING MOUNTPOINT")
		os.Exit(2)
	}
	root, err := fs.NewLoopbackRoot(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The same cache settings as a condfs view, so that the comparison is
	// about the code, not the caching.
	sec := time.Second
	zero := time.Duration(0)
	server, err := fs.Mount(os.Args[2], root, &fs.Options{
		EntryTimeout: &sec, AttrTimeout: &sec, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "loopback", Name: "loopback", DirectMount: true, EnableLocks: true, Options: []string{"default_permissions"}},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-sigs; server.Unmount() }()
	fmt.Println("ready")
	server.Wait()
}
