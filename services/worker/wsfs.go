package worker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The filesystem a run writes to (docs/sandbox.md, "The workspace's own
// filesystem"; docs/worker.md, "Lost is never success"): its workspace
// folder, locked, and the workspace's own filesystem on it — mounted by
// the worker, or made by the launcher — through whose descriptor the
// worker reads what the run left. The run's box (internal/sandbox/contain)
// decides which it gets.

// workspaceWatch is how often a run's workspace size is checked.
const workspaceWatch = time.Second

var errLimit = errors.New("worker: sandbox limit exceeded")

// runFS is one run's workspace filesystem.
type runFS struct {
	dir     *os.File                // the workspace folder, locked (prepareWorkspace)
	mounted string                  // the workspace's own tmpfs, while mounted
	root    *os.File                // its root, locked, while mounted (mount)
	view    atomic.Pointer[os.File] // the root of the filesystem the launcher made, once it did
}

// mount gives the run's workspace a filesystem of its own whose size is
// size bytes: a write past it fails with ENOSPC inside the run, before
// the host's disk sees it. Only a root worker whose runs have namespaces
// of their own does so (mounting needs root in the host's mount
// namespace; contain.WorkspaceMount). The workspace's own folders are made
// anew on it.
func (f *runFS) mount(ws string, size int64) error {
	inodes := max(size/(4<<10), 1024) // one inode per 4 KiB, as ext4 allows by default
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", size, inodes)
	if err := mountTmpfs(ws, opts); err != nil {
		return fmt.Errorf("sandbox: workspace filesystem: %w", err)
	}
	f.mounted = ws
	// The path now leads to the new filesystem's root, which no lock
	// covers yet: lock it before it holds an .agora directory, so a sweep
	// that takes the lock first finds none and lets go, and one that
	// comes later finds it held (docs/worker.md, "Why a sweep never
	// touches a live run"). The launcher keeps this lock too.
	root, err := lockDir(ws, false)
	if err != nil {
		return fmt.Errorf("sandbox: workspace filesystem: lock: %w", err)
	}
	f.root = root
	if f.dir != nil && samePathFile(ws, f.dir) {
		return errors.New("sandbox: workspace filesystem: the mount did not take the workspace's place")
	}
	for _, d := range []string{".agora", filepath.Join(".agora", "artifacts")} {
		if err := unix.Mkdirat(int(root.Fd()), d, 0o700); err != nil {
			return fmt.Errorf("sandbox: workspace filesystem: %w", err)
		}
	}
	return nil
}

// unmount lets the workspace's own filesystem go, once the run's results
// are read: what the run wrote goes with it, and the folder under it is
// the worker's pristine one again. The filesystem's lock is let go only
// once it no longer covers the folder.
func (f *runFS) unmount() {
	if f == nil {
		return
	}
	if f.mounted != "" {
		detach(f.mounted)
		f.mounted = ""
	}
	if f.root != nil {
		f.root.Close()
		f.root = nil
	}
}

// launcherHold is the lock the launcher keeps while the run lives: the
// workspace's own filesystem's when the worker mounted one (the path leads
// there), else the folder's.
func (f *runFS) launcherHold(dir *os.File) *os.File {
	if f != nil && f.root != nil {
		return f.root
	}
	return dir
}

// setView takes the root of the workspace's own filesystem the launcher
// made (sandbox.Spec.Workspace, through the run's box).
func (f *runFS) setView(root *os.File) {
	if old := f.view.Swap(root); old != nil {
		old.Close()
	}
}

// full reports whether the workspace's own filesystem, the worker's or
// the launcher's, is (all but) full: the run met ENOSPC there.
func (f *runFS) full() bool {
	if f == nil {
		return false
	}
	if f.root != nil && fsFull(fdPath(f.root)) {
		return true
	}
	v := f.view.Load()
	return v != nil && fsFull(fdPath(v))
}

// viewOr is where the worker reads the run's workspace: through the
// descriptor of what the run wrote to — the root of the workspace's own
// filesystem the launcher made, once it did, or the one the worker
// mounted, or the locked folder — else ws. So what the worker reads is
// what the run wrote, whatever became of the path meanwhile (lost says
// whether it still leads there).
func (f *runFS) viewOr(ws string) string {
	if f != nil {
		if v := f.view.Load(); v != nil {
			return fdPath(v)
		}
		if f.root != nil {
			return fdPath(f.root)
		}
		if f.dir != nil {
			return fdPath(f.dir)
		}
	}
	return ws
}

// fdPath names the file f has open, for the functions that take a path.
func fdPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }

// lost says what became of the run's workspace when it is no longer the
// one the run wrote to — the folder gone, replaced, the run's own
// filesystem no longer mounted on it, .agora gone — and "" while it is.
// A run whose workspace was lost fails workspace-lost: whatever the
// worker would read there is not what the run left.
func (f *runFS) lost(ws string) string {
	if f == nil || f.dir == nil {
		return ""
	}
	want, what := f.dir, "folder"
	if f.root != nil {
		want, what = f.root, "own filesystem"
	}
	var st unix.Stat_t
	if err := unix.Lstat(ws, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Sprintf("the workspace %s is gone: it was removed while the run lived", ws)
		}
		return fmt.Sprintf("the workspace %s cannot be read: %v", ws, err)
	}
	if !samePathFile(ws, want) {
		return fmt.Sprintf("the workspace %s no longer leads to the run's %s: it was unmounted or replaced while the run lived", ws, what)
	}
	var ag unix.Stat_t
	if err := unix.Lstat(filepath.Join(f.viewOr(ws), ".agora"), &ag); err != nil || ag.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Sprintf("the workspace %s has no .agora directory any more", ws)
	}
	return ""
}

// close lets the launcher's filesystem go once the run's results are
// read; the folder's lock is the invocation's, parked or closed with the
// workspace.
func (f *runFS) close() {
	if f == nil {
		return
	}
	if v := f.view.Swap(nil); v != nil {
		v.Close()
	}
	f.dir = nil
}

// privateDirs makes a sandboxed run's private tmp and home in its
// workspace and returns the variables that name them: the worker's own
// home, where credentials live, is out of the run's reach
// (docs/sandbox.md, "The definition's sandbox: block").
func privateDirs(ws string) (map[string]string, error) {
	tmp := filepath.Join(ws, ".agora", "tmp")
	home := filepath.Join(ws, ".agora", "home")
	for _, d := range []string{tmp, home} {
		// A parked workspace (workspace.go) has them already, empty.
		if err := os.Mkdir(d, 0o700); err != nil && !(errors.Is(err, fs.ErrExist) && pristineDir(d)) {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	return map[string]string{"TMPDIR": tmp, "HOME": home}, nil
}

// giveWorkspace hands ws and everything in it (all the worker's own, made
// for this run) to the run's host user uid, when runs have one of their
// own (uid not 0).
func giveWorkspace(ws string, uid int) error {
	if uid == 0 {
		return nil
	}
	return filepath.WalkDir(ws, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, uid)
	})
}

// takeWorkspace gives the workspace's own folders back to the worker once
// the run is over (and every process of it gone), so a parked workspace
// is the worker's again; what the run made in them is removed as the
// worker's anyway. Links are never followed.
func takeWorkspace(ws string, uid int) {
	if uid == 0 {
		return
	}
	for _, d := range []string{ws, filepath.Join(ws, ".agora"), filepath.Join(ws, ".agora", "artifacts"), filepath.Join(ws, ".agora", "home"), filepath.Join(ws, ".agora", "tmp")} {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			_ = os.Lchown(d, os.Geteuid(), os.Getegid())
		}
	}
}

// workspaceSize adds up the sizes of the regular files under ws, without
// following links.
func workspaceSize(ws string) int64 {
	var n int64
	_ = filepath.WalkDir(ws, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
