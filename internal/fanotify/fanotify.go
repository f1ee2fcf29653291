// Package fanotify reads the events of a fanotify group that reports file
// ids (FAN_REPORT_FID, FAN_REPORT_DFID_NAME): one reader for the views'
// link watch (fsys) and the staged layers' backing watch (changes).
package fanotify

import (
	"encoding/binary"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Event is one event: its mask and what follows its metadata (the info
// records).
type Event struct {
	Mask uint64
	Info []byte
}

// Read reads f until a read fails (os.ErrClosed once f is closed), which
// it returns, handing each batch read to batch. A batch's events share its
// buffer: batch must not keep them.
func Read(f *os.File, batch func([]Event)) error {
	buf := make([]byte, 64<<10)
	var events []Event
	for {
		nr, err := f.Read(buf)
		if err != nil {
			return err
		}
		events = events[:0]
		for off := 0; off+int(unsafe.Sizeof(unix.FanotifyEventMetadata{})) <= nr; {
			md := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[off]))
			if md.Event_len == 0 || off+int(md.Event_len) > nr {
				break
			}
			events = append(events, Event{Mask: md.Mask, Info: buf[off+int(md.Metadata_len) : off+int(md.Event_len)]})
			off += int(md.Event_len)
		}
		batch(events)
	}
}

// FileID decodes an event's first info record when its type is typ:
// struct fanotify_event_info_fid is a header (type u8, pad u8, len u16),
// the fsid (2 × i32), then struct file_handle (bytes u32, type i32,
// handle). key names the object (its fsid and handle) as a map key.
func FileID(info []byte, typ ...uint8) (fsid unix.Fsid, handle unix.FileHandle, key string, ok bool) {
	const hdr, fsidLen = 4, 8
	if len(info) < hdr+fsidLen+8 {
		return fsid, handle, "", false
	}
	known := false
	for _, t := range typ {
		known = known || info[0] == t
	}
	if !known {
		return fsid, handle, "", false
	}
	fh := info[hdr+fsidLen:]
	n := binary.NativeEndian.Uint32(fh[0:4])
	if int(n) > len(fh)-8 {
		return fsid, handle, "", false
	}
	fsid = unix.Fsid{Val: [2]int32{int32(binary.NativeEndian.Uint32(info[4:8])), int32(binary.NativeEndian.Uint32(info[8:12]))}}
	handle = unix.NewFileHandle(int32(binary.NativeEndian.Uint32(fh[4:8])), fh[8:8+n])
	return fsid, handle, string(info[hdr : hdr+fsidLen+8+int(n)]), true
}
