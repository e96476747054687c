//go:build linux

package worker

import (
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs with opts on dir (the workspace's own
// filesystem, wsfs.go).
func mountTmpfs(dir, opts string) error {
	return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts)
}

// detach unmounts what is mounted on dir, if anything, lazily.
func detach(dir string) { _ = unix.Unmount(dir, unix.MNT_DETACH) }

// fsFull reports whether the filesystem at dir has (all but) no room or
// no inode left.
func fsFull(dir string) bool {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return false
	}
	return st.Bavail*uint64(st.Bsize) < 64<<10 || st.Ffree == 0
}

// openUnder opens the directory name in dir as dir's own filesystem holds
// it, not what is mounted on it: through a copy of dir's mount alone
// (open_tree without AT_RECURSIVE), which shows no mount made below dir.
// Like mounting, it needs the privilege to mount.
func openUnder(dir, name string) (*os.File, error) {
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, err
	}
	defer unix.Close(tree)
	fd, err := unix.Openat(tree, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir, name)), nil
}

// emptyTmpfs reports whether dir, an open directory, is on a tmpfs and
// holds nothing.
func emptyTmpfs(dir *os.File) bool {
	var st unix.Statfs_t
	if unix.Fstatfs(int(dir.Fd()), &st) != nil || st.Type != unix.TMPFS_MAGIC {
		return false
	}
	d, err := os.Open(fdPath(dir))
	if err != nil {
		return false
	}
	defer d.Close()
	_, err = d.Readdirnames(1)
	return err == io.EOF
}
