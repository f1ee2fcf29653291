package fsys

import (
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// guardFS recovers a panic in any FUSE operation and observes every one,
// and does nothing else: a request that panics alone fails closed (EIO, or
// nothing for requests without an answer), the stack is logged, the view (or
// hub) counts it, and every other request and session goes on. It is the
// outermost layer of a connection (connFS, then go-fuse's bridge), so a
// panic in condfs's nodes or in go-fuse's own code is caught alike. One
// method for each of fuse.RawFileSystem's (TestGuardCatchesEveryOperation
// drives each of them into a panic).
type guardFS struct {
	fuse.RawFileSystem
	panics *atomic.Int64
	log    *slog.Logger
	// observe, if set, is told of every request when it ends (metrics).
	observe func(op string, start time.Time)
}

func (g guardFS) now() time.Time {
	if g.observe == nil {
		return time.Time{}
	}
	return time.Now()
}

// done ends every request: it recovers a panic (recover works here because
// done is the deferred call itself) and reports the request.
func (g guardFS) done(op string, start time.Time, code *fuse.Status) {
	if r := recover(); r != nil {
		g.recovered(op, r, code)
	}
	if g.observe != nil {
		g.observe(op, start)
	}
}

func (g guardFS) recovered(op string, r any, code *fuse.Status) {
	g.panics.Add(1)
	g.log.Error("recovered a panic in a FUSE operation; it failed with EIO", "op", op, "panic", r, "stack", string(debug.Stack()))
	if code != nil {
		*code = fuse.EIO
	}
}

func (g guardFS) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) (code fuse.Status) {
	defer g.done("Lookup", g.now(), &code)
	return g.RawFileSystem.Lookup(cancel, header, name, out)
}

func (g guardFS) Forget(nodeid uint64, nlookup uint64) {
	defer g.done("Forget", g.now(), nil)
	g.RawFileSystem.Forget(nodeid, nlookup)
}

func (g guardFS) GetAttr(cancel <-chan struct{}, input *fuse.GetAttrIn, out *fuse.AttrOut) (code fuse.Status) {
	defer g.done("GetAttr", g.now(), &code)
	return g.RawFileSystem.GetAttr(cancel, input, out)
}

func (g guardFS) SetAttr(cancel <-chan struct{}, input *fuse.SetAttrIn, out *fuse.AttrOut) (code fuse.Status) {
	defer g.done("SetAttr", g.now(), &code)
	return g.RawFileSystem.SetAttr(cancel, input, out)
}

func (g guardFS) Mknod(cancel <-chan struct{}, input *fuse.MknodIn, name string, out *fuse.EntryOut) (code fuse.Status) {
	defer g.done("Mknod", g.now(), &code)
	return g.RawFileSystem.Mknod(cancel, input, name, out)
}

func (g guardFS) Mkdir(cancel <-chan struct{}, input *fuse.MkdirIn, name string, out *fuse.EntryOut) (code fuse.Status) {
	defer g.done("Mkdir", g.now(), &code)
	return g.RawFileSystem.Mkdir(cancel, input, name, out)
}

func (g guardFS) Unlink(cancel <-chan struct{}, header *fuse.InHeader, name string) (code fuse.Status) {
	defer g.done("Unlink", g.now(), &code)
	return g.RawFileSystem.Unlink(cancel, header, name)
}

func (g guardFS) Rmdir(cancel <-chan struct{}, header *fuse.InHeader, name string) (code fuse.Status) {
	defer g.done("Rmdir", g.now(), &code)
	return g.RawFileSystem.Rmdir(cancel, header, name)
}

func (g guardFS) Rename(cancel <-chan struct{}, input *fuse.RenameIn, oldName string, newName string) (code fuse.Status) {
	defer g.done("Rename", g.now(), &code)
	return g.RawFileSystem.Rename(cancel, input, oldName, newName)
}

