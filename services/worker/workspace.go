package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// prepareWorkspace creates this attempt's own workspace,
// <root>/<dispatch_id>.<attempt>.<random>, mode 0700, with its .agora
// directory, and returns it locked (an exclusive flock on the directory,
// held by the returned file and by the launcher that inherits it). No other
// attempt ever uses or removes it, and a sweep removes it only once the
// lock is free: the run and every process of it are gone.
//
// A parked workspace (below), when sp has one, is taken instead of making
// a new one: the same folders, renamed, already locked.
func prepareWorkspace(root, dispatchID string, attempt int, sp *spares) (string, *os.File, error) {
	// A work message published past the dispatcher may carry any subject
	// token: "/" would name the root itself, "a/b" a directory inside
	// another dispatch's workspace.
	if dispatchID == "" || dispatchID == "." || dispatchID == ".." || strings.ContainsAny(dispatchID, `/\`) {
		return "", nil, fmt.Errorf("dispatch id %q cannot name a workspace directory", dispatchID)
	}
	if sp != nil {
		if ws, hold, ok := sp.take(root, dispatchID, attempt); ok {
			return ws, hold, nil
		}
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

// SweepWorkspaces removes the workspaces under root that no run holds any
// more, as a worker on root does at its start and then periodically: for
// tooling that stops workers for good (a worker killed mid-run leaves its
// runs' workspaces, and their filesystems mounted, until a worker on the
// same root sweeps them). It returns how many it removed.
func SweepWorkspaces(root string, log *slog.Logger) int { return sweepWorkspaces(root, log) }

// sweep runs one workspace sweep of the worker's root and counts it.
func (s *Service) sweep() {
	n := sweepWorkspaces(s.cfg.WorkspaceRoot, s.log)
	s.metrics.sweeps.Inc()
	s.metrics.swept.Add(float64(n))
}

// sweepWorkspaces removes workspaces under root that no run holds any more
// — left by a worker that was killed, on this host, sharing the root or
// not — and kills processes still working in them. Only directories named
// like workspaces and holding an .agora directory are touched, so a root
// pointed at a folder with other content loses nothing else. It returns
// how many it removed.
//
// A workspace is abandoned only by a lock the sweep holds: what the
// workspace's path leads to — the folder, or the run's own filesystem
// mounted on it — is locked by its run from before it holds an .agora
// directory until after it is gone, so a sweep that takes the lock and
// finds .agora through the locked descriptor knows no run lives there
// (docs/worker.md, "Why a sweep never touches a live run").
func sweepWorkspaces(root string, log *slog.Logger) int {
	ents, err := os.ReadDir(root)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("sweep workspaces", "err", err)
		}
		return 0
	}
	var rootSt unix.Stat_t
	if err := unix.Stat(root, &rootSt); err != nil {
		log.Warn("sweep workspaces", "err", err)
		return 0
	}
	var cwds map[string][]int
	procs := func() map[string][]int {
		if cwds == nil {
			cwds = processCwds()
		}
		return cwds
	}
	removed := 0
	for _, e := range ents {
		if !e.IsDir() || !workspaceName.MatchString(e.Name()) {
			continue
		}
		if sweepWorkspace(root, e.Name(), uint64(rootSt.Dev), procs, log) {
			removed++
		}
	}
	if removed > 0 {
		log.Info("removed abandoned workspaces", "root", root, "count", removed)
	}
	return removed
}

// sweepWorkspace removes the workspace name under root when no run holds
// it and reports whether it did. rootDev is root's device: a workspace on
// another device is the run's own filesystem, mounted on the folder
// (wsfs.go, runFS.mount), which a worker that died mid-run left.
func sweepWorkspace(root, name string, rootDev uint64, procs func() map[string][]int, log *slog.Logger) bool {
	ws := filepath.Join(root, name)
	top := lockAbandoned(ws)
	if top == nil {
		// In use by a live run, not a workspace, unreadable — or the
		// empty filesystem of a worker killed while it mounted it.
		if !detachEmptyMount(root, name, rootDev) {
			return false
		}
		if top = lockAbandoned(ws); top == nil {
			return false
		}
	}
	defer top.Close()
	for dir, pids := range procs() {
		if dir == ws || strings.HasPrefix(dir, ws+string(filepath.Separator)) {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			log.Warn("killed processes left in an abandoned workspace", "workspace", ws, "pids", pids)
		}
	}
	held := top
	var st unix.Stat_t
	if unix.Fstat(int(top.Fd()), &st) != nil {
		return false
	}
	if uint64(st.Dev) != rootDev {
		// The run's own filesystem, abandoned: let it go, then the folder
		// under it must be abandoned too, by a lock of its own.
		detach(ws)
		dir := lockAbandoned(ws)
		if dir == nil {
			return false
		}
		defer dir.Close()
		held = dir
	}
	// Only the folder the sweep holds is removed: ws must still lead to it.
	if !samePathFile(ws, held) {
		return false
	}
	if err := os.RemoveAll(ws); err != nil {
		log.Warn("remove abandoned workspace", "workspace", ws, "err", err)
		return false
	}
	return true
}

// detachEmptyMount lets go of the filesystem mounted on the workspace
// name under root when a worker was killed between mounting it and making
// .agora on it (runFS.mount), and reports whether it did: the
// filesystem is an empty tmpfs whose lock is free, and the folder under it
// holds .agora and its lock is free too. A live worker holds the folder's
// lock from the folder's creation until its filesystem is let go, so a
// worker caught between its mount and its lock keeps the mount. The
// folder is reached under the mount, through a copy of root's mount alone
// (openUnder).
func detachEmptyMount(root, name string, rootDev uint64) bool {
	ws := filepath.Join(root, name)
	top, err := lockDir(ws, true)
	if err != nil {
		return false
	}
	defer top.Close()
	var st unix.Stat_t
	if unix.Fstat(int(top.Fd()), &st) != nil || uint64(st.Dev) == rootDev || !emptyTmpfs(top) {
		return false
	}
	dir, err := openUnder(root, name)
	if err != nil {
		return false
	}
	if syscall.Flock(int(dir.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		dir.Close()
		return false // a live worker's
	}
	err = unix.Fstatat(int(dir.Fd()), ".agora", &st, unix.AT_SYMLINK_NOFOLLOW)
	dir.Close()
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false // not a workspace folder
	}
	detach(ws)
	return true
}

// lockAbandoned returns what ws leads to, locked, when its lock is free
// and it holds an .agora directory (looked up through the locked
// descriptor); else nil.
func lockAbandoned(ws string) *os.File {
	f, err := lockDir(ws, true)
	if err != nil {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstatat(int(f.Fd()), ".agora", &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		f.Close()
		return nil
	}
	return f
}

// samePathFile reports whether path (not followed) leads to the file f
// has open.
func samePathFile(path string, f *os.File) bool {
	var a, b unix.Stat_t
	if unix.Lstat(path, &a) != nil || unix.Fstat(int(f.Fd()), &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
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
// returns nil output and no reason when the run wrote none; nil output and
// a reason when the file is not regular, larger than MaxOutput or not
// JSON (the run's own doing); and an error when the file is there but
// cannot be read.
func readOutput(ws string) (json.RawMessage, string, error) {
	p := filepath.Join(ws, ".agora", "output.json")
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	if !fi.Mode().IsRegular() {
		return nil, "output.json is not a regular file", nil
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxOutput+1))
	if err != nil {
		return nil, "", err
	}
	if len(b) > MaxOutput {
		return nil, fmt.Sprintf("output.json is larger than %d bytes", MaxOutput), nil
	}
	if !json.Valid(b) {
		return nil, "output.json is not valid JSON", nil
	}
	return json.RawMessage(b), "", nil
}

// Recycling (docs/worker.md, "Workspaces"). Making a workspace and removing
// it are a handful of directory creations and removals per run, which on a
// disk (and more so one mounted with online discard) cost milliseconds. So
// a workspace whose run is over is cleared and parked, still locked, under
// a spare name (spare.0.<n>: attempt 0 names no run, and the sweep removes
// it after a crash), and the next run renames it to its own name. A
// workspace is parked only when what remains is exactly a fresh one: the
// folder, .agora and .agora/artifacts (and the sandbox's .agora/tmp and
// .agora/home), each a real directory of mode 0700 owned by the worker with
// no extended attributes, and all of them empty. Anything else — a link,
// another mode or owner, an attribute, an entry that cannot be removed —
// and the workspace is removed instead: nothing a run leaves reaches
// another run.

// spares are a worker's parked workspaces, at most max (one per slot).
type spares struct {
	mu   sync.Mutex
	list []spare
	max  int
}

type spare struct {
	dir  string
	hold *os.File // the workspace's lock, kept while it is parked
}

// keptDirs are the directories under .agora a parked workspace may keep.
var keptDirs = map[string]bool{"artifacts": true, "tmp": true, "home": true}

// take returns a parked workspace, renamed for dispatchID's attempt, and
// its lock; ok false when there is none.
func (sp *spares) take(root, dispatchID string, attempt int) (string, *os.File, bool) {
	for {
		sp.mu.Lock()
		if len(sp.list) == 0 {
			sp.mu.Unlock()
			return "", nil, false
		}
		p := sp.list[len(sp.list)-1]
		sp.list = sp.list[:len(sp.list)-1]
		sp.mu.Unlock()
		ws := filepath.Join(root, dispatchID+"."+strconv.Itoa(attempt)+"."+strconv.FormatUint(uint64(rand.Uint32()), 10))
		if err := renameNoReplace(p.dir, ws); err != nil {
			_ = os.RemoveAll(p.dir)
			p.hold.Close()
			continue
		}
		return ws, p.hold, true
	}
}

// park clears ws, whose run is over and whose lock hold is, and keeps it
// for the next run; when it cannot (see above) or enough are parked, it
// removes ws and releases the lock.
func (sp *spares) park(root, ws string, hold *os.File) {
	sp.mu.Lock()
	full := len(sp.list) >= sp.max
	sp.mu.Unlock()
	if !full && clearWorkspace(ws) {
		dir := filepath.Join(root, "spare.0."+strconv.FormatUint(uint64(rand.Uint32()), 10))
		if renameNoReplace(ws, dir) == nil {
			sp.mu.Lock()
			if len(sp.list) < sp.max {
				sp.list = append(sp.list, spare{dir: dir, hold: hold})
				sp.mu.Unlock()
				return
			}
			sp.mu.Unlock()
			ws = dir
		}
	}
	_ = os.RemoveAll(ws)
	if hold != nil {
		hold.Close()
	}
}

// drain removes every parked workspace.
func (sp *spares) drain() {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	list := sp.list
	sp.list = nil
	sp.mu.Unlock()
	for _, p := range list {
		_ = os.RemoveAll(p.dir)
		p.hold.Close()
	}
}

// clearWorkspace empties ws down to a fresh workspace's directories and
// reports whether what is left is exactly that.
func clearWorkspace(ws string) bool {
	agora := filepath.Join(ws, ".agora")
	if !pristineDir(ws) || !clearDir(ws, func(name string) bool { return name == ".agora" }) {
		return false
	}
	if !pristineDir(agora) || !clearDir(agora, func(name string) bool { return keptDirs[name] }) {
		return false
	}
	ents, err := os.ReadDir(agora)
	if err != nil {
		return false
	}
	artifacts := false
	for _, e := range ents {
		dir := filepath.Join(agora, e.Name())
		if !pristineDir(dir) || !clearDir(dir, func(string) bool { return false }) {
			return false
		}
		artifacts = artifacts || e.Name() == "artifacts"
	}
	return artifacts
}

// clearDir removes every entry of dir but those keep names, without
// following links, and checks that only those are left.
func clearDir(dir string, keep func(string) bool) bool {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if !keep(e.Name()) {
			if os.RemoveAll(filepath.Join(dir, e.Name())) != nil {
				return false
			}
		}
	}
	if ents, err = os.ReadDir(dir); err != nil {
		return false
	}
	for _, e := range ents {
		if !keep(e.Name()) {
			return false
		}
	}
	return true
}

// pristineDir reports whether path is a real directory of mode 0700 (no
// special bits), owned by this process's user and group, with no extended
// attributes (an ACL is one).
func pristineDir(path string) bool {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil {
		return false
	}
	if st.Mode != unix.S_IFDIR|0o700 || int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid() {
		return false
	}
	return noXattrs(path)
}
