package changes

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLayerMountsAreBoundedAcrossLayers: many staged spaces mounted at
// once (one backing change remounts every session over it) mount at most
// cap(mountSlots) at a time: an unprivileged daemon's layers start that
// many children. The child here is a script that records when it ran and
// mounts nothing.
func TestLayerMountsAreBoundedAcrossLayers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("maps the user namespace's root to the host's: needs root")
	}
	dir := t.TempDir()
	record := filepath.Join(dir, "ran")
	script := filepath.Join(dir, "child")
	must(t, os.WriteFile(script, []byte(fmt.Sprintf(`#!/bin/sh
s=$(/bin/date +%%s%%N)
/bin/sleep 0.2
echo "$s $(/bin/date +%%s%%N)" >> %s
`, record)), 0o755))
	old := MountHelper
	MountHelper = script
	t.Cleanup(func() { MountHelper = old })

	lower := filepath.Join(dir, "lower")
	must(t, os.Mkdir(lower, 0o755))
	lfd, err := unix.Open(lower, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(lfd)

	n := 3 * cap(mountSlots)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sp := &layerSpace{name: fmt.Sprintf("s%d", i), lower: lower, upper: dir, lowerFD: lfd, mergedFD: -1,
				work: filepath.Join(dir, fmt.Sprintf("work%d", i))}
			if err := (&Layer{userns: true}).mountSpace(sp); err == nil {
				t.Errorf("space %d: mounted by a child that mounts nothing", i)
			}
		}()
	}
	wg.Wait()

	f, err := os.Open(record)
	must(t, err)
	defer f.Close()
	type event struct {
		at    int64
		delta int
	}
	var events []event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var start, end int64
		if _, err := fmt.Sscan(sc.Text(), &start, &end); err != nil {
			t.Fatalf("record %q: %v", sc.Text(), err)
		}
		events = append(events, event{start, 1}, event{end, -1})
	}
	if len(events) != 2*n {
		t.Fatalf("%d children ran; want %d", len(events)/2, n)
	}
	sort.Slice(events, func(i, j int) bool {
		if events[i].at != events[j].at {
			return events[i].at < events[j].at
		}
		return events[i].delta < events[j].delta // an end before a start at the same instant
	})
	running, most := 0, 0
	for _, e := range events {
		running += e.delta
		most = max(most, running)
	}
	if most > cap(mountSlots) {
		t.Errorf("%d children ran at once; want at most %d", most, cap(mountSlots))
	}
}