func (g guardFS) Link(cancel <-chan struct{}, input *fuse.LinkIn, filename string, out *fuse.EntryOut) (code fuse.Status) {
	defer g.done("Link", g.now(), &code)
	return g.RawFileSystem.Link(cancel, input, filename, out)
}

func (g guardFS) Symlink(cancel <-chan struct{}, header *fuse.InHeader, pointedTo string, linkName string, out *fuse.EntryOut) (code fuse.Status) {
	defer g.done("Symlink", g.now(), &code)
	return g.RawFileSystem.Symlink(cancel, header, pointedTo, linkName, out)
}

func (g guardFS) Readlink(cancel <-chan struct{}, header *fuse.InHeader) (r0 []byte, code fuse.Status) {
	defer g.done("Readlink", g.now(), &code)
	return g.RawFileSystem.Readlink(cancel, header)
}

func (g guardFS) Access(cancel <-chan struct{}, input *fuse.AccessIn) (code fuse.Status) {
	defer g.done("Access", g.now(), &code)
	return g.RawFileSystem.Access(cancel, input)
}

func (g guardFS) GetXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string, dest []byte) (r0 uint32, code fuse.Status) {
	defer g.done("GetXAttr", g.now(), &code)
	return g.RawFileSystem.GetXAttr(cancel, header, attr, dest)
}

func (g guardFS) ListXAttr(cancel <-chan struct{}, header *fuse.InHeader, dest []byte) (r0 uint32, code fuse.Status) {
	defer g.done("ListXAttr", g.now(), &code)
	return g.RawFileSystem.ListXAttr(cancel, header, dest)
}

func (g guardFS) SetXAttr(cancel <-chan struct{}, input *fuse.SetXAttrIn, attr string, data []byte) (code fuse.Status) {
	defer g.done("SetXAttr", g.now(), &code)
	return g.RawFileSystem.SetXAttr(cancel, input, attr, data)
}

func (g guardFS) RemoveXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string) (code fuse.Status) {
	defer g.done("RemoveXAttr", g.now(), &code)
	return g.RawFileSystem.RemoveXAttr(cancel, header, attr)
}

func (g guardFS) Create(cancel <-chan struct{}, input *fuse.CreateIn, name string, out *fuse.CreateOut) (code fuse.Status) {
	defer g.done("Create", g.now(), &code)
	return g.RawFileSystem.Create(cancel, input, name, out)
}

func (g guardFS) Tmpfile(cancel <-chan struct{}, input *fuse.CreateIn, out *fuse.CreateOut) (code fuse.Status) {
	defer g.done("Tmpfile", g.now(), &code)
	return g.RawFileSystem.Tmpfile(cancel, input, out)
}

func (g guardFS) Open(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) (code fuse.Status) {
	defer g.done("Open", g.now(), &code)
	return g.RawFileSystem.Open(cancel, input, out)
}

func (g guardFS) Read(cancel <-chan struct{}, input *fuse.ReadIn, buf []byte) (r0 fuse.ReadResult, code fuse.Status) {
	defer g.done("Read", g.now(), &code)
	return g.RawFileSystem.Read(cancel, input, buf)
}

func (g guardFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) (code fuse.Status) {
	defer g.done("Lseek", g.now(), &code)
	return g.RawFileSystem.Lseek(cancel, in, out)
}

func (g guardFS) GetLk(cancel <-chan struct{}, input *fuse.LkIn, out *fuse.LkOut) (code fuse.Status) {
	defer g.done("GetLk", g.now(), &code)
	return g.RawFileSystem.GetLk(cancel, input, out)
}

func (g guardFS) SetLk(cancel <-chan struct{}, input *fuse.LkIn) (code fuse.Status) {
	defer g.done("SetLk", g.now(), &code)
	return g.RawFileSystem.SetLk(cancel, input)
}

func (g guardFS) SetLkw(cancel <-chan struct{}, input *fuse.LkIn) (code fuse.Status) {
	defer g.done("SetLkw", g.now(), &code)
	return g.RawFileSystem.SetLkw(cancel, input)
}

