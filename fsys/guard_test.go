package fsys

import (
	"io"
	"log/slog"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// panicky panics in every operation: its RawFileSystem is nil.
type panicky struct{ fuse.RawFileSystem }

// TestGuardCatchesEveryOperation drives every request of
// fuse.RawFileSystem through the guard into a panic: each is recovered and
// counted, answers EIO where it answers at all, and is observed under its
// own name. A method go-fuse adds and the guard does not wrap fails here.
func TestGuardCatchesEveryOperation(t *testing.T) {
	var panics atomic.Int64
	var observed string
	g := guardFS{
		RawFileSystem: panicky{}, panics: &panics, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		observe: func(op string, _ time.Time) { observed = op },
	}
	// Not requests: go-fuse's own calls at setup.
	setup := map[string]bool{"String": true, "SetDebug": true, "Init": true}
	api := reflect.TypeOf((*fuse.RawFileSystem)(nil)).Elem()
	gv := reflect.ValueOf(g)
	for i := 0; i < api.NumMethod(); i++ {
		name := api.Method(i).Name
		if setup[name] {
			continue
		}
		fn := gv.MethodByName(name)
		args := make([]reflect.Value, fn.Type().NumIn())
		for j := range args {
			if at := fn.Type().In(j); at.Kind() == reflect.Pointer {
				args[j] = reflect.New(at.Elem())
			} else {
				args[j] = reflect.Zero(at)
			}
		}
		before := panics.Load()
		observed = ""
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: the panic escaped the guard: %v", name, r)
				}
			}()
			for _, out := range fn.Call(args) {
				if st, ok := out.Interface().(fuse.Status); ok && st != fuse.EIO {
					t.Errorf("%s answered %v after a panic, want EIO", name, st)
				}
			}
		}()
		if got := panics.Load() - before; got != 1 {
			t.Errorf("%s: %d panics counted, want 1", name, got)
		}
		if observed != name {
			t.Errorf("%s observed as %q", name, observed)
		}
	}
}

// recordingFS answers directory requests and records them.
type recordingFS struct {
	fuse.RawFileSystem
	calls *[]string
	entry func(out *fuse.EntryOut) fuse.Status
}

func (r recordingFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	*r.calls = append(*r.calls, "OpenDir")
	if in.Flags != 0 || in.NodeId != 7 {
		return fuse.EINVAL // O_RDONLY, for the request's own node
	}
	out.Fh = 42
	return fuse.OK
}

func (r recordingFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	*r.calls = append(*r.calls, "ReadDirPlus")
	if in.Fh != 42 {
		return fuse.EBADF
	}
	return fuse.OK
}

func (r recordingFS) ReleaseDir(in *fuse.ReleaseIn) {
	if in.Fh == 42 {
		*r.calls = append(*r.calls, "ReleaseDir")
	}
}

func (r recordingFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	return r.entry(out)
}

// TestConnectionDirectoriesAndAbsences: the kernel opens directories
// itself (OPENDIR is ENOSYS); a listing opens its own directory, as the
// request's node, and releases it; a listing that names a handle is
// refused; an absence the nodes mark cacheable is a negative entry, any
// other ENOENT stays one.
func TestConnectionDirectoriesAndAbsences(t *testing.T) {
	var calls []string
	c := connFS{RawFileSystem: recordingFS{calls: &calls, entry: func(out *fuse.EntryOut) fuse.Status { return fuse.ENOENT }}}
	if st := c.OpenDir(nil, &fuse.OpenIn{}, &fuse.OpenOut{}); st != fuse.ENOSYS {
		t.Errorf("OPENDIR answered %v, want ENOSYS", st)
	}
	in := &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: 7}}
	if st := c.ReadDirPlus(nil, in, nil); st != fuse.OK {
		t.Errorf("READDIRPLUS answered %v", st)
	}
	if want := []string{"OpenDir", "ReadDirPlus", "ReleaseDir"}; !reflect.DeepEqual(calls, want) {
		t.Errorf("calls %v, want %v", calls, want)
	}
	in.Fh = 9
	if st := c.ReadDirPlus(nil, in, nil); st != fuse.EBADF {
		t.Errorf("a listing with a handle answered %v, want EBADF", st)
	}
	var out fuse.EntryOut
	if st := c.Lookup(nil, &fuse.InHeader{}, "x", &out); st != fuse.ENOENT {
		t.Errorf("a plain absence answered %v, want ENOENT", st)
	}
	c = connFS{RawFileSystem: recordingFS{calls: &calls, entry: func(out *fuse.EntryOut) fuse.Status {
		out.SetEntryTimeout(time.Minute)
		return fuse.ENOENT
	}}}
	if st := c.Lookup(nil, &fuse.InHeader{}, "x", &out); st != fuse.OK || out.NodeId != 0 {
		t.Errorf("a cacheable absence answered %v (node %d), want a negative entry", st, out.NodeId)
	}
}
