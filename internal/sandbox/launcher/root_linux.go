//go:build linux

package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// stageRoot is where the launcher builds the run's root before it enters
// it: a mount point every host has, covered only in the launcher's own
// mount namespace.
const stageRoot = "/tmp"

// Sizes of the run's own filesystems.
const (
	defaultTmpSize = 64 << 20
	shmSize        = 64 << 20
	// tmpInodes bounds the files of /tmp and /dev/shm: an empty file
	// takes no room of the size, but its inode is kernel memory
	// (docs/sandbox.md, "Attack → layer → test").
	tmpInodes = 65536
)

// devices are the nodes the run's /dev holds, bound from the host's.
var devices = []string{"null", "zero", "full", "random", "urandom"}

// buildRoot gives the launcher, and so the runtime, a root of its own
// (docs/sandbox.md, "A root of its own"): a tmpfs holding only the
// policy's binds (each from a descriptor the worker opened, so no path of
// the worker's need be reachable by the run's user), a fresh /proc, a /dev
// of a few devices, private /tmp and /dev/shm; it is entered with
// pivot_root, the old root detached, and the root itself made read-only.
// The worker's data folder, its home, /root, /var/run and any socket of
// the host are simply not there.
//
// With p.Workspace, the bind at that target is instead a tmpfs of
// p.WorkspaceSize bytes holding a copy of the bind's source; buildRoot
// returns a descriptor of it (else -1) for the worker, which reads the
// run's results through it.
func buildRoot(p Policy, fds []int) (wsFD int, err error) {
	wsFD = -1
	defer func() {
		if err != nil && wsFD >= 0 {
			unix.Close(wsFD)
			wsFD = -1
		}
	}()
	// Nothing mounted here propagates back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return wsFD, fmt.Errorf("root: make / a slave: %w", err)
	}
	cloneBindTrees(p, fds)
	if err := unix.Mount("tmpfs", stageRoot, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m,nr_inodes=16384"); err != nil {
		return wsFD, fmt.Errorf("root: tmpfs: %w", err)
	}
	rootFD, err := unix.Open(stageRoot, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return wsFD, fmt.Errorf("root: %w", err)
	}
	defer unix.Close(rootFD)
	if err := buildProc(rootFD); err != nil {
		return wsFD, err
	}
	if err := buildDev(rootFD); err != nil {
		return wsFD, err
	}
	if err := buildTmp(rootFD, p.TmpSize); err != nil {
		return wsFD, err
	}
	// The binds come last: one may lie under /tmp (a workspace root
	// there) and must not be covered by the private /tmp.
	if wsFD, err = placeBinds(rootFD, p, fds); err != nil {
		return wsFD, err
	}
	if err := enterRoot(); err != nil {
		return wsFD, err
	}
	return wsFD, nil
}

// cloneBindTrees takes a copy of the mount tree of each bind's plain
// descriptor, in its place. A worker that is not root sends plain
// descriptors, bound by their path: the copy is taken now, before the
// staged root covers /tmp (where a workspace root often is).
func cloneBindTrees(p Policy, fds []int) {
	for _, b := range p.Binds {
		if b.FD >= 0 && b.FD < len(fds) && fds[b.FD] >= 0 {
			if tree, ok := cloneByPath(fds[b.FD]); ok {
				unix.Close(fds[b.FD])
				fds[b.FD] = tree
			}
		}
	}
}

// buildProc mounts a fresh /proc for the run's PID namespace: it lists
// only the run's processes.
func buildProc(rootFD int) error {
	if err := mkdirIn(rootFD, "/proc"); err != nil {
		return err
	}
	if err := unix.Mount("proc", stageRoot+"/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("root: /proc: %w", err)
	}
	return nil
}

// buildTmp mounts the run's private /tmp: a tmpfs of size bytes (0 means
// defaultTmpSize) and at most tmpInodes files.
func buildTmp(rootFD int, size uint64) error {
	if size == 0 {
		size = defaultTmpSize
	}
	if err := mkdirIn(rootFD, "/tmp"); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", stageRoot+"/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size="+strconv.FormatUint(size, 10)+",nr_inodes="+strconv.Itoa(tmpInodes)); err != nil {
		return fmt.Errorf("root: /tmp: %w", err)
	}
	return nil
}

// placeBinds binds each of the policy's binds into the staged root, the
// workspace as a tmpfs of its own, whose descriptor it returns (else -1),
// also with an error: the caller closes it then.
func placeBinds(rootFD int, p Policy, fds []int) (wsFD int, err error) {
	wsFD = -1
	for _, b := range p.Binds {
		if b.FD < 0 || b.FD >= len(fds) || fds[b.FD] < 0 {
			return wsFD, fmt.Errorf("root: bind %s: no descriptor %d", b.Target, b.FD)
		}
		if p.Workspace != "" && b.Target == p.Workspace && b.Dir {
			if wsFD, err = workspaceTmpfs(rootFD, fds[b.FD], b.Target, p.WorkspaceSize); err != nil {
				return wsFD, err
			}
			continue
		}
		if err := bindAt(rootFD, fds[b.FD], "", b.Target, b.Dir, b.Write, false); err != nil {
			return wsFD, err
		}
	}
	return wsFD, nil
}

// enterRoot enters the staged root with pivot_root; the host's root goes
// away with the old root's mounts, and the new root is made read-only.
func enterRoot() error {
	if err := unix.Chdir(stageRoot); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("root: pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("root: detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("root: make / read-only: %w", err)
	}
	return nil
}

