package acl

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/BurntSushi/toml"

	cctx "github.com/condfs/condfs/context"
)

// Block is a selected prompt block.
type Block struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Body        string `json:"body"`
}

// BlockError reports a selected block that could not be read.
type BlockError struct {
	Name   string `json:"name"`
	File   string `json:"file"`
	Reason string `json:"reason"`
}

// maxBlockBytes bounds one block file; a prompt block is text for a model,
// not a data store.
const maxBlockBytes = 1 << 20

// Blocks returns the blocks that atoms selects, in table order, read from
// dir/NAME.md. A missing or malformed file is reported in errs and left
// out; the others still load. Files are opened beneath dir, so a symlink
// there cannot lead out of it.
func (c *Config) Blocks(dir string, atoms cctx.Set) (blocks []Block, errs []BlockError) {
	blocks, errs = []Block{}, []BlockError{}
	var root *os.Root
	for _, br := range c.blocks {
		if !br.cond.Holds(atoms) {
			continue
		}
		file := filepath.Join(dir, br.name+".md")
		if root == nil {
			r, err := os.OpenRoot(dir)
			if err != nil {
				errs = append(errs, BlockError{Name: br.name, File: file, Reason: "blocks directory: " + err.Error()})
				continue
			}
			defer r.Close()
			root = r
		}
		b, err := readBlock(root, br.name)
		if err != nil {
			errs = append(errs, BlockError{Name: br.name, File: file, Reason: err.Error()})
			continue
		}
		blocks = append(blocks, b)
	}
	return blocks, errs
}

func readBlock(root *os.Root, name string) (Block, error) {
	// O_NONBLOCK: a FIFO in the blocks directory must not hang a request.
	f, err := root.OpenFile(name+".md", os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Block{}, errors.New("file is missing")
		}
		return Block{}, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return Block{}, errors.New("not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, maxBlockBytes+1))
	if err != nil {
		return Block{}, err
	}
	if len(data) > maxBlockBytes {
		return Block{}, fmt.Errorf("file is over %d bytes", maxBlockBytes)
	}
	desc, body, err := ParseFrontMatter(data)
	if err != nil {
		return Block{}, err
	}
	return Block{Name: name, Description: desc, Body: body}, nil
}

// ParseFrontMatter splits a block file into its description and body. The
// first line must be exactly "+++" (no BOM; a CR before a LF is dropped);
// the front matter ends at the next line that is exactly "+++"; it is TOML
// and needs a string "description"; other keys are ignored.
func ParseFrontMatter(data []byte) (description, body string, err error) {
	lines := bytes.SplitAfter(data, []byte("\n"))
	trim := func(l []byte) string {
		s := strings.TrimSuffix(string(l), "\n")
		return strings.TrimSuffix(s, "\r")
	}
	if len(lines) == 0 || trim(lines[0]) != "+++" || !bytes.HasSuffix(lines[0], []byte("\n")) {
		return "", "", errors.New("front matter: the first line must be exactly +++")
	}
	end := -1
	for i := 1; i < len(lines); i++ {
		if trim(lines[i]) == "+++" {
			end = i
			break
		}
	}
	if end < 0 {
		return "", "", errors.New("front matter: no closing +++ line")
	}
	var fm bytes.Buffer
	for _, l := range lines[1:end] {
		fm.WriteString(trim(l))
		fm.WriteByte('\n')
	}
	if line, col, ok := tomlNestingOK(fm.Bytes()); !ok {
		return "", "", fmt.Errorf("front matter: %d:%d: nested deeper than %d levels", line+1, col, maxTOMLNesting)
	}
	var meta map[string]any
	if _, err := toml.Decode(fm.String(), &meta); err != nil {
		return "", "", fmt.Errorf("front matter: %v", err)
	}
	d, ok := meta["description"]
	if !ok {
		return "", "", errors.New("front matter: description is required")
	}
	ds, ok := d.(string)
	if !ok {
		return "", "", errors.New("front matter: description must be a string")
	}
	var b bytes.Buffer
	for _, l := range lines[end+1:] {
		b.Write(l)
	}
	return ds, b.String(), nil
}