func (g guardFS) Release(cancel <-chan struct{}, input *fuse.ReleaseIn) {
	defer g.done("Release", g.now(), nil)
	g.RawFileSystem.Release(cancel, input)
}

func (g guardFS) Write(cancel <-chan struct{}, input *fuse.WriteIn, data []byte) (r0 uint32, code fuse.Status) {
	defer g.done("Write", g.now(), &code)
	return g.RawFileSystem.Write(cancel, input, data)
}

func (g guardFS) Writev(cancel <-chan struct{}, input *fuse.WriteIn, data [][]byte) (r0 uint32, code fuse.Status) {
	defer g.done("Writev", g.now(), &code)
	return g.RawFileSystem.Writev(cancel, input, data)
}

func (g guardFS) CopyFileRange(cancel <-chan struct{}, input *fuse.CopyFileRangeIn) (r0 uint32, code fuse.Status) {
	defer g.done("CopyFileRange", g.now(), &code)
	return g.RawFileSystem.CopyFileRange(cancel, input)
}

func (g guardFS) Ioctl(cancel <-chan struct{}, input *fuse.IoctlIn, inbuf []byte, output *fuse.IoctlOut, outbuf []byte) (code fuse.Status) {
	defer g.done("Ioctl", g.now(), &code)
	return g.RawFileSystem.Ioctl(cancel, input, inbuf, output, outbuf)
}

func (g guardFS) Flush(cancel <-chan struct{}, input *fuse.FlushIn) (code fuse.Status) {
	defer g.done("Flush", g.now(), &code)
	return g.RawFileSystem.Flush(cancel, input)
}

func (g guardFS) Fsync(cancel <-chan struct{}, input *fuse.FsyncIn) (code fuse.Status) {
	defer g.done("Fsync", g.now(), &code)
	return g.RawFileSystem.Fsync(cancel, input)
}

func (g guardFS) Fallocate(cancel <-chan struct{}, input *fuse.FallocateIn) (code fuse.Status) {
	defer g.done("Fallocate", g.now(), &code)
	return g.RawFileSystem.Fallocate(cancel, input)
}

func (g guardFS) OpenDir(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) (code fuse.Status) {
	defer g.done("OpenDir", g.now(), &code)
	return g.RawFileSystem.OpenDir(cancel, input, out)
}

func (g guardFS) ReadDir(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) (code fuse.Status) {
	defer g.done("ReadDir", g.now(), &code)
	return g.RawFileSystem.ReadDir(cancel, input, out)
}

func (g guardFS) ReadDirPlus(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) (code fuse.Status) {
	defer g.done("ReadDirPlus", g.now(), &code)
	return g.RawFileSystem.ReadDirPlus(cancel, input, out)
}

func (g guardFS) FsyncDir(cancel <-chan struct{}, input *fuse.FsyncIn) (code fuse.Status) {
	defer g.done("FsyncDir", g.now(), &code)
	return g.RawFileSystem.FsyncDir(cancel, input)
}

func (g guardFS) ReleaseDir(input *fuse.ReleaseIn) {
	defer g.done("ReleaseDir", g.now(), nil)
	g.RawFileSystem.ReleaseDir(input)
}

func (g guardFS) StatFs(cancel <-chan struct{}, input *fuse.InHeader, out *fuse.StatfsOut) (code fuse.Status) {
	defer g.done("StatFs", g.now(), &code)
	return g.RawFileSystem.StatFs(cancel, input, out)
}

func (g guardFS) Statx(cancel <-chan struct{}, input *fuse.StatxIn, out *fuse.StatxOut) (code fuse.Status) {
	defer g.done("Statx", g.now(), &code)
	return g.RawFileSystem.Statx(cancel, input, out)
}

// OnUnmount is go-fuse's call when the connection ends (a panic there
// would end the daemon, every session with it).
func (g guardFS) OnUnmount() {
	defer g.done("OnUnmount", g.now(), nil)
	g.RawFileSystem.OnUnmount()
}