// buildDev makes the run's /dev: a tmpfs with the host's null, zero, full,
// random and urandom bound in, the usual links into /proc/self/fd and a
// private /dev/shm. No terminal, no disk, no other device.
func buildDev(rootFD int) error {
	if err := mkdirIn(rootFD, "/dev"); err != nil {
		return err
	}
	dev := stageRoot + "/dev"
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return fmt.Errorf("root: /dev: %w", err)
	}
	for _, d := range devices {
		if err := bindAt(rootFD, -1, "/dev/"+d, "/dev/"+d, false, true, true); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := unix.Symlink(target, dev+"/"+name); err != nil {
			return fmt.Errorf("root: /dev/%s: %w", name, err)
		}
	}
	if err := mkdirIn(rootFD, "/dev/shm"); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dev+"/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size="+strconv.Itoa(shmSize)+",nr_inodes="+strconv.Itoa(tmpInodes)); err != nil {
		return fmt.Errorf("root: /dev/shm: %w", err)
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, dev, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("root: make /dev read-only: %w", err)
	}
	return nil
}

// bindAt mounts a source at target inside the staged root, then makes the
// mount and everything under it nosuid and nodev, and read-only unless
// write. The source is srcFD — a detached mount tree a root worker made
// with open_tree (moved into place), or a plain descriptor (bound through
// its path, which the launcher's user can then reach) — or, when srcFD is
// -1, the path src. Missing parents are made in the root's tmpfs; a target
// reached through a symbolic link is refused (a link could aim the mount
// anywhere).
func bindAt(rootFD, srcFD int, src, target string, dir, write, device bool) error {
	rel := strings.TrimPrefix(filepath.Clean(target), "/")
	if rel == "" || rel == "." {
		return fmt.Errorf("root: bind %s: cannot replace the root", target)
	}
	if err := mkdirIn(rootFD, "/"+filepath.Dir(rel)); err != nil {
		return err
	}
	full := stageRoot + "/" + rel
	if _, err := resolveIn(rootFD, rel); errors.Is(err, unix.ENOENT) {
		if dir {
			err = unix.Mkdir(full, 0o755)
		} else {
			var fd int
			fd, err = unix.Open(full, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err == nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			return fmt.Errorf("root: bind %s: mount point: %w", target, err)
		}
	} else if err != nil {
		return fmt.Errorf("root: bind %s: %w", target, err)
	}
	if err := mountFrom(srcFD, src, full); err != nil {
		return fmt.Errorf("root: bind %s: %w", target, err)
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if device {
		attr = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC
	}
	if !write {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, full, unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: attr}); err != nil {
		return fmt.Errorf("root: bind %s: set flags: %w", target, err)
	}
	return nil
}

// resolveIn checks that rel names something inside the staged root
// reached without a symbolic link.
func resolveIn(rootFD int, rel string) (os.FileMode, error) {
	fd, err := unix.Openat2(rootFD, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH})
	if err != nil {
		return 0, err
	}
	unix.Close(fd)
	return 0, nil
}

// mkdirIn makes dir and its missing parents inside the staged root, none
// of them through a symbolic link.
func mkdirIn(rootFD int, dir string) error {
	rel := strings.TrimPrefix(filepath.Clean(dir), "/")
	if rel == "" || rel == "." {
		return nil
	}
	cur := ""
	for _, part := range strings.Split(rel, "/") {
		cur = filepath.Join(cur, part)
		_, err := resolveIn(rootFD, cur)
		if errors.Is(err, unix.ENOENT) {
			err = unix.Mkdirat(rootFD, cur, 0o755)
		}
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("root: make %s: %w", "/"+cur, err)
		}
	}
	return nil
}

// mountFrom mounts srcFD (or the path src when srcFD is -1) at full.
func mountFrom(srcFD int, src, full string) error {
	if srcFD >= 0 {
		err := unix.MoveMount(srcFD, "", unix.AT_FDCWD, full, unix.MOVE_MOUNT_F_EMPTY_PATH)
		if err == nil {
			return nil
		}
		if err != unix.EINVAL {
			return fmt.Errorf("move_mount: %w", err)
		}
		// Not a detached tree: a plain descriptor of the worker's mount
		// namespace, which cannot be bound from here; its path can.
		if src, err = os.Readlink("/proc/self/fd/" + strconv.Itoa(srcFD)); err != nil {
			return err
		}
	}
	return unix.Mount(src, full, "", unix.MS_BIND|unix.MS_REC, "")
}

// cloneByPath copies the mount tree at the path fd names, in the launcher's
// own mount namespace, when that path still leads to the same file.
func cloneByPath(fd int) (int, bool) {
	path, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || !strings.HasPrefix(path, "/") {
		return -1, false
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return -1, false
	}
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Fstat(tree, &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino {
		unix.Close(tree)
		return -1, false
	}
	return tree, true
}

// workspaceTmpfs mounts a tmpfs of size bytes at target inside the staged
// root, copies into it what the worker laid out in the folder src names,
// and returns a descriptor of its root for the worker.
func workspaceTmpfs(rootFD, src int, target string, size uint64) (int, error) {
	if err := mkdirIn(rootFD, target); err != nil {
		return -1, err
	}
	full := stageRoot + "/" + strings.TrimPrefix(filepath.Clean(target), "/")
	inodes := max(size/(4<<10), 1024)
	opts := "mode=0700,size=" + strconv.FormatUint(size, 10) + ",nr_inodes=" + strconv.FormatUint(inodes, 10)
	if err := unix.Mount("tmpfs", full, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return -1, fmt.Errorf("root: workspace filesystem: %w", err)
	}
	if err := os.CopyFS(full, os.DirFS("/proc/self/fd/"+strconv.Itoa(src))); err != nil {
		return -1, fmt.Errorf("root: workspace filesystem: copy the workspace: %w", err)
	}
	fd, err := unix.Open(full, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("root: workspace filesystem: %w", err)
	}
	return fd, nil
}
