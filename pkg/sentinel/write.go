package sentinel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write validates r and writes it as the sentinel file of workspace,
// atomically: it writes a temporary file in the same directory, syncs it,
// renames it over [Path](workspace) and syncs the directory, so a reader
// sees either the old file or the whole new one. It creates the .agora
// directory with mode 0700 when missing (but not workspace itself) and the
// file with mode 0600. Write blocks on file-system I/O.
//
// Write returns a *[MalformedError] when r fails [Request.Validate] and an
// *[OversizedError] when the encoded file would exceed [MaxSize]; nothing is
// written in either case. It refuses a .agora that is not a directory,
// including a symlink to one. What it writes is what [Resolve] reads back:
// empty Options and a null PartialState are omitted, and PartialState is
// written byte for byte, without the whitespace around it.
func Write(workspace string, r Request) error {
	if err := r.Validate(); err != nil {
		return err
	}
	b := encode(r)
	if len(b) > MaxSize {
		return &OversizedError{Size: int64(len(b)), Limit: MaxSize}
	}

	dir := filepath.Dir(Path(workspace))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("sentinel: write: %w", err)
	}
	info, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("sentinel: write: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("sentinel: write: %s is not a directory (%s)", dir, typeName(info.Mode()))
	}

	f, err := os.CreateTemp(dir, ".needs_input-*.tmp")
	if err != nil {
		return fmt.Errorf("sentinel: write: %w", err)
	}
	tmp := f.Name()
	if err := writeAndClose(f, b); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("sentinel: write: %w", err)
	}
	if err := os.Rename(tmp, Path(workspace)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("sentinel: write: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("sentinel: write: %w", err)
	}
	return nil
}

// writeAndClose writes b to f with mode 0600, syncs and closes it.
func writeAndClose(f *os.File, b []byte) error {
	_, err := f.Write(b)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// wireRequest is Request without PartialState, which encode splices in by
// hand: encoding/json would compact and re-escape a json.RawMessage.
type wireRequest struct {
	Question  string   `json:"question"`
	Options   []string `json:"options,omitempty"`
	Context   string   `json:"context,omitempty"`
	Kind      Kind     `json:"kind,omitempty"`
	DedupeKey string   `json:"dedupe_key,omitempty"`
	Reuse     *bool    `json:"reuse,omitempty"`
}

// encode renders a validated request as the bytes of a sentinel file: one
// JSON object and a newline.
func encode(r Request) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// Cannot fail: every field is a valid UTF-8 string.
	_ = enc.Encode(wireRequest{
		Question:  r.Question,
		Options:   r.Options,
		Context:   r.Context,
		Kind:      r.Kind,
		DedupeKey: r.DedupeKey,
		Reuse:     r.Reuse,
	})
	state := trimJSONSpace(r.PartialState)
	if len(state) == 0 || isNull(state) {
		return buf.Bytes()
	}
	// Replace the closing "}\n" with the partial state.
	buf.Truncate(buf.Len() - 2)
	buf.WriteString(`,"partial_state":`)
	buf.Write(state)
	buf.WriteString("}\n")
	return buf.Bytes()
}
