package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// prepareWorkspace creates this attempt's own workspace,
// <root>/<dispatch_id>.<attempt>.<random>, mode 0700, with its .agora
// directory, and returns it locked (an exclusive flock on the directory,
// held by the returned file and by the launcher that inherits it). No other
// attempt ever uses or removes it, and a sweep removes it only once the
// lock is free: the run and every process of it are gone.
func prepareWorkspace(root, dispatchID string, attempt int) (string, *os.File, error) {
	// A work message published past the dispatcher may carry any subject
	// token: "/" would name the root itself, "a/b" a directory inside
	// another dispatch's workspace.
	if dispatchID == "" || dispatchID == "." || dispatchID == ".." || strings.ContainsAny(dispatchID, `/\`) {
		return "", nil, fmt.Errorf("dispatch id %q cannot name a workspace directory", dispatchID)
	}
	pattern := dispatchID + "." + strconv.Itoa(attempt) + ".*"
	ws, err := os.MkdirTemp(root, pattern)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(root, 0o700); err == nil {
			ws, err = os.MkdirTemp(root, pattern)
		}
	}
	if err != nil {
		return "", nil, fmt.Errorf("create workspace: %w", err)
	}
	hold, err := lockDir(ws, false)
	if err != nil {
		os.RemoveAll(ws)
		return "", nil, fmt.Errorf("lock workspace: %w", err)
	}
	if err := os.Mkdir(filepath.Join(ws, ".agora"), 0o700); err != nil {
		hold.Close()
		return ws, nil, fmt.Errorf("create workspace: %w", err)
	}
	// Where the sub-agent leaves files to keep (artifacts.go).
	if err := os.Mkdir(filepath.Join(ws, ".agora", "artifacts"), 0o700); err != nil {
		hold.Close()
		return ws, nil, fmt.Errorf("create workspace: %w", err)
	}
	return ws, hold, nil
}

// lockDir opens dir and takes an exclusive flock on it; with try it fails
// at once (syscall.EWOULDBLOCK) when someone holds the lock.
func lockDir(dir string, try bool) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_EX
	if try {
		how |= syscall.LOCK_NB
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// workspaceName matches what prepareWorkspace creates.
var workspaceName = regexp.MustCompile(`^[^./\\]+\.[0-9]+\.[0-9]+$`)

// sweepWorkspaces removes workspaces under root that no run holds any more
// — left by a worker that was killed, on this host, sharing the root or
// not — and kills processes still working in them. Only directories named
// like workspaces and holding an .agora directory are touched, so a root
// pointed at a folder with other content loses nothing else. It returns
// how many it removed.
func sweepWorkspaces(root string, log *slog.Logger) int {
	ents, err := os.ReadDir(root)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("sweep workspaces", "err", err)
		}
		return 0
	}
	var cwds map[string][]int
	removed := 0
	for _, e := range ents {
		if !e.IsDir() || !workspaceName.MatchString(e.Name()) {
			continue
		}
		ws := filepath.Join(root, e.Name())
		if fi, err := os.Lstat(filepath.Join(ws, ".agora")); err != nil || !fi.IsDir() {
			continue
		}
		hold, err := lockDir(ws, true)
		if err != nil {
			continue // in use by a live run (or unreadable): not ours to touch
		}
		if cwds == nil {
			cwds = processCwds()
		}
		for dir, pids := range cwds {
			if dir == ws || strings.HasPrefix(dir, ws+string(filepath.Separator)) {
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
				log.Warn("killed processes left in an abandoned workspace", "workspace", ws, "pids", pids)
			}
		}
		if err := os.RemoveAll(ws); err != nil {
			log.Warn("remove abandoned workspace", "workspace", ws, "err", err)
		} else {
			removed++
		}
		hold.Close()
	}
	if removed > 0 {
		log.Info("removed abandoned workspaces", "root", root, "count", removed)
	}
	return removed
}

// processCwds maps working directories to the processes in them, for the
// processes this user may inspect.
func processCwds() map[string][]int {
	out := map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if dir, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err == nil {
			out[dir] = append(out[dir], pid)
		}
	}
	return out
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
