package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// prepareWorkspace creates <root>/<dispatch_id> with mode 0700 and its
// .agora directory. On a redelivery (stale true) a workspace left by a
// crashed earlier attempt is removed first.
func prepareWorkspace(root, dispatchID string, stale bool) (string, error) {
	// A work message published past the dispatcher may carry any subject
	// token: "/" would name the root itself, "a/b" a directory inside
	// another dispatch's workspace.
	if dispatchID == "" || dispatchID == "." || dispatchID == ".." || strings.ContainsAny(dispatchID, `/\`) {
		return "", fmt.Errorf("dispatch id %q cannot name a workspace directory", dispatchID)
	}
	ws := filepath.Join(root, dispatchID)
	if stale {
		if err := os.RemoveAll(ws); err != nil {
			return "", fmt.Errorf("remove stale workspace: %w", err)
		}
	}
	err := os.Mkdir(ws, 0o700)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(root, 0o700); err == nil {
			err = os.Mkdir(ws, 0o700)
		}
	}
	if err != nil {
		return "", fmt.Errorf("create workspace: %w", err)
	}
	if err := os.Mkdir(filepath.Join(ws, ".agora"), 0o700); err != nil {
		return "", fmt.Errorf("create workspace: %w", err)
	}
	return ws, nil
}

// writeWorkspaceFile writes rel inside ws through an os.Root, so neither
// the path nor a symlink on the way can reach outside the workspace.
func writeWorkspaceFile(ws, rel string, data []byte) error {
	root, err := os.OpenRoot(ws)
	if err != nil {
		return err
	}
	defer root.Close()
	rel = filepath.Clean(filepath.FromSlash(rel))
	if dir := filepath.Dir(rel); dir != "." {
		if err := root.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("file %q: %w", rel, err)
		}
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("file %q: %w", rel, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("file %q: %w", rel, err)
	}
	return f.Close()
}

// MaxOutput is the largest .agora/output.json carried in `finished`.
const MaxOutput = 64 << 10

// readOutput reads .agora/output.json without following a symlink. It
// returns nil output and a reason when the file is absent, not regular,
// larger than MaxOutput or not JSON.
func readOutput(ws string) (json.RawMessage, string) {
	p := filepath.Join(ws, ".agora", "output.json")
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ""
	}
	if err != nil {
		return nil, err.Error()
	}
	if !fi.Mode().IsRegular() {
		return nil, "output.json is not a regular file"
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err.Error()
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxOutput+1))
	if err != nil {
		return nil, err.Error()
	}
	if len(b) > MaxOutput {
		return nil, fmt.Sprintf("output.json is larger than %d bytes", MaxOutput)
	}
	if !json.Valid(b) {
		return nil, "output.json is not valid JSON"
	}
	return json.RawMessage(b), ""
}
