package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// The cost of checkpoints (docs/changes.md): a second session over the same
// tree, with a checkpoint, against the fixture's session, which has none.

var (
	ckptOnce sync.Once
	ckptMnt  string
	ckptErr  error
)

// checkpointed opens session "c" (once) and makes a checkpoint in it.
func checkpointed(b *testing.B) string {
	if fx == nil {
		b.Fatal("no FUSE fixture (run as root with -bench selecting FS)")
	}
	ckptOnce.Do(func() {
		mnt := filepath.Join(filepath.Dir(filepath.Dir(fx.mounts["condfs"])), "mnt-c")
		open := map[string]any{"id": "c", "mount": mnt, "context": []string{"discord:guild:7"}}
		if benchUID > 0 {
			open["owner"] = benchUID
		}
		if ckptErr = fx.ctl.Call("session.open", open, nil); ckptErr != nil {
			return
		}
		ckptErr = fx.ctl.Call("checkpoint.create", map[string]any{"session": "c", "name": "bench"}, nil)
		ckptMnt = filepath.Join(mnt, "workspace")
	})
	if ckptErr != nil {
		b.Fatal(ckptErr)
	}
	return ckptMnt
}

// BenchmarkFSCreateWriteCheckpoint is BenchmarkFSCreateWrite's create,
// write and close of a 4 KiB file through a view with no checkpoint and
// through one with a checkpoint (each new file recorded as absent first).
func BenchmarkFSCreateWriteCheckpoint(b *testing.B) {
	for _, v := range []string{"condfs", "condfs-checkpoint"} {
		b.Run(v, func(b *testing.B) {
			dir := fx.mounts["condfs"]
			if v == "condfs-checkpoint" {
				dir = checkpointed(b)
			}
			d := filepath.Join(dir, "data/create")
			buf := make([]byte, 4096)
			i := 0
			err := asBenchUID(func() error {
				for b.Loop() {
					p := filepath.Join(d, fmt.Sprintf("%s-%d", v, i))
					i++
					f, err := os.Create(p)
					if err != nil {
						return err
					}
					f.Write(buf)
					f.Close()
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkFSCheckpointCreate: checkpoint.create over the socket, with the
// fixture's tree (over 10,000 files) in the session: nothing walks it.
func BenchmarkFSCheckpointCreate(b *testing.B) {
	checkpointed(b)
	for b.Loop() {
		if err := fx.ctl.Call("checkpoint.create", map[string]any{"session": "c"}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFSRollback1000: a checkpoint, 1,000 small files rewritten through
// the view (not timed), then the rollback (timed).
func BenchmarkFSRollback1000(b *testing.B) {
	dir := filepath.Join(checkpointed(b), "many")
	for b.Loop() {
		b.StopTimer()
		var cp struct{ ID string }
		if err := fx.ctl.Call("checkpoint.create", map[string]any{"session": "c"}, &cp); err != nil {
			b.Fatal(err)
		}
		err := asBenchUID(func() error {
			for i := range 1000 {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), []byte("changed"), 0o644); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		var res struct{ Restored int }
		if err := fx.ctl.Call("checkpoint.rollback", map[string]any{"session": "c", "checkpoint": cp.ID}, &res); err != nil || res.Restored != 1000 {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkFSFirstWrite1MiB: the first write to an existing 1 MiB file after
// a checkpoint (one copy of it), against cp of the same file natively.
func BenchmarkFSFirstWrite1MiB(b *testing.B) {
	dir := checkpointed(b)
	src := filepath.Join(fx.backing, "data/big1m")
	if err := os.WriteFile(src, make([]byte, 1<<20), 0o644); err != nil {
		b.Fatal(err)
	}
	if benchUID > 0 {
		os.Chown(src, benchUID, benchUID)
	}
	b.Run("cp", func(b *testing.B) {
		for b.Loop() {
			data, _ := os.ReadFile(src)
			os.WriteFile(src+".copy", data, 0o644)
		}
	})
	b.Run("condfs-checkpoint", func(b *testing.B) {
		p := filepath.Join(dir, "data/big1m")
		for b.Loop() {
			b.StopTimer()
			if err := fx.ctl.Call("checkpoint.create", map[string]any{"session": "c"}, nil); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			err := asBenchUID(func() error {
				f, err := os.OpenFile(p, os.O_WRONLY, 0)
				if err != nil {
					return err
				}
				_, err = f.WriteAt([]byte("x"), 0)
				f.Close()
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
