// Package configfile reads a config file the way every loader must: a
// regular file only (a FIFO or a device at a config path is never opened
// for reading, so it cannot hang the daemon), of at most MaxSize bytes.
package configfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// MaxSize is the largest config file accepted.
const MaxSize = 4 << 20

// ErrEmpty is returned by Read for a zero-length file when empty is not
// allowed.
var ErrEmpty = errors.New("the file is empty")

// Read reads path, following symlinks (a Kubernetes ConfigMap is made of
// them). It opens with O_NONBLOCK so that a FIFO never blocks, then refuses
// anything but a regular file.
func Read(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, st.Mode().Type())
	}
	if st.Size() > MaxSize {
		return nil, fmt.Errorf("%s: %d bytes, over the %d-byte limit for a config file", path, st.Size(), MaxSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%s: over the %d-byte limit for a config file", path, MaxSize)
	}
	return data, nil
}
