package integration

import (
	"os"
	"testing"
)

func TestSmoke(t *testing.T) {
	r := newRig(t, "[memories.\"/private/\"]\nwhen = \"discord:dm\"\naction = \"allow\"\n", atoms(t, "discord:guild:1", "discord:channel:2"))
	r.file("memories", "private/diary.md", "secret")
	r.file("memories", "notes.md", "hello")
	ents, err := os.ReadDir(r.mnt)
	t.Log(ents, err)
	ents, err = os.ReadDir(r.view_("memories", ""))
	t.Log(ents, err)
	b, err := os.ReadFile(r.view_("memories", "notes.md"))
	t.Log(string(b), err)
	_, err = os.Stat(r.view_("memories", "private/diary.md"))
	t.Log("private:", err)
	if err := r.view.SetContext(atoms(t, "discord:dm", "discord:dm:5", "discord:channel:5")); err != nil {
		t.Fatal(err)
	}
	b, err = os.ReadFile(r.view_("memories", "private/diary.md"))
	t.Log("private after:", string(b), err, "epoch:", r.view.EpochInvalidation())
}
